"""The static planner: chosen settings, pinned values, fp8 rules, infeasibility and its suggestions."""

from __future__ import annotations

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import gpus, memory, vllm
from kvpilot.tuner import plan as plan_pkg
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import planner
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, ServingBounds

H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink", nvml_total_bytes=81_559 << 20)
A100 = GpuSpec("A100-80GB", int(79.25 * GIB), (8, 0), False, "nvlink", nvml_total_bytes=81_920 << 20)
L4 = GpuSpec("L4", int(21.96 * GIB), (8, 9), True, "pcie", nvml_total_bytes=23_034 << 20)
LLAMA_8B = build_model_spec(cfg.LLAMA_31_8B)
LLAMA_70B = build_model_spec(cfg.LLAMA_31_70B)


def test_llama_8b_on_one_h100() -> None:
    bounds = ServingBounds(max_context=32768)
    plan = planner.compute_plan(LLAMA_8B, H100, 1, bounds)
    s, b = plan.settings, plan.budget
    assert plan.feasible and b.starts
    assert s.max_model_len == 32768 and s.tensor_parallel_size == 1 and s.kv_cache_dtype == "auto"
    # the utilisation is the step's own answer for these settings, not a bound the planner got stuck at
    assert s.gpu_memory_utilization == planner.compute_safe_utilization(
        LLAMA_8B,
        H100,
        EngineSettings(max_model_len=32768, tensor_parallel_size=1, kv_cache_dtype="auto"),
        bounds,
        "0.33.0",
    )
    # max_num_seqs: as many requests filling a quarter of the context as the cache holds, rounded down to 8
    assert s.max_num_seqs is not None and 16 <= s.max_num_seqs < 1024
    quarter = planner.TYPICAL_FILL * 32768
    assert s.max_num_seqs * quarter <= b.kv_cache_tokens < (s.max_num_seqs + 8) * quarter * 1.02
    assert plan.concurrency_at_max_len == b.max_concurrency > 10
    assert plan.args == vllm.build_vllm_args(s)


def test_llama_8b_on_one_l4_sits_inside_the_bounds() -> None:
    plan = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(max_context=8192))
    gmu = plan.settings.gpu_memory_utilization
    assert gmu is not None and 0.5 < gmu < 0.95  # a small GPU keeps more head-room than the cap


def test_the_leftover_gpus_are_pipeline_stages_in_the_budget() -> None:
    """Defect (issue 9, #2): Llama-3.1-70B on 4 x L40S with TP 2 was refused as Infeasible, budgeted as if
    one TP group held the whole model; the operator renders --pipeline-parallel-size 2."""
    l40s = gpus.lookup_gpu("L40S")
    pinned = EngineSettings(tensor_parallel_size=2)
    plan = planner.compute_plan(LLAMA_70B, l40s, 4, ServingBounds(max_context=8192), pinned=pinned)
    assert plan.feasible, plan.reasons
    assert plan.pipeline_parallel_size == 2
    same = memory.compute_budget(LLAMA_70B, l40s, plan.settings, pipeline_parallel_size=2)
    assert plan.budget == same
    alone = memory.compute_budget(LLAMA_70B, l40s, plan.settings, pipeline_parallel_size=1)
    assert not alone.starts  # what the planner used to budget


def test_the_topology_budget_reads_an_unset_tp_as_one_and_the_rest_as_stages() -> None:
    """:func:`plan.compute_topology_budget`, the one home the planner and both loops share: TP unset is 1,
    and 4 GPUs then make 4 pipeline stages (the same budget as spelling it out)."""
    l40s = gpus.lookup_gpu("L40S")
    unset = EngineSettings(max_model_len=8192)
    budget = plan_pkg.compute_topology_budget(LLAMA_70B, l40s, 4, unset, "0.33.0")
    one = unset.replace(tensor_parallel_size=1)
    spelled = memory.compute_budget(LLAMA_70B, l40s, one, pipeline_parallel_size=4, vllm_version="0.33.0")
    assert budget == spelled
    alone = memory.compute_budget(LLAMA_70B, l40s, one, pipeline_parallel_size=1, vllm_version="0.33.0")
    assert budget != alone


def test_auto_max_model_len_is_resolved_to_what_fits() -> None:
    """Defect (issue 9, #5): --max-model-len -1 (vLLM's auto-fit) was used literally by the budget."""
    plan = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(), pinned=EngineSettings(max_model_len=-1))
    assert plan.feasible and plan.settings.max_model_len == -1
    assert 0 < plan.budget.max_model_len < LLAMA_8B.max_model_len
    assert plan.budget.max_concurrency >= 1
    assert plan.settings.max_num_seqs is not None and plan.settings.max_num_seqs >= 1


def test_utilisation_keeps_more_headroom_on_small_gpus() -> None:
    big = planner.compute_plan(
        LLAMA_8B, H100, 1, ServingBounds(max_context=8192)
    ).settings.gpu_memory_utilization
    small = planner.compute_plan(
        LLAMA_8B, L4, 1, ServingBounds(max_context=8192)
    ).settings.gpu_memory_utilization
    assert big is not None and small is not None and small < big


