"""``spec.template``, ``spec.podSecurity: Restricted`` and ``/scale`` on the real control plane.

The operator runs on the host (:func:`e2e.waits.host_operator`), watching only ``kvtpl-*`` namespaces. The
Deployment controller, the ReplicaSet controller, the scheduler and the API server's admission (PodSecurity,
ServiceAccount) are the real upstream code; KWOK plays the kubelet of the L4 nodes. Evidence (issue 13):

* the template's fields are on the pod the ReplicaSet controller created (not only on the Deployment);
* a template that contradicts what kvpilot owns is Ready=False ``InvalidSpec`` naming the field, with
  an event;
* a namespace labelled ``pod-security.kubernetes.io/enforce=restricted`` admits the pod of a
  ``podSecurity: Restricted`` service, and refuses the same service's ``Default`` pod (so the check can fail);
* ``kubectl scale inferenceservices.kvpilot.io/NAME --replicas 3`` scales it; a reconcile keeps 3.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.waits import host_operator, wait_established, wait_for

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"
RESOURCE = "inferenceservices.kvpilot.io"
NS_PREFIX = "kvtpl-"
WAIT_S = 180.0

BASE: dict[str, Any] = {
    "apiVersion": "kvpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "svc"},
    "spec": {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "source": "Catalogue"},
        "gpu": {"count": 1, "product": "NVIDIA-L4"},
        "serving": {"maxContextLength": 8192},
        "tuning": {"mode": "Auto"},
    },
}


def _get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), None
    )


def _ready_settled(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = _get(cluster, RESOURCE, name, "-n", ns)
        ready = _condition(obj, "Ready")
        settled = bool(ready) and ready.get("observedGeneration") == (obj or {})["metadata"]["generation"]
        return obj if settled else None

    return wait_for(check, WAIT_S, f"{ns}/{name} Ready for its generation")


def _pods(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    pods = _get(cluster, "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={name}") or {"items": []}
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def _apply(cluster: LocalCluster, ns: str, doc: dict[str, Any]) -> None:
    proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode == 0, proc.stderr


def _service(name: str, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    return doc


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cluster.kubectl("apply", "-f", str(CRD))
    wait_established(cluster.kubectl, f"crd/{RESOURCE}")
    log = tmp_path_factory.mktemp("operator") / "kopf.log"
    with host_operator(cluster, log, f"{NS_PREFIX}*"):
        yield log


@pytest.fixture
def ns(cluster: LocalCluster, operator: Path) -> Iterator[str]:
    name = f"{NS_PREFIX}{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(name):
        yield name


TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "search"}, "annotations": {"example.com/owner": "search-team"}},
    "spec": {
        "serviceAccountName": "vllm-runner",
        "dnsPolicy": "ClusterFirst",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"team": "search"}},
            }
        ],
        "volumes": [{"name": "extra", "emptyDir": {}}],
        "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
        "containers": [
            {"name": "vllm", "volumeMounts": [{"name": "extra", "mountPath": "/extra"}]},
            {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"},
        ],
    },
}


def test_template_fields_are_on_the_rendered_pod(cluster: LocalCluster, ns: str) -> None:
    cluster.kubectl("create", "serviceaccount", "vllm-runner", "-n", ns)
    _apply(cluster, ns, _service("shaped", template=TEMPLATE))
    ready = _condition(_ready_settled(cluster, ns, "shaped"), "Ready")
    assert ready is not None and ready["status"] != "False", ready
    pod = wait_for(lambda: _pods(cluster, ns, "shaped"), WAIT_S, "the pod")[0]
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "search" and meta["labels"]["app.kubernetes.io/instance"] == "shaped"
    assert meta["annotations"]["example.com/owner"] == "search-team"
    assert spec["serviceAccountName"] == "vllm-runner"
    assert spec["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": {"team": "search"}}
    assert [c["name"] for c in spec["containers"]] == ["vllm", "proxy"]
    assert [c["name"] for c in spec["initContainers"]][0] == "warm"
    vllm = spec["containers"][0]
    assert {"name": "extra", "mountPath": "/extra"} in vllm["volumeMounts"]
    assert "--max-model-len" in vllm["args"]  # the tuned flags are still kvpilot's
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "extra" in [v["name"] for v in spec["volumes"]]


def test_a_template_contradicting_kvpilot_is_invalid_spec(cluster: LocalCluster, ns: str) -> None:
    mount = {"name": "shm2", "mountPath": "/dev/shm"}
    bad = {
        "spec": {
            "volumes": [{"name": "shm2", "emptyDir": {}}],
            "containers": [{"name": "vllm", "volumeMounts": [mount]}],
        }
    }
    _apply(cluster, ns, _service("clash", template=bad))
    ready = _condition(_ready_settled(cluster, ns, "clash"), "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert "spec.template.spec.containers[vllm].volumeMounts[shm2]" in ready["message"]

    def event() -> list[dict[str, Any]]:
        evs = _get(cluster, "events", "-n", ns, "--field-selector", "involvedObject.name=clash") or {}
        return [e for e in evs.get("items", []) if e.get("type") == "Warning" and "/dev/shm" in e["message"]]

    wait_for(event, WAIT_S, "a Warning event naming the field")
    assert _get(cluster, "deployment", "clash", "-n", ns) is None


def test_restricted_namespace_admits_the_restricted_pod(cluster: LocalCluster, ns: str) -> None:
    cluster.kubectl(
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    _apply(cluster, ns, _service("locked", podSecurity="Restricted"))
    _apply(cluster, ns, _service("rooted"))
    pod = wait_for(lambda: _pods(cluster, ns, "locked"), WAIT_S, "the Restricted pod admitted")[0]
    sc = pod["spec"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 2000
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    vllm = pod["spec"]["containers"][0]
    assert vllm["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e.get("value") for e in vllm.get("env", [])}
    mounts = {m["mountPath"] for m in vllm["volumeMounts"]}
    assert "/tmp" in mounts and (env.get("HOME") in mounts or "/home/vllm" in mounts)

    def refused() -> list[str]:
        rss = _get(cluster, "replicasets", "-n", ns, "-l", "app.kubernetes.io/instance=rooted") or {}
        conds = [c for rs in rss.get("items", []) for c in (rs.get("status") or {}).get("conditions") or []]
        return [
            c["message"]
            for c in conds
            if c["type"] == "ReplicaFailure" and "violates PodSecurity" in c["message"]
        ]

    wait_for(refused, WAIT_S, "the Default (root) pod refused by PodSecurity admission")
    assert _pods(cluster, ns, "rooted") == []


def test_kubectl_scale_scales_and_a_reconcile_keeps_it(cluster: LocalCluster, ns: str) -> None:
    _apply(cluster, ns, _service("scaled"))
    obj = _ready_settled(cluster, ns, "scaled")
    assert obj["status"]["selector"] == "app.kubernetes.io/instance=scaled,app.kubernetes.io/name=vllm"
    cluster.kubectl("scale", f"{RESOURCE}/scaled", "-n", ns, "--replicas", "3")

    def three() -> Any:
        d = _get(cluster, "deployment", "scaled", "-n", ns)
        status = (d or {}).get("status") or {}
        return d if d and d["spec"]["replicas"] == 3 and status.get("replicas") == 3 else None

    wait_for(three, WAIT_S, "the Deployment at 3 replicas")
    scale = wait_for(
        lambda: (
            (s := _get(cluster, RESOURCE, "scaled", "-n", ns, "--subresource", "scale"))
            and s["status"].get("replicas") == 3
            and s
        ),
        WAIT_S,
        "/scale reporting 3",
    )
    assert scale["spec"]["replicas"] == 3
    assert "app.kubernetes.io/instance=scaled" in scale["status"]["selector"]
    # a reconcile (a spec change: a new generation) keeps the count the scaler set
    cluster.kubectl(
        "patch",
        RESOURCE,
        "scaled",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"serving": {"maxContextLength": 4096}}}),
    )
    _ready_settled(cluster, ns, "scaled")
    d = wait_for(
        lambda: (
            (d := _get(cluster, "deployment", "scaled", "-n", ns))
            and "4096" in d["spec"]["template"]["spec"]["containers"][0]["args"]
            and d
        ),
        WAIT_S,
        "the new Deployment",
    )
    assert d["spec"]["replicas"] == 3
    assert _get(cluster, RESOURCE, "scaled", "-n", ns)["spec"]["replicas"] == 3


def test_an_hpa_on_a_recreate_single_replica_is_a_conflict(cluster: LocalCluster, ns: str) -> None:
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "risky-hpa"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "kvpilot.io/v1alpha1",
                "kind": "InferenceService",
                "name": "risky",
            },
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }
    _apply(cluster, ns, hpa)
    _apply(cluster, ns, _service("risky", rollout={"strategy": "Recreate", "allowDowntime": True}))
    obj = _ready_settled(cluster, ns, "risky")
    assert _condition(obj, "Ready")["status"] == "True"  # type: ignore[index]
    assert obj["status"]["warnings"][0].startswith("AutoscalerConflict: HorizontalPodAutoscaler risky-hpa")

    def event() -> list[dict[str, Any]]:
        evs = _get(cluster, "events", "-n", ns, "--field-selector", "involvedObject.name=risky") or {}
        return [e for e in evs.get("items", []) if e.get("reason") == "AutoscalerConflict"]

    assert wait_for(event, WAIT_S, "an AutoscalerConflict event")[0]["type"] == "Warning"
