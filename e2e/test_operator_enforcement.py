"""The operator's own tenant guard on the real control plane, with the chart's admission policy disabled.

``helm install`` with ``admissionPolicy.enabled=false`` (the chart then sets
``admissionPolicy.operatorEnforcement`` to Strict); the operator runs on the host with the chart's container
command and environment and its ServiceAccount's token (e2e/test_chart.py's :class:`HostOperator`).
``alice`` holds only the chart's user roles in ``tenant-a``. With no policy the API server admits her
InferenceService with a privileged hostPath sidecar (e2e/tenant_cases.py's ``host-path-privileged``), but the
operator refuses it: Ready=False, reason Forbidden, a Warning event, and no Deployment; her example
InferenceService, applied alongside, gets its Deployment (the operator is reconciling).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.chart_harness import NS, module_cluster
from e2e.tenant_cases import REFUSED, A
from e2e.test_chart import EXAMPLE, Chart, HostOperator
from e2e.waits import wait_for


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chart]:
    with module_cluster(tmp_path_factory, "enforcement") as (cluster, home):
        yield Chart(cluster, home)


def _ready(chart: Chart, name: str) -> dict[str, Any] | None:
    isvc = chart.get("inferenceservices.kvpilot.io", name, "-n", A) or {}
    conditions = isvc.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


def test_without_the_policy_the_operator_refuses_an_escalation(chart: Chart) -> None:
    chart.kubectl("create", "namespace", NS)
    notes = chart.helm(
        "install", "kvpilot", "charts/kvpilot", "--namespace", NS, "--set", "admissionPolicy.enabled=false"
    )
    assert "admissionPolicy.operatorEnforcement=Strict: no admission policy runs" in notes, notes
    assert chart.kubectl("get", "validatingadmissionpolicies", "-o", "name").stdout.strip() == ""
    op = HostOperator(chart, chart.sa_kubeconfig(), "host-operator-guard")
    try:
        chart.cluster.create_namespace(A)
        for role in ("kvpilot-edit", "kvpilot-view"):
            chart.kubectl(
                "-n", A, "create", "rolebinding", f"alice-{role}", f"--clusterrole={role}", "--user=alice"
            )
        spec, _ = REFUSED["host-path-privileged"]
        created = chart.create_as("alice", spec, "escalate", ns=A)
        assert created.returncode == 0, f"the API server refused it (no policy should run): {created.stderr}"
        chart.kubectl("--as=alice", "-n", A, "apply", "-f", str(EXAMPLE))
        example = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]

        def refused() -> dict[str, Any] | None:
            assert op.alive(), f"the operator exited ({op.proc.returncode}):\n{op.log[-4000:]}"
            ready = _ready(chart, "escalate")
            return ready if ready and ready["status"] == "False" else None

        ready = wait_for(refused, 120, "Ready=False on the escalating InferenceService")
        assert ready["reason"] == "Forbidden", ready
        message = ready["message"]
        assert "spec.template.spec.volumes[root].hostPath" in message, message
        assert "spec.template.spec.containers[vllm].securityContext.privileged" in message, message
        assert "admissionPolicy.operatorEnforcement=Strict" in message, message
        # the operator reconciles what alice may run, so the refusal is the guard's, not an idle operator's
        wait_for(lambda: chart.get("deployment", example, "-n", A), 120, f"Deployment {A}/{example}")
        assert chart.get("deployment", "escalate", "-n", A) is None
        events = chart.get("events", "-n", A, "--field-selector", "involvedObject.name=escalate")
        assert any(e["type"] == "Warning" and e["reason"] == "Forbidden" for e in events["items"]), events
    finally:
        op.stop()
