"""The chart's peering lifetime (``peering.lifetimeSeconds``), as the variable the operator reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from helmchart import CHART, RELEASE, one, run_helm, values_args

from kvpilot.operator.loop import startup

Render = Callable[..., list[dict[str, Any]]]


def _env(objs: list[dict[str, Any]]) -> dict[str, str | None]:
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_default_lifetime_is_kopfs_and_reaches_the_operator(rendered: Render) -> None:
    default = yaml.safe_load((CHART / "values.yaml").read_text())["peering"]["lifetimeSeconds"]
    assert default == kopf.OperatorSettings().peering.lifetime  # the chart changes nothing by default
    value = _env(rendered())[startup.PEERING_LIFETIME_ENV]
    assert value is not None
    assert startup.peering_lifetime_from_env({startup.PEERING_LIFETIME_ENV: value}) == default


def test_a_shorter_lifetime_is_what_the_operator_reads(rendered: Render) -> None:
    value = _env(rendered(sets=["peering.lifetimeSeconds=20"]))[startup.PEERING_LIFETIME_ENV]
    assert value is not None
    assert startup.peering_lifetime_from_env({startup.PEERING_LIFETIME_ENV: value}) == 20


def test_standalone_has_no_peering_lifetime(rendered: Render) -> None:
    assert startup.PEERING_LIFETIME_ENV not in _env(rendered(CHART / "ci" / "standalone-values.yaml"))


def test_the_schema_minimum_is_the_operators() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    lifetime = schema["properties"]["peering"]["properties"]["lifetimeSeconds"]
    assert lifetime == {"type": "integer", "minimum": startup.PEERING_LIFETIME_MIN_S}


@pytest.mark.parametrize("value", [str(startup.PEERING_LIFETIME_MIN_S - 1), "soon", "1.5"])
def test_the_schema_refuses_what_the_operator_would(helm: Path, value: str) -> None:
    sets = [f"peering.lifetimeSeconds={value}"]
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0 and "/peering/lifetimeSeconds" in proc.stderr, proc.stderr


def test_extra_env_cannot_set_the_lifetime_a_second_time(helm: Path) -> None:
    sets = [f"operator.extraEnv[0].name={startup.PEERING_LIFETIME_ENV}"]
    value = ("--set-string", "operator.extraEnv[0].value=15")  # an env value is a string
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), *value, check=False)
    assert proc.returncode != 0 and "set peering.lifetimeSeconds instead" in proc.stderr, proc.stderr
