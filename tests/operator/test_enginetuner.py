"""The EngineTuner (target mode): discovery, the plan, status per mode, the webhook's patch, Auto's
evictions; with an in-memory API and the real planner."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest
from operator_fakes import H100_LABELS, L4_LABELS, node_object

from e2e.pods import termination_message
from kvpilot.operator import api
from kvpilot.operator.clients import pod_logs
from kvpilot.operator.enginetuner import target, target_deps, target_eviction, target_handlers, target_webhook
from kvpilot.operator.pods import pod_reading, pod_view
from kvpilot.operator.status import status_patch
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner import gpus, vllm
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.model.catalogue import lookup_model_config
from kvpilot.tuner.plan import compute_topology_budget
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import command as vllm_command

FORBIDDEN_BODY = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"tuned\\" is '
    'forbidden: User \\"system:serviceaccount:kvpilot:kvpilot\\" cannot get resource \\"pods/log\\" in API '
    'group \\"\\" in the namespace \\"team\\"","reason":"Forbidden","details":{"name":"tuned","kind":"pods"},'
    '"code":403}'
)
"""The API server's answer to a pods/log read the RBAC refuses."""
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
NS = "team"
# The argument layout of vLLM production-stack's helm/templates/deployment-vllm-multi.yaml (all in command).
PS_COMMAND = [
    "vllm",
    "serve",
    LLAMA,
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--no-enable-prefix-caching",
    "--max-model-len",
    "131072",
    "--max-num-seqs",
    "256",
    "--gpu_memory_utilization",
    "0.95",
]
# KServe's vLLM runtime (config/runtimes/kserve-vllmserver.yaml): a script passing "$@", flags in args.
KS_COMMAND = [
    "bash",
    "-c",
    "export MODEL=${MODEL_DIR}\nvllm serve ${MODEL} --host 0.0.0.0 --port 8000 $@\n",
    "bash",
]
KS_ARGS = ["--max-model-len=65536", "--max-num-seqs", "64"]


def deployment(
    name: str, command: list[str], args: list[str] | None = None, **container: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.33.0",
        "command": command,
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        **container,
    }
    if args is not None:
        c["args"] = args
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"model": name}},
            "template": {"metadata": {"labels": {"model": name}}, "spec": {"containers": [c]}},
        },
    }


def pod_of(
    workload: dict[str, Any],
    name: str,
    *,
    node: str | None = "l4-0",
    ready: bool = True,
    crash: bool = False,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    template = copy.deepcopy(workload["spec"]["template"])
    wl = workload["metadata"]["name"]
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "creationTimestamp": created,
            "labels": {**template["metadata"]["labels"], "pod-template-hash": "abc12"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": f"{wl}-abc12", "controller": True}],
        },
        "spec": {**template["spec"], **({"nodeName": node} if node else {})},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "state": ({"waiting": {"reason": "CrashLoopBackOff"}} if crash else {"running": {}}),
                }
            ],
        },
    }


class FakeTargetKube:
    def __init__(self) -> None:
        self.workloads: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.nodes = [node_object("l4-0", L4_LABELS), node_object("l4-1", L4_LABELS)]
        self.config_maps: dict[tuple[str, str], dict[str, str]] = {}
        self.evicted: list[str] = []
        self.pdb_blocks = False
        self.writes = 0
        self.logs: dict[str, pod_view.PreviousLog] = {}
        self.log_reads: list[tuple[str, str]] = []

    def read_config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.config_maps.get((namespace, name))

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def list_node_labels(self, label_selector: str) -> list[dict[str, str]]:
        return [dict(n["metadata"]["labels"]) for n in self.nodes]

    def read_persistent_volume_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def list_active_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def apply(self, manifest: Any) -> None:
        self.writes += 1

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def read_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def read_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        return self.workloads.get((namespace, kind, name))

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(t.split("=", 1) for t in label_selector.split(",") if t)
        return [p for p in self.pods if wanted.items() <= p["metadata"]["labels"].items()]

    def read_previous_log(
        self, namespace: str, pod: str, container: str, tail_lines: int
    ) -> pod_view.PreviousLog:
        self.log_reads.append((pod, container))
        return self.logs.get(pod)

    def evict_pod(self, namespace: str, name: str) -> bool:
        if self.pdb_blocks:
            return False
        self.evicted.append(name)
        return True


