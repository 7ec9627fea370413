"""The untuned flags of the extra args that change vLLM's memory, and the plans made for them."""

from __future__ import annotations

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import ServingBounds


def test_the_last_occurrence_wins_and_other_flags_are_ignored() -> None:
    args = ["--enforce-eager", "--block-size", "32", "--no-enforce-eager", "--performance_mode=throughput"]
    flags = vllm.build_engine_flags([*args, "--disable-prefix-caching"], model_runner_v2=False)
    assert flags == vllm.EngineFlags(
        model_runner_v2=False, enforce_eager=False, performance_mode="throughput", enable_prefix_caching=False
    )
    assert vllm.build_engine_flags(["--max-model-len", "4096"]) == vllm.DEFAULT_ENGINE


def test_a_value_vllm_refuses_is_not_read() -> None:
    assert vllm.build_engine_flags(["--performance-mode", "fast", "--enforce-eager=1"]) == vllm.DEFAULT_ENGINE


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--performance-mode"], "--performance-mode"),
        (["--enable-prefix-caching=false"], "--enable-prefix-caching"),
        (["--no-enable-prefix"], "--no-enable-prefix"),
    ],
)
def test_refused_by_name(args: list[str], flag: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs) as raised:
        vllm.check_engine_flags(args)
    assert raised.value.flag == flag


def test_unrelated_flags_pass() -> None:
    vllm.check_engine_flags(["--enable-lora", "--enable-chunked-prefill", "--no-enable-log-requests"])


def test_an_eager_engine_is_planned_without_graphs_and_an_interactive_one_with_more() -> None:
    model, gpu = build_model_spec(cfg.LLAMA_31_8B), lookup_gpu("L4")
    bounds = ServingBounds(max_context=8192)
    graphs = {
        mode: compute_plan(model, gpu, 1, bounds, engine=vllm.EngineFlags(**kwargs)).budget.cuda_graph_gib
        for mode, kwargs in {
            "balanced": {},
            "eager": {"enforce_eager": True},
            "interactivity": {"performance_mode": "interactivity"},
        }.items()
    }
    assert graphs["eager"] == 0 < graphs["balanced"] < graphs["interactivity"]
    eager = compute_plan(model, gpu, 1, bounds, engine=vllm.EngineFlags(enforce_eager=True)).settings
    default = compute_plan(model, gpu, 1, bounds).settings
    assert eager.gpu_memory_utilization is not None and default.gpu_memory_utilization is not None
    assert eager.gpu_memory_utilization >= default.gpu_memory_utilization  # no graph pool to leave room for
