"""The weight cache on the real control plane: a static PersistentVolume bound by the real PV
controller, mounted as the Hugging Face cache of an InferenceService's pods, and a second start of the
same service read from it (a cache hit in the fleet's start-up model, so it starts faster).

What the API server, the PV controller (kube-controller-manager) and the scheduler's volume binding
do is real; the containers are the fleet's (:class:`e2e.fleet.truth.StartupModel`: download, load,
engine start-up).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario
from e2e.fleet.pod import read_weight_cache
from e2e.fleet.stack import Stack, condition
from e2e.fleet.testing import wait_until
from e2e.fleet.truth import StartupModel
from kvpilot.operator.pods import storage

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHECKPOINT_GIB = 15.0
#: 16 GB of Llama-3.1-8B: 30 s of download, 3.75 s of load, 45 s of engine start-up when cold; the
#: fleet plays it 25x faster (3.2 s cold, 2.0 s from the cache).
STARTUP = StartupModel(checkpoint_gib=CHECKPOINT_GIB, wall_per_simulated_s=0.04)
TRUTH = GroundTruth(gpu_memory_gib=79.11, non_kv_gib=20.0, startup=STARTUP, backoff_s=2.0)


@pytest.fixture(scope="module")
def cache_stack(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str]]:
    ns = f"e2e-storage-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    stack = Stack(
        cluster,
        Path(tmp_path_factory.mktemp("storage")),
        namespaces=[ns],
        operator_namespaces=[ns],
        default_scenario=Scenario(name="cache", truth=TRUTH),
    )
    stack.start()
    try:
        yield stack, ns
        assert stack.fleet is not None and not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([ns])
        cluster.kubectl("delete", "pv", f"{ns}-weights", "--ignore-not-found", "--wait=false", check=False)


def _static_volume(ns: str) -> list[dict[str, Any]]:
    """A pre-provisioned volume (what a platform team creates for an NFS or local disk) and a claim that
    the PV controller must bind to it: no storage class, so nothing provisions dynamically."""
    labels = {"kvpilot.io/e2e-volume": ns}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{ns}-weights", "labels": labels},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": f"/var/lib/kvpilot-e2e/{ns}", "type": "DirectoryOrCreate"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "weights", "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "selector": {"matchLabels": labels},
                "resources": {"requests": {"storage": "50Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": ns},
            "stringData": {"token": "hf_e2e_not_a_real_token"},
        },
    ]


def _isvc(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "cached", "namespace": ns},
        "spec": {
            "model": {
                "id": MODEL,
                "source": "Catalogue",
                "storage": {"persistentVolumeClaim": {"claimName": "weights"}},
            },
            "gpu": {"count": 1, "product": H100},
            "serving": {"maxContextLength": 8192},
            "engine": {
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
            },
            "tuning": {"mode": "Off"},
        },
    }


def _pods(stack: Stack, ns: str) -> list[dict[str, Any]]:
    out = stack.kubectl(
        "get", "pods", "-n", ns, "-l", "app.kubernetes.io/instance=cached", "-o", "json"
    ).stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _start_to_serving_s(stack: Stack, ns: str, pod: str) -> tuple[float, dict[str, str]]:
    """Wall seconds from the fleet's container start to serving, and where the weights and the compiled
    graphs came from (the ``Started`` event's ``weights=...`` and ``compile=...``)."""
    assert stack.fleet is not None
    events = [e for e in stack.fleet.events_for(ns) if e.pod == pod]
    started = next(e for e in events if e.kind == "Started")
    serving = next(e for e in events if e.kind == "Serving")
    words = started.detail[started.detail.rindex("weights=") :].split()
    return serving.time - started.time, dict(w.split("=", 1) for w in words)


def test_static_volume_binds_and_a_second_start_is_a_cache_hit(cache_stack: tuple[Stack, str]) -> None:
    stack, ns = cache_stack
    stack.cluster.apply(_static_volume(ns))
    wait_until(
        lambda: (
            json.loads(stack.kubectl("get", "pvc", "weights", "-n", ns, "-o", "json").stdout)["status"].get(
                "phase"
            )
            == "Bound"
        ),
        timeout=60,
        what="the PV controller binds the claim to the static volume",
    )
    pvc = json.loads(stack.kubectl("get", "pvc", "weights", "-n", ns, "-o", "json").stdout)
    assert pvc["spec"]["volumeName"] == f"{ns}-weights"

    stack.cluster.apply([_isvc(ns)])
    stack.wait_isvc(
        ns, "cached", lambda o: condition(o, "Available").get("status") == "True", timeout=120, what="serving"
    )
    (first,) = _pods(stack, ns)
    spec = first["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == storage.VOLUME)
    assert volume["persistentVolumeClaim"]["claimName"] == "weights"
    assert read_weight_cache(first) == f"pvc:{ns}/weights"
    (init,) = spec["initContainers"]
    assert init["name"] == storage.INIT_CONTAINER
    token = next(e for e in init["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}  # never the value
    assert "hf_e2e_not_a_real_token" not in json.dumps(first)
    cold_s, cold_source = _start_to_serving_s(stack, ns, first["metadata"]["name"])
    assert cold_source == {"weights": "download", "compile": "cold"}

    # a restart of the service (the pod is replaced, as a retune or a node drain would): the weights are
    # on the volume now, so the new pod only loads them
    stack.kubectl("delete", "pod", first["metadata"]["name"], "-n", ns, "--wait=false")
    wait_until(
        lambda: any(p["metadata"]["name"] != first["metadata"]["name"] for p in _pods(stack, ns)),
        timeout=60,
        what="the ReplicaSet replaces the pod",
    )
    (second,) = [p for p in _pods(stack, ns) if p["metadata"]["name"] != first["metadata"]["name"]]
    assert stack.fleet is not None
    stack.fleet.wait_for(
        lambda: any(
            e.kind == "Serving" and e.pod == second["metadata"]["name"] for e in stack.fleet.events_for(ns)
        ),
        timeout=120,
        what="the second pod serves",
    )
    warm_s, warm_source = _start_to_serving_s(stack, ns, second["metadata"]["name"])
    # the claim is writable, so kvpilot put VLLM_CACHE_ROOT on it: the same settings' graphs load too
    assert warm_source == {"weights": "cache-hit", "compile": "warm"}
    saved = STARTUP.simulated_seconds(cached=False) - STARTUP.simulated_seconds(
        cached=True, compile_cached=True
    )
    assert cold_s - warm_s > 0.5 * saved * STARTUP.wall_per_simulated_s, (cold_s, warm_s)


def test_kvpilot_probe_budget_outlasts_the_fleets_start_up() -> None:
    """The start-up probe kvpilot renders must never kill a start the fleet's model calls normal, from a
    16 GB to a 700 GB checkpoint, with and without a cache (no cluster needed)."""
    for gib in (15.0, 140.0, 400.0, 700.0):
        model = dataclasses.replace(STARTUP, checkpoint_gib=gib)
        for cached in (False, True):
            threshold = storage.compute_startup_failure_threshold(int(gib * (1 << 30)), cached=cached)
            budget = threshold * storage.STARTUP_PERIOD_S
            assert budget > model.simulated_seconds(cached=cached), (gib, cached, budget)


@pytest.mark.parametrize(
    ("storage_spec", "want"),
    [
        ({"persistentVolumeClaim": {"claimName": "weights"}}, "pvc:ml/weights"),
        ({"hostPath": {"path": "/var/cache/hf"}}, "host:gpu-node-1:/var/cache/hf"),
        (None, None),
    ],
)
def test_the_fleet_finds_the_cache_kvpilot_renders(
    storage_spec: dict[str, Any] | None, want: str | None
) -> None:
    """The fleet reads the weight cache from the pod as kubelet would mount it: from what ``kvpilot render``
    produces for each kind of ``spec.model.storage`` (no cluster needed)."""
    from kvpilot.operator.inferenceservice import render

    model: dict[str, Any] = {"id": MODEL, **({"storage": storage_spec} if storage_spec else {})}
    manifests = render.build_manifests(
        {
            "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1"},
            "spec": {"model": model, "gpu": {"product": "H100-SXM"}, "serving": {"maxContextLength": 8192}},
        }
    )
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    pod = {
        "metadata": {"namespace": "ml"},
        "spec": {**deployment["spec"]["template"]["spec"], "nodeName": "gpu-node-1"},
    }
    assert read_weight_cache(pod) == want
