"""kvpilot's LeaderWorkerSet on the real API server with LWS's CRD installed (issue 28).

The LWS controller is not part of this control plane yet (its Go module could not be fetched), so nothing
makes the group's pods; what is checked is everything up to it, against the real API server: the operator's
client discovers the kind only once its CRD is installed (``ClusterKube.serves_kind``: an InferenceService of
several nodes is ``LeaderWorkerSetNotInstalled`` before), the LeaderWorkerSet ``kvpilot render`` builds is
accepted by the CRD's validation and comes back unpruned after kvpilot's server-side apply, and an LWS of the
same name that is not kvpilot's is a NameConflict through the operator's own apply path, and the operator
itself, given an InferenceService of two nodes per replica, applies the group and no Deployment. The CRD is
LWS v0.10.0's (tests/data/lws, provenance in tests/data/README.md); it is removed again after the module, so
the other modules see a cluster without it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from e2e.cluster import LocalCluster
from e2e.waits import host_operator, wait_established, wait_for
from kvpilot.operator import errors
from kvpilot.operator.clients.kube import ClusterKube
from kvpilot.operator.inferenceservice import render
from kvpilot.operator.pods import leader_worker_set as lws
from kvpilot.operator.pods import ownership, workloads

ROOT = Path(__file__).resolve().parents[1]
LWS_CRD = ROOT / "tests" / "data" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
ISVC_CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"
DEEPSEEK = {
    "apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "dsv3"},
    "spec": {"model": {"id": "deepseek-ai/DeepSeek-V3"}, "serving": {"maxContextLength": 32768},
             "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2}},
}  # fmt: skip


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Iterator[ClusterKube]:
    """The operator's client on the cluster; LWS's CRD is installed after the first check and removed after
    the module."""
    client = ClusterKube(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    assert not client.serves_kind(lws.KIND), "the LWS CRD is installed before this module installed it"
    cluster.kubectl("apply", "--server-side", "-f", "-", input=gzip.decompress(LWS_CRD.read_bytes()).decode())
    try:
        wait_established(cluster.kubectl, f"crd/{CRD_NAME}")
        wait_for(lambda: client.serves_kind(lws.KIND), 60, "discovery serves leaderworkerset.x-k8s.io/v1")
        yield client
    finally:
        cluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", check=False)


def rendered(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    service, group = render.build_manifests(DEEPSEEK)
    for m in (service, group):
        m["metadata"]["namespace"] = namespace
    return service, group


def is_subset(wanted: Any, have: Any, where: str = "") -> list[str]:
    """Where ``have`` lacks or differs from what ``wanted`` sets (the API server adds defaults, and must not
    prune or change what kvpilot set)."""
    if isinstance(wanted, dict):
        if not isinstance(have, dict):
            return [where or "."]
        return [p for k, v in wanted.items() for p in is_subset(v, have.get(k), f"{where}.{k}")]
    if isinstance(wanted, list):
        if not isinstance(have, list) or len(have) != len(wanted):
            return [where]
        pairs = enumerate(zip(wanted, have, strict=True))
        return [p for i, (w, h) in pairs for p in is_subset(w, h, f"{where}[{i}]")]
    return [] if wanted == have else [where]


def test_the_rendered_group_is_accepted_and_kept_whole(kube: ClusterKube, namespace: str) -> None:
    service, group = rendered(namespace)
    kube.apply(service)
    kube.apply(group)
    back = kube.read_object(lws.KIND, namespace, "dsv3")
    assert back is not None
    assert is_subset(group["spec"], back["spec"]) == []  # nothing pruned, nothing rewritten
    managers = {(f["manager"], f["operation"]) for f in back["metadata"]["managedFields"]}
    assert ("kvpilot", "Apply") in managers
    leader = back["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert "--master-addr" in leader and lws.LEADER_ADDRESS in leader
    kube.apply(group)  # re-applying the same object is a no-op, not a conflict
    again = kube.read_object(lws.KIND, namespace, "dsv3")
    assert again is not None and again["metadata"]["generation"] == back["metadata"]["generation"]


def test_a_group_the_api_server_refuses_is_apply_rejected(kube: ClusterKube, namespace: str) -> None:
    _, group = rendered(namespace)
    group["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"  # not in the CRD's enum
    with pytest.raises(errors.ApplyRejected, match="LeaderWorkerSet dsv3"):
        kube.apply(group)


def test_another_teams_group_of_that_name_is_a_name_conflict(
    kube: ClusterKube, namespace: str, cluster: LocalCluster
) -> None:
    _, group = rendered(namespace)
    theirs = {**group, "metadata": {"name": "dsv3", "namespace": namespace}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(theirs))
    ours = {**group, "metadata": {**group["metadata"], "ownerReferences": [{
        "apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "name": "dsv3", "uid": "u-dsv3",
        "controller": True, "blockOwnerDeletion": True}]}}  # fmt: skip
    with pytest.raises(errors.NameConflict, match=f"LeaderWorkerSet {namespace}/dsv3 already exists"):
        asyncio.run(workloads.apply_workloads([ours], kube, ownership.VerifiedOwners()))
    kept = kube.read_object(lws.KIND, namespace, "dsv3")
    assert kept is not None and not kept["metadata"].get("ownerReferences")


def test_the_operator_applies_the_group_for_an_inference_service_of_two_nodes(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The whole path: the operator (on the host, watching one namespace) applies the LeaderWorkerSet and the
    Service selecting its leaders, owned by the InferenceService, and no Deployment."""
    cluster.kubectl("apply", "-f", str(ISVC_CRD))
    wait_established(cluster.kubectl, "crd/inferenceservices.kvpilot.io")
    ns = f"kvlws-{uuid.uuid4().hex[:6]}"
    with cluster.temporary_namespace(ns), host_operator(cluster, tmp_path / "kopf.log", ns):
        doc = {**DEEPSEEK, "metadata": {"name": "dsv3", "namespace": ns}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

        def ready() -> dict[str, Any] | None:
            obj = json.loads(cluster.kubectl("get", "inferenceservices.kvpilot.io", "dsv3", "-n", ns,
                                             "-o", "json").stdout)  # fmt: skip
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
            return obj if "Ready" in conds else None

        obj = wait_for(ready, 120, f"{ns}/dsv3 Ready set")
        ready_cond = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert ready_cond["status"] == "True", ready_cond
        group = kube.read_object(lws.KIND, ns, "dsv3")
        assert group is not None and group["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert group["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        service = kube.read_object("Service", ns, "dsv3")
        assert service is not None and service["spec"]["selector"][lws.WORKER_INDEX_LABEL] == "0"
        assert kube.read_object("Deployment", ns, "dsv3") is None
