"""The operator against the real local control plane (kube-apiserver with CEL, controllers, scheduler, KWOK).

The operator runs on the host as ``kopf run --standalone -m kvpilot.operator.main`` (a child
process, stopped by its PID), watching only the namespaces these tests create (``kvop-*``), so
it never touches objects of other e2e modules. Evidence required by the operator issue:

* every example applied with ``kubectl apply`` gives a Deployment with the planned args, whose pod
  the real scheduler places on a node of the planned GPU type (or, for the one that cannot fit,
  Ready=False reason Infeasible and a Warning event, and no Deployment);
* a spec change rolls out (a new ReplicaSet with the new args);
* ``kubectl get inferenceservices.kvpilot.io`` shows the printer columns;
* every invalid manifest of tests/operator/invalid_manifests.py is refused by the API server
  (schema, CEL) or answered with Ready=False and a Warning event (operator);
* deleting the InferenceService removes the Deployment and Service (garbage collection).
"""

from __future__ import annotations

import json
import sys
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
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
RESOURCE = "inferenceservices.kvpilot.io"
NS_PREFIX = "kvop-"
WAIT_S = 120.0

sys.path.insert(0, str(ROOT / "tests" / "operator"))
from invalid_manifests import CASES, Case  # noqa: E402


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


def ready_settled(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    """The object once Ready is set for its current generation."""

    def check() -> dict[str, Any] | None:
        obj = get(cluster, RESOURCE, name, "-n", ns)
        ready = condition(obj, "Ready")
        if obj and ready and ready.get("observedGeneration") == obj["metadata"]["generation"]:
            return obj
        return None

    return wait_for(check, WAIT_S, f"{ns}/{name} Ready for its generation")


def warning_events(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    events = get(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}") or {}
    return [e for e in events.get("items", []) if e.get("type") == "Warning"]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The CRD applied and the operator running on the host; yields its log file."""
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


def apply_file(cluster: LocalCluster, ns: str, path: Path | None = None, doc: dict | None = None):
    text = path.read_text() if path is not None else yaml.safe_dump(doc)
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=text, check=False)


def deployment_args(deployment: dict[str, Any]) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def scheduled_pods(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    pods = get(cluster, "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={name}") or {"items": []}
    return [p for p in pods["items"] if p["spec"].get("nodeName")]


# --------------------------------------------------------------------------------------------- tests


def test_explain_documents_the_api(cluster: LocalCluster, operator: Path) -> None:
    out = cluster.kubectl("explain", f"{RESOURCE}.spec.tuning.mode").stdout
    assert "Recommend" in out and "Auto" in out
    out = cluster.kubectl("explain", f"{RESOURCE}.status.budget.kvCacheTokens").stdout
    assert "KV cache" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example(cluster: LocalCluster, ns: str, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    name = doc["metadata"]["name"]
    proc = apply_file(cluster, ns, path)
    assert proc.returncode == 0, proc.stderr
    obj = ready_settled(cluster, ns, name)
    ready = condition(obj, "Ready")
    if ready["status"] == "False":
        # the example that cannot fit says so, and nothing is deployed
        assert "does-not-fit" in path.stem, f"{name}: {ready}"
        assert ready["reason"] == "Infeasible"
        assert condition(obj, "Infeasible")["status"] == "True"
        assert "Options:" in ready["message"]
        wait_for(
            lambda: [e for e in warning_events(cluster, ns, name) if e["reason"] == "Infeasible"],
            WAIT_S,
            "an Infeasible event",
        )
        assert get(cluster, "deployment", name, "-n", ns) is None
        return
    applied = obj["status"]["applied"]
    deployment = wait_for(lambda: get(cluster, "deployment", name, "-n", ns), WAIT_S, "the Deployment")
    args = deployment_args(deployment)
    assert args[0] == doc["spec"]["model"]["id"]
    assert flag(args, "--max-model-len") == str(applied["maxModelLen"])
    assert flag(args, "--max-num-seqs") == str(applied["maxNumSeqs"])
    assert flag(args, "--kv-cache-dtype") == applied["kvCacheDtype"]
    assert flag(args, "--tensor-parallel-size") == str(doc["spec"]["gpu"]["count"])
    if "fp8-kv" in path.stem:
        assert applied["kvCacheDtype"] == "fp8"
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert get(cluster, "service", name, "-n", ns)["spec"]["ports"][0]["port"] == 8000
    pods = wait_for(lambda: scheduled_pods(cluster, ns, name), WAIT_S, "a scheduled pod")
    node = get(cluster, "node", pods[0]["spec"]["nodeName"])
    product = node["metadata"]["labels"]["nvidia.com/gpu.product"]
    assert product in obj["status"]["gpu"]["product"].split(", ")
    limits = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert str(limits["nvidia.com/gpu"]) == str(doc["spec"]["gpu"]["count"])
    events = get(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    planned = [e for e in events["items"] if e["reason"] in ("Planned", "ConfigResolved")]
    assert [e["reason"] for e in planned] == ["Planned"]  # one event per decision (docs/operator.md, "Scale")
    assert "model config from" in planned[0]["message"] and "GPU " in planned[0]["message"]


def test_printer_columns(cluster: LocalCluster, ns: str) -> None:
    path = next(p for p in EXAMPLES if p.stem == "llama-3.1-8b-on-l4")
    assert apply_file(cluster, ns, path).returncode == 0
    obj = ready_settled(cluster, ns, "llama-8b-l4")
    out = cluster.kubectl("get", RESOURCE, "-n", ns).stdout
    header, row = out.splitlines()[:2]
    columns = ("MODEL", "GPU", "MAX-MODEL-LEN", "MAX-NUM-SEQS", "GPU-MEM-UTIL", "KV-DTYPE", "READY", "AGE")
    assert set(columns) <= set(header.split()), header
    assert "meta-llama/Llama-3.1-8B-Instruct" in row and "NVIDIA-L4" in row and "True" in row
    assert str(obj["status"]["applied"]["maxModelLen"]) in row
    wide = cluster.kubectl("get", RESOURCE, "-n", ns, "-o", "wide").stdout
    assert "REASON" in header.split()
    assert any(reason in row for reason in ("Applied", "Serving")), row  # Serving once the loop saw the pods
    assert "REPLICAS" in wide.splitlines()[0]


def test_gpu_discovered_from_node_labels(cluster: LocalCluster, ns: str) -> None:
    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "qwen"},
        "spec": {
            "model": {"id": "Qwen/Qwen2.5-7B-Instruct"},
            "gpu": {"count": 2},
            "nodeSelector": {"kvpilot.dev/e2e-pool": "a100"},
        },
    }
    assert apply_file(cluster, ns, doc=doc).returncode == 0
    obj = ready_settled(cluster, ns, "qwen")
    assert condition(obj, "Ready")["status"] == "True", condition(obj, "Ready")
    assert obj["status"]["gpu"]["catalogueName"] == "A100-80GB"
    pod_spec = get(cluster, "deployment", "qwen", "-n", ns)["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {
        "kvpilot.dev/e2e-pool": "a100",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    pods = wait_for(lambda: scheduled_pods(cluster, ns, "qwen"), WAIT_S, "a scheduled pod")
    assert pods[0]["spec"]["nodeName"].startswith("a100-")


def test_spec_change_rolls_out(cluster: LocalCluster, ns: str) -> None:
    path = next(p for p in EXAMPLES if p.stem == "llama-3.1-8b-on-l4")
    assert apply_file(cluster, ns, path).returncode == 0
    ready_settled(cluster, ns, "llama-8b-l4")
    before = deployment_args(get(cluster, "deployment", "llama-8b-l4", "-n", ns))
    cluster.kubectl(
        "patch",
        RESOURCE,
        "llama-8b-l4",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"serving": {"maxContextLength": 12288}}}),
    )

    def rolled() -> dict[str, Any] | None:
        # observedGeneration is in the status merge patch, history in the JSON patch that follows it
        # (status_patch.ListPatch): wait for both
        obj = get(cluster, RESOURCE, "llama-8b-l4", "-n", ns)
        status = (obj or {}).get("status") or {}
        history = [h["trigger"] for h in status.get("history") or ()]
        return obj if status.get("observedGeneration") == 2 and history[-1:] == ["SpecChanged"] else None

    obj = wait_for(rolled, WAIT_S, "observedGeneration 2 and its SpecChanged history entry")
    assert condition(obj, "Ready")["status"] == "True"
    assert obj["status"]["applied"]["maxModelLen"] == 12288
    assert [h["trigger"] for h in obj["status"]["history"]][-2:] == ["Created", "SpecChanged"]
    after = deployment_args(get(cluster, "deployment", "llama-8b-l4", "-n", ns))
    assert flag(after, "--max-model-len") == "12288" != flag(before, "--max-model-len")

    def new_replicaset() -> list[dict[str, Any]]:
        rs = get(cluster, "replicasets", "-n", ns, "-l", "app.kubernetes.io/instance=llama-8b-l4")["items"]
        return [
            r
            for r in rs
            if flag(deployment_args(r), "--max-model-len") == "12288" and r["status"].get("readyReplicas")
        ]

    wait_for(new_replicaset, WAIT_S, "the new ReplicaSet to be ready")


def test_headless_service_on_request_and_fixed(cluster: LocalCluster, ns: str) -> None:
    """``spec.service.headless``: a Service without a ClusterIP, and the API server refuses to change it
    (a Service's clusterIP is immutable); the default keeps the ClusterIP Service."""
    doc = yaml.safe_load(next(p for p in EXAMPLES if p.stem == "llama-3.1-8b-on-l4").read_text())
    docs = {name: {**doc, "metadata": {"name": name}} for name in ("headless", "cip")}
    docs["headless"]["spec"] = {**doc["spec"], "service": {"headless": True}}
    for d in docs.values():
        assert apply_file(cluster, ns, doc=d).returncode == 0
    for name in docs:
        assert condition(ready_settled(cluster, ns, name), "Ready")["status"] == "True"
    headless, cip = (get(cluster, "service", name, "-n", ns)["spec"] for name in ("headless", "cip"))
    assert headless["clusterIP"] == "None" and headless["type"] == "ClusterIP"
    assert cip["clusterIP"] not in ("None", "")  # allocated from the service CIDR
    for name, to in (("headless", False), ("cip", True)):
        patch = json.dumps({"spec": {"service": {"headless": to}}})
        proc = cluster.kubectl("patch", RESOURCE, name, "-n", ns, "--type", "merge", "-p", patch, check=False)
        assert proc.returncode != 0 and "service.headless cannot change" in proc.stderr, proc.stderr


def test_sglang_service_rendered_and_its_engine_fixed(cluster: LocalCluster, ns: str) -> None:
    """``spec.engine.kind: SGLang``: the operator applies SGLang's container and plan (Ready, Planned in
    SGLang's terms, ``status.appliedEngineArgs``), the closed loop tunes it (ClosedLoop=True, reason Tuning in
    mode Auto); the API server
    refuses to change the kind (CEL ``self == oldSelf``)."""
    doc = yaml.safe_load((ROOT / "examples" / "sglang" / "llama-3.1-8b-on-l4.yaml").read_text())
    name = doc["metadata"]["name"]
    assert apply_file(cluster, ns, doc=doc).returncode == 0
    obj = ready_settled(cluster, ns, name)
    assert condition(obj, "Ready")["status"] == "True", condition(obj, "Ready")
    assert "--mem-fraction-static" in condition(obj, "Planned")["message"]
    deployment = wait_for(lambda: get(cluster, "deployment", name, "-n", ns), WAIT_S, "the Deployment")
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (
        c["command"] == ["python3", "-m", "sglang.launch_server"] and c["ports"][0]["containerPort"] == 30000
    )
    assert flag(c["args"], "--model-path") == doc["spec"]["model"]["id"] and "--enable-metrics" in c["args"]
    loop = wait_for(
        lambda: condition(get(cluster, RESOURCE, name, "-n", ns), "ClosedLoop"),
        WAIT_S,
        "the loop's condition",
    )
    assert (loop["status"], loop["reason"]) == ("True", "Tuning") and "SGLang" in loop["message"]
    applied = get(cluster, RESOURCE, name, "-n", ns)["status"]["appliedEngineArgs"]
    assert flag(applied, "--mem-fraction-static") == flag(c["args"], "--mem-fraction-static")
    patch = json.dumps({"spec": {"engine": {"kind": "vLLM", "image": "vllm/vllm-openai:v0.33.0"}}})
    proc = cluster.kubectl("patch", RESOURCE, name, "-n", ns, "--type", "merge", "-p", patch, check=False)
    assert proc.returncode != 0 and "engine.kind cannot change" in proc.stderr, proc.stderr


def test_modes_off_and_recommend(cluster: LocalCluster, ns: str) -> None:
    for mode in ("Off", "Recommend"):
        doc = yaml.safe_load(next(p for p in EXAMPLES if p.stem == "llama-3.1-8b-on-l4").read_text())
        doc["metadata"]["name"] = f"mode-{mode.lower()}"
        doc["spec"]["tuning"]["mode"] = mode
        doc["spec"]["engine"]["pinned"] = {"maxModelLen": 8192}
        assert apply_file(cluster, ns, doc=doc).returncode == 0
        obj = ready_settled(cluster, ns, doc["metadata"]["name"])
        args = deployment_args(get(cluster, "deployment", doc["metadata"]["name"], "-n", ns))
        assert flag(args, "--max-model-len") == "8192"
        assert flag(args, "--max-num-seqs") is None and flag(args, "--gpu-memory-utilization") is None
        assert ("recommendation" in obj["status"]) == (mode == "Recommend")
        assert obj["status"]["budget"]["kvCacheTokens"] > 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_invalid_manifest(cluster: LocalCluster, ns: str, case: Case) -> None:
    doc = case.manifest()
    proc = apply_file(cluster, ns, doc=doc)
    name = doc["metadata"]["name"]
    if case.expect in ("schema", "cel"):
        assert proc.returncode != 0, f"the API server accepted {case.name}"
        # schema: the full field path the API server names (spec.model.id, not "id", which "Invalid" holds);
        # cel: the rule's message
        assert case.match in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    obj = ready_settled(cluster, ns, name)
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", case.match), ready
    wait_for(
        lambda: [e for e in warning_events(cluster, ns, name) if e["reason"] == case.match],
        WAIT_S,
        f"a Warning event {case.match}",
    )
    assert get(cluster, "deployment", name, "-n", ns) is None


def test_configmap_config_missing_then_created(cluster: LocalCluster, ns: str) -> None:
    """A missing ConfigMap is retried with back-off; creating it later is picked up without a spec change."""
    from kvpilot.tuner.model import catalogue as models

    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "custom"},
        "spec": {
            "model": {"id": "acme/custom-8b", "source": "ConfigMap", "configMapRef": {"name": "custom-cfg"}},
            "gpu": {"count": 1, "product": "L4"},
        },
    }
    assert apply_file(cluster, ns, doc=doc).returncode == 0
    obj = ready_settled(cluster, ns, "custom")
    assert condition(obj, "Ready")["reason"] == "ConfigNotFound"
    config = json.dumps(models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "custom-cfg"},
        "data": {"config.json": config},
    }
    assert apply_file(cluster, ns, doc=cm).returncode == 0

    def ready() -> bool:
        return (condition(get(cluster, RESOURCE, "custom", "-n", ns), "Ready") or {}).get("status") == "True"

    wait_for(ready, 180, "Ready after the ConfigMap appeared")
    deployment = get(cluster, "deployment", "custom", "-n", ns)
    assert deployment_args(deployment)[0] == "acme/custom-8b"


