"""Every reconciliation path, with no cluster: fakes for the API, the Hub and the planner."""

from __future__ import annotations

import json

import kopf
import pytest
from operator_fakes import Harness, condition, isvc

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import handlers
from kvpilot.tuner import gpus
from kvpilot.tuner.types import GIB

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def args_of(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


async def test_auto_applies_the_plan(harness: Harness) -> None:
    body = isvc(serving={"maxContextLength": 16384})
    await harness.run(body)
    service, deployment = harness.kube.applied
    assert (service["kind"], deployment["kind"]) == ("Service", "Deployment")
    args = args_of(deployment)
    assert args[0] == LLAMA_8B
    assert flag(args, "--max-model-len") == "16384"
    assert flag(args, "--max-num-seqs") == "64"
    assert flag(args, "--tensor-parallel-size") == "1"
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    st = body["status"]
    assert st["observedGeneration"] == 1
    assert condition(body, "Ready")["status"] == "True"
    assert condition(body, "Planned")["status"] == "True"
    assert condition(body, "ConfigResolved")["status"] == "True"
    assert condition(body, "Infeasible")["status"] == "False"
    assert st["applied"]["maxModelLen"] == 16384
    assert st["recommendation"]["settings"]["maxModelLen"] == 16384
    l4 = gpus.lookup_gpu("L4")
    assert st["gpu"] == {
        "product": "NVIDIA-L4",
        "catalogueName": "L4",
        "count": 1,
        "memoryGiB": round(l4.total_bytes / GIB, 2),
    }
    assert 21 < st["gpu"]["memoryGiB"] < 23  # an L4 as CUDA reports it (22.03 GiB), not 24 GB
    assert st["budget"]["kvCacheTokens"] == 28672
    assert [h["action"] for h in st["history"]] == ["Planned"]
    assert st["lastChangeTime"]
    normal = [(reason, message) for type_, reason, message in harness.emitter.events if type_ == "Normal"]
    assert [reason for reason, _ in normal] == ["Planned"]  # one event per decision: each is a write
    assert "model config from the built-in catalogue" in normal[0][1] and "GPU L4 x1" in normal[0][1]


async def test_recommend_deploys_user_settings_and_recommends(harness: Harness) -> None:
    body = isvc(tuning={"mode": "Recommend"}, engine={"pinned": {"maxNumSeqs": 8}})
    await harness.run(body)
    args = args_of(harness.kube.last("Deployment"))
    assert flag(args, "--max-model-len") is None
    assert flag(args, "--max-num-seqs") == "8"
    assert flag(args, "--tensor-parallel-size") == "1"
    st = body["status"]
    assert st["applied"]["maxModelLen"] is None or "maxModelLen" not in st["applied"]
    assert st["recommendation"]["settings"]["maxModelLen"] == 8192
    assert st["recommendation"]["trigger"] == "Created"
    assert "Recommended" in harness.emitter.reasons


async def test_off_reports_only(harness: Harness) -> None:
    body = isvc(tuning={"mode": "Off"}, engine={"extraArgs": ["--max-model-len", "4096", "--enforce-eager"]})
    await harness.run(body)
    args = args_of(harness.kube.last("Deployment"))
    assert flag(args, "--max-model-len") == "4096"
    assert "--enforce-eager" in args
    assert flag(args, "--max-num-seqs") is None and flag(args, "--gpu-memory-utilization") is None
    st = body["status"]
    assert "recommendation" not in st
    assert st["budget"]["kvCacheGiB"] == 3.5
    assert condition(body, "Planned")["status"] == "True"
    assert "Reported" in harness.emitter.reasons


async def test_spec_change_replans_and_records_history(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    body["spec"]["serving"] = {"maxContextLength": 4096}
    body["metadata"]["generation"] = 2
    await harness.run(body, trigger=handlers.SPEC_CHANGED)
    assert flag(args_of(harness.kube.last("Deployment")), "--max-model-len") == "4096"
    history = body["status"]["history"]
    assert [h["trigger"] for h in history] == ["Created", "SpecChanged"]
    assert history[-1]["from"]["maxModelLen"] == 8192 and history[-1]["to"]["maxModelLen"] == 4096
    assert body["status"]["observedGeneration"] == 2


async def test_resume_keeps_closed_loop_settings_and_is_quiet(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    body["status"]["applied"]["maxNumSeqs"] = 48  # the closed loop retuned
    harness.emitter.events.clear()
    await harness.run(body, trigger=handlers.RESUMED)
    assert flag(args_of(harness.kube.last("Deployment")), "--max-num-seqs") == "48"
    assert harness.emitter.events == []
    assert len(body["status"]["history"]) == 1


async def test_resume_keeps_retuned_settings_while_the_pods_do_not_serve(harness: Harness) -> None:
    """Ready=False because the pods crash-loop (the closed loop's view) still means the reconcile succeeded:
    an operator restarted mid-rollout must keep the retuned settings, not re-apply the initial plan."""
    body = isvc()
    await harness.run(body)
    body["status"]["applied"]["maxNumSeqs"] = 48  # the closed loop retuned
    for c in body["status"]["conditions"]:
        if c["type"] == "Ready":
            c.update(status="False", reason="CrashLoopBackOff")
    await harness.run(body, trigger=handlers.RESUMED)
    assert flag(args_of(harness.kube.last("Deployment")), "--max-num-seqs") == "48"


async def test_resume_unchanged_reapplies_without_history(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    await harness.run(body, trigger=handlers.RESUMED)
    assert len(harness.kube.applied) == 4
    assert len(body["status"]["history"]) == 1
    assert condition(body, "Ready")["lastTransitionTime"] == "2026-11-30T10:00:00Z"


async def test_gpu_discovered_from_node_labels(harness: Harness) -> None:
    body = isvc(gpu={"count": 4}, nodeSelector={"pool": "h100"})
    await harness.run(body)
    pod = harness.kube.last("Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert body["status"]["gpu"]["catalogueName"] == "H100-SXM"
    await harness.run(isvc(name="other", gpu={"count": 2}, nodeSelector={"pool": "h100"}))
    assert harness.kube.node_lists == 1  # cached per selector


async def test_catalogue_gpu_with_several_gfd_names_uses_node_affinity(harness: Harness) -> None:
    await harness.run(isvc(gpu={"count": 1, "product": "H100-SXM"}))
    pod = harness.kube.last("Deployment")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"]
    assert "nodeSelector" not in pod


async def test_gpu_count_larger_than_any_node_warns(harness: Harness) -> None:
    body = isvc(gpu={"count": 2}, nodeSelector={"pool": "l4"})
    await harness.run(body)
    assert any("will not schedule" in w for w in body["status"]["warnings"])
    assert "PlanWarning" in harness.emitter.reasons


# ----------------------------------------------------------------------------------------- failures


async def _fails(harness: Harness, body: dict, kind: type, retry: int = 0) -> dict:
    with pytest.raises(kind) as info:
        await harness.run(body, retry=retry)
    ready = condition(body, "Ready")
    assert ready["status"] == "False"
    assert harness.emitter.events[-1][0] == "Warning"
    assert harness.emitter.events[-1][1] == ready["reason"]
    assert harness.kube.applied == [], "nothing may be applied on failure"
    return {"ready": ready, "error": info.value}


async def test_unknown_model(harness: Harness) -> None:
    out = await _fails(harness, isvc(model={"id": "acme/NoSuchModel-7B"}), kopf.PermanentError)
    assert out["ready"]["reason"] == "UnknownModel"
    assert "ConfigMap" in out["ready"]["message"]  # says what to change


async def test_unknown_gpu(harness: Harness) -> None:
    body = isvc(gpu={"count": 1, "product": "GTX-480"})
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "UnknownGpu"
    assert condition(body, "ConfigResolved")["status"] == "False"


async def test_unknown_gpu_from_labels(harness: Harness) -> None:
    harness.kube.nodes = [{"nvidia.com/gpu.product": "NVIDIA-Mystery-GPU", "pool": "x"}]
    out = await _fails(harness, isvc(gpu={"count": 1}, nodeSelector={"pool": "x"}), kopf.PermanentError)
    assert out["ready"]["reason"] == "UnknownGpu"
    assert "nvidia.com/gpu.memory" in out["ready"]["message"]


async def test_no_matching_nodes_is_retried(harness: Harness) -> None:
    out = await _fails(harness, isvc(gpu={"count": 1}, nodeSelector={"pool": "none"}), kopf.TemporaryError)
    assert out["ready"]["reason"] == "NoMatchingNodes"


async def test_ambiguous_gpu(harness: Harness) -> None:
    out = await _fails(harness, isvc(gpu={"count": 1}), kopf.PermanentError)
    assert out["ready"]["reason"] == "AmbiguousGpu"
    assert "NVIDIA-L4 (1 nodes)" in out["ready"]["message"]


async def test_configmap_missing_is_retried(harness: Harness) -> None:
    body = isvc(model={"id": "acme/custom", "source": "ConfigMap", "configMapRef": {"name": "cfg"}})
    out = await _fails(harness, body, kopf.TemporaryError)
    assert out["ready"]["reason"] == "ConfigNotFound"
    assert "kubectl create configmap cfg" in out["ready"]["message"]


async def test_configmap_with_bad_config(harness: Harness) -> None:
    harness.kube.config_maps[("ns1", "cfg")] = {"config.json": json.dumps({"model_type": "llama"})}
    body = isvc(model={"id": "acme/custom", "source": "ConfigMap", "configMapRef": {"name": "cfg"}})
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidModelConfig"
    assert condition(body, "ConfigResolved")["reason"] == "InvalidModelConfig"


async def test_configmap_not_json(harness: Harness) -> None:
    harness.kube.config_maps[("ns1", "cfg")] = {"config.json": "{not json"}
    body = isvc(model={"id": "acme/custom", "source": "ConfigMap", "configMapRef": {"name": "cfg"}})
    out = await _fails(harness, body, kopf.PermanentError)
    assert "not valid JSON" in out["ready"]["message"]


async def test_configmap_config_is_planned(harness: Harness) -> None:
    from kvpilot.tuner.model import catalogue as models

    config = models.lookup_model_config(LLAMA_8B)
    harness.kube.config_maps[("ns1", "cfg")] = {"cfg.json": json.dumps(config)}
    body = isvc(
        model={"id": "acme/custom", "source": "ConfigMap", "configMapRef": {"name": "cfg", "key": "cfg.json"}}
    )
    await harness.run(body)
    assert condition(body, "ConfigResolved")["message"].startswith("model config from ConfigMap ns1/cfg")


async def test_hub_unreachable_backs_off(harness: Harness) -> None:
    harness.hub_result = errors.HubUnreachable("the Hugging Face Hub cannot be reached")
    body = isvc(model={"id": "acme/custom", "source": "Hub"})
    first = (await _fails(harness, body, kopf.TemporaryError, retry=0))["error"]
    later = (await _fails(harness, body, kopf.TemporaryError, retry=3))["error"]
    assert first.delay < later.delay <= errors.BACKOFF_CAP_S
    assert condition(body, "Ready")["reason"] == "HubUnreachable"


async def test_hub_with_token_secret(harness: Harness) -> None:
    from kvpilot.tuner.model import catalogue as models

    harness.hub_result = models.lookup_model_config(LLAMA_8B)
    harness.kube.secrets[("ns1", "hf")] = {"token": "hf_SECRET123"}
    body = isvc(
        model={"id": "acme/gated", "revision": "abc123", "source": "Hub", "hubTokenSecretRef": {"name": "hf"}}
    )
    await harness.run(body)
    assert harness.hub_calls == [("acme/gated", "abc123", "hf_SECRET123")]
    container = harness.kube.last("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container[
        "env"
    ]
    assert flag(container["args"], "--revision") == "abc123"
    everything = json.dumps([body["status"], harness.emitter.events, harness.kube.applied])
    assert "hf_SECRET123" not in everything
    await harness.run(isvc(name="second", model=body["spec"]["model"]))
    assert len(harness.hub_calls) == 1  # cached by (id, revision)


async def test_hub_token_secret_missing(harness: Harness) -> None:
    body = isvc(model={"id": "acme/gated", "source": "Hub", "hubTokenSecretRef": {"name": "hf"}})
    out = await _fails(harness, body, kopf.TemporaryError)
    assert out["ready"]["reason"] == "ConfigNotFound"


async def test_infeasible(harness: Harness) -> None:
    body = isvc(model={"id": "meta-llama/Llama-3.1-70B-Instruct"}, serving={"minContextLength": 8192})
    body["spec"]["gpu"] = {"count": 1, "product": "L4"}
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "Infeasible"
    assert condition(body, "Infeasible")["status"] == "True"
    assert condition(body, "Planned")["status"] == "False"
    assert "use 4x H100-SXM" in out["ready"]["message"]
    assert body["status"]["history"][-1]["action"] == "Infeasible"
    await _fails(harness, body, kopf.PermanentError)
    assert len(body["status"]["history"]) == 1, "the same verdict is not repeated in history"


async def test_bogus_extra_args(harness: Harness) -> None:
    out = await _fails(harness, isvc(engine={"extraArgs": ["--batch-size", "32"]}), kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidEngineArgs"
    assert "--max-num-seqs" in out["ready"]["message"]


async def test_extra_args_contradicting_pinned(harness: Harness) -> None:
    body = isvc(engine={"extraArgs": ["--max-num-seqs", "4"], "pinned": {"maxNumSeqs": 8}})
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidSpec"


async def test_invalid_spec_semantics(harness: Harness) -> None:
    body = isvc(serving={"minContextLength": 9000, "maxContextLength": 4096})
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidSpec"
    assert "minContextLength" in out["ready"]["message"]


async def test_apply_failure_is_retried_and_status_says_so(harness: Harness) -> None:
    harness.kube.fail_apply = errors.ApplyFailed("applying Deployment llm failed: HTTP 500")
    body = isvc()
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    assert condition(body, "Ready")["reason"] == "ApplyFailed"


async def test_unexpected_error_is_retried_not_crashed(harness: Harness) -> None:
    harness.kube.fail_apply = RuntimeError("boom")
    body = isvc()
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    assert condition(body, "Ready")["reason"] == "InternalError"


async def test_an_unexpected_errors_text_stays_out_of_status_and_events(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """It may quote what a tenant must not read (another team's object, a URL's credentials)."""
    secret = "https://admin:hunter2@prometheus.internal team-b/payroll"
    harness.kube.fail_apply = KeyError(secret)
    body = isvc()
    with pytest.raises(kopf.TemporaryError) as raised:
        await harness.run(body)
    ready = condition(body, "Ready")
    assert ready["reason"] == "InternalError" and "(KeyError)" in ready["message"]
    tenant_visible = json.dumps([body.get("status"), harness.emitter.events, str(raised.value)])
    assert "hunter2" not in tenant_visible and "payroll" not in tenant_visible
    assert "hunter2" in caplog.text  # the operator's log keeps the detail


async def test_recovery_after_failure_sets_ready(harness: Harness) -> None:
    body = isvc(engine={"extraArgs": ["--batch-size", "32"]})
    with pytest.raises(kopf.PermanentError):
        await harness.run(body)
    body["spec"]["engine"] = {}
    body["metadata"]["generation"] = 2
    await harness.run(body, trigger=handlers.SPEC_CHANGED)
    assert condition(body, "Ready")["status"] == "True"
    assert condition(body, "Ready")["reason"] == "Applied"


async def test_plan_neutral_spec_change_keeps_retuned_settings(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    body["status"]["applied"]["maxNumSeqs"] = 48  # the closed loop retuned
    body["spec"]["replicas"] = 3
    body["spec"]["tuning"] = {"cooldownSeconds": 60}
    body["metadata"]["generation"] = 2
    diff = [("change", ("replicas",), 1, 3), ("add", ("tuning", "cooldownSeconds"), None, 60)]
    await harness.run(body, trigger=handlers.SPEC_CHANGED, diff=diff)
    deployment = harness.kube.last("Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert flag(args_of(deployment), "--max-num-seqs") == "48"
    assert len(body["status"]["history"]) == 1  # the engine settings did not change
    assert body["status"]["observedGeneration"] == 2


async def test_plan_input_change_replans(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    body["status"]["applied"]["maxNumSeqs"] = 48
    body["spec"]["serving"] = {"maxContextLength": 4096}
    body["metadata"]["generation"] = 2
    diff = [("add", ("serving",), None, {"maxContextLength": 4096})]
    await harness.run(body, trigger=handlers.SPEC_CHANGED, diff=diff)
    args = args_of(harness.kube.last("Deployment"))
    assert flag(args, "--max-num-seqs") == "64" and flag(args, "--max-model-len") == "4096"


@pytest.mark.parametrize(
    "paths,replan",
    [
        ([("replicas",)], False),
        ([("engine", "image"), ("tuning", "cooldownSeconds")], False),
        ([("tuning", "bounds", "maxNumSeqs", "max")], True),  # the bounds bind the plan too
        ([("engine",)], True),  # a whole parent: conservative
        ([("engine", "pinned", "maxNumSeqs")], True),
        ([("tuning", "bounds", "gpuMemoryUtilization")], True),
        ([("tuning", "mode")], True),
        ([("model", "id")], True),
        ([], False),
    ],
)
def test_compute_replan_needed(paths: list[tuple[str, ...]], replan: bool) -> None:
    from kvpilot.operator.planning import modes

    assert modes.compute_replan_needed([("change", p, 1, 2) for p in paths]) is replan


async def test_a_cached_gated_config_never_serves_a_request_without_the_token(harness: Harness) -> None:
    """Issue 16: the Hub cache keyed on (model, revision) only, so a tenant without a token got Ready on a
    gated model another tenant had fetched; and a deleted token Secret went unnoticed on a cache hit."""
    from kvpilot.tuner.model import catalogue as models

    harness.hub_result = models.lookup_model_config(LLAMA_8B)
    harness.kube.secrets[("ns1", "hf")] = {"token": "hf_SECRET123"}
    gated = {"id": "acme/gated", "source": "Hub", "hubTokenSecretRef": {"name": "hf"}}
    await harness.run(isvc(model=gated))
    harness.hub_result = errors.HubAccessDenied("acme/gated is gated on the Hugging Face Hub")
    no_token = isvc(name="no-token", model={"id": "acme/gated", "source": "Hub"})
    with pytest.raises(kopf.TemporaryError):
        await harness.run(no_token)
    assert harness.hub_calls[-1] == ("acme/gated", None, None)  # asked the Hub again, without a token
    assert condition(no_token, "Ready")["reason"] == "HubAccessDenied"
    del harness.kube.secrets[("ns1", "hf")]
    third = isvc(name="third", model=gated)
    with pytest.raises(kopf.TemporaryError):
        await harness.run(third)
    assert condition(third, "Ready")["reason"] == "ConfigNotFound"  # noticed although the config is cached


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--port", "9000"], "--port"),
        (["--host=127.0.0.1"], "--host"),
        (["--model", "evil/model"], "--model"),
        (["--config", "/etc/vllm.yaml"], "--config"),
        (["-dp", "2"], "--data-parallel-size"),
        (["--pipeline-parallel-size", "8"], "--pipeline-parallel-size 8"),
        (["-pp=3"], "--pipeline-parallel-size 3"),
        (["--dtype", "float32"], "--dtype float32"),
    ],
)
async def test_extra_args_contradicting_the_pod_or_the_plan_are_invalid_spec(
    harness: Harness, extra: list[str], named: str
) -> None:
    body = isvc(engine={"extraArgs": extra})
    out = await _fails(harness, body, kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidSpec"
    assert named in out["ready"]["message"] and "spec.engine.extraArgs" in out["ready"]["message"]
    assert harness.kube.applied == []


async def test_a_memory_limit_below_the_kv_offloading_tier_is_invalid_spec(harness: Harness) -> None:
    """vLLM pins --kv-offloading-size GiB of host memory (all the ranks' tiers, in one pod here): a limit
    below it could only be OOM-killed, so it is refused by name before anything renders."""
    engine = {"extraArgs": ["--kv-offloading-size", "100"], "resources": {"limits": {"memory": "64Gi"}}}
    out = await _fails(harness, isvc(engine=engine), kopf.PermanentError)
    assert out["ready"]["reason"] == "InvalidSpec"
    message = out["ready"]["message"]
    assert "--kv-offloading-size" in message and "100.0 GiB" in message and "limits.memory (64Gi)" in message
    assert harness.kube.applied == []


async def test_a_memory_limit_that_holds_the_tier_or_lmcaches_tier_is_planned(harness: Harness) -> None:
    for extra in (
        ["--kv-offloading-size", "48"],
        ["--kv-offloading-size", "100", "--kv-offloading-backend", "lmcache"],
    ):
        body = isvc(engine={"extraArgs": extra, "resources": {"limits": {"memory": "64Gi"}}})
        await harness.run(body)
        args = harness.kube.last("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--kv-offloading-size" in args


async def test_pipeline_stages_that_fill_the_gpus_are_planned_for(harness: Harness) -> None:
    body = isvc(gpu={"count": 4, "product": "L4"}, engine={"extraArgs": ["-pp", "2"]})
    await harness.run(body)
    args = harness.kube.last("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert "-pp" in args and "--pipeline-parallel-size" not in args  # the user's own, not a second one


async def test_status_selector_selects_the_deployments_pods(harness: Harness) -> None:
    # the scale subresource's labelSelectorPath: an HPA counts the pods with it
    body = isvc()
    await harness.run(body)
    deployment = harness.kube.last("Deployment")
    pairs = dict(kv.split("=", 1) for kv in body["status"]["selector"].split(","))
    assert pairs == deployment["spec"]["selector"]["matchLabels"]
    assert pairs.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert pairs["app.kubernetes.io/instance"] == body["metadata"]["name"]


async def test_the_first_reconcile_is_one_status_patch_and_later_ones_patch_the_freshest_lists(
    harness: Harness,
) -> None:
    body = isvc()
    first = await harness.run(body)
    # no patch function: kopf sends the merge patch alone (one PATCH of status on create)
    assert not first.fns
    assert {c["type"] for c in first["status"]["conditions"]} >= {"Ready", "Planned", "ConfigResolved"}
    assert [h["action"] for h in first["status"]["history"]] == ["Planned"]
    body["spec"]["serving"] = {"maxContextLength": 4096}
    body["metadata"]["generation"] = 2
    later = await harness.run(body, trigger=handlers.SPEC_CHANGED)
    # the closed loop may write conditions and history by now: they are patched on the freshest object
    assert later.fns and "conditions" not in later["status"]
    assert [h["action"] for h in body["status"]["history"]] == ["Planned", "Planned"]
