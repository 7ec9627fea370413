"""A real autoscaler end to end: KEDA scales an InferenceService through ``/scale`` on a vLLM metric.

KEDA's operator and metrics adapter (built from the Go module proxy by e2e/build-keda.sh, started by
``e2e.keda_local.KedaServer``) run against the real control plane; the ScaledObject's Prometheus trigger
queries the real Prometheus for ``vllm:num_requests_waiting``, which the fleet's simulated vLLM pods
export; the HorizontalPodAutoscaler KEDA creates runs in the real kube-controller-manager and writes
the InferenceService's ``spec.replicas`` through its scale subresource; kvpilot's operator carries the
count to the Deployment. Meanwhile the same queue (four sequences allowed, requests waiting, an almost
empty KV cache) makes the closed loop retune (``--max-num-seqs`` up, or ``--gpu-memory-utilization`` down
when the simulated GPU memory runs short): a retune during the scale-out, which must
neither fight the autoscaler's count nor lose it. The closed loop and the HPA react to the same queue in
either order, so retunes are held (``maxChangesPerHour: 0``) until the HPA has scaled out once.

Missing KEDA binaries are an error (``KedaError``), never a skip.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import Scenario, Workload
from e2e.fleet.stack import Stack, condition, deployment_args
from e2e.fleet.testing import H100_8B, catalogue_isvc, wait_until
from e2e.keda_local import KedaServer

NAME = "chat"
H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_REPLICAS = 3
THRESHOLD = 4
"""Requests waiting per replica the HPA aims at (``AverageValue``): the queue below makes that 2, then 3."""
TRUTH = H100_8B
QUIET = Workload(arrival_rate=0.2, prompt_tokens=200, output_tokens=50)
QUEUE = Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200)
"""Per pod: far more than four sequences at a time want to run (the closed-loop suite's ``idle`` case)."""


def isvc_manifest(ns: str) -> dict[str, Any]:
    # no spec.replicas: the autoscaler owns it (through /scale), and a re-apply would not take it back
    tuning = {
        "mode": "Auto",
        "cooldownSeconds": 0,
        "maxChangesPerHour": 0,  # no retune until the HPA has scaled out (the test raises it)
        "rolloutDeadlineSeconds": 30,
    }
    return catalogue_isvc(NAME, ns, MODEL, H100, {"maxContextLength": 8192, "concurrency": 4}, tuning)


def scaled_object(ns: str, prometheus_url: str) -> dict[str, Any]:
    """Scale-ups one pod per 10 s; scale-downs disabled, so any drop of the count is someone else's."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "name": NAME},
            "minReplicaCount": 1,
            "maxReplicaCount": MAX_REPLICAS,
            "pollingInterval": 5,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}],
                        },
                        "scaleDown": {"selectPolicy": "Disabled"},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": f'sum(vllm:num_requests_waiting{{namespace="{ns}"}})',
                        "threshold": str(THRESHOLD),
                    },
                }
            ],
        },
    }


@dataclass
class Sample:
    t: float
    isvc_replicas: int
    deploy_replicas: int | None
    applied: dict[str, Any]


@dataclass
class World:
    cluster: LocalCluster
    stack: Stack
    keda: KedaServer
    ns: str
    samples: list[Sample] = field(default_factory=list)

    def isvc(self) -> dict[str, Any]:
        return self.stack.isvc(self.ns, NAME)

    def hpa(self) -> dict[str, Any]:
        return dict(
            json.loads(
                self.cluster.kubectl("get", "hpa", f"keda-hpa-{NAME}", "-n", self.ns, "-o", "json").stdout
            )
        )

    def hpa_events(self) -> list[dict[str, Any]]:
        sel = f"involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name=keda-hpa-{NAME}"
        out = self.cluster.kubectl("get", "events", "-n", self.ns, "--field-selector", sel, "-o", "json")
        return list(json.loads(out.stdout)["items"])

    def deployment(self) -> dict[str, Any]:
        return dict(self.cluster.get_json(f"/apis/apps/v1/namespaces/{self.ns}/deployments/{NAME}"))

    def sample(self) -> None:
        obj = self.cluster.get_json(
            f"/apis/kvpilot.io/v1alpha1/namespaces/{self.ns}/inferenceservices/{NAME}"
        )
        try:
            deploy: int | None = int(self.deployment()["spec"]["replicas"])
        except Exception:  # not created yet
            deploy = None
        applied = dict(obj.get("status", {}).get("applied") or {})
        self.samples.append(Sample(time.monotonic(), int(obj["spec"]["replicas"]), deploy, applied))

    def diagnostics(self) -> str:
        hpa = self.cluster.kubectl("get", "hpa", "-n", self.ns, "-o", "yaml", check=False).stdout
        so = self.cluster.kubectl("get", "scaledobject", "-n", self.ns, "-o", "yaml", check=False).stdout
        return (
            f"HPA:\n{hpa[-3000:]}\nScaledObject:\n{so[-2000:]}\nkeda:\n{self.keda.log_tail('keda')}\n"
            f"adapter:\n{self.keda.log_tail('keda-adapter')}"
        )


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    run_dir = Path(tmp_path_factory.mktemp("keda"))
    keda = KedaServer(cluster, run_dir / "keda")  # raises KedaError when the build is missing
    ns = f"e2e-keda-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    stack = Stack(
        cluster,
        run_dir,
        namespaces=[ns],
        scenarios={(ns, NAME): Scenario(name=NAME, truth=TRUTH, workload=QUIET)},
    )
    stop = threading.Event()
    try:
        keda.start()
        stack.start()
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        w = World(cluster, stack, keda, ns)
        cluster.apply(isvc_manifest(ns))

        def sampler() -> None:
            while not stop.wait(1.0):
                with contextlib.suppress(Exception):  # the API server is busy; the next second counts
                    w.sample()

        threading.Thread(target=sampler, name="keda-sampler", daemon=True).start()
        yield w
        assert stack.fleet is not None and not stack.fleet.errors, stack.fleet.errors
    finally:
        stop.set()
        # the ScaledObject's finalizer needs KEDA running, the InferenceService's the operator
        cluster.kubectl("delete", "scaledobject", "--all", "-n", ns, "--timeout=60s", check=False)
        stack.stop_and_clean([ns])
        keda.stop()
        print(f"KEDA run directory (KEDA, operator and Prometheus logs): {run_dir}")


def _applied(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("applied") or {})


def _retunes(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in obj.get("status", {}).get("history") or [] if h.get("action") == "Retuned"]


def _hpa_active(hpa: dict[str, Any]) -> bool:
    conds = hpa.get("status", {}).get("conditions") or []
    return any(c["type"] == "ScalingActive" and c["status"] == "True" for c in conds)


def test_keda_scales_an_inferenceservice_and_a_retune_keeps_the_count(world: World) -> None:
    w, stack = world, world.stack
    planned = _applied(stack.wait_isvc(w.ns, NAME, _applied, timeout=120, what="planned and applied"))
    assert planned["maxNumSeqs"] == 4, planned
    obj = w.isvc()
    selector = obj["status"].get("selector")
    assert selector and f"app.kubernetes.io/instance={NAME}" in selector, obj["status"]

    # KEDA made an HPA on the InferenceService; with an empty queue it holds one replica
    w.cluster.apply(scaled_object(w.ns, stack.prom.url))
    try:
        hpa = wait_until(
            lambda: (h := w.hpa()) and _hpa_active(h) and h, timeout=120, what="KEDA's HPA active"
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{w.diagnostics()}") from None
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
        "kvpilot.io/v1alpha1",
        "InferenceService",
        NAME,
    ), ref
    assert hpa["spec"]["metrics"][0]["type"] == "External", hpa["spec"]["metrics"]
    time.sleep(10)  # two HPA syncs (5 s) on the quiet metric
    assert w.isvc()["spec"]["replicas"] == 1
    assert int(w.deployment()["spec"]["replicas"]) == 1

    # the queue grows: the HPA scales the InferenceService out through /scale, the Deployment follows
    t_load = time.monotonic()
    stack.fleet.set_scenario(w.ns, NAME, Scenario(name=NAME, truth=TRUTH, workload=QUEUE))
    try:
        wait_until(lambda: w.isvc()["spec"]["replicas"] >= 2, timeout=150, what="the HPA to scale out to 2+")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{w.diagnostics()}") from None

    # the write came from the HPA (which only scales through /scale): its SuccessfulRescale event. (The
    # InferenceService's managedFields do not name the scale writer here, so they cannot tell.)
    def rescaled_to_2() -> bool:
        rescales = [e["message"] for e in w.hpa_events() if e.get("reason") == "SuccessfulRescale"]
        return any(m.startswith("New size: 2;") for m in rescales)

    wait_until(rescaled_to_2, timeout=30, what="the HPA's SuccessfulRescale event (New size: 2)")
    wait_until(
        lambda: int(w.deployment()["spec"]["replicas"]) == w.isvc()["spec"]["replicas"] >= 2,
        timeout=60,
        what="the Deployment to follow the InferenceService's replicas",
    )

    # the closed loop retunes on the same load (a --max-num-seqs raise for the queue, or a lower
    # --gpu-memory-utilization when the simulated GPU memory runs short), while the count is the
    # autoscaler's: retunes are allowed now (a spec change: the reconcile re-applies the Deployment too),
    # while the HPA goes on scaling out (one pod per 10 s, up to MAX_REPLICAS)
    w.cluster.kubectl(
        "patch",
        "inferenceservice",
        NAME,
        "-n",
        w.ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"tuning": {"maxChangesPerHour": 60}}}),
    )
    obj = stack.wait_isvc(w.ns, NAME, _retunes, timeout=360, what="a retune")
    change = _retunes(obj)[0]
    assert change["trigger"] in ("IdleCapacity", "GpuMemoryPressure"), change
    assert change["to"] != change["from"] and change["from"]["maxNumSeqs"] == 4, change
    obj = stack.wait_isvc(
        w.ns,
        NAME,
        lambda o: (
            condition(o, "Ready").get("status") == "True"
            and not o.get("status", {}).get("rollout")
            and condition(o, "RolloutInProgress").get("status") != "True"
        ),
        timeout=180,
        what="the retune rolled out",
    )
    applied, args = _applied(obj), deployment_args(w.cluster.kubectl, w.ns, NAME)
    assert (args.max_num_seqs, args.gpu_memory_utilization) == (
        applied["maxNumSeqs"],
        applied["gpuMemoryUtilization"],
    ), (args, applied)
    assert applied != planned, applied
    # status.applied takes the retune when its rollout is done: by then the autoscaler's count was in place
    # (the sampler reads every second)
    during = wait_until(
        lambda: [s for s in w.samples if all(s.applied.get(k) == v for k, v in change["to"].items())],
        timeout=30,
        what="a sample with the retune applied",
    )
    assert during[0].isvc_replicas >= 2, (during[:1], w.samples[-5:])

    # neither fought nor lost: the count only ever grew (scale-downs are disabled), on both objects,
    # and ends where the autoscaler put it
    def settled() -> bool:
        hpa, isvc, dep = w.hpa(), w.isvc(), w.deployment()
        want = hpa.get("status", {}).get("desiredReplicas")
        return bool(
            want
            and want >= 2
            and isvc["spec"]["replicas"] == want == int(dep["spec"]["replicas"])
            and (dep.get("status", {}).get("readyReplicas") or 0) == want
            and isvc.get("status", {}).get("replicas") == want
        )

    wait_until(settled, timeout=120, what="HPA, InferenceService and Deployment agree, all replicas Ready")
    samples = [s for s in w.samples if s.t >= t_load]
    isvc_counts = [s.isvc_replicas for s in samples]
    assert isvc_counts == sorted(isvc_counts), isvc_counts
    deploy_counts = [s.deploy_replicas for s in samples if s.deploy_replicas is not None]
    assert deploy_counts == sorted(deploy_counts), deploy_counts
    assert max(isvc_counts) <= MAX_REPLICAS
