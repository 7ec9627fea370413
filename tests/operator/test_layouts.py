"""How a replica over several nodes splits (:mod:`kvpilot.operator.planning.layouts`) and how the split is
rendered: the reconciler's group and the closed loop's render of other settings carry the same flags."""

from __future__ import annotations

from typing import Any

from kvpilot.operator import api
from kvpilot.operator.inferenceservice import desired, loop_actions, loop_reading
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import workloads
from kvpilot.tuner.plan import Layout
from kvpilot.tuner.types import EngineSettings

META = {"name": "dsv3", "namespace": "ml", "uid": "u-1"}


def _spec(model: str, nodes: int, **gpu: Any) -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": model},
            "serving": {"maxContextLength": 32768},
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": nodes, **gpu},
        }
    )


def _inputs(spec: api.InferenceServiceSpec) -> resolve.Inputs:
    return resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))


def _layout(spec: api.InferenceServiceSpec) -> Layout | None:
    return modes.compute_group_layout(spec, _inputs(spec), modes.compute_user_args(spec))


def _args(group: dict[str, Any], role: str) -> list[str]:
    args: list[str] = group["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]["args"]
    return args


def test_a_moe_model_over_two_nodes_splits_into_expert_parallel_engines() -> None:
    layout = _layout(_spec("deepseek-ai/DeepSeek-V3", 2))
    assert layout == Layout(2, 8, 4, 1, 4, expert_parallel=True)


def test_a_dense_model_or_one_node_keeps_the_default_split() -> None:
    assert _layout(_spec("meta-llama/Llama-3.1-70B-Instruct", 2)) is None  # TP 8 x PP 2, derived
    assert _layout(_spec("Qwen/Qwen3-30B-A3B", 1)) is None  # one node: one engine, as always


def test_the_plan_of_a_data_parallel_group_is_each_engines() -> None:
    spec = _spec("deepseek-ai/DeepSeek-V3", 2)
    inputs = _inputs(spec)
    plan = modes.compute_feasible_plan(
        spec, inputs.model.spec, inputs.gpu.gpu, modes.compute_user_args(spec), weights_total_bytes=None
    )
    assert (plan.gpu_count, plan.settings.tensor_parallel_size, plan.pipeline_parallel_size) == (4, 4, 1)


def test_the_engine_args_carry_the_layouts_flags_instead_of_stages() -> None:
    spec = _spec("deepseek-ai/DeepSeek-V3", 2)
    settings = EngineSettings(max_model_len=32768, tensor_parallel_size=4)
    layout = Layout(2, 8, 4, 1, 4, expert_parallel=True)
    args = workloads.build_engine_args(spec, settings, [], layout)
    at = args.index("--data-parallel-size")
    assert args[at : at + 5] == [
        "--data-parallel-size",
        "4",
        "--data-parallel-size-local",
        "2",
        "--enable-expert-parallel",
    ]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert "--pipeline-parallel-size" not in args
    without = workloads.build_engine_args(spec, settings, [])  # no layout: the GPUs left over are stages
    assert without[without.index("--pipeline-parallel-size") + 1] == "4"


def test_the_closed_loop_renders_the_same_split_as_the_reconciler() -> None:
    spec = _spec("deepseek-ai/DeepSeek-V3", 2)
    inputs = _inputs(spec)
    built = desired.build_desired(META, spec, inputs)
    (group,) = [m for m in built.manifests if m["kind"] == "LeaderWorkerSet"]
    again = loop_actions.build_loop_deployment(META, spec, inputs, built.decision.deploy)
    for role in ("leaderTemplate", "workerTemplate"):
        assert _args(again, role) == _args(group, role)
        assert "--enable-expert-parallel" in _args(group, role)
    shorter = loop_actions.build_loop_deployment(
        META, spec, inputs, built.decision.deploy.replace(max_model_len=16384)
    )
    assert "--data-parallel-size" in _args(shorter, "workerTemplate")
    assert "--pipeline-parallel-size" not in _args(shorter, "workerTemplate")


def test_the_closed_loops_budget_of_a_group_is_the_plans() -> None:
    """The loop budgets the running settings in the rendered topology: a DP x EP engine (its GPUs, the
    group's expert shards), or the pipeline stages across the nodes, as the plan did."""
    for model in ("deepseek-ai/DeepSeek-V3", "meta-llama/Llama-3.1-70B-Instruct"):
        spec = _spec(model, 2)
        inputs = _inputs(spec)
        plan = modes.compute_feasible_plan(
            spec, inputs.model.spec, inputs.gpu.gpu, modes.compute_user_args(spec), weights_total_bytes=None
        )
        assert loop_reading.budget_for(inputs, spec, plan.settings) == plan.budget, model