def test_pinned_values_are_never_changed() -> None:
    pinned = EngineSettings(
        max_model_len=4096, max_num_seqs=32, gpu_memory_utilization=0.8, kv_cache_dtype="fp8"
    )
    plan = planner.compute_plan(LLAMA_8B, H100, 1, ServingBounds(allow_fp8_kv=False), pinned=pinned)
    for name, value in pinned.as_dict().items():
        assert getattr(plan.settings, name) == value


def test_fp8_kv_only_when_allowed_and_supported() -> None:
    bounds = ServingBounds(max_context=32768)
    assert planner.compute_plan(LLAMA_8B, H100, 1, bounds).settings.kv_cache_dtype == "auto"
    allowed = ServingBounds(max_context=32768, allow_fp8_kv=True)
    assert planner.compute_plan(LLAMA_8B, H100, 1, allowed).settings.kv_cache_dtype == "fp8"
    assert planner.compute_plan(LLAMA_8B, A100, 1, allowed).settings.kv_cache_dtype == "auto"


def test_expected_concurrency_is_met() -> None:
    plan = planner.compute_plan(LLAMA_8B, H100, 1, ServingBounds(max_context=16384, concurrency=24))
    assert plan.feasible and plan.settings.max_num_seqs == 24 and plan.concurrency_at_max_len >= 24


def test_a_shortened_context_keeps_the_sequences_it_settles() -> None:
    """The sequences settled for the shorter context cost graphs of their own (more capture sizes): the
    context is shortened again for them rather than the plan falling back to one sequence."""
    plan = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(max_context=65536, allow_fp8_kv=False))
    assert plan.feasible and plan.budget.starts
    assert plan.settings.max_num_seqs is not None and plan.settings.max_num_seqs >= 2
    assert plan.settings.max_model_len is not None and 16384 < plan.settings.max_model_len < 65536


def test_context_is_shortened_to_fit_but_never_below_min_context() -> None:
    plan = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds())
    assert plan.feasible and plan.settings.max_model_len is not None
    assert plan.settings.max_model_len < LLAMA_8B.max_model_len
    assert any("shortened" in w for w in plan.warnings)
    strict = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(min_context=131072))
    assert not strict.feasible
    # The longest context that starts is below the user's minimum: it is reported, never offered as the fix.
    assert not any("shorter context fits" in r for r in strict.reasons)
    assert any("below the minimum context 131072" in r for r in strict.reasons)


def test_infeasible_plan_says_why_and_what_would_fit() -> None:
    plan = planner.compute_plan(LLAMA_70B, H100, 1, ServingBounds(max_context=8192))
    assert not plan.feasible
    assert plan.reasons[0].startswith("No available memory for the cache blocks")
    assert any("2 H100-SXM GPUs" in r for r in plan.reasons)
    assert any("FP8-quantized checkpoint" in r for r in plan.reasons)


def test_more_gpus_suggestion_counts_gpus() -> None:
    plan = planner.compute_plan(LLAMA_70B, L4, 2, ServingBounds(max_context=8192))
    assert not plan.feasible
    # 8, not 16, since L4s (PCIe-only) carry no NVLink all-reduce memory (memory model 2026.12.5.3)
    assert any("8 L4 GPUs (tensor parallel 8)" in r for r in plan.reasons)


@pytest.mark.parametrize(("gpus", "tp"), [(1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (6, 4), (8, 8)])
def test_tensor_parallel_divides_the_heads(gpus: int, tp: int) -> None:
    assert planner.compute_tensor_parallel(build_model_spec(cfg.LLAMA_4_SCOUT), gpus) == tp


def test_gpu_count_that_does_not_divide_heads_warns() -> None:
    plan = planner.compute_plan(LLAMA_8B, H100, 3, ServingBounds(max_context=8192))
    assert plan.settings.tensor_parallel_size == 2
    assert any(w.startswith("tensor_parallel_size 2: vLLM refuses 3") for w in plan.warnings)


def test_max_context_above_the_model_is_capped() -> None:
    plan = planner.compute_plan(build_model_spec(cfg.GEMMA_2_9B), H100, 1, ServingBounds(max_context=32768))
    assert plan.settings.max_model_len == 8192
    assert any("exceeds the model's maximum" in w for w in plan.warnings)


def test_version_is_an_input() -> None:
    old = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(max_context=8192), vllm_version="0.19.0")
    new = planner.compute_plan(LLAMA_8B, L4, 1, ServingBounds(max_context=8192))
    assert old.vllm_version == "0.19.0" and new.vllm_version == "0.33.0"
    # 0.19 keeps CUDA graphs outside the budget, so it must leave them head-room.
    assert (old.settings.gpu_memory_utilization or 1) < (new.settings.gpu_memory_utilization or 0)