def tuner(mode: str = "Recommend", target_name: str = "llama", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "EngineTuner",
        "metadata": {"name": "t", "namespace": NS, "generation": 1, "uid": "u1"},
        "spec": {"targetRef": {"kind": "Deployment", "name": target_name}, "updateMode": mode, **spec},
        "status": {},
    }


async def run(
    body: dict[str, Any], kube: FakeTargetKube, emitter: RecordingEmitter, now: float = 1.8e9
) -> None:
    patch = kopf.Patch()
    deps = target_deps.TargetDeps(kube=kube, emit=emitter, clock=lambda: now)
    try:
        await target_handlers.reconcile(
            body=body,
            spec=body["spec"],
            meta=body["metadata"],
            status=body["status"],
            patch=patch,
            logger=logging.getLogger("test"),
            deps=deps,
        )
    finally:
        status = body["status"]
        for key, value in (patch.get("status") or {}).items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        for fn in patch.fns:
            fn(body)


def cond(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


@pytest.fixture
def kube() -> FakeTargetKube:
    pod_reading.LOGS.clear()  # the process's previous-log cache: no test sees another's reads
    k = FakeTargetKube()
    ps = deployment("llama", PS_COMMAND)
    k.workloads[(NS, "Deployment", "llama")] = ps
    k.pods = [pod_of(ps, "llama-abc12-x")]
    return k


async def test_recommend_discovers_and_recommends_without_writing(kube: FakeTargetKube) -> None:
    body, emitter = tuner("Recommend"), RecordingEmitter()
    await run(body, kube, emitter)
    st = body["status"]
    assert st["discovered"]["model"] == LLAMA
    assert st["discovered"]["settings"] == {
        "maxModelLen": 131072,
        "maxNumSeqs": 256,
        "gpuMemoryUtilization": 0.95,
    }
    assert st["discovered"]["gpuProduct"] == "NVIDIA-L4" and st["discovered"]["gpuCount"] == 1
    rec = st["recommendation"]["settings"]
    assert rec["maxModelLen"] < 131072  # 128k does not fit the L4's KV cache; the plan shortens it
    assert cond(body, "Ready")["reason"] == "Recommending" and cond(body, "Discovered")["status"] == "True"
    assert st["discovered"]["podsTuned"] == 0
    assert "Recommended" in emitter.reasons
    assert kube.writes == 0 and kube.evicted == []


async def test_off_plans_and_reports_only(kube: FakeTargetKube) -> None:
    body = tuner("Off")
    await run(body, kube, RecordingEmitter())
    assert "recommendation" not in body["status"]
    assert cond(body, "Planned")["status"] == "True" and cond(body, "Ready")["reason"] == "Reporting"


async def test_kserve_target_needs_the_model_and_says_so(kube: FakeTargetKube) -> None:
    ks = deployment(
        "isvc-predictor", KS_COMMAND, KS_ARGS, env=[{"name": "MODEL_DIR", "value": "/mnt/models"}]
    )
    kube.workloads[(NS, "Deployment", "isvc-predictor")] = ks
    kube.pods = [pod_of(ks, "isvc-predictor-abc12-y")]
    body = tuner("Recommend", "isvc-predictor")
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    assert cond(body, "Discovered")["reason"] == "DiscoveryIncomplete"
    assert "set spec.model" in cond(body, "Discovered")["message"]
    body = tuner("Recommend", "isvc-predictor", model={"id": LLAMA})
    await run(body, kube, RecordingEmitter())
    assert body["status"]["discovered"]["settings"] == {"maxModelLen": 65536, "maxNumSeqs": 64}
    assert body["status"]["discovered"]["argsOrigin"] == "args"


async def test_missing_target_and_unlabelled_nodes(kube: FakeTargetKube) -> None:
    body = tuner("Recommend", "nope")
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    assert cond(body, "TargetFound")["reason"] == "TargetNotFound"
    kube.pods[0]["spec"].pop("nodeName")
    body = tuner("Recommend")
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    assert "spec.gpu.product" in cond(body, "Discovered")["message"]
    body = tuner("Recommend", gpu={"product": "NVIDIA-L4"})
    await run(body, kube, RecordingEmitter())
    assert body["status"]["recommendation"]["settings"]["maxModelLen"] > 0


async def test_config_file_from_a_config_map(kube: FakeTargetKube) -> None:
    wl = deployment(
        "cfg",
        ["vllm", "serve", LLAMA, "--config", "/etc/vllm/engine.yaml"],
        volumeMounts=[{"name": "cfg", "mountPath": "/etc/vllm"}],
    )
    wl["spec"]["template"]["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "engine"}}]
    kube.workloads[(NS, "Deployment", "cfg")] = wl
    kube.pods = [pod_of(wl, "cfg-abc12-z")]
    kube.config_maps[(NS, "engine")] = {"engine.yaml": "max-num-seqs: 12\nmax_model_len: 4096\n"}
    body = tuner("Recommend", "cfg")
    await run(body, kube, RecordingEmitter())
    assert body["status"]["discovered"]["settings"] == {"maxNumSeqs": 12, "maxModelLen": 4096}
    assert "ConfigMap engine" in body["status"]["discovered"]["argsOrigin"]


async def test_invalid_spec_is_a_condition(kube: FakeTargetKube) -> None:
    body = tuner("Sometimes")
    with pytest.raises(kopf.PermanentError):
        await run(body, kube, RecordingEmitter())
    assert cond(body, "Ready")["reason"] == "InvalidSpec"


async def _actuation(kube: FakeTargetKube, mode: str) -> tuple[dict[str, Any], Any]:
    body = tuner(mode)
    await run(body, kube, RecordingEmitter())
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    return body, index


async def test_webhook_rewrites_only_the_targets_new_pods(kube: FakeTargetKube) -> None:
    body, index = await _actuation(kube, "Initial")
    assert index is not None
    ((key, actuation),) = index.items()
    assert key == (NS, "Deployment", "llama")
    lookup = {k: [v] for k, v in index.items()}
    wl = kube.workloads[(NS, "Deployment", "llama")]
    new_pod = pod_of(wl, "", node=None)
    found = target_webhook.compute_pod_patch(new_pod, NS, lookup)
    assert found is not None
    containers, _ = found
    (c,) = containers
    assert {k: v for k, v in c.items() if k != "command"} == {
        k: v for k, v in new_pod["spec"]["containers"][0].items() if k != "command"
    }  # only the command changed
    parsed = vllm_command.find_vllm_command(c["command"], [])
    assert parsed is not None
    rec = body["status"]["recommendation"]["settings"]
    assert vllm_command.compute_command_settings(parsed).max_model_len == rec["maxModelLen"]
    assert c["command"][:8] == PS_COMMAND[:8]
    # the pod now carries it; excluded pods and other workloads' pods are left alone
    assert target.pod_carries({"spec": {"containers": containers}}, "vllm", actuation.settings)
    excluded = copy.deepcopy(new_pod)
    excluded["metadata"]["labels"][target.EXCLUDE_LABEL] = "true"
    assert target_webhook.compute_pod_patch(excluded, NS, lookup) is None
    other = copy.deepcopy(new_pod)
    other["metadata"]["ownerReferences"][0]["name"] = "llama-v2-abc12"
    assert target_webhook.compute_pod_patch(other, NS, lookup) is None
    assert target_webhook.compute_pod_patch(new_pod, "elsewhere", lookup) is None


async def test_index_only_for_actuating_modes_at_the_current_generation(kube: FakeTargetKube) -> None:
    _, index = await _actuation(kube, "Recommend")
    assert index is None
    body, index = await _actuation(kube, "Auto")
    assert index is not None
    body["metadata"]["generation"] = 2  # a spec change not yet reconciled: no stale recommendation
    assert target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"]) is None


async def test_initial_never_evicts_and_auto_evicts_one_at_a_time(kube: FakeTargetKube) -> None:
    wl = kube.workloads[(NS, "Deployment", "llama")]
    kube.pods = [pod_of(wl, "a"), pod_of(wl, "b")]
    await run(tuner("Initial"), kube, RecordingEmitter())
    assert kube.evicted == []
    body, emitter = tuner("Auto"), RecordingEmitter()
    await run(body, kube, emitter)
    # not before the webhook can read the recommendation from the status: a replacement would be untuned
    assert kube.evicted == [] and "not in the status yet" in cond(body, "Ready")["message"]
    await run(body, kube, emitter, now=1.8e9 + 1)
    assert kube.evicted == ["a"] and "Evicted" in emitter.reasons
    assert body["status"]["evictions"] == 1
    await run(body, kube, emitter, now=1.8e9 + 5)  # within the interval: no second eviction
    assert kube.evicted == ["a"]


def test_compute_eviction_prefers_crash_loops_and_waits_for_readiness() -> None:
    wl = deployment("llama", PS_COMMAND)
    rec = EngineSettings(max_model_len=8192, max_num_seqs=8, gpu_memory_utilization=0.9)
    now = 1.8e9
    ok, crashing = pod_of(wl, "ok"), pod_of(wl, "crash", ready=False, crash=True)
    victim, _ = target_eviction.compute_eviction(
        [ok, crashing], "vllm", rec, now=now, last_eviction=now - 1, interval_s=30, schedulable=True
    )
    assert victim == "crash"  # at once: it serves nothing
    starting = pod_of(wl, "starting", ready=False)
    victim, why = target_eviction.compute_eviction(
        [ok, starting], "vllm", rec, now=now, last_eviction=None, interval_s=30, schedulable=True
    )
    assert victim is None and "not Ready" in why
    victim, why = target_eviction.compute_eviction(
        [ok], "vllm", rec, now=now, last_eviction=None, interval_s=30, schedulable=False
    )
    assert victim is None and "holding" in why
    tuned_cmd = vllm.build_vllm_args(rec)
    tuned = deployment("llama", ["vllm", "serve", LLAMA, *tuned_cmd])
    victim, why = target_eviction.compute_eviction(
        [pod_of(tuned, "t")], "vllm", rec, now=now, last_eviction=None, interval_s=30, schedulable=True
    )
    assert victim is None and "every pod" in why


async def test_pdb_refusal_is_not_an_error(kube: FakeTargetKube) -> None:
    kube.pdb_blocks = True
    body = tuner("Auto")
    await run(body, kube, RecordingEmitter())
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 1)
    assert "PodDisruptionBudget refused" in cond(body, "Ready")["message"] and kube.evicted == []


CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total "
    "capacity of 22.03 GiB of which 140.75 MiB is free."
)


