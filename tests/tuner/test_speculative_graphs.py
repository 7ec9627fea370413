"""CUDA graphs with speculative decoding: the counts vLLM captures and what the plan budgets for them.

The counts come from ``tests/data/vllm_capture_sizes.json``'s ``speculative`` points (each release's own
``_set_cudagraph_sizes``, ``adjust_cudagraph_sizes_for_spec_decode`` and ``initialize_cudagraph_keys``,
run by ``bench/vllm_capture_sizes.py``) and are checked against the public logs of
``tests/data/vllm_graph_estimates.json`` that give both counts of a speculative FULL_AND_PIECEWISE start.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

from kvpilot.tuner import memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.memory.graphs import compute_graph_estimate_bytes
from kvpilot.tuner.model.spec import ModelSpec, build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, ServingBounds

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
SIZES = json.loads((DATA / "vllm_capture_sizes.json").read_text())
ESTIMATES = json.loads((DATA / "vllm_graph_estimates.json").read_text())
H100 = GpuSpec("H100", 80 * GIB, (9, 0), True, "nvlink")
MTP_3 = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']


def _speculation(
    model: ModelSpec, spec: vllm.SpeculativeFlags | None, model_runner_v2: bool
) -> tuple[int, int]:
    """``graph_speculation`` on one GPU, with the drafter the budget resolves."""
    return memory.graph_speculation(model, spec, memory.resolve_drafter(model, spec, 1, 1), model_runner_v2)


def _point(release: str, k: int, seqs: int, tokens: int) -> dict[str, Any]:
    if k == 0:
        entries, extra = SIZES["functions"].values(), {}
    else:
        entries, extra = SIZES["speculative"].values(), {"num_speculative_tokens": k}
    want = {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": tokens,
        "blackwell": False,
        "performance_mode": None,
        **extra,
    }
    for entry in entries:
        if release in entry["releases"]:
            for point in entry["points"]:
                if all(point[key] == value for key, value in want.items()):
                    return dict(point)
    raise AssertionError(f"no point {release} {want}")


def _logged_speculative_starts() -> list[dict[str, Any]]:
    rows = []
    for row in ESTIMATES:
        spec = row.get("speculative")
        if not spec or row.get("cudagraph_mode") != "FULL_AND_PIECEWISE" and row.get("cudagraph_mode"):
            continue
        if row.get("full_graphs") is None or row.get("max_num_seqs") is None or not row.get("vllm_version"):
            continue
        match = re.search(r"num_spec(?:ulative)?_tokens=(\d+)", spec)
        assert match, spec
        rows.append({**row, "k": int(match.group(1))})
    return rows


def test_the_logged_speculative_starts_are_there() -> None:
    assert {r["id"] for r in _logged_speculative_starts()} == {"g-020", "g-023", "g-024", "g-025"}


@pytest.mark.parametrize("row", _logged_speculative_starts(), ids=lambda r: str(r["id"]))
def test_the_counts_match_what_vllm_logged(row: dict[str, Any]) -> None:
    """``Profiling CUDA graph memory: PIECEWISE=p, FULL=f`` of V1-runner starts with speculative decoding
    (0.19.2 EAGLE3-3, 0.22.0 MTP-3 and DFlash-6, 0.25.0 MTP-2 at TP 2): what the engine itself built."""
    version = vllm.parse_version(".".join(str(row["vllm_version"]).split(".")[:2]))
    counts = vllm.cuda_graph_counts(
        version,
        H100,
        row["max_num_seqs"],
        row["max_num_batched_tokens"],
        num_speculative_tokens=row["k"],
        model_runner_v2=False,
    )
    assert counts == (row["piecewise_graphs"], row["full_graphs"])


def _qwen35_9b() -> Any:
    return build_model_spec(json.loads((DATA / "hf_configs" / "Qwen__Qwen3.5-9B.json").read_text()))


@pytest.mark.parametrize("runner_v2", [True, False])
def test_an_mtp_plan_budgets_the_graphs_vllm_captures(runner_v2: bool) -> None:
    """Qwen3.5-9B with its one MTP layer, k = 3, max_num_seqs 256, 8,192 batched tokens, vLLM 0.33 on an
    H100: the plan's graph estimate is the per-layer cost over the counts the releases' own code gives
    (``vllm_capture_sizes.json``), the drafter's layer in the graphs it captures inside the estimate."""
    model, gpu = _qwen35_9b(), lookup_gpu("H100-SXM")
    pinned = EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192)
    flags = vllm.build_engine_flags([], model_runner_v2=runner_v2)
    spec_flags = vllm.build_engine_flags(MTP_3, model_runner_v2=runner_v2)
    plain = compute_plan(model, gpu, 1, ServingBounds(), pinned=pinned, engine=flags)
    mtp = compute_plan(model, gpu, 1, ServingBounds(), pinned=pinned, engine=spec_flags)
    assert plain.settings.max_num_seqs == mtp.settings.max_num_seqs == 256

    base = _point("0.33", 0, 256, 8192)
    spec = _point("0.33", 3, 256, 8192)
    plain_counts = (len(base["sizes"]), len([s for s in base["sizes"] if s <= 256]))
    if runner_v2:  # the config's sizes PIECEWISE; the drafter: prefill graphs as the target's + decode graphs
        piecewise = len(spec["sizes"])
        drafter = piecewise + len(spec["full_decode"]) + len([s for s in spec["sizes"] if s <= 256])
    else:  # the V1 runner's re-cut sizes; the drafter in each PIECEWISE graph
        piecewise = len(spec["adjusted"])
        drafter = piecewise
    spec_counts = (piecewise, len(spec["full_decode"]))
    assert spec_counts != plain_counts

    want_plain = compute_graph_estimate_bytes(
        model, piecewise=plain_counts[0], full=plain_counts[1], pp=1, tp=1
    )
    want_mtp = compute_graph_estimate_bytes(
        model, piecewise=spec_counts[0], full=spec_counts[1], pp=1, tp=1, drafter_layer_graphs=drafter
    )
    assert plain.budget.cuda_graph_gib == pytest.approx(want_plain / GIB, abs=1e-6)
    assert mtp.budget.cuda_graph_gib == pytest.approx(want_mtp / GIB, abs=1e-6)
    assert mtp.budget.cuda_graph_gib > plain.budget.cuda_graph_gib
    said = [w for w in mtp.warnings if w.startswith("--speculative-config (method mtp, 3 draft tokens)")]
    assert len(said) == 1 and "uniform-decode batches" in said[0] and "are, as vLLM" in said[0]