def test_suggestions_respect_the_minimum_context() -> None:
    """An infeasible plan never offers a context below min_context as the fix, and looks for fp8 there."""
    from kvpilot.tuner import gpus
    from kvpilot.tuner.model import catalogue as models

    spec = build_model_spec(models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    l4 = gpus.lookup_gpu("L4")
    compute_plan = planner.compute_plan
    plan = compute_plan(spec, l4, 1, ServingBounds(min_context=131072, max_context=131072))
    assert not plan.feasible
    text = " ".join(plan.reasons)
    assert "A shorter context fits" not in text
    assert "below the minimum context 131072" in text
    # With fp8 allowed at a minimum the auto-dtype cache cannot hold, the planner says fp8 fits there.
    squeezed = compute_plan(spec, l4, 1, ServingBounds(min_context=40960, max_context=131072))
    assert not squeezed.feasible  # the longest 16-bit context that starts is 30720
    assert any("fp8" in r and "40960" in r for r in squeezed.reasons), squeezed.reasons
    assert any("spec.tuning.allowFp8KvCache: true" in r for r in squeezed.reasons)  # fp8_advice's wording
    assert not any("A shorter context fits" in r for r in squeezed.reasons)


@pytest.mark.parametrize(
    "bounds", [ServingBounds(), ServingBounds(min_context=131072), ServingBounds(concurrency=64)]
)
def test_a_plan_computes_each_budget_once(monkeypatch: pytest.MonkeyPatch, bounds: ServingBounds) -> None:
    # The context searches and the suggestions revisit settings: the planner asks memory once per settings.
    seen: list[tuple[object, ...]] = []
    compute_budget = planner.memory.compute_budget

    def counting(model, gpu, settings, **kw):
        seen.append((model, gpu, settings, *sorted(kw.items())))
        return compute_budget(model, gpu, settings, **kw)

    monkeypatch.setattr(planner.memory, "compute_budget", counting)
    planner.compute_plan(LLAMA_8B, L4, 1, bounds)
    assert seen and len(seen) == len(set(seen))


def test_a_pinned_kv_pool_is_the_planned_pool_exactly() -> None:
    bounds = ServingBounds(max_context=32768)
    plain = planner.compute_plan(LLAMA_8B, H100, 1, bounds)
    pinned = planner.compute_plan(LLAMA_8B, H100, 1, bounds, pin_kv_cache_memory=True)
    assert plain.kv_cache_memory_bytes is None and "--gpu-memory-utilization" in plain.args
    assert pinned.kv_cache_memory_bytes == plain.budget.kv_pool_bytes > 0
    assert pinned.budget.available_kv_cache_gib * GIB == pinned.kv_cache_memory_bytes
    assert pinned.budget.num_gpu_blocks == plain.budget.num_gpu_blocks
    assert pinned.budget.kv_cache_tokens == plain.budget.kv_cache_tokens
    assert pinned.settings.gpu_memory_utilization is None  # the pool replaces the utilisation
    assert pinned.args == vllm.build_vllm_args(
        pinned.settings, kv_cache_memory_bytes=pinned.kv_cache_memory_bytes
    )
    assert "--gpu-memory-utilization" not in pinned.args
    flag = pinned.args.index("--kv-cache-memory-bytes")
    assert pinned.args[flag + 1] == str(pinned.kv_cache_memory_bytes)


def test_an_infeasible_plan_pins_nothing() -> None:
    plan = planner.compute_plan(LLAMA_70B, L4, 1, ServingBounds(), pin_kv_cache_memory=True)
    assert not plan.feasible and plan.kv_cache_memory_bytes is None


HYBRID_CONFIGS = (
    "Qwen__Qwen3.5-9B",
    "Qwen__Qwen3-Next-80B-A3B-Instruct",
    "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
)


@pytest.mark.parametrize("name", HYBRID_CONFIGS)
@pytest.mark.parametrize("gpu_name", ["RTX-3090", "L4", "A100-40GB", "H100-SXM", "B200"])
def test_the_planner_never_asks_a_hybrid_for_more_sequences_than_state_blocks(
    name: str, gpu_name: str
) -> None:
    """vLLM 0.33 refuses ``max_num_seqs`` above a hybrid model's cache blocks (full CUDA graphs)."""
    import json
    import pathlib

    from kvpilot.tuner import gpus as gpu_catalogue
    from kvpilot.tuner.plan import compute_plan
    from kvpilot.tuner.types import ServingBounds

    path = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs" / f"{name}.json"
    spec = build_model_spec(json.loads(path.read_text()))
    for count in (1, 2, 4, 8):
        plan = compute_plan(spec, gpu_catalogue.lookup_gpu(gpu_name), count, ServingBounds())
        if plan.feasible:
            assert plan.settings.max_num_seqs is not None
            assert plan.settings.max_num_seqs <= plan.budget.num_gpu_blocks, (count, plan.budget)
            assert plan.budget.starts