def tuned_pod(body: dict[str, Any], kube: FakeTargetKube, name: str) -> dict[str, Any]:
    """A new pod of the target as the webhook admits it (with the status' recommendation)."""
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    pod = pod_of(kube.workloads[(NS, "Deployment", "llama")], name)
    found = target_webhook.compute_pod_patch(pod, NS, {k: [v] for k, v in index.items()})
    assert found is not None
    pod["spec"]["containers"] = found[0]
    return pod


def crashed(
    pod: dict[str, Any], at: float, message: str = CUDA_OOM, reason: str = "Error", container: str = "vllm"
) -> dict[str, Any]:
    """``pod`` with its engine ``container`` crash-looping after exiting with ``message`` at ``at``."""
    pod["status"] = {
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {
                "name": container,
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": reason,
                        "message": message,
                        "finishedAt": status_patch.format_time(at),
                    }
                },
            }
        ],
    }
    return pod


def compact(wire: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if v is not None}


async def test_a_crash_of_the_recommendation_lowers_it_and_auto_replaces_it(kube: FakeTargetKube) -> None:
    now = 1.8e9
    wl = kube.workloads[(NS, "Deployment", "llama")]
    kube.pods = [crashed(pod_of(wl, "owners"), now - 100)]  # the owner's settings crash before the tuner
    body, emitter = tuner("Auto"), RecordingEmitter()
    await run(body, kube, emitter, now=now)
    await run(body, kube, emitter, now=now + 1)
    planned = body["status"]["recommendation"]["settings"]
    assert [h["action"] for h in body["status"]["history"]] == ["Planned"]
    assert kube.evicted == ["owners"]  # not the recommendation's crash: replaced, nothing lowered
    assert "failedSettings" not in body["status"]

    kube.pods = [crashed(tuned_pod(body, kube, "tuned"), now + 40)]
    await run(body, kube, emitter, now=now + 60)
    st = body["status"]
    lowered = st["recommendation"]["settings"]
    assert lowered != planned and st["recommendation"]["trigger"] == "CudaOOM"
    *_, last = st["history"]
    assert (last["action"], last["trigger"]) == ("Retuned", "CudaOOM")
    assert compact(last["from"]) == compact(planned) and compact(last["to"]) == compact(lowered)
    assert [compact(f) for f in st["failedSettings"]] == [compact(planned)]
    assert (lowered.get("gpuMemoryUtilization") or 1.0) < (planned.get("gpuMemoryUtilization") or 1.0) or (
        lowered["maxNumSeqs"] < planned["maxNumSeqs"]
    )
    assert "Retuned" in emitter.reasons
    assert kube.evicted == ["owners"]  # once the webhook can read the lowered settings:
    await run(body, kube, emitter, now=now + 61)
    assert body["status"]["recommendation"]["settings"] == lowered
    assert kube.evicted == ["owners", "tuned"]  # it crash-loops with settings that are no longer recommended
    # the webhook now admits the lowered settings, and a healthy pod of them keeps them
    kube.pods = [tuned_pod(body, kube, "lowered")]
    settings = api.Settings.model_validate(lowered).to_engine()
    assert target.pod_carries(kube.pods[0], "vllm", settings)
    history = list(st["history"])
    await run(body, kube, emitter, now=now + 120)
    assert body["status"]["recommendation"]["settings"] == lowered and body["status"]["history"] == history


