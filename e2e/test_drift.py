"""One writer per field and drift repair, on the real local control plane.

The operator runs on the host (``kopf run``) with the closed loop ticking every 2 s (no Prometheus: the
loop still reads the pods every tick and writes ``Available``, ``Degraded``, ``MetricsAvailable`` and
``Ready`` from them), watching only this module's namespaces (``kvdrift-*``); KWOK makes the pods Ready.

* A spec update while the loop ticks reaches ``Ready`` at the new generation within one reconcile, and no
  later tick puts back the old generation's ``Ready``.
* A deleted Deployment or Service is recreated; ``kubectl patch`` of the vLLM args or ``kubectl scale`` is
  reverted, with a ``DriftDetected`` event naming the field and who changed it.
"""

from __future__ import annotations

import json
import time
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
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-on-l4.yaml"
RESOURCE = "inferenceservices.kvpilot.io"
NAME = "llama-8b-l4"
WAIT_S = 90.0


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return c


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(cluster.kubectl, f"crd/{RESOURCE}")
    log = tmp_path_factory.mktemp("drift-operator") / "kopf.log"
    with host_operator(cluster, log, "kvdrift-*", {"KVPILOT_CLOSED_LOOP_INTERVAL": "2"}):
        yield log


@pytest.fixture
def serving(cluster: LocalCluster, operator: Path) -> Iterator[str]:
    """A namespace with the example InferenceService Ready (Serving) at generation 1."""
    ns = f"kvdrift-{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(ns):
        cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))

        def served() -> Any:
            obj = get(cluster, RESOURCE, NAME, "-n", ns)
            ready = condition(obj, "Ready")
            return obj if (ready.get("reason"), ready.get("observedGeneration")) == ("Serving", 1) else None

        wait_for(served, WAIT_S, f"{ns}/{NAME} Ready (Serving) at generation 1")
        try:
            yield ns
        finally:  # while the operator runs: it releases its finalizer
            cluster.kubectl("delete", RESOURCE, "--all", "-n", ns, "--timeout=60s", check=False)


def drift_events(cluster: LocalCluster, ns: str) -> list[str]:
    events = get(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME}") or {}
    return [e.get("message", "") for e in events.get("items", []) if e.get("reason") == "DriftDetected"]


def test_a_spec_update_during_ticks_reaches_ready_at_the_new_generation(
    cluster: LocalCluster, serving: str
) -> None:
    ns = serving
    token = {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}
    env = [{"name": "HF_TOKEN", "valueFrom": token}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    patch = {"spec": {"engine": {"env": env}}}
    cluster.kubectl("patch", RESOURCE, NAME, "-n", ns, "--type=merge", "-p", json.dumps(patch))
    started = time.monotonic()

    def at_two() -> Any:
        obj = get(cluster, RESOURCE, NAME, "-n", ns)
        ready = condition(obj, "Ready")
        ok = obj["status"].get("observedGeneration") == 2 and ready.get("observedGeneration") == 2
        return obj if ok else None

    wait_for(at_two, 30, "Ready at generation 2")
    took = time.monotonic() - started
    # the loop ticks every 2 s: for the next 10 s no tick may bring back generation 1's Ready
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        obj = get(cluster, RESOURCE, NAME, "-n", ns)
        seen.append(
            (condition(obj, "Ready").get("observedGeneration"), condition(obj, "Ready").get("reason"))
        )
        time.sleep(0.5)
    assert {g for g, _ in seen} == {2}, seen
    # and Ready follows the new pods again (Serving at generation 2)
    wait_for(
        lambda: condition(get(cluster, RESOURCE, NAME, "-n", ns), "Ready").get("reason") == "Serving",
        WAIT_S,
        "Ready Serving at generation 2",
    )
    history = get(cluster, RESOURCE, NAME, "-n", ns)["status"]["history"]
    assert [h["action"] for h in history][:1] == ["Planned"], history
    print(f"Ready at generation 2 {took:.1f} s after the spec update")


def test_a_deleted_deployment_and_service_are_recreated(cluster: LocalCluster, serving: str) -> None:
    ns = serving
    for kind in ("deployment", "service"):
        uid = get(cluster, kind, NAME, "-n", ns)["metadata"]["uid"]
        cluster.kubectl("delete", kind, NAME, "-n", ns, "--wait=true")
        started = time.monotonic()
        back = wait_for(
            lambda: (o := get(cluster, kind, NAME, "-n", ns)) and o["metadata"]["uid"] != uid and o,  # noqa: B023
            30,
            f"{kind} {NAME} recreated",
        )
        print(f"{kind} recreated in {time.monotonic() - started:.1f} s")
        (owner,) = back["metadata"]["ownerReferences"]
        assert owner["name"] == NAME
    messages = wait_for(
        lambda: len(drift_events(cluster, ns)) >= 2 and drift_events(cluster, ns), 30, "events"
    )
    assert any(f"Deployment {NAME} was deleted" in m for m in messages), messages
    assert any(f"Service {NAME} was deleted" in m for m in messages), messages


def test_a_hand_edit_of_the_args_and_replicas_is_reverted(cluster: LocalCluster, serving: str) -> None:
    ns = serving
    original = get(cluster, "deployment", NAME, "-n", ns)
    args = container(original)["args"]
    edited = [*args, "--enforce-eager"]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": edited}]}}}}
    cluster.kubectl("patch", "deployment", NAME, "-n", ns, "-p", json.dumps(patch))
    wait_for(
        lambda: container(get(cluster, "deployment", NAME, "-n", ns))["args"] == args, 30, "args reverted"
    )
    messages = wait_for(lambda: drift_events(cluster, ns), 30, "a DriftDetected event")
    assert any(
        "spec.template.spec.containers[vllm].args was changed by kubectl-patch" in m
        and "--enforce-eager" in m
        for m in messages
    ), messages
    cluster.kubectl("scale", "deployment", NAME, "-n", ns, "--replicas=3")
    wait_for(
        lambda: get(cluster, "deployment", NAME, "-n", ns)["spec"]["replicas"] == 1, 30, "replicas reverted"
    )
    messages = wait_for(
        lambda: [m for m in drift_events(cluster, ns) if "spec.replicas" in m],
        30,
        "a DriftDetected on replicas",
    )
    assert "kubectl" in messages[0], messages
    # the repair did not touch what the spec says: still Ready at generation 1 and the planned settings
    obj = get(cluster, RESOURCE, NAME, "-n", ns)
    assert condition(obj, "Ready").get("observedGeneration") == 1
    assert yaml.safe_dump(container(get(cluster, "deployment", NAME, "-n", ns))["args"]) == yaml.safe_dump(
        args
    )
