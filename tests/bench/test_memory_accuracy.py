"""The memory bench's cases and how it puts each to the planner (bench/memory_accuracy.py).

A case's ``engine_args`` are the run's vLLM arguments that have no field of their own, as a user would give
them to ``kvpilot plan --engine-args``; the bench counts the cases the plan refuses or warns about by name
and gives kvpilot's figures again without them, while the first figures still hold every case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import memory_accuracy
from kvpilot.tuner import gpus
from kvpilot.tuner.memory import estimate
from kvpilot.tuner.vllm.args import iter_flags

DATA = Path(__file__).resolve().parents[1] / "data"
CASE_FILES = sorted(DATA.glob("vllm_memory_cases*.json"))

_OWN_FIELDS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enforce_eager",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
)
FIELD_FLAGS = {
    *(f"--{f.replace('_', '-')}" for f in _OWN_FIELDS),
    "--no-enforce-eager",
    "--no-enable-prefix-caching",
    "--disable-prefix-caching",
}
"""Flags a case carries as fields: in ``engine_args`` too they could disagree with the field."""


def _cases(name: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in json.loads((DATA / name).read_text())}


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.name)
def test_engine_args_are_strings_without_the_flags_the_case_has_fields_for(path: Path) -> None:
    for case in json.loads(path.read_text()):
        args = memory_accuracy.engine_args(case)
        assert all(isinstance(a, str) for a in args)
        assert not {flag for _, flag, _ in iter_flags(args)} & FIELD_FLAGS, case["id"]


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.name)
def test_a_speculative_config_is_in_the_engine_args_the_plan_is_given(path: Path) -> None:
    """``speculative_config`` records the run's; the plan sees it only as ``--speculative-config``."""
    for case in json.loads(path.read_text()):
        args = memory_accuracy.engine_args(case)
        given = [args[i + 1] for i, flag, _ in iter_flags(args) if flag == "--speculative-config"]
        if case.get("speculative_config") is None:
            assert not given, case["id"]
        else:
            assert [json.loads(g) for g in given] == [case["speculative_config"]], case["id"]


def test_the_public_2x_cases_are_refused_or_warned_about_as_kvpilot_plan_would() -> None:
    cases = _cases("vllm_memory_cases_public_2x.json")
    verdicts = {i: memory_accuracy.plan_verdict(c, gpus.lookup_gpu) for i, c in cases.items()}
    warned = verdicts["case-106"]
    assert warned is not None and warned[0] == "warned" and warned[1].startswith("--speculative-config ")
    # an Intel XPU (101, 102): not a CUDA GPU
    for refused in ("case-101", "case-102"):
        verdict = verdicts[refused]
        assert verdict is not None and verdict[0] == "refused" and repr(cases[refused]["gpu"]) in verdict[1]
    assert {i for i, v in verdicts.items() if v is None} == {
        "case-103",  # an A40, in the catalogue since its NVML total was found
        "case-104",
        "case-105",
        "case-107",
        "case-108",
        "case-109",  # an RTX 3090 Ti, in the catalogue since 2026-12-07
        # --moe-backend cutlass on NVFP4 experts: CutlassExpertsFp4, budgeted since memory model 2026.12.7.9
        "case-110",
        "case-111",
        "case-112",
        "case-113",
        "case-114",
        "case-115",  # vLLM 0.31.0, an A100 80GB at the defaults
        "case-116",  # vLLM 0.30.0 on an L4 (Tensward reports: KV tokens only, 116 to 118)
        "case-117",
        "case-118",
    }


def test_an_argument_the_plan_refuses_or_warns_about_is_named() -> None:
    case = {"id": "x", "gpu": "H100-SXM", "engine_args": ["--enforce-eag"]}
    refused = memory_accuracy.plan_verdict(case, gpus.lookup_gpu)
    assert refused is not None and refused[0] == "refused" and "--enforce-eager" in refused[1]
    case["engine_args"] = ["--kv-offloading-size", "8", "--cpu-offload-gb", "4"]
    warned = memory_accuracy.plan_verdict(case, gpus.lookup_gpu)
    assert warned is not None and warned[0] == "warned"
    assert warned[1].startswith("--kv-offloading-size ") and " --cpu-offload-gb " in warned[1]
    assert memory_accuracy.plan_verdict({"id": "y", "gpu": None}, gpus.lookup_gpu) is None
    with pytest.raises(ValueError, match="engine_args must be a list of strings"):
        memory_accuracy.engine_args({"id": "z", "engine_args": "--enforce-eager"})