async def test_a_crash_no_argument_fixes_is_recorded_once_and_changes_nothing(kube: FakeTargetKube) -> None:
    now = 1.8e9
    body, emitter = tuner("Initial"), RecordingEmitter()
    await run(body, kube, emitter, now=now)
    planned = body["status"]["recommendation"]["settings"]
    kube.pods = [crashed(tuned_pod(body, kube, "p"), now + 10, message="Killed", reason="OOMKilled")]
    await run(body, kube, emitter, now=now + 20)
    await run(body, kube, emitter, now=now + 40)
    st = body["status"]
    assert st["recommendation"]["settings"] == planned
    assert [h["action"] for h in st["history"]] == ["Planned", "Held"]
    assert "memory limit" in st["history"][-1]["reason"]
    assert kube.evicted == []  # Initial never evicts


async def test_the_targets_eager_flag_is_planned_for(kube: FakeTargetKube) -> None:
    """A target running ``--enforce-eager`` captures no CUDA graphs: the EngineTuner budgets none."""
    graphs = await run_budget(kube, PS_COMMAND)
    eager = await run_budget(kube, [*PS_COMMAND, "--enforce-eager"])
    assert graphs["cudaGraphGiB"] > 0 and eager["cudaGraphGiB"] == 0
    assert eager["kvCacheTokens"] > graphs["kvCacheTokens"]