def test_hub_unreachable_is_retried(cluster: LocalCluster, ns: str) -> None:
    doc = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "hub"},
        "spec": {"model": {"id": "acme/some-model", "source": "Hub"}, "gpu": {"count": 1, "product": "L4"}},
    }
    assert apply_file(cluster, ns, doc=doc).returncode == 0
    obj = ready_settled(cluster, ns, "hub")
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "HubUnreachable"), ready
    assert condition(obj, "ConfigResolved")["status"] == "False"
    wait_for(
        lambda: [e for e in warning_events(cluster, ns, "hub") if e["reason"] == "HubUnreachable"],
        WAIT_S,
        "a HubUnreachable event",
    )
    assert get(cluster, "deployment", "hub", "-n", ns) is None


def test_delete_removes_what_it_owns(cluster: LocalCluster, ns: str) -> None:
    path = next(p for p in EXAMPLES if p.stem == "llama-3.1-8b-on-l4")
    assert apply_file(cluster, ns, path).returncode == 0
    ready_settled(cluster, ns, "llama-8b-l4")
    assert get(cluster, "deployment", "llama-8b-l4", "-n", ns)
    assert get(cluster, "service", "llama-8b-l4", "-n", ns)
    cluster.kubectl("delete", RESOURCE, "llama-8b-l4", "-n", ns, "--timeout=90s")
    wait_for(
        lambda: get(cluster, "deployment", "llama-8b-l4", "-n", ns) is None, WAIT_S, "the Deployment to go"
    )
    wait_for(lambda: get(cluster, "service", "llama-8b-l4", "-n", ns) is None, WAIT_S, "the Service to go")
    wait_for(lambda: not (get(cluster, "pods", "-n", ns) or {"items": []})["items"], WAIT_S, "the pods to go")


def test_operator_log_has_no_crash(operator: Path) -> None:
    """No unexpected error in the reconciler (InternalError), no failing closed-loop tick, no traceback."""
    text = operator.read_text()
    for sign in ("InternalError", "tick failed", "Traceback"):
        at = text.find(sign)
        assert at < 0, f"{sign!r} in the operator log:\n{text[max(0, at - 1500) : at + 1500]}"
