"""The planner across nodes (:mod:`kvpilot.tuner.plan.nodes`) on published configs (tests/data/hf_configs).

Figures are kvpilot's own estimates (no multi-node start-up log exists yet); the tests pin the choice rules:
one node answers exactly as the single-node planner, a model that does not fit one node gets the fewest
nodes that serve the wanted context, TP stays within a node, and DP x EP splits the experts over the group.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import errors, gpus, memory
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.plan.nodes import compute_node_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
H100, B200 = gpus.lookup_gpu("H100-SXM"), gpus.lookup_gpu("B200")
AT_32K = ServingBounds(max_context=32768)


def _spec(name: str) -> Any:
    return build_model_spec(json.loads((HF_CONFIGS / f"{name}.json").read_text()))


def test_one_node_is_the_single_node_plan() -> None:
    spec = _spec("meta-llama__Llama-3.1-70B-Instruct")
    node_plan = compute_node_plan(spec, H100, 8, AT_32K, nodes=1)
    assert node_plan.plan == compute_plan(spec, H100, 8, AT_32K)
    assert node_plan.layout.nodes == 1 and node_plan.args == node_plan.plan.args


def test_deepseek_v32_does_not_fit_one_h100_node_and_gets_two() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.2")
    single = compute_plan(spec, H100, 8, AT_32K)
    assert not single.feasible
    node_plan = compute_node_plan(spec, H100, 8, AT_32K)
    assert node_plan.feasible and node_plan.layout.nodes == 2
    assert node_plan.explanation[0].startswith("Nothing fits one node of 8 x H100-SXM: ")
    assert node_plan.plan.settings.max_model_len == 32768
    assert any(line.startswith("Chosen: ") for line in node_plan.explanation)


def test_two_nodes_weigh_tp_within_a_node_times_pp_and_dp_times_ep() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.2")
    node_plan = compute_node_plan(spec, H100, 8, AT_32K, nodes=2)
    layouts = {
        (c.layout.tensor_parallel_size, c.layout.pipeline_parallel_size, c.layout.data_parallel_size)
        for c in node_plan.considered
    }
    assert layouts == {(8, 2, 1), (8, 1, 2), (4, 1, 4), (2, 1, 8), (1, 1, 16)}
    assert all(c.layout.tensor_parallel_size <= 8 for c in node_plan.considered)
    best = max(node_plan.considered, key=lambda c: (c.plan.feasible, c.context, c.concurrency))
    assert node_plan.layout == best.layout
    assert len([line for line in node_plan.explanation if line.startswith("Weighed: ")]) == 4


def test_pipeline_stages_hold_get_pp_indices_layers_one_node_each() -> None:
    pp_plan = compute_node_plan(_spec("meta-llama__Llama-3.1-70B-Instruct"), H100, 8, AT_32K, nodes=2)
    assert [r.layers for r in pp_plan.ranks] == [range(0, 40), range(40, 80)]
    assert [r.role for r in pp_plan.ranks] == ["stage 0 (node 0)", "stage 1 (node 1)"]
    assert pp_plan.args[-4:] == ("--tensor-parallel-size", "8", "--pipeline-parallel-size", "2")


def test_a_pinned_tensor_parallel_size_is_kept_in_every_layout() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.2")
    node_plan = compute_node_plan(
        spec, H100, 8, AT_32K, nodes=2, pinned=EngineSettings(tensor_parallel_size=8)
    )
    assert {(c.layout.tensor_parallel_size, c.layout.data_parallel_size) for c in node_plan.considered} == {
        (8, 1),
        (8, 2),
    }


def test_dense_models_get_no_data_parallel_layouts() -> None:
    node_plan = compute_node_plan(_spec("meta-llama__Llama-3.1-70B-Instruct"), H100, 8, AT_32K, nodes=2)
    assert [c.layout.data_parallel_size for c in node_plan.considered] == [1]
    assert node_plan.layout.pipeline_parallel_size == 2


def test_expert_parallelism_holds_whole_experts_the_first_ranks_one_more() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.2")  # 256 routed experts
    whole = memory.compute_weight_bytes(spec, tensor_parallel_size=1)
    ep16 = memory.compute_weight_bytes(
        spec, tensor_parallel_size=1, expert_shards=memory.ExpertShards(16, expert_parallel=True)
    )
    tp_split16 = memory.compute_weight_bytes(
        spec, tensor_parallel_size=1, expert_shards=memory.ExpertShards(16)
    )
    assert ep16 < whole / 8  # 16 of 256 experts per GPU, attention whole
    assert abs(ep16 - tp_split16) < 0.01 * ep16  # the same bytes, split by experts or by their width
    assert memory.ExpertShards(16, expert_parallel=True).split(250, 2048, 1) == (16, 2048)
    assert memory.ExpertShards(16).split(256, 2048, 1) == (256, 128)
    assert memory.ONE_ENGINE.split(256, 2048, 8) == (256, 256)


def test_dp_ranks_split_the_expected_concurrency_and_render_their_flags() -> None:
    spec = _spec("moonshotai__Kimi-K2.5")
    node_plan = compute_node_plan(spec, H100, 8, ServingBounds(max_context=32768, concurrency=64), nodes=2)
    dp = [c for c in node_plan.considered if c.layout.data_parallel_size == 16]
    assert dp and dp[0].plan.settings.max_num_seqs == 4  # 64 sequences over 16 engines
    assert dp[0].layout.parallel_args() == (
        "--data-parallel-size",
        "16",
        "--data-parallel-size-local",
        "8",
        "--enable-expert-parallel",
    )


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("zai-org__GLM-5", B200),
        ("moonshotai__Kimi-K3", B200),
        ("deepseek-ai__DeepSeek-V4-Pro", H100),
        ("Qwen__Qwen3.5-397B-A17B", H100),
    ],
)
def test_the_2026_flagships_plan_across_nodes(name: str, gpu: Any) -> None:
    node_plan = compute_node_plan(_spec(name), gpu, 8, AT_32K)
    assert node_plan.feasible and node_plan.layout.nodes >= 2
    assert node_plan.explanation[0].startswith(f"Nothing fits one node of 8 x {gpu.name}")
    layout = node_plan.layout
    ranks = layout.tensor_parallel_size * layout.pipeline_parallel_size * layout.data_parallel_size
    assert ranks == layout.gpus


def test_bad_node_counts_are_refused() -> None:
    spec = _spec("meta-llama__Llama-3.1-70B-Instruct")
    with pytest.raises(errors.TunerError, match="must be at least 1"):
        compute_node_plan(spec, H100, 0, AT_32K)
    with pytest.raises(errors.TunerError, match="must be at least 1"):
        compute_node_plan(spec, H100, 8, AT_32K, nodes=0)


def test_a_dp_rank_budgets_the_moe_layers_on_every_ranks_gathered_tokens() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.2")
    kw: dict[str, Any] = {
        "pp": 1,
        "pp_rank": 0,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
        "dtype": "bfloat16",
        "version": (0, 33),
    }
    alone = memory.compute_activation_bytes(spec, tp=1, **kw)
    dp16 = memory.compute_activation_bytes(spec, tp=1, expert_shards=memory.ExpertShards(16, True), **kw)
    dp4 = memory.compute_activation_bytes(spec, tp=4, expert_shards=memory.ExpertShards(16, True), **kw)
    # 16 x 8192 gathered tokens through 8 experts each: an order of magnitude above one engine's peak.
    assert dp16 > 10 * alone and dp4 < dp16 / 3
