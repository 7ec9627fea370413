"""A pod whose own arguments start data-parallel engines (``-dp``, ``-dpl``, ``-dpn``, ``-ep``): the plan is
one engine's (:func:`kvpilot.tuner.plan.compute_rank_gpus`), its routed experts split over the whole group
(:func:`kvpilot.tuner.plan.topology.compute_expert_shards`), and what vLLM refuses is refused by name.

The invariants are the engine's, not kvpilot's figures: a rank of a dense model is a whole engine on its
GPUs; a rank of a MoE model holds its attention whole and a share of the experts; the closed loop's budget of
the plan's settings is the plan's.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import errors, gpus, memory, vllm
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan import compute_plan, compute_topology_budget
from kvpilot.tuner.plan.nodes import compute_node_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
H100, H200 = gpus.lookup_gpu("H100-SXM"), gpus.lookup_gpu("H200")
AT_32K = ServingBounds(max_context=32768)


def _spec(name: str) -> Any:
    return build_model_spec(json.loads((HF_CONFIGS / f"{name}.json").read_text()))


def _engine(text: str) -> vllm.EngineFlags:
    args = text.split()
    vllm.check_engine_flags(args)
    return vllm.build_engine_flags(args)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("-dp 1", None),
        ("-dp 8", vllm.DataParallel(8, 8, False)),
        ("-dp 8 -ep", vllm.DataParallel(8, 8, True)),
        (
            "--data-parallel-size=4 --enable-expert-parallel --disable-expert-parallel",
            vllm.DataParallel(4, 4, False),
        ),
        ("-dp 16 -dpl 8 -ep", vllm.DataParallel(16, 8, True)),
        ("-dp 8 --data-parallel-rank 3 -ep", vllm.DataParallel(8, 1, True)),
        ("-ep --tensor-parallel-size 8", vllm.DataParallel(1, 1, True)),
    ],
)
def test_the_ranks_a_pod_starts_are_read_from_its_flags(
    text: str, expected: vllm.DataParallel | None
) -> None:
    assert _engine(text).data_parallel == expected


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("-dp 0", vllm.DATA_PARALLEL_SIZE_FLAG),
        ("-dp two", vllm.DATA_PARALLEL_SIZE_FLAG),
        ("-dp 4 -dpl 8", vllm.DATA_PARALLEL_SIZE_LOCAL_FLAG),
        ("--enable-expert-parallel=true", vllm.EXPERT_PARALLEL_FLAG),
    ],
)
def test_what_vllm_refuses_of_the_flags_is_refused_by_name(text: str, flag: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs) as e:
        vllm.check_engine_flags(text.split())
    assert e.value.flag == flag and flag in str(e.value)


def test_the_flags_are_no_longer_named_as_unbudgeted() -> None:
    engine = _engine("-dp 8 -ep")
    assert engine.unmodelled == ()
    plan = compute_plan(_spec("Qwen__Qwen3-30B-A3B"), H100, 8, AT_32K, engine=engine)
    assert not any("not in kvpilot's memory model" in w for w in plan.warnings), plan.warnings


def test_a_dense_models_rank_is_a_whole_engine_on_its_share_of_the_gpus() -> None:
    """No experts to share: each of the pod's two ranks is the one-GPU engine, budget for budget."""
    spec = _spec("Qwen__Qwen3-8B")
    alone = compute_plan(spec, H100, 1, AT_32K)
    ranks = compute_plan(spec, H100, 2, AT_32K, engine=_engine("-dp 2"))
    assert ranks.settings == alone.settings and ranks.budget == alone.budget
    assert ranks.data_parallel_size == 2 and ranks.gpu_count == 2
    assert any("this pod runs 2 of them" in w for w in ranks.warnings), ranks.warnings


