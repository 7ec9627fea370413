"""The chart's fleet-learning setting (``learning.sharedNamespaces``), as the variable the operator reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helmchart import CHART, RELEASE, one, run_helm, values_args

from kvpilot.operator.planning import profile_scope

Render = Callable[..., list[dict[str, Any]]]
ENV = profile_scope.SHARED_NAMESPACES_ENV


def _env(objs: list[dict[str, Any]]) -> dict[str, str | None]:
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_by_default_every_namespace_learns_alone(rendered: Render) -> None:
    value = _env(rendered())[ENV]
    assert value == "" and profile_scope.sharing_from_env({ENV: value}) == frozenset()


def test_listed_namespaces_reach_the_operator(rendered: Render) -> None:
    value = _env(rendered(sets=["learning.sharedNamespaces={team-a,team-b}"]))[ENV]
    assert value is not None and profile_scope.sharing_from_env({ENV: value}) == {"team-a", "team-b"}


@pytest.mark.parametrize(
    ("sets", "why"),
    [
        (["learning.sharedNamespaces={team-a}"], "list at least two namespaces"),
        (["learning.sharedNamespaces={team-a,Team_B}"], "/learning/sharedNamespaces"),
        (
            [f"operator.extraEnv[0].name={ENV}", "operator.extraEnv[0].value=a"],
            "set learning.sharedNamespaces",
        ),
    ],
)
def test_the_chart_refuses_what_the_operator_would(helm: Path, sets: list[str], why: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr
