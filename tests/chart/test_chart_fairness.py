"""The chart's fairness values (``operator.fairness``), as the variables the operator's gate reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helmchart import CHART, RELEASE, one, run_helm, values_args

from kvpilot.operator import fairness

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(autouse=True)
def _keep_the_process_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fairness, "_GATE", fairness.gate())  # configure() below replaces it; put it back


def _gate_from(objs: list[dict[str, Any]]) -> fairness.FairGate:
    """The gate the operator would run with the rendered Deployment's environment (its start-up steps)."""
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    fairness.configure(fairness.settings_from_env(env))
    return fairness.gate()


def test_the_default_install_runs_the_documented_gate(rendered: Render) -> None:
    gate = _gate_from(rendered())
    assert (gate.total, gate.per_namespace) == (fairness.DEFAULT_TOTAL, fairness.DEFAULT_PER_NAMESPACE)


def test_the_values_reach_the_gate(rendered: Render) -> None:
    sets = ["operator.fairness.maxConcurrentWork=40", "operator.fairness.maxWorkPerNamespace=2"]
    gate = _gate_from(rendered(sets=sets))
    assert (gate.total, gate.per_namespace) == (40, 2)


@pytest.mark.parametrize(
    ("sets", "why"),
    [
        (["operator.fairness.maxWorkPerNamespace=0"], "/operator/fairness/maxWorkPerNamespace"),
        (["operator.fairness.maxConcurrentWork=many"], "/operator/fairness/maxConcurrentWork"),
        (["operator.fairness.slots=3"], "slots"),
        (
            ["operator.fairness.maxConcurrentWork=4", "operator.fairness.maxWorkPerNamespace=5"],
            "maxWorkPerNamespace (5) is above maxConcurrentWork (4)",
        ),
        (
            [f"operator.extraEnv[0].name={fairness.PER_NAMESPACE_ENV}", "operator.extraEnv[0].value=x"],
            "set operator.fairness.* instead of KVPILOT_MAX_WORK_PER_NAMESPACE",
        ),
    ],
)
def test_the_chart_refuses_what_the_operator_would(helm: Path, sets: list[str], why: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr
