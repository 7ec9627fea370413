"""Evidence that the e2e cluster is a real control plane, not a fake API.

Each test depends on behaviour only the upstream components provide: CEL
validation in kube-apiserver, the deployment/replicaset/garbage-collector
controllers, kube-scheduler's resource fit and node selectors, kubectl, helm,
and kubelet-style pod status written through the pods/status subresource.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import nodes
from e2e.cluster import LocalCluster, versions
from e2e.kwok_stages import PROBED_LABEL, PROBED_VALUE
from e2e.pods import CUDA_OOM_MESSAGE, container_status, simulate_container_crash
from e2e.waits import wait_established, wait_for

TESTDATA = Path(__file__).resolve().parent / "testdata"


def get_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def gpu_deployment(name: str, product: str, gpus: int, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "args": ["--model", "Qwen/Qwen2.5-7B-Instruct"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def apply(cluster: LocalCluster, ns: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))


def test_version_is_the_pinned_release(cluster: LocalCluster) -> None:
    want = versions()["K8S_VERSION"]
    info = cluster.get_json("/version")
    assert info["gitVersion"] == want
    assert info["gitTreeState"] == "clean"
    assert (info["major"], info["minor"]) == tuple(want.lstrip("v").split(".")[:2])
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == want
    assert out["serverVersion"]["gitVersion"] == want
    # the apiserver really talks to etcd
    readyz = cluster.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "[+]etcd ok" in readyz


def test_crd_cel_rule_rejects_bad_object(cluster: LocalCluster, namespace: str) -> None:
    crd = TESTDATA / "gpuquota-crd.yaml"
    cluster.kubectl("apply", "-f", str(crd))
    wait_established(cluster.kubectl, "crd/gpuquotas.e2e.kvpilot.dev")

    def quota(name: str, lo: int, hi: int, product: str = "NVIDIA-L4") -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "e2e.kvpilot.dev/v1",
                "kind": "GPUQuota",
                "metadata": {"name": name},
                "spec": {"product": product, "minGPUs": lo, "maxGPUs": hi},
            }
        )

    # the resource is discoverable, and a good object is accepted
    wait_for(
        lambda: (
            cluster.kubectl(
                "apply", "-n", namespace, "-f", "-", input=quota("good", 1, 4), check=False
            ).returncode
            == 0
        ),
        30,
        "GPUQuota discovery",
    )
    assert (
        cluster.kubectl("get", "gq", "good", "-n", namespace, "-o", "jsonpath={.spec.maxGPUs}").stdout == "4"
    )

    # CEL rule on spec: the API server's own message
    bad = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=quota("bad", 5, 2), check=False)
    assert bad.returncode != 0
    # exactly as kube-apiserver v1.36 words it (the value is omitted for object-level rules)
    want = 'The GPUQuota "bad" is invalid: spec: Invalid value: minGPUs must not exceed maxGPUs'
    assert bad.stderr.strip() == want
    # OpenAPI schema bound
    big = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=quota("big", 1, 100), check=False)
    assert big.returncode != 0 and "should be less than or equal to 64" in big.stderr
    # CEL transition rule (self == oldSelf) on update
    imm = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=quota("good", 1, 4, "NVIDIA-H100-80GB-HBM3"), check=False
    )
    assert imm.returncode != 0 and "product is immutable" in imm.stderr
    nothing = cluster.kubectl("get", "gq", "bad", "-n", namespace, check=False)
    assert nothing.returncode != 0 and "NotFound" in nothing.stderr


def test_deployment_schedules_onto_matching_gpu_pool(cluster: LocalCluster, namespace: str) -> None:
    h100 = nodes.H100_80GB_HBM3.product
    apply(cluster, namespace, gpu_deployment("llm-h100", h100, gpus=8, replicas=2))

    # deployment controller -> ReplicaSet -> replicaset controller -> Pods
    rs = wait_for(
        lambda: get_json(cluster, "rs", "-n", namespace, "-l", "app=llm-h100")["items"], 60, "ReplicaSet"
    )
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"

    def running() -> list[dict[str, Any]]:
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "app=llm-h100")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]
        return ok if len(ok) == 2 else []

    pods = wait_for(running, 90, "2 Running pods")
    placed = {p["spec"]["nodeName"] for p in pods}
    assert len(placed) == 2, "8 GPUs each: the scheduler must use two different 8-GPU nodes"
    for name in placed:
        node = get_json(cluster, "node", name)
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == h100
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    for p in pods:
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    wait_for(
        lambda: (
            get_json(cluster, "deploy", "llm-h100", "-n", namespace)["status"].get("availableReplicas") == 2
        ),
        60,
        "Deployment available",
    )

    # No L4 node has 8 GPUs: Pending, with the scheduler's own reason.
    apply(cluster, namespace, gpu_deployment("llm-l4-too-big", nodes.L4.product, gpus=8, replicas=1))

    def unschedulable() -> dict[str, Any] | None:
        for p in get_json(cluster, "pods", "-n", namespace, "-l", "app=llm-l4-too-big")["items"]:
            for c in p["status"].get("conditions", []):
                if (
                    c["type"] == "PodScheduled"
                    and c["status"] == "False"
                    and c.get("reason") == "Unschedulable"
                ):
                    return p
        return None

    pending = wait_for(unschedulable, 60, "PodScheduled=False/Unschedulable")
    assert pending["status"]["phase"] == "Pending"
    assert not pending["spec"].get("nodeName")
    cond = next(c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    events = wait_for(
        lambda: [
            e
            for e in get_json(cluster, "events", "-n", namespace)["items"]
            if e["reason"] == "FailedScheduling"
            and e["involvedObject"]["name"] == pending["metadata"]["name"]
        ],
        30,
        "event",
    )
    assert "Insufficient nvidia.com/gpu" in events[0]["message"]

    # A product no node has: Pending because of the node selector.
    apply(cluster, namespace, gpu_deployment("llm-b200", "NVIDIA-B200", gpus=1, replicas=1))
    pods_b200 = wait_for(
        lambda: [
            p
            for p in get_json(cluster, "pods", "-n", namespace, "-l", "app=llm-b200")["items"]
            if any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions", []))
        ],
        60,
        "llm-b200 Unschedulable",
    )
    assert "didn't match Pod's node affinity/selector" in pods_b200[0]["status"]["conditions"][0]["message"]

    # garbage collector: deleting the Deployment removes its ReplicaSet and Pods
    cluster.kubectl("delete", "deploy", "llm-h100", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: (
            not get_json(cluster, "rs", "-n", namespace, "-l", "app=llm-h100")["items"]
            and not get_json(cluster, "pods", "-n", namespace, "-l", "app=llm-h100")["items"]
        ),
        60,
        "cascade delete",
    )


def test_namespace_deletion_completes(cluster: LocalCluster) -> None:
    """namespace controller + garbage collector + KWOK's pod-delete stage (the kubelet's part)."""
    ns = "e2e-ns-deletion"
    cluster.create_namespace(ns)
    apply(cluster, ns, gpu_deployment("llm", nodes.A100_SXM4_80GB.product, gpus=2, replicas=3))
    wait_for(
        lambda: get_json(cluster, "deploy", "llm", "-n", ns)["status"].get("availableReplicas") == 3,
        60,
        "3 available replicas",
    )
    cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=90s")
    gone = cluster.kubectl("get", "namespace", ns, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_kubectl_apply_and_get(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    f = tmp_path / "cm.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "engine-args"},
                "data": {"gpu-memory-utilization": "0.92", "max-model-len": "8192"},
            }
        )
    )
    out = cluster.kubectl("apply", "-n", namespace, "-f", str(f))
    assert "configmap/engine-args created" in out.stdout
    out = cluster.kubectl("apply", "-n", namespace, "-f", str(f))
    assert "configmap/engine-args unchanged" in out.stdout
    got = cluster.kubectl(
        "get", "configmap", "engine-args", "-n", namespace, "-o", "jsonpath={.data.max-model-len}"
    ).stdout
    assert got == "8192"

    table = cluster.kubectl(
        "get", "nodes", "-l", f"nvidia.com/gpu.product={nodes.L4.product}", "--no-headers"
    ).stdout
    rows = [r.split() for r in table.splitlines()]
    assert len(rows) == 8 and all(r[1] == "Ready" for r in rows)
    gpus = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_product: dict[str, int] = {}
    for n in gpus:
        prod = n["metadata"]["labels"].get("nvidia.com/gpu.product")
        if prod:
            by_product[prod] = by_product.get(prod, 0) + int(n["status"]["allocatable"]["nvidia.com/gpu"])
    assert by_product == nodes.total_gpus()

    # RBAC is enforced: the namespace's default service account may not list pods
    can = cluster.kubectl(
        "auth",
        "can-i",
        "list",
        "pods",
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:default",
        check=False,
    )
    assert can.stdout.strip() == "no"


def test_helm_install_and_uninstall(cluster: LocalCluster, namespace: str) -> None:
    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(cluster.helm_bin), *args, "-n", namespace],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, **cluster.env()},
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    helm("install", "tiny", str(TESTDATA / "chart"), "--set", "replicas=2", "--wait", "--timeout", "90s")
    rel = json.loads(helm("list", "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in rel] == [("tiny", "deployed")]
    cm = get_json(cluster, "configmap", "tiny-settings", "-n", namespace)
    assert cm["data"]["kubeVersion"] == versions()["K8S_VERSION"]
    dep = get_json(cluster, "deploy", "tiny", "-n", namespace)
    assert dep["status"]["readyReplicas"] == 2
    pods = get_json(cluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=tiny")["items"]
    assert {
        get_json(cluster, "node", p["spec"]["nodeName"])["metadata"]["labels"]["nvidia.com/gpu.product"]
        for p in pods
    } == {nodes.L4.product}

    helm("uninstall", "tiny", "--wait", "--timeout", "90s")
    assert json.loads(helm("list", "-o", "json").stdout) == []
    gone = cluster.kubectl("get", "deploy", "tiny", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


@pytest.mark.parametrize("crash_loop", [True, False], ids=["crashloop", "terminated"])
def test_simulated_vllm_crash_shows_in_pod_status(
    cluster: LocalCluster, namespace: str, crash_loop: bool
) -> None:
    apply(cluster, namespace, gpu_deployment("llm", nodes.L4.product, gpus=1, replicas=1))
    pod = wait_for(lambda: get_json(cluster, "pods", "-n", namespace, "-l", "app=llm")["items"], 60, "pod")[0]
    name = pod["metadata"]["name"]

    p = simulate_container_crash(
        cluster.kubeconfig,
        namespace,
        name,
        exit_code=1,
        message=CUDA_OOM_MESSAGE,
        restart_count=3,
        crash_loop=crash_loop,
        kubectl=cluster.kubectl_bin,
    )
    time.sleep(2)  # KWOK must not overwrite it
    p = get_json(cluster, "pod", name, "-n", namespace)
    st = container_status(p, "vllm")
    assert st["restartCount"] == 3 and st["ready"] is False
    term = st["lastState"]["terminated"] if crash_loop else st["state"]["terminated"]
    assert term["exitCode"] == 1 and term["reason"] == "Error"
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in term["message"]
    if crash_loop:
        assert st["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert p["status"]["phase"] == "Running"
    ready = next(c for c in p["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"

    # kubectl's printer derives STATUS/RESTARTS from the container status, as for a real kubelet
    row = cluster.kubectl("get", "pod", name, "-n", namespace, "--no-headers").stdout.split()
    assert row[2] == ("CrashLoopBackOff" if crash_loop else "Error") and row[3].startswith("3")
    # and the deployment controller sees the replica as unavailable
    wait_for(
        lambda: get_json(cluster, "deploy", "llm", "-n", namespace)["status"].get("unavailableReplicas") == 1,
        60,
        "Deployment unavailableReplicas=1",
    )

    # a cgroup OOM kill reads differently
    p = (
        simulate_container_crash(
            cluster.kubeconfig,
            namespace,
            name,
            exit_code=137,
            message="",
            restart_count=4,
            kubectl=cluster.kubectl_bin,
        )
        if crash_loop
        else p
    )
    if crash_loop:
        term = container_status(p, "vllm")["lastState"]["terminated"]
        assert (term["exitCode"], term["reason"]) == (137, "OOMKilled")


def test_a_probed_pod_runs_unready_until_its_kubelet_says_so(cluster: LocalCluster, namespace: str) -> None:
    """KWOK makes a bound pod Ready at once; one labelled ``e2e.kvpilot.io/kubelet: probes`` runs but stays
    unready (a kubelet whose readiness probe has not passed), so the Deployment controller counts it
    unavailable until the pod is made Ready (``e2e/kwok_stages.py``; the fleet plays that kubelet)."""
    probed = gpu_deployment("probed", nodes.L4.product, gpus=1, replicas=1)
    probed["spec"]["template"]["metadata"]["labels"][PROBED_LABEL] = PROBED_VALUE
    probed["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    plain = gpu_deployment("plain", nodes.L4.product, gpus=1, replicas=1)
    for obj in (probed, plain):
        apply(cluster, namespace, obj)

    def pod(app: str) -> dict[str, Any] | None:
        items = get_json(cluster, "pods", "-n", namespace, "-l", f"app={app}")["items"]
        running = [p for p in items if p["status"].get("phase") == "Running"]
        return running[0] if running else None

    def ready(p: dict[str, Any]) -> str:
        return next(c["status"] for c in p["status"]["conditions"] if c["type"] == "Ready")

    assert ready(wait_for(lambda: pod("plain"), 60, "the plain pod Running")) == "True"
    first = wait_for(lambda: pod("probed"), 60, "the probed pod Running")
    assert ready(first) == "False"
    assert first["status"]["containerStatuses"][0]["ready"] is False
    time.sleep(2)  # KWOK's stages have settled: nothing makes it Ready but its kubelet
    assert ready(get_json(cluster, "pod", first["metadata"]["name"], "-n", namespace)) == "False"
    deploy = get_json(cluster, "deploy", "probed", "-n", namespace)
    assert not deploy["status"].get("availableReplicas"), deploy["status"]