async def run_budget(kube: FakeTargetKube, command: list[str]) -> dict[str, Any]:
    ps = deployment("llama", command)
    kube.workloads[(NS, "Deployment", "llama")] = ps
    kube.pods = [pod_of(ps, "llama-abc12-x")]
    body = tuner("Off")
    await run(body, kube, RecordingEmitter())
    budget: dict[str, Any] = body["status"]["budget"]
    return budget


REAL_LOGS = Path(__file__).resolve().parents[1] / "data" / "vllm_logs" / "0.32-cpu"


def crashed_in(pod: dict[str, Any], container: str, at: float, message: str) -> dict[str, Any]:
    """``crashed``, for a vLLM container named ``container``."""
    crashed(pod, at, message)
    pod["status"]["containerStatuses"][0]["name"] = container
    return pod


async def test_a_start_up_failure_only_the_previous_log_explains_is_read_from_it(
    kube: FakeTargetKube,
) -> None:
    """A real vLLM 0.32 start-up failure: the termination message (kubelet's last 80 lines / 2 KiB) holds
    only "Engine core initialization failed"; the EngineTuner reads the previous log of the target's vLLM
    container (here named ``server``), once per restart, as an InferenceService does, and lowers the
    context from vLLM's own estimate."""
    now = 1.8e9
    wl = deployment("llama", PS_COMMAND)
    wl["spec"]["template"]["spec"]["containers"][0]["name"] = "server"
    kube.workloads[(NS, "Deployment", "llama")] = wl
    kube.pods = [pod_of(wl, "owners")]
    body, emitter = tuner("Initial"), RecordingEmitter()
    await run(body, kube, emitter, now=now)
    planned = body["status"]["recommendation"]["settings"]
    log = (REAL_LOGS / "f1-kv-too-small.log").read_text()
    message = termination_message(log)
    assert "Engine core initialization failed" in message and "max_model_len" not in message
    kube.pods = [crashed_in(tuned_pod(body, kube, "tuned"), "server", now + 40, message)]
    kube.logs["tuned"] = log
    await run(body, kube, emitter, now=now + 60)
    await run(body, kube, emitter, now=now + 61)
    assert kube.log_reads == [("tuned", "server")]  # once for this restart, of the vLLM container
    st = body["status"]
    assert st["recommendation"]["trigger"] == "KvCacheTooSmall"
    assert st["recommendation"]["settings"]["maxModelLen"] < planned["maxModelLen"]
    *_, last = st["history"]
    assert (last["action"], last["trigger"]) == ("Retuned", "KvCacheTooSmall")