def test_the_bench_keeps_every_case_and_adds_the_figures_without_the_flagged_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    memory_accuracy.main(["--cases", str(DATA / "vllm_memory_cases_public_2x.json"), "--quiet"])
    out = capsys.readouterr().out
    first, _, rest = out.partition(" the plan, asked as")
    # every started case with a logged GiB, the refused and warned ones too (failed starts: outcome only)
    assert "available KV cache GiB             n=12 " in first
    assert "refused or warned about by name: 3 of 18 cases" in rest
    assert "case-106: warned: --speculative-config is not in kvpilot's memory model" in rest
    clean = rest.partition("neither refused nor warned about by name:")[2]
    assert "available KV cache GiB             n=10 " in clean


GOAL_EXCEPTIONS = {
    "case-109": (
        "Gemma-4-E4B at 0.22.1: its weights. The log loads 15.18 GiB; kvpilot counts 14.85, which is what "
        "vLLM 0.33's own Gemma4ForConditionalGeneration builds from the case's config "
        "(tests/contract/test_contract_model_classes.py), a trimmed fixture of the published one "
        "(config_exact false). With the logged weights the prediction is -3.4 %."
    ),
    **dict.fromkeys(
        ("case-111", "case-112", "case-113"),
        "RedHatAI/Qwen3.6-35B-A3B-NVFP4 with --moe-backend cutlass at 0.20.0 (memory model 2026.12.7.9: "
        "CutlassExpertsFp4 budgeted from vLLM's code, +72 %, +242 %, +77 %; 2026.12.7.8: +131 %, +454 %, "
        "+139 %). The build's quantization_config was not found (config_exact false): every Linear counts "
        "as NVFP4, and the weights come to 20.41 GiB against the 21.86 logged (1.45 GiB of the "
        "over-prediction); the CUDA-graph estimate agrees (0.38 / 0.39 GiB). The rest is the profile peak: "
        "logged activation and non-torch together 2.91 GiB at 4096 batched tokens and 4.73 at 16384, "
        "kvpilot 2.17 and 3.06. The logged step, 1.82 GiB for 12,288 more tokens, is near what the kernel's "
        "code gives the decoder (1.97 GiB with the hidden-size copies), but at 4096 tokens kvpilot's peak "
        "is the vision encoder's forward (1.92 GiB, the decoder's 0.73), and 0.74 GiB there is not "
        "explained (WSL2; no non-torch line logged).",
    ),
}
"""Unflagged public starts outside the goal, each with why; one that meets the goal fails the test below
(take it off the list)."""


def _unflagged_errors() -> dict[str, float]:
    """(predicted - logged) / logged available KV GiB of the public 0.2x starts the plan takes as given."""
    cases = json.loads((DATA / "vllm_memory_cases_public_2x.json").read_text())
    rows = estimate.compute_estimates(cases, gpus.lookup_gpu)
    out = {}
    for case, row in zip(cases, rows, strict=True):
        logged = (case.get("observed") or {}).get("available_kv_cache_gib")
        if case.get("outcome_class") == "failed" or not logged or row["available_kv_cache_gib"] is None:
            continue
        if memory_accuracy.plan_verdict(case, gpus.lookup_gpu) is None:
            out[case["id"]] = row["available_kv_cache_gib"] / logged - 1.0
    return out


def test_the_public_2x_cases_the_plan_takes_meet_the_goal() -> None:
    """Issue 27's goal on the starts the plan neither refuses nor warns about: median <= 2 %, worst
    over-prediction of the available KV cache <= 3 % (memory model 2026.12.7.3: 1.25 % and +2.78 % over
    the four cases besides the listed exception; 2.12 % and +6.15 % with it. 2026.12.7.4 with case-115, vLLM
    0.31.0, added 2026-12-07: 0.77 % and +2.78 % over five; 1.45 % and +6.15 % with case-109. 2026.12.7.9,
    --moe-backend cutlass budgeted: case-110 joins, -2.3 %: 1.45 % and +2.78 % over six)."""
    errors = _unflagged_errors()
    assert set(GOAL_EXCEPTIONS) <= set(errors)
    kept = sorted(abs(e) for i, e in errors.items() if i not in GOAL_EXCEPTIONS)
    median = (kept[(len(kept) - 1) // 2] + kept[len(kept) // 2]) / 2
    over = max(e for i, e in errors.items() if i not in GOAL_EXCEPTIONS)
    assert len(kept) >= 4 and median <= 0.02 and over <= 0.03, (median, over, errors)
    for case_id in GOAL_EXCEPTIONS:
        assert errors[case_id] > 0.03, f"{case_id} now meets the goal: take it off GOAL_EXCEPTIONS"
