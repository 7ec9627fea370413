"""Contract: SGLang 0.5.23's own ``ServerArgs`` against kvpilot's SGLang facts and budget.

SGLang cannot share kvpilot's environment (it pins its own torch and transformers), so it lives in
``.venv-sglang`` (``make sglang-venv``: the 0.5.23 wheel without dependencies, four small pure ones, and
the engine venv's CPU torch via a ``.pth``) and answers through ``sglang_probe.py`` in one subprocess.
There, on CPU, SGLang's parser reads every flag kvpilot renders, and ``resolve_once`` runs SGLang's own
``handle_gpu_memory_settings`` with the GPU memory of every catalogue GPU (``nvidia-smi``'s total, which is
what SGLang reads), so the GPU-tier defaults and the default ``--mem-fraction-static`` are SGLang's, not a
copy; its ``ModelConfig`` gives the KV geometry the pool configurator multiplies.
SGLang's own ``DefaultPoolConfigurator`` then sizes the budget's pool (cell and token count). Not
covered: the free memory the configurator profiles (it needs a GPU); kvpilot's weights and CUDA context
are estimates there.

Never skipped: without ``.venv-sglang`` the test fails, naming the command that builds it.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpilot.tuner import engines, gpus, sglang
from kvpilot.tuner.model import build_model_spec, lookup_model_config

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PROBE = Path(__file__).with_name("sglang_probe.py")
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "deepseek-ai/DeepSeek-V3")
GPU_MIB = sorted({(g.nvml_total_bytes or g.total_bytes) // gpus.MIB for g in gpus.CATALOGUE})
REST: dict[str, Any] = {
    "max_running_requests": 64,
    "chunked_prefill_size": 2048,
    "max_total_tokens": 100000,
    "schedule_conservativeness": 0.3,
    "page_size": 16,
    "pp_size": 2,
    "max_prefill_tokens": 16384,
}
"""Every other flag kvpilot renders, set in every other rendering."""
SETTINGS = [
    sglang.SglangSettings(
        context_length=ctx,
        mem_fraction_static=mfs,
        kv_cache_dtype=dtype,
        tp_size=tp,
        **(REST if i % 2 else {}),
    )
    for i, (ctx, mfs, dtype, tp) in enumerate(
        itertools.product((None, 8192), (None, 0.835), (None, *sglang.KV_CACHE_DTYPE_BYTES), (None, 4))
    )
]


POOL_CASES = [
    *(
        (model, "H100-SXM", tp, dtype, page)
        for model, tp, dtype, page in itertools.product(MODELS[:2], (1, 2, 4), ("auto", "fp8_e4m3"), (1, 16))
    ),
    *(
        ("deepseek-ai/DeepSeek-V3", "H200", 8, dtype, page)
        for dtype, page in itertools.product(("auto", "fp8_e4m3"), (1, 64))
    ),
]
"""MHA models on an H100 at TP 1/2/4; DeepSeek-V3 (MLA, its latent replicated) on eight H200s."""


def _budget(model: str, gpu: str, tp: int, dtype: str, page: int) -> engines.SglangBudget:
    spec = build_model_spec(lookup_model_config(model))
    settings = sglang.SglangSettings(tp_size=tp, kv_cache_dtype=dtype, page_size=page)
    return engines.compute_sglang_budget(spec, gpus.lookup_gpu(gpu), settings, weights_total_bytes=None)


def _mib(gpu: str) -> int:
    spec = gpus.lookup_gpu(gpu)
    return (spec.nvml_total_bytes or spec.total_bytes) // gpus.MIB


def _config_dir(tmp: Path, model: str) -> Path:
    folder = tmp / model.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(lookup_model_config(model)))
    return folder


@functools.cache
def _ask(request_json: str) -> dict[str, Any]:
    if not PYTHON.exists():
        pytest.fail(
            f"SGLang {sglang.PINNED_SGLANG_VERSION} is required for this contract and {PYTHON} is missing: "
            "build it with `make sglang-venv`.",
            pytrace=False,
        )
    done = subprocess.run(
        [str(PYTHON), str(PROBE)],
        input=request_json,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    assert answer["version"] == sglang.PINNED_SGLANG_VERSION
    return answer


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sglang-models")
    folders = {model: str(_config_dir(tmp, model)) for model in MODELS}
    llama = folders[MODELS[0]]
    parse = [[sglang.MODEL_FLAG, llama, *sglang.build_sglang_args(s)] for s in SETTINGS]
    resolve = [
        {"argv": [sglang.MODEL_FLAG, llama, "--tp-size", str(tp)], "gpu_mib": mib}
        for mib, tp in itertools.product(GPU_MIB, (1, 4))
    ]
    resolve += [
        {"argv": [sglang.MODEL_FLAG, llama, "--max-running-requests", "16"], "gpu_mib": GPU_MIB[-1]},
        {"argv": [sglang.MODEL_FLAG, llama, "--chunked-prefill-size", "2048"], "gpu_mib": GPU_MIB[-1]},
        *(
            {"argv": [sglang.MODEL_FLAG, folder, "--tp-size", "2"], "gpu_mib": 81559}
            for folder in folders.values()
        ),
    ]
    pool = [
        {
            "argv": [sglang.MODEL_FLAG, folders[model], "--tp-size", str(tp)],
            "gpu_mib": _mib(gpu),
            "kv_dtype": dtype,
            "page_size": page,
            "available_bytes": _budget(model, gpu, tp, dtype, page).pool_bytes,
        }
        for model, gpu, tp, dtype, page in POOL_CASES
    ]
    max_running = [
        {"argv": [sglang.MODEL_FLAG, llama, *extra], "gpu_mib": GPU_MIB[-1], "tokens": tokens}
        for tokens, extra in itertools.product(MAX_RUNNING_TOKENS, MAX_RUNNING_ARGS)
    ]
    request = {"parse": parse, "resolve": resolve, "pool": pool, "max_running": max_running}
    answer = _ask(json.dumps(request))
    return {"request": request, **answer}


MAX_RUNNING_TOKENS = (10, 4_000, 100_000, 415_408, 2_000_000, 40_000_000)
MAX_RUNNING_ARGS: tuple[tuple[str, ...], ...] = (
    (),
    ("--context-length", "8192"),
    ("--max-running-requests", "208"),
    ("--max-running-requests", "5000", "--context-length", "4096"),
)
"""Pools from a few tokens (the pool caps the limit) to 40M (the estimate's 4096 ceiling), Llama-3.1-8B's
own context (131,072) and a shorter one, the limit unset and written (below and above the pool's cap)."""


def test_the_running_request_limit_is_sglangs_own(answers: dict[str, Any]) -> None:
    """SGLang's ``resolve_max_num_reqs`` gives the limit kvpilot's loop reads for SGLang
    (:func:`kvpilot.tuner.sglang.default_max_running_requests`: the ``KvBound`` rule's saturation) on every
    pool and flag set: the estimate's 2048 floor and 4096 ceiling, the pool's cap, a written limit."""
    cases = list(itertools.product(MAX_RUNNING_TOKENS, MAX_RUNNING_ARGS))
    assert len(answers["max_running"]) == len(cases)
    seen = set()
    for (tokens, extra), got in zip(cases, answers["max_running"], strict=True):
        flags = dict(zip(extra[::2], extra[1::2], strict=True))
        context = int(flags.get("--context-length", 131072))
        given = int(flags["--max-running-requests"]) if "--max-running-requests" in flags else None
        assert sglang.default_max_running_requests(tokens, context, given) == got, (tokens, extra)
        seen.add(got)
    assert {5, 2048, 4096, 208} <= seen  # the cap, the floor, the ceiling and a written limit all reached


def test_every_rendered_flag_reads_back_as_rendered(answers: dict[str, Any]) -> None:
    for settings, parsed in zip(SETTINGS, answers["parse"], strict=True):
        assert "error" not in parsed, (settings, parsed)
        for name in sglang.FLAGS:
            wanted = getattr(settings, name)
            if wanted is not None:
                assert parsed[name] == wanted, (name, settings, parsed)


def test_unknown_flags_are_refused_by_the_probe_parser() -> None:
    """The probe's parser bites: a misspelt flag, and a prefix of a real one (which SGLang's own parser
    would take), come back as errors, not as values."""
    misspelt = [[sglang.MODEL_FLAG, "m", flag, "0.8"] for flag in ("--mem-fraction", "--mem-fraction-statik")]
    answer = _ask(json.dumps({"parse": misspelt, "resolve": []}))
    assert all("unrecognized arguments" in parsed.get("error", "") for parsed in answer["parse"]), answer


def test_the_aliases_kvpilot_reads_are_sglangs() -> None:
    """A target's command may spell a flag by its alias (:data:`kvpilot.tuner.sglang.ALIASES`,
    ``--model`` for ``--model-path``): SGLang's parser reads them as kvpilot does."""
    argv = [sglang.MODEL_ALIASES[0], "m"]
    for alias, flag in sglang.ALIASES.items():
        argv += [alias, "2"]
        assert flag in sglang.FLAGS.values(), flag
    (parsed,) = _ask(json.dumps({"parse": [argv], "resolve": []}))["parse"]
    assert "error" not in parsed, parsed
    ours = sglang.parse_sglang_args(argv)
    assert parsed["model_path"] == "m"
    assert (parsed["tp_size"], parsed["pp_size"]) == (ours.tp_size, ours.pp_size) == (2, 2)


def _resolved_case(answers: dict[str, Any], i: int) -> tuple[list[str], float, dict[str, Any]]:
    case = answers["request"]["resolve"][i]
    return case["argv"], case["gpu_mib"], answers["resolve"][i]


def _flag(argv: list[str], flag: str) -> int | None:
    return int(argv[argv.index(flag) + 1]) if flag in argv else None


def test_gpu_tier_defaults_and_fraction_are_sglangs(answers: dict[str, Any]) -> None:
    for i in range(len(answers["resolve"])):
        argv, mib, got = _resolved_case(answers, i)
        tp = _flag(argv, "--tp-size") or 1
        chunk = _flag(argv, "--chunked-prefill-size") or sglang.default_chunked_prefill_size(mib)
        graph = sglang.default_cuda_graph_max_bs(mib, tp, _flag(argv, "--max-running-requests"))
        reserve = sglang.compute_reserve(mib, chunked_prefill_size=chunk, cuda_graph_max_bs=graph, tp_size=tp)
        assert got["prefill_graph_backend"].endswith("disabled")  # the reserve assumes no prefill graph
        assert (got["chunked_prefill_size"], got["cuda_graph_max_bs"]) == (chunk, graph), (mib, tp, got)
        assert got["mem_fraction_static"] == sglang.default_mem_fraction_static(mib, reserve), (mib, tp, got)


def test_the_budget_uses_sglangs_kv_geometry(answers: dict[str, Any]) -> None:
    """SGLang picks the MLA backend exactly where kvpilot's spec has MLA; an MHA budget's cell is
    ``kv_heads_per_rank * (head_dim + v_head_dim) * layers * 2`` of SGLang's ``ModelConfig``
    (``pool_configurator.py`` lines 492-498); the context is SGLang's ``context_len``."""
    cases = answers["request"]["resolve"][-len(MODELS) :]
    for model, case, got in zip(MODELS, cases, answers["resolve"][-len(MODELS) :], strict=True):
        assert case["argv"][-1] == "2"
        spec = build_model_spec(lookup_model_config(model))
        budget = engines.compute_sglang_budget(
            spec, gpus.lookup_gpu("H100-SXM"), sglang.SglangSettings(tp_size=2)
        )
        assert got["use_mla_backend"] == (spec.mla is not None), model
        if not got["use_mla_backend"]:
            cell = got["kv_heads_per_rank"] * (got["head_dim"] + got["v_head_dim"]) * got["num_layers"] * 2
            assert budget.cell_bytes == cell, model
        assert budget.context_length == got["context_length"], model
        assert budget.settings.mem_fraction_static == got["mem_fraction_static"], model
        assert got["page_size"] == budget.settings.page_size == 1, model


def test_the_pool_is_sglangs_own_configurator(answers: dict[str, Any]) -> None:
    """SGLang's ``DefaultPoolConfigurator`` (``_compute_cell_size``, ``calculate_pool_sizes``) sizes the
    budget's pool to the same cell and the same token count: MHA at TP 1/2/4, MLA at TP 8, bf16 and fp8,
    pages 1 and 16/64."""
    assert len(answers["pool"]) == len(POOL_CASES)
    for (model, gpu, tp, dtype, page), got in zip(POOL_CASES, answers["pool"], strict=True):
        budget = _budget(model, gpu, tp, dtype, page)
        assert got["max_total_num_tokens"] > 0, (model, gpu, tp)  # a pool, not two zeros
        assert (budget.cell_bytes, budget.max_total_tokens) == (
            got["cell_size"],
            got["max_total_num_tokens"],
        ), (
            model,
            gpu,
            tp,
            dtype,
            page,
        )
