"""Conditions: list keyed by type, transition time moves only on a status change."""

from __future__ import annotations

import pytest

from kvpilot.operator import conditions as c


def test_set_and_keep_transition_time() -> None:
    one = c.set_condition([], "Ready", "False", "Infeasible", "too big", generation=1, now="t1")
    two = c.set_condition(one, "Ready", "False", "UnknownGpu", "which GPU?", generation=2, now="t2")
    three = c.set_condition(two, "Ready", "True", "Applied", "ok", generation=3, now="t3")
    assert two[0]["lastTransitionTime"] == "t1" and two[0]["reason"] == "UnknownGpu"
    assert three[0]["lastTransitionTime"] == "t3" and three[0]["observedGeneration"] == 3
    assert len(three) == 1


def test_order_and_lookup() -> None:
    conds = c.set_conditions(
        [{"type": "MetricsAvailable", "status": "True", "reason": "Scraped"}],
        [
            (c.INFEASIBLE, "False", "Feasible", ""),
            (c.READY, "True", "Applied", ""),
        ],
        generation=1,
        now="t",
    )
    assert [x["type"] for x in conds] == ["Ready", "Infeasible", "MetricsAvailable"]
    assert c.is_true(conds, "Ready") and not c.is_true(conds, "Infeasible")
    assert c.find_condition(conds, "Nope") is None


@pytest.mark.parametrize("status,reason", [("Yes", "Ok"), ("True", "not camel"), ("True", "")])
def test_rejects_bad_values(status: str, reason: str) -> None:
    with pytest.raises(ValueError):
        c.set_condition([], "Ready", status, reason, "", generation=1, now="t")
