"""Name collisions on the real control plane: an InferenceService named like another team's Service and claim
neither takes them over nor, when deleted, takes them with it (kvpilot.operator.pods.ownership).

The other team's objects are made by hand, with no owner. Before the fix the operator server-side applied its
Service and claim onto them with force and a controller owner reference: the Service's selector pointed at
kvpilot's pods (the other team's traffic redirected), and deleting the InferenceService let the garbage
collector delete the other team's Service and claim (data loss).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario
from e2e.fleet.stack import ISVC, Stack, condition, isvc_events

H100 = "NVIDIA-H100-80GB-HBM3"
THEIR_SELECTOR = {"app": "ledger-api"}


@pytest.fixture(scope="module")
def team_b(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    ns = f"e2e-team-b-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    stack = Stack(
        cluster,
        Path(tmp_path_factory.mktemp("names")),
        namespaces=[ns],
        operator_namespaces=[ns],
        default_scenario=Scenario(name="names", truth=GroundTruth(gpu_memory_gib=79.11, non_kv_gib=20.0)),
    )
    stack.start()
    try:
        yield stack, ns
    finally:
        stack.stop_and_clean([ns])


def _theirs(ns: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ledger", "namespace": ns},
            "spec": {"selector": THEIR_SELECTOR, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "ledger-model-cache", "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


def _ledger(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "ledger", "namespace": ns},
        "spec": {
            "model": {
                "id": "meta-llama/Llama-3.1-8B-Instruct",
                "source": "Catalogue",
                "storage": {"claimTemplate": {"size": "50Gi"}},
            },
            "gpu": {"count": 1, "product": H100},
            "tuning": {"mode": "Off"},
        },
    }


def _get(stack: Stack, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    out = stack.kubectl("get", kind, name, "-n", ns, "-o", "json", "--ignore-not-found").stdout
    return json.loads(out) if out.strip() else None


def test_a_careless_name_neither_takes_over_nor_deletes_another_teams_objects(
    team_b: tuple[Stack, str],
) -> None:
    stack, ns = team_b
    stack.cluster.apply(_theirs(ns))
    stack.cluster.apply([_ledger(ns)])
    obj = stack.wait_isvc(
        ns,
        "ledger",
        lambda o: condition(o, "Ready").get("reason") == "NameConflict",
        timeout=60,
        what="Ready=False NameConflict",
    )
    ready = condition(obj, "Ready")
    assert ready["status"] == "False"
    said = f"Service {ns}/ledger already exists and is not kvpilot's (controlled by: no owner)"
    assert said in ready["message"]
    assert f"PersistentVolumeClaim {ns}/ledger-model-cache already exists" in ready["message"]
    warned = isvc_events(stack.kubectl, ns)
    assert any(e["reason"] == "NameConflict" and e["type"] == "Warning" for e in warned)
    service, claim = _get(stack, "service", "ledger", ns), _get(stack, "pvc", "ledger-model-cache", ns)
    assert service is not None and claim is not None
    assert service["spec"]["selector"] == THEIR_SELECTOR, "the other team's traffic must stay theirs"
    assert "ownerReferences" not in service["metadata"] and "ownerReferences" not in claim["metadata"]
    assert _get(stack, "deployment", "ledger", ns) is None, "nothing of the conflicting service is applied"

    stack.kubectl("delete", ISVC, "ledger", "-n", ns, "--wait=true", "--timeout=60s")
    time.sleep(10)  # the garbage collector's chance to take anything the InferenceService owned
    service, claim = _get(stack, "service", "ledger", ns), _get(stack, "pvc", "ledger-model-cache", ns)
    assert service is not None and claim is not None, "deleting the InferenceService deleted another's object"
    assert service["spec"]["selector"] == THEIR_SELECTOR
