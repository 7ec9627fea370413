"""Contract: a plan across nodes is one vLLM 0.33 accepts and splits as kvpilot budgets it.

Its flags parse with ``vllm serve``'s parser, the ranks add up in vLLM's own ``ParallelConfig`` (world size
across data parallelism = the replica's GPUs, ``--nnodes`` dividing it), the pipeline stages hold the layers
``get_pp_indices`` gives them and an expert-parallel rank holds as many experts as ``determine_expert_map``.
"""

from __future__ import annotations

import importlib
import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import gpus
from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan.nodes import compute_node_plan
from kvpilot.tuner.types import ServingBounds

pytestmark = pytest.mark.contract

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
CASES = [
    ("zai-org__GLM-5", "B200"),
    ("moonshotai__Kimi-K3", "B200"),
    ("deepseek-ai__DeepSeek-V4-Pro", "H100-SXM"),
    ("Qwen__Qwen3.5-397B-A17B", "H100-SXM"),
    ("deepseek-ai__DeepSeek-V3.2", "H100-SXM"),
    ("meta-llama__Llama-3.1-70B-Instruct", "H100-SXM"),
]


@pytest.mark.parametrize(("name", "gpu"), CASES)
@pytest.mark.parametrize("nodes", [2, 3])
def test_node_plans_parse_and_add_up_in_vllm(vllm_parser: Any, name: str, gpu: str, nodes: int) -> None:
    config = importlib.import_module("vllm.config")
    dist = importlib.import_module("vllm.distributed.utils")
    experts_map = importlib.import_module("vllm.model_executor.layers.fused_moe.expert_map_manager")
    spec = build_model_spec(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    node_plan = compute_node_plan(
        spec, gpus.lookup_gpu(gpu), 8, ServingBounds(max_context=32768), nodes=nodes
    )
    for candidate in node_plan.considered:
        layout = candidate.layout
        args = [*candidate.plan.args, *layout.parallel_args(), "--nnodes", str(nodes)]
        parsed = vllm_parser.parse_args(args)
        parallel = config.ParallelConfig(
            tensor_parallel_size=parsed.tensor_parallel_size,
            pipeline_parallel_size=parsed.pipeline_parallel_size,
            data_parallel_size=parsed.data_parallel_size,
            enable_expert_parallel=parsed.enable_expert_parallel,
            nnodes=parsed.nnodes,
        )
        assert parallel.world_size_across_dp == layout.gpus, args
        assert parallel.world_size_across_dp % parallel.nnodes == 0
    pp = node_plan.layout.pipeline_parallel_size
    for rank, budget in enumerate(node_plan.ranks):
        if node_plan.layout.data_parallel_size == 1:
            assert (budget.layers.start, budget.layers.stop) == dist.get_pp_indices(spec.num_layers, rank, pp)
        elif spec.moe is not None:
            local, _, _ = experts_map.determine_expert_map(node_plan.layout.gpus, 0, spec.moe.num_experts)
            assert budget.experts == local


@pytest.mark.parametrize("nodes", [2, 4])
def test_each_nodes_role_flags_parse_with_vllm_serve(vllm: Any, nodes: int) -> None:
    """Node 0 serves, the others run headless; each names the group size, its rank and node 0's address."""
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    cli_args = importlib.import_module("vllm.entrypoints.common.cli_args")
    parser: Any = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
    for rank in range(nodes):
        role = kv_vllm.build_node_role_args(nodes, str(rank), "10.0.0.7", headless=rank > 0)
        parsed = parser.parse_args(["some/model", *role])
        assert (parsed.nnodes, parsed.node_rank, parsed.master_addr) == (nodes, rank, "10.0.0.7")
        assert parsed.headless is (rank > 0)
    assert kv_vllm.build_node_role_args(1, "0", "10.0.0.7", headless=False) == ()
