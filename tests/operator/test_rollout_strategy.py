"""spec.rollout.strategy resolved against the cluster (kvpilot.operator.pods.rollout_strategy)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator import api
from kvpilot.operator.pods.rollout_strategy import (
    HELD_MESSAGE,
    build_deployment_strategy,
    compute_lost_fraction,
    compute_rollout_choice,
)


def choose(replicas: int, fits: bool | None, serving: bool = True, **rollout: Any) -> tuple[Any, str, int]:
    c = compute_rollout_choice(
        api.RolloutSpec.model_validate(rollout),
        replicas,
        fits_now=fits,
        serving=serving,
        not_serving_why="CrashLoopBackOff",
    )
    return c.strategy, c.reason, c.max_unavailable


@pytest.mark.parametrize(
    ("replicas", "fits", "serving", "rollout", "strategy", "step"),
    [
        (1, True, True, {}, "Surge", 0),  # a surge pod fits: nothing is lost
        (3, False, True, {}, "Replace", 1),  # full pool, several replicas: one at a time
        (3, False, True, {"maxUnavailable": 5}, "Replace", 2),  # at most replicas - 1: one keeps serving
        (1, False, True, {"allowDowntime": True}, "Recreate", 0),
        (1, False, True, {}, None, 0),  # held
        (1, False, False, {}, "Replace", 1),  # crash loop: nothing lost by taking its GPU
        (2, False, False, {}, "Replace", 2),
        (1, None, True, {}, "Surge", 0),  # capacity unknown: surge waits Pending, never fails
        (1, False, True, {"strategy": "Surge"}, "Surge", 0),  # explicit strategies are honoured
        (1, True, True, {"strategy": "Replace"}, "Replace", 1),
        (4, True, True, {"strategy": "Recreate", "allowDowntime": True}, "Recreate", 0),
    ],
)
def test_choice(
    replicas: int, fits: bool | None, serving: bool, rollout: dict[str, Any], strategy: Any, step: int
) -> None:
    got, reason, max_unavailable = choose(replicas, fits, serving, **rollout)
    assert (got, max_unavailable) == (strategy, step), reason


def test_held_and_crash_reasons() -> None:
    assert choose(1, False)[1] == HELD_MESSAGE
    assert "no replica serves (CrashLoopBackOff)" in choose(1, False, serving=False)[1]


def test_rendered_strategies() -> None:
    replace = compute_rollout_choice(api.RolloutSpec(), 3, fits_now=False, serving=True)
    assert build_deployment_strategy(replace) == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    recreate = compute_rollout_choice(api.RolloutSpec(allow_downtime=True), 1, fits_now=False, serving=True)
    assert build_deployment_strategy(recreate) == {"type": "Recreate"}
    held = compute_rollout_choice(api.RolloutSpec(), 1, fits_now=False, serving=True)
    assert build_deployment_strategy(held)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_lost_fraction() -> None:
    spec = api.RolloutSpec(allow_downtime=True)
    surge = compute_rollout_choice(spec, 1, fits_now=True, serving=True)
    assert compute_lost_fraction(surge, 1, serving=True) == 0
    recreate = compute_rollout_choice(spec, 1, fits_now=False, serving=True)
    assert compute_lost_fraction(recreate, 1, serving=True) == 1.0
    replace = compute_rollout_choice(spec, 4, fits_now=False, serving=True)
    assert compute_lost_fraction(replace, 4, serving=True) == 0.25
    assert compute_lost_fraction(recreate, 1, serving=False) == 0.0  # nothing serves: nothing to lose
