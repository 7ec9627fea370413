"""An EngineTuner whose target runs SGLang or TGI: discovery by each engine's own reader, the
InferenceService planner's plan for that engine in the status, the webhook's rewrite with the engine's own
flags, Auto's eviction, and the refusals; with an in-memory API and the real planner."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from operator_fakes import L4_LABELS
from test_enginetuner import LLAMA, NS, PS_COMMAND, FakeTargetKube, cond, deployment, pod_of, run, tuner

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target, target_engine_plan, target_webhook
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import pod_reading
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner import sglang, tgi

SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23-cu129"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
SGLANG_ARGS = [
    "--model-path", LLAMA, "--host", "0.0.0.0", "--port", "30000", "--enable-metrics",
    "--mem-fraction-static", "0.9", "--context-length", "131072",
]  # fmt: skip
TGI_ENV = [
    {"name": "MODEL_ID", "value": LLAMA},
    {"name": "MAX_TOTAL_TOKENS", "value": "131072"},
    {"name": "MAX_INPUT_TOKENS", "value": "131000"},
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
]


def sglang_deployment(name: str = "sg", args: list[str] | None = None) -> dict[str, Any]:
    command = ["python3", "-m", "sglang.launch_server"]
    return deployment(name, command, SGLANG_ARGS if args is None else args, image=SGLANG_IMAGE)


def tgi_deployment(name: str = "tgi") -> dict[str, Any]:
    """TGI's env form: the image's entry point runs the launcher, which reads flags from the environment."""
    wl = deployment(name, [], ["--hostname", "0.0.0.0", "--port", "80"], image=TGI_IMAGE, env=TGI_ENV)
    (container,) = wl["spec"]["template"]["spec"]["containers"]
    del container["command"]
    container["name"] = "tgi"
    return wl


def spec(**fields: Any) -> api.EngineTunerSpec:
    return api.EngineTunerSpec.model_validate({"targetRef": {"kind": "Deployment", "name": "x"}, **fields})


def discover(workload: dict[str, Any], **fields: Any) -> target_engine_plan.EngineDiscovery:
    s = spec(**fields)
    found = target_engine_plan.find_target_engine(s, workload)
    assert found is not None
    return target_engine_plan.build_engine_discovery(s, workload, [L4_LABELS], *found)


def with_container(container: dict[str, Any]) -> dict[str, Any]:
    wl = deployment("x", [])
    wl["spec"]["template"]["spec"]["containers"] = [{"name": "server", **container}]
    return wl


# --- discovery ------------------------------------------------------------------------------------------


def test_sglang_exec_forms_are_read_with_sglangs_parser() -> None:
    found = discover(sglang_deployment(args=[*SGLANG_ARGS, "--tensor-parallel-size", "2"]))
    assert (found.kind, found.model.id, found.gpu_count, found.gpu_product) == (
        "SGLang",
        LLAMA,
        2,
        "NVIDIA-L4",
    )
    assert found.settings == sglang.SglangSettings(context_length=131072, mem_fraction_static=0.9, tp_size=2)
    assert found.args_origin == "args" and found.command.form == "launch_server"
    serve = discover(
        with_container({"image": "r/llm:1", "command": ["sglang", "serve", LLAMA, "--page-size", "16"]})
    )
    assert (serve.kind, serve.model.id, serve.settings.page_size, serve.args_origin) == (  # type: ignore[union-attr]
        "SGLang",
        LLAMA,
        16,
        "command",
    )


def test_sglang_shell_form_takes_its_model_from_the_environment() -> None:
    script = 'exec python3 -m sglang.launch_server --model-path "$MODEL" --port 30000 "$@"'
    found = discover(
        with_container(
            {
                "image": "r/llm:1",
                "command": ["sh", "-c", script, "sh"],
                "args": ["--max-running-requests", "16"],
                "env": [{"name": "MODEL", "value": LLAMA}],
            }
        )
    )
    assert (found.model.id, found.model_origin) == (LLAMA, "the container's environment ($MODEL)")
    assert found.settings == sglang.SglangSettings(max_running_requests=16)


def test_tgi_launcher_image_and_environment_forms() -> None:
    launcher = discover(
        with_container(
            {
                "image": "r/tgi:1",
                "command": ["text-generation-launcher", "--model-id", LLAMA, "--num-shard", "2"],
                "args": ["--max-total-tokens", "8192"],
            }
        )
    )
    assert (launcher.kind, launcher.model.id, launcher.gpu_count) == ("TGI", LLAMA, 2)
    assert launcher.settings == tgi.TgiSettings(max_total_tokens=8192, num_shard=2)
    env = discover(tgi_deployment())
    assert (env.kind, env.model.id, env.model_origin) == (
        "TGI",
        LLAMA,
        "the container's environment (MODEL_ID)",
    )
    assert env.settings == tgi.TgiSettings(max_input_tokens=131000, max_total_tokens=131072)
    assert env.args_origin == "args and the environment" and env.command.form == "image"
    assert env.gpu_count == 1  # no --num-shard: every GPU the container has


def test_a_vllm_container_beside_another_engine_is_the_one_tuned() -> None:
    wl = tgi_deployment()
    wl["spec"]["template"]["spec"]["containers"].append(
        deployment("v", PS_COMMAND)["spec"]["template"]["spec"]["containers"][0]
    )
    assert target_engine_plan.find_target_engine(spec(), wl) is None
    assert target_engine_plan.find_target_engine(spec(containerName="vllm"), wl) is None
    named = target_engine_plan.find_target_engine(spec(containerName="tgi"), wl)
    assert named is not None and named[1].kind == "TGI"


def test_an_engine_kvpilot_does_not_know_is_discovery_incomplete_by_name() -> None:
    wl = with_container({"image": "ollama/ollama:0.5", "command": ["ollama", "serve"]})
    assert target_engine_plan.find_target_engine(spec(containerName="server"), wl) is None
    with pytest.raises(target.DiscoveryIncomplete, match="container 'server' runs no engine kvpilot reads"):
        target.build_discovery(spec(containerName="server"), wl, [L4_LABELS], {})
    with pytest.raises(target.DiscoveryIncomplete, match=r"no container .* runs vLLM, SGLang or TGI"):
        target.build_discovery(spec(), wl, [L4_LABELS], {})


# --- Recommend: the plan in the status --------------------------------------------------------------------


@pytest.fixture
def sg_kube() -> FakeTargetKube:
    pod_reading.LOGS.clear()
    k = FakeTargetKube()
    wl = sglang_deployment()
    k.workloads[(NS, "Deployment", "sg")] = wl
    k.pods = [pod_of(wl, "sg-abc12-x"), pod_of(wl, "sg-abc12-y", node="l4-1")]
    return k


@pytest.fixture
def tgi_kube() -> FakeTargetKube:
    pod_reading.LOGS.clear()
    k = FakeTargetKube()
    wl = tgi_deployment()
    k.workloads[(NS, "Deployment", "tgi")] = wl
    k.pods = [pod_of(wl, "tgi-abc12-x")]
    return k


async def test_recommend_plans_an_sglang_deployment(sg_kube: FakeTargetKube) -> None:
    body, emitter = tuner("Recommend", "sg"), RecordingEmitter()
    await run(body, sg_kube, emitter)
    st = body["status"]
    assert st["discovered"]["engine"] == "SGLang" and st["discovered"]["model"] == LLAMA
    assert st["discovered"]["engineArgs"] == ["--context-length", "131072", "--mem-fraction-static", "0.9"]
    assert "settings" not in st["discovered"] and "budget" not in st
    args = st["recommendation"]["engineArgs"]
    planned = sglang.parse_sglang_args(args)
    assert planned.context_length is not None and planned.context_length < 131072  # 128k does not fit an L4
    assert planned.mem_fraction_static is not None and planned.mem_fraction_static < 0.9
    reason = st["recommendation"]["reason"]
    assert "--mem-fraction-static" in reason and "KV pool" in reason  # the budget, step by step
    assert cond(body, "Planned")["message"].startswith(f"SGLang {sglang.PINNED_SGLANG_VERSION}: ")
    assert cond(body, "Ready")["reason"] == "Recommending" and st["discovered"]["podsTuned"] == 0
    assert "(SGLang, launch_server" in cond(body, "Discovered")["message"]
    assert emitter.reasons == ["Recommended"]
    assert sg_kube.writes == 0 and sg_kube.evicted == []
    # the next reconcile keeps it (no event, the same reason and time)
    again = RecordingEmitter()
    await run(body, sg_kube, again, now=1.8e9 + 60)
    assert body["status"]["recommendation"] == st["recommendation"] and again.reasons == []


async def test_recommend_plans_a_tgi_deployment_from_its_environment(tgi_kube: FakeTargetKube) -> None:
    body = tuner("Recommend", "tgi")
    await run(body, tgi_kube, RecordingEmitter())
    st = body["status"]
    assert st["discovered"]["engine"] == "TGI"
    assert st["discovered"]["engineArgs"] == ["--max-input-tokens", "131000", "--max-total-tokens", "131072"]
    planned = tgi.parse_tgi_args(st["recommendation"]["engineArgs"])
    assert planned.max_total_tokens is not None and planned.max_total_tokens < 131072
    assert planned.num_shard in (None, 1)  # one GPU: TGI's default
    assert cond(body, "Planned")["message"].startswith(f"TGI {tgi.PINNED_TGI_VERSION}: ")
    assert st["gpu"]["catalogueName"] == "L4" and st["gpu"]["count"] == 1
    assert (cond(body, "Available")["status"], cond(body, "Available")["reason"]) == ("True", "Serving")
    assert (cond(body, "Degraded")["status"], cond(body, "Degraded")["reason"]) == ("False", "Healthy")


async def test_an_sglang_targets_crash_loop_is_degraded(sg_kube: FakeTargetKube) -> None:
    wl = sg_kube.workloads[(NS, "Deployment", "sg")]
    sg_kube.pods = [pod_of(wl, "sg-abc12-x", ready=False, crash=True)]
    name = wl["spec"]["template"]["spec"]["containers"][0]["name"]
    sg_kube.pods[0]["status"]["containerStatuses"][0]["name"] = name
    body = tuner("Recommend", "sg")
    await run(body, sg_kube, RecordingEmitter())
    assert (cond(body, "Available")["status"], cond(body, "Available")["reason"]) == (
        "False",
        "CrashLoopBackOff",
    )
    assert (cond(body, "Degraded")["status"], cond(body, "Degraded")["reason"]) == (
        "True",
        "CrashLoopBackOff",
    )


async def test_off_reports_the_plan_without_a_recommendation(tgi_kube: FakeTargetKube) -> None:
    body = tuner("Off", "tgi")
    await run(body, tgi_kube, RecordingEmitter())
    assert "recommendation" not in body["status"]
    assert cond(body, "Planned")["status"] == "True" and cond(body, "Ready")["reason"] == "Reporting"


async def test_unparsable_flags_are_discovery_incomplete(sg_kube: FakeTargetKube) -> None:
    wl = sglang_deployment(args=[*SGLANG_ARGS, "--mem-fraction-static", "lots"])
    sg_kube.workloads[(NS, "Deployment", "sg")] = wl
    body = tuner("Recommend", "sg")
    with pytest.raises(kopf.TemporaryError):
        await run(body, sg_kube, RecordingEmitter())
    assert cond(body, "Discovered")["reason"] == "DiscoveryIncomplete"
    assert "SGLang arguments do not parse" in cond(body, "Discovered")["message"]


# --- Auto: the webhook's rewrite and the evictions ----------------------------------------------------------


def created_pod(workload: dict[str, Any], name: str) -> dict[str, Any]:
    pod = pod_of(workload, name)
    pod["spec"].pop("nodeName")
    pod.pop("status")
    return pod


async def test_auto_rewrites_sglangs_flags_and_evicts_one_pod(sg_kube: FakeTargetKube) -> None:
    body = tuner("Auto", "sg")
    await run(body, sg_kube, RecordingEmitter())
    assert sg_kube.evicted == []  # the recommendation is not in the status yet: the webhook could not read it
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    (actuation,) = index.values()
    recommended = body["status"]["recommendation"]["engineArgs"]
    assert actuation.settings == EngineArgs("SGLang", tuple(recommended))
    wl = sg_kube.workloads[(NS, "Deployment", "sg")]
    patched = target_webhook.compute_pod_patch(
        created_pod(wl, "sg-abc12-z"), NS, {k: [v] for k, v in index.items()}
    )
    assert patched is not None
    (container,) = patched[0]
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    # the owner's flags stay, the tuned ones are the plan's (the pod's shape, --tp-size, the owner's)
    assert container["args"][:7] == [
        "--model-path",
        LLAMA,
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--enable-metrics",
    ]
    assert sglang.parse_sglang_args(container["args"]) == sglang.parse_sglang_args(
        [a for a in recommended if a not in ("--tp-size", "1")]
    )
    assert target.pod_carries({"spec": {"containers": [container]}}, "vllm", actuation.settings)
    assert target_webhook.describe(actuation).startswith("t: SGLang --context-length")
    # a pod already rewritten is left alone; one excluded too
    tuned = created_pod(wl, "sg-abc12-w")
    tuned["spec"]["containers"] = [container]
    assert target_webhook.compute_pod_patch(tuned, NS, {k: [v] for k, v in index.items()}) is None
    # the next reconcile sees it published and evicts one pod that does not run it
    await run(body, sg_kube, RecordingEmitter(), now=1.8e9 + 60)
    assert sg_kube.evicted == ["sg-abc12-x"] and body["status"]["evictions"] == 1
    assert "evicted sg-abc12-x" in cond(body, "Ready")["message"]


async def test_webhook_rewrites_tgis_environment_form(tgi_kube: FakeTargetKube) -> None:
    body = tuner("Initial", "tgi")
    await run(body, tgi_kube, RecordingEmitter())
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    wl = tgi_kube.workloads[(NS, "Deployment", "tgi")]
    pod = created_pod(wl, "tgi-abc12-z")
    before = copy.deepcopy(pod)
    patched = target_webhook.compute_pod_patch(pod, NS, {k: [v] for k, v in index.items()})
    assert patched is not None and pod == before  # a patch, not an edit
    (container,) = patched[0]
    assert "command" not in container  # the image's entry point still runs the launcher
    names = [e["name"] for e in container["env"]]
    assert names == ["MODEL_ID", "HF_TOKEN"]  # the tuned flags' variables go, the others stay
    recommended = tgi.parse_tgi_args(body["status"]["recommendation"]["engineArgs"])
    assert container["args"][:4] == ["--hostname", "0.0.0.0", "--port", "80"]
    assert tgi.parse_tgi_args(container["args"]).max_total_tokens == recommended.max_total_tokens
    rec = EngineArgs("TGI", tuple(body["status"]["recommendation"]["engineArgs"]))
    assert target.pod_carries({"spec": {"containers": [container]}}, "tgi", rec)
    assert not target.pod_carries(tgi_kube.pods[0], "tgi", rec)
    # Initial never evicts
    await run(body, tgi_kube, RecordingEmitter(), now=1.8e9 + 60)
    assert tgi_kube.evicted == []


def test_index_needs_the_engines_flags_and_the_engine() -> None:
    status = {
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True"}],
        "discovered": {"container": "server", "engine": "TGI"},
        "recommendation": {"engineArgs": ["--max-total-tokens", "4096"]},
    }
    body_spec = {"targetRef": {"kind": "Deployment", "name": "tgi"}, "updateMode": "Auto"}
    index = target_webhook.index_tuner(NS, "t", body_spec, status, {"generation": 1})
    wanted = EngineArgs("TGI", ("--max-total-tokens", "4096"))
    assert index == {(NS, "Deployment", "tgi"): target_webhook.Actuation("t", "server", wanted)}
    bad = {**status, "recommendation": {"engineArgs": ["--max-total-tokens", "many"]}}
    assert target_webhook.index_tuner(NS, "t", body_spec, bad, {"generation": 1}) is None
    vllm_only = {**status, "discovered": {"container": "server"}}  # vLLM's status has settings, not these
    assert target_webhook.index_tuner(NS, "t", body_spec, vllm_only, {"generation": 1}) is None