def test_a_cpu_proposer_changes_only_the_graphs() -> None:
    """ngram drafts on the CPU, but vLLM still captures for decode query length 1 + k."""
    model, gpu = _qwen35_9b(), lookup_gpu("H100-SXM")
    settings = EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
    ngram = vllm.read_speculative_flags(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    )
    plain = memory.compute_budget(model, gpu, settings)
    spec = memory.compute_budget(model, gpu, settings, speculative=ngram)
    assert spec.speculative_gib == plain.speculative_gib == 0
    assert spec.kv_bytes_per_token == plain.kv_bytes_per_token
    assert spec.cuda_graph_gib > plain.cuda_graph_gib
    assert _speculation(model, ngram, True) == (3, 0)


def test_a_draft_model_captures_graphs_under_the_v1_runner_only() -> None:
    """Model Runner V2's ``standalone_ar/speculator.py``: ``init_cudagraph_manager`` and ``capture`` pass
    (0.33); the V1 runner's ``DraftModelProposer`` runs the base proposer's ``dummy_run`` like EAGLE's."""
    model = build_model_spec(json.loads((DATA / "hf_configs" / "Qwen__Qwen3-32B.json").read_text()))
    draft_config = json.loads((DATA / "hf_configs" / "Qwen__Qwen3-0.6B.json").read_text())
    draft = vllm.SpeculativeFlags("draft_model", 3, "draft_model", "Qwen/Qwen3-0.6B", draft_config)
    assert _speculation(model, draft, True) == (3, 0)
    assert _speculation(model, draft, False) == (3, draft_config["num_hidden_layers"])


def test_the_count_vllm_takes_when_none_is_given() -> None:
    """An MTP drafter's layers (``n_predict``); suffix decoding's ``suffix_decoding_max_tree_depth``, 24."""
    model = _qwen35_9b()
    suffix = vllm.read_speculative_flags(["--speculative-config", '{"method": "suffix"}'])
    mtp = vllm.SpeculativeFlags(vllm.MTP, None, "mtp")
    assert _speculation(model, suffix, True) == (vllm.SUFFIX_DEFAULT_TOKENS, 0) == (24, 0)
    assert _speculation(model, mtp, True) == (1, 1)
    assert _speculation(model, None, True) == (0, 0)
