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


RENDERED = [
    ("deepseek-ai/DeepSeek-V3", "H100-SXM", 2),  # DP 4 x TP 4, experts over 16 GPUs
    ("zai-org/GLM-5", "B200", 2),  # DP 8 x TP 2
    ("Qwen/Qwen3-30B-A3B", "H100-SXM", 3),  # DP x EP over three nodes
    ("meta-llama/Llama-3.1-70B-Instruct", "H100-SXM", 2),  # dense: TP 8 x PP 2
]


def _role_args(template: dict[str, Any], rank: int, model_dir: pathlib.Path) -> list[str]:
    """A role's vLLM arguments as the pod's container runs them: LWS's variables substituted, the model id
    a folder of its config (vLLM resolves the model first, offline)."""
    model, *args = template["spec"]["containers"][0]["args"]
    names = {"$(LWS_WORKER_INDEX)": str(rank), "$(LWS_LEADER_ADDRESS)": LEADER}
    return [str(model_dir), *(names.get(a, a) for a in args)]


LEADER = "dsv3-0.dsv3.ml"


@pytest.mark.parametrize(("model", "gpu", "nodes"), RENDERED)
def test_every_rendered_role_parses_in_vllm_with_the_planned_split(
    vllm: Any, model_dir_factory: Any, model: str, gpu: str, nodes: int
) -> None:
    """Each pod of a rendered group, leader and every worker, parsed by ``vllm serve``'s own parser and built
    by vLLM (``EngineArgs.create_engine_config``, headless on the workers): its ``ParallelConfig`` is the
    node plan's split, each node runs its own contiguous data-parallel ranks, all meet at the leader."""
    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    cli_args = importlib.import_module("vllm.entrypoints.common.cli_args")
    parser: Any = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
    from kvpilot.operator.inferenceservice import render
    from kvpilot.tuner import model as models

    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "dsv3", "namespace": "ml"},
        "spec": {
            "model": {"id": model},
            "serving": {"maxContextLength": 32768},
            "gpu": {"count": 8, "product": gpu, "nodesPerReplica": nodes},
        },
    }
    (group,) = [m for m in render.build_manifests(doc) if m["kind"] == "LeaderWorkerSet"]
    config = models.lookup_model_config(model)
    spec, model_dir = build_model_spec(config), model_dir_factory(config)
    layout = compute_node_plan(
        spec, gpus.lookup_gpu(gpu), 8, ServingBounds(max_context=32768), nodes=nodes
    ).layout
    local = layout.data_parallel_size // nodes if layout.data_parallel_size > 1 else 1
    roles = group["spec"]["leaderWorkerTemplate"]
    for rank in range(nodes):
        template = roles["leaderTemplate"] if rank == 0 else roles["workerTemplate"]
        parsed = parser.parse_args(_role_args(template, rank, model_dir))
        parsed.model = parsed.model_tag  # as ``vllm serve`` does (entrypoints/cli/serve.py)
        engine = arg_utils.EngineArgs.from_cli_args(parsed)
        built = engine.create_engine_config(headless=parsed.headless).parallel_config
        got = (
            built.tensor_parallel_size,
            built.pipeline_parallel_size,
            built.data_parallel_size,
            built.data_parallel_size_local,
            built.data_parallel_rank,
            built.enable_expert_parallel,
            (built.nnodes, built.node_rank, built.master_addr),
            parsed.headless,
        )
        planned = (
            layout.tensor_parallel_size,
            layout.pipeline_parallel_size,
            layout.data_parallel_size,
            local,
            rank * local if layout.data_parallel_size > 1 else 0,
            layout.expert_parallel,
            (nodes, rank, LEADER),
            rank > 0,
        )
        assert got == planned, (model, rank)
        assert built.world_size_across_dp == layout.gpus
        if layout.data_parallel_size > 1:  # the engines' coordinator, on the leader
            assert built.data_parallel_master_ip == LEADER
