"""``kvpilot render`` (render.build_manifests) and desired.build_desired, with the real planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpilot.operator.inferenceservice import desired, render

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def load(name: str) -> dict:
    return yaml.safe_load(next(p for p in EXAMPLES if p.name == name).read_text())


def args_of(manifests: list[dict]) -> list[str]:
    return manifests[1]["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_a_valid_inference_service(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "kvpilot.io/v1alpha1" and doc["kind"] == "InferenceService"
    desired.parse_spec(doc["spec"])


def test_8b_on_one_l4() -> None:
    service, deployment = render.build_manifests(load("llama-3.1-8b-on-l4.yaml"))
    assert (service["kind"], deployment["kind"]) == ("Service", "Deployment")
    args = args_of([service, deployment])
    assert 8192 <= int(flag(args, "--max-model-len")) <= 32768
    assert flag(args, "--kv-cache-dtype") == "auto"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert "ownerReferences" not in deployment["metadata"]  # no uid offline


def test_70b_fp8_on_four_h100() -> None:
    args = args_of(render.build_manifests(load("llama-3.1-70b-fp8-on-4xh100.yaml")))
    assert flag(args, "--tensor-parallel-size") == "4"
    assert int(flag(args, "--max-model-len")) >= 32768
    assert "--enable-prefix-caching" in args


def test_long_context_only_with_fp8_kv() -> None:
    doc = load("long-context-fp8-kv-on-l4.yaml")
    args = args_of(render.build_manifests(doc))
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert int(flag(args, "--max-model-len")) >= doc["spec"]["serving"]["minContextLength"]
    doc["spec"]["tuning"]["allowFp8KvCache"] = False
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(doc)
    assert info.value.reason == "Infeasible"
    assert "Options:" in info.value.message


def test_the_one_that_does_not_fit_says_so() -> None:
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(load("llama-3.1-70b-does-not-fit-4xl4.yaml"))
    assert info.value.reason == "Infeasible"
    assert "Options:" in info.value.message and "GPUs" in info.value.message


def test_render_needs_a_gpu_offline_but_takes_one() -> None:
    doc = load("llama-3.1-8b-on-l4.yaml")
    del doc["spec"]["gpu"]["product"]
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(doc)
    assert info.value.reason == "InvalidSpec" and "spec.gpu.product" in info.value.message
    manifests = render.build_manifests(doc, gpu_product="L4")
    assert manifests[1]["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"


def test_modes_offline() -> None:
    doc = load("llama-3.1-8b-on-l4.yaml")
    doc["spec"]["tuning"]["mode"] = "Off"
    args = args_of(render.build_manifests(doc))
    assert flag(args, "--max-model-len") is None and flag(args, "--tensor-parallel-size") == "1"


def test_render_refuses_other_kinds_and_bad_specs() -> None:
    with pytest.raises(render.RenderError):
        render.build_manifests({"kind": "Deployment"})
    with pytest.raises(render.RenderError) as info:
        render.build_manifests({"kind": "InferenceService", "spec": {"model": {"id": "x", "source": "Hub"}}})
    assert info.value.reason == "InvalidSpec"


def test_one_node_per_replica_renders_as_a_spec_without_nodes() -> None:
    doc = load("llama-3.1-8b-on-l4.yaml")
    one = {**doc, "spec": {**doc["spec"], "gpu": {**doc["spec"].get("gpu", {}), "nodesPerReplica": 1}}}
    assert render.build_manifests(one) == render.build_manifests(doc)


def test_a_dense_model_over_two_nodes_renders_tensor_parallel_within_and_stages_across() -> None:
    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama"},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
            "serving": {"maxContextLength": 32768},
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
        },
    }
    _, group = render.build_manifests(doc)
    args = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    assert flag(args, "--tensor-parallel-size") == "8" and flag(args, "--pipeline-parallel-size") == "2"
    assert "--data-parallel-size" not in args and "--enable-expert-parallel" not in args


def test_several_nodes_per_replica_render_a_leader_worker_set() -> None:
    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "ds"},
        "spec": {
            "model": {"id": "deepseek-ai/DeepSeek-V3"},
            "serving": {"maxContextLength": 32768},
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
        },
    }
    service, group = render.build_manifests(doc)
    assert group["kind"] == "LeaderWorkerSet" and group["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    roles = group["spec"]["leaderWorkerTemplate"]
    leader = roles["leaderTemplate"]["spec"]["containers"][0]["args"]
    worker = roles["workerTemplate"]["spec"]["containers"][0]["args"]
    # the node planner's choice for this MoE model: 4 engines of TP 4, 2 per node, experts over 16 GPUs
    for args in (leader, worker):
        assert flag(args, "--tensor-parallel-size") == "4" and flag(args, "--data-parallel-size") == "4"
        assert flag(args, "--data-parallel-size-local") == "2" and "--enable-expert-parallel" in args
        assert "--pipeline-parallel-size" not in args
        assert flag(args, "--nnodes") == "2" and flag(args, "--max-model-len") == "32768"
    assert (flag(leader, "--node-rank"), flag(worker, "--node-rank")) == ("0", "$(LWS_WORKER_INDEX)")
    one = {**doc, "spec": {**doc["spec"], "gpu": {"count": 8, "product": "H100-SXM"}}}
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(one)  # DeepSeek-V3 does not fit one node of 8 H100s
    assert info.value.reason == "Infeasible"


SEVENTY_ON_L40S = {
    "apiVersion": "kvpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama-70b", "namespace": "ml"},
    "spec": {
        "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
        "gpu": {"product": "L40S", "count": 4, "tensorParallelSize": 2},
        "serving": {"maxContextLength": 8192},
    },
}


def test_pipeline_parallel_spec_is_planned_for_the_layout_it_renders() -> None:
    """Defect (issue 9, #2): this spec was refused as Infeasible; it starts with PP 2, which is rendered."""
    _, deployment = render.build_manifests(SEVENTY_ON_L40S)
    args = args_of([{}, deployment])
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--pipeline-parallel-size") == "2"


def test_the_loop_budgets_the_rendered_args_as_the_plan_did() -> None:
    """The closed loop's budget of the settings the Deployment runs equals the plan's (one topology rule)."""
    from kvpilot.operator.inferenceservice import loop_reading
    from kvpilot.operator.planning import resolve
    from kvpilot.tuner import vllm

    spec = desired.parse_spec(SEVENTY_ON_L40S["spec"])
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    wanted = desired.build_desired(SEVENTY_ON_L40S["metadata"], spec, inputs)
    container = wanted.manifests[1]["spec"]["template"]["spec"]["containers"][0]
    running, _ = vllm.parse_vllm_args(container["args"])
    assert loop_reading.budget_for(inputs, spec, running) == wanted.decision.plan.budget


def test_the_loop_budgets_settings_without_a_tensor_parallel_size() -> None:
    """Defect (issue 9, #3): the loop read spec.tensor_parallel_size, which does not exist."""
    from kvpilot.operator.inferenceservice import loop_reading
    from kvpilot.operator.planning import resolve
    from kvpilot.tuner import memory
    from kvpilot.tuner.types import EngineSettings

    spec = desired.parse_spec(SEVENTY_ON_L40S["spec"])
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    settings = EngineSettings(max_model_len=8192)
    budget = loop_reading.budget_for(inputs, spec, settings)
    expected = memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        settings.replace(tensor_parallel_size=1),
        pipeline_parallel_size=4,
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    assert budget == expected


@pytest.mark.parametrize("where", ["extraArgs", "pinned"])
def test_a_kv_dtype_vllm_has_but_kvpilot_cannot_size_is_invalid_spec(where: str) -> None:
    """Defect (issue 9, #4): turboquant_k8v4 passed the API and ended in a bare ValueError (InternalError)."""
    engine: dict = (
        {"extraArgs": ["--kv-cache-dtype", "turboquant_k8v4"]}
        if where == "extraArgs"
        else {"pinned": {"kvCacheDtype": "turboquant_k8v4"}}
    )
    isvc = {**SEVENTY_ON_L40S, "spec": {**SEVENTY_ON_L40S["spec"], "engine": engine}}
    with pytest.raises(render.RenderError) as caught:
        render.build_manifests(isvc)
    assert caught.value.reason == "InvalidSpec"
    assert "turboquant_k8v4" in caught.value.message


@pytest.mark.parametrize(
    ("bounds", "check"),
    [
        ({"maxNumSeqs": {"max": 2}}, lambda s: int(s) <= 2),
        ({"maxNumSeqs": {"min": 64}}, lambda s: int(s) >= 64),
    ],
)
def test_tuning_bounds_bind_the_first_plan(bounds: dict, check) -> None:
    """Issue 16: a maximum of 2 deployed 3 and a minimum of 64 deployed 3; the loop's bounds bind the plan."""
    isvc = {
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "gpu": {"product": "L4"},
            "serving": {"maxContextLength": 8192},
            "tuning": {"bounds": bounds},
        },
    }
    _, deployment = render.build_manifests(isvc)
    seqs = flag(args_of([{}, deployment]), "--max-num-seqs")
    assert seqs is not None and check(seqs), seqs