def test_a_moe_ranks_experts_split_over_the_group_and_its_attention_stays_whole() -> None:
    """DeepSeek-V3 on 8 H200 as ``-dp 8 -ep``: each GPU holds a whole MLA attention stack (TP 1) and 32 of the
    256 routed experts, so more weights than tensor parallel 8 (attention split 8 ways) and far fewer than
    the whole model on one GPU."""
    spec = _spec("deepseek-ai__DeepSeek-V3")
    tp8 = compute_plan(spec, H200, 8, AT_32K)
    dp8 = compute_plan(spec, H200, 8, AT_32K, engine=_engine("-dp 8 -ep"))
    whole = memory.compute_weight_bytes(spec, tensor_parallel_size=1)
    assert dp8.settings.tensor_parallel_size == 1 and dp8.data_parallel_size == 8
    assert tp8.budget.weights_gib < dp8.budget.weights_gib < whole / 2**30 / 4
    assert dp8.feasible and dp8.budget.starts
    assert any("32 of 256 on the busiest" in w for w in dp8.warnings), dp8.warnings
    # without expert parallelism each expert's intermediate size splits over the same 8 GPUs: the same share
    no_ep = compute_plan(spec, H200, 8, AT_32K, engine=_engine("-dp 8"))
    assert no_ep.budget.weights_gib == pytest.approx(dp8.budget.weights_gib, rel=0.01)


def test_more_ranks_in_the_group_than_on_the_pod_split_the_experts_further() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3")
    one_node = compute_plan(spec, H200, 8, AT_32K, engine=_engine("-dp 8 -ep"))
    two_nodes = compute_plan(spec, H200, 8, AT_32K, engine=_engine("-dp 16 -dpl 8 -ep"))
    assert two_nodes.budget.weights_gib < one_node.budget.weights_gib
    assert two_nodes.budget.kv_cache_tokens > one_node.budget.kv_cache_tokens
    assert two_nodes.data_parallel_size == 8


def test_the_closed_loops_budget_of_the_plan_is_the_plans() -> None:
    """The loop budgets the pod's GPUs with the pod's flags (:func:`compute_topology_budget`): the same one
    engine the plan sized, whatever it later changes."""
    spec = _spec("Qwen__Qwen3-30B-A3B")
    engine = _engine("-dp 4 -ep")
    plan = compute_plan(spec, H100, 8, AT_32K, engine=engine)
    assert plan.settings.tensor_parallel_size == 2
    again = compute_topology_budget(spec, H100, 8, plan.settings, plan.vllm_version, engine=engine)
    assert again == plan.budget


def test_a_pinned_kv_pool_is_one_ranks() -> None:
    spec = _spec("Qwen__Qwen3-30B-A3B")
    engine = _engine("-dp 8 -ep")
    plan = compute_plan(spec, H100, 8, AT_32K, engine=engine)
    pinned = compute_plan(spec, H100, 8, AT_32K, engine=engine, pin_kv_cache_memory=True)
    assert pinned.kv_cache_memory_bytes == plan.budget.kv_pool_bytes
    assert pinned.budget.kv_cache_tokens == plan.budget.kv_cache_tokens


@pytest.mark.parametrize(("gpus_", "text"), [(8, "-dp 3"), (8, "-dp 4 -dpl 4 --tensor-parallel-size 4")])
def test_ranks_that_do_not_split_the_pods_gpus_are_refused(gpus_: int, text: str) -> None:
    engine = _engine(text)
    tp = vllm.find_flag_values(text.split(), vllm.FLAGS["tensor_parallel_size"])
    pinned = EngineSettings(tensor_parallel_size=int(tp[-1])) if tp else EngineSettings()
    with pytest.raises(errors.InvalidEngineArgs, match="do not split the pod's 8 GPUs evenly"):
        compute_plan(_spec("Qwen__Qwen3-8B"), H100, gpus_, AT_32K, engine=engine, pinned=pinned)


def test_a_node_plan_lays_out_its_own_data_parallel_group() -> None:
    with pytest.raises(errors.InvalidEngineArgs, match="layout kvpilot chooses"):
        compute_node_plan(
            _spec("deepseek-ai__DeepSeek-V3.2"), H100, 8, AT_32K, nodes=2, engine=_engine("-dp 16 -ep")
        )