async def test_an_unreadable_previous_log_says_why_in_the_tuners_history(kube: FakeTargetKube) -> None:
    """The same failure with the log forbidden (RBAC): nothing to lower from, and the reason says that the
    operator may not read pods/log and what to grant."""
    now = 1.8e9
    body, emitter = tuner("Initial"), RecordingEmitter()
    await run(body, kube, emitter, now=now)
    message = termination_message((REAL_LOGS / "f1-kv-too-small.log").read_text())
    kube.pods = [crashed(tuned_pod(body, kube, "tuned"), now + 40, message)]
    kube.logs["tuned"] = pod_logs.compute_unread_log(403, FORBIDDEN_BODY, NS)
    await run(body, kube, emitter, now=now + 60)
    reasons = " ".join(h["reason"] for h in body["status"]["history"])
    assert "may not get pods/log in namespace team" in reasons and "grant" in reasons, reasons


async def test_available_and_degraded_follow_the_targets_pods(kube: FakeTargetKube) -> None:
    """The target's pods set ``Available`` (a Ready replica, whatever flags it runs: its owner rolls them)
    and ``Degraded`` (the most telling fault a pod shows), as an InferenceService's pods set its own."""
    ps = kube.workloads[(NS, "Deployment", "llama")]
    kube.pods = [pod_of(ps, "llama-abc12-x"), pod_of(ps, "llama-abc12-y", ready=False, crash=True)]
    body = tuner("Recommend")
    await run(body, kube, RecordingEmitter())
    available, degraded = cond(body, "Available"), cond(body, "Degraded")
    assert (available["status"], available["reason"]) == ("True", "Serving")
    assert available["message"].startswith("1 of 2 replicas are Ready")
    assert (degraded["status"], degraded["reason"]) == ("True", "CrashLoopBackOff")
    assert "llama-abc12-y" in degraded["message"]
    kube.pods = [
        pod_of(ps, "llama-abc12-x", ready=False),
        pod_of(ps, "llama-abc12-y", node=None, ready=False),
    ]
    kube.pods[1]["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
    )
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 60)
    available, degraded = cond(body, "Available"), cond(body, "Degraded")
    assert (available["status"], available["reason"]) == ("False", "Unschedulable")
    assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")
    kube.pods = [pod_of(ps, "llama-abc12-x")]
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 120)
    assert cond(body, "Available")["status"] == "True"
    assert (cond(body, "Degraded")["status"], cond(body, "Degraded")["reason"]) == ("False", "Healthy")


async def test_a_pod_of_data_parallel_engines_is_planned_one_engine_at_a_time(kube: FakeTargetKube) -> None:
    """``vllm serve ... -dp 4 -ep`` on 4 H100s: four engines of one GPU, each with its own KV cache and the
    routed experts split over all four. The recommendation is one engine's (the flags vLLM gives each rank),
    its budget the tuner's for those flags on the pod's GPUs, and the status says how the ranks split."""
    model = "Qwen/Qwen3-30B-A3B"
    command = ["vllm", "serve", model, "-dp", "4", "--enable-expert-parallel", "--max-model-len", "32768"]
    wl = deployment("moe", command, resources={"limits": {"nvidia.com/gpu": 4}})
    wl["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "h100"}
    kube.workloads[(NS, "Deployment", "moe")] = wl
    kube.nodes = [node_object("h100-0", H100_LABELS)]
    kube.pods = [pod_of(wl, "moe-abc12-x", node="h100-0")]
    body = tuner("Recommend", target_name="moe")
    await run(body, kube, RecordingEmitter())
    st = body["status"]
    assert st["discovered"]["gpuCount"] == 4, st["discovered"]
    settings = api.Settings.model_validate(st["recommendation"]["settings"]).to_engine()
    assert settings.tensor_parallel_size == 1  # each rank's own GPU
    engine = vllm.build_engine_flags(command[3:])
    expected = compute_topology_budget(
        build_model_spec(lookup_model_config(model)),
        gpus.lookup_gpu("H100-SXM"),
        4,
        settings,
        "0.33.0",
        engine=engine,
    )
    assert st["budget"]["weightsGiB"] == pytest.approx(expected.weights_gib, abs=0.01)
    assert st["budget"]["kvCacheTokens"] == expected.kv_cache_tokens
    assert any("this pod runs 4 of them" in w for w in st["warnings"]), st["warnings"]