def test_max_model_len_bounds_bind_the_first_plan() -> None:
    isvc = {
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "gpu": {"product": "H100-SXM"},
            "tuning": {"bounds": {"maxModelLen": {"max": 16384}}},
        },
    }
    _, deployment = render.build_manifests(isvc)
    assert flag(args_of([{}, deployment]), "--max-model-len") == "16384"


def test_render_prints_the_pod_disruption_budget_of_two_replicas() -> None:
    doc = load("llama-3.1-8b-on-l4.yaml")
    doc["spec"]["replicas"] = 2
    kinds = [m["kind"] for m in render.build_manifests(doc)]
    assert kinds[-1] == "PodDisruptionBudget" and kinds.count("PodDisruptionBudget") == 1


REPLACE_ONE = {"maxSurge": 0, "maxUnavailable": 1}
SURGE_ONE = {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(
    ("rollout", "strategy"),
    [
        ({"strategy": "Replace"}, {"type": "RollingUpdate", "rollingUpdate": REPLACE_ONE}),
        ({"strategy": "Surge"}, {"type": "RollingUpdate", "rollingUpdate": SURGE_ONE}),
        ({"strategy": "Recreate", "allowDowntime": True}, {"type": "Recreate"}),
        ({"strategy": "Auto"}, {"type": "RollingUpdate", "rollingUpdate": SURGE_ONE}),
    ],
    ids=["Replace", "Surge", "Recreate", "Auto"],
)
def test_render_shows_the_strategy_the_operator_applies(rollout: dict, strategy: dict) -> None:
    """An explicit strategy needs no look at the cluster: render, the first create and the closed loop's
    apply all render it (before, render printed a surge for an explicit Replace). Auto surges until the
    cluster is read."""
    from kvpilot.operator.pods import rollout_strategy

    doc = load("llama-3.1-8b-on-l4.yaml")
    doc["spec"]["replicas"] = 2
    doc["spec"]["rollout"] = rollout
    deployment = next(m for m in render.build_manifests(doc) if m["kind"] == "Deployment")
    assert deployment["spec"]["strategy"] == strategy
    spec = desired.parse_spec(doc["spec"])
    live = rollout_strategy.compute_rollout_choice(spec.rollout, 2, fits_now=True, serving=True)
    if rollout["strategy"] != "Auto":  # what the live operator chooses for an explicit strategy
        assert rollout_strategy.build_deployment_strategy(live) == strategy


@pytest.mark.parametrize(
    "rollout",
    [{"strategy": "Replace"}, {"strategy": "Surge"}, {"strategy": "Recreate", "allowDowntime": True}],
    ids=["Replace", "Surge", "Recreate"],
)
async def test_the_reconcilers_deployment_is_renders(rollout: dict) -> None:
    """An update's reconciliation re-chooses the strategy against the cluster
    (:func:`kvpilot.operator.pods.workloads.fetch_rollout_strategy`, handlers' path after a create): for an
    explicit strategy the Deployment it applies is render's, to the last field, and no node is read."""
    from operator_fakes import FakeKube

    from kvpilot.operator.pods import workloads

    doc = load("llama-3.1-8b-on-l4.yaml")
    doc["spec"]["replicas"] = 2
    doc["spec"]["rollout"] = rollout
    rendered = render.build_manifests(doc)
    kube = FakeKube()
    spec = desired.parse_spec(doc["spec"])
    reconciled = await workloads.fetch_rollout_strategy(kube, spec, rendered)  # type: ignore[arg-type]
    assert reconciled == rendered
    assert kube.node_lists == 0
