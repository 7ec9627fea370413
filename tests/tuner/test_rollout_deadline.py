"""The rollout deadline follows the service's start time (``kvpilot.tuner.loop.rollout``): new settings
still loading their weights are never judged failed, and a service that starts fast keeps the configured
deadline."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import BUDGET, CURRENT, NOW, context, state_and_evidence, window

from kvpilot.tuner.loop.policy import Action, Decision, PolicyConfig, RolloutState, Trigger, compute_decision
from kvpilot.tuner.loop.rollout import compute_deadline_seconds

POLICY = PolicyConfig()  # 900 s configured, x1.5 the expected start, 0.5 GiB/s, 180 s load + engine
GOOD = CURRENT.replace(max_num_seqs=320)


@pytest.mark.parametrize(
    ("restart_seconds", "checkpoint_gib", "expected"),
    [
        (None, 15.0, 900.0),  # an 8B model: 30 s download + 180 s = 210 s, x1.5 = 315 s < 900 s
        (150.0, 15.0, 900.0),  # measured fast: the configured deadline stands
        (1260.0, 61.0, 1890.0),  # measured 21 min (a slow network): 1.5 x the measured start
        (None, 600.0, 2070.0),  # nothing measured, a 600 GiB checkpoint: (1200 s + 180 s) x 1.5
        (200.0, 600.0, 2070.0),  # measured with the weights cached; a cold start on a new node is longer
    ],
)
def test_deadline_follows_the_expected_start(
    restart_seconds: float | None, checkpoint_gib: float, expected: float
) -> None:
    got = compute_deadline_seconds(POLICY, restart_seconds=restart_seconds, checkpoint_gib=checkpoint_gib)
    assert got == pytest.approx(expected)


def test_deadline_never_below_the_configured_one() -> None:
    policy = PolicyConfig(rollout_deadline_seconds=3600)
    assert compute_deadline_seconds(policy, restart_seconds=1260.0, checkpoint_gib=61.0) == 3600


def test_negative_start_evidence_is_refused() -> None:
    with pytest.raises(ValueError, match="negative start evidence"):
        compute_deadline_seconds(POLICY, restart_seconds=-1.0, checkpoint_gib=15.0)


def _decide(rollout: RolloutState, **kw: object) -> Decision:
    state, evidence = state_and_evidence(
        CURRENT, window(), rollout=rollout, last_good=GOOD, ready=False, **kw  # type: ignore[arg-type]
    )
    return compute_decision(state, evidence, context(policy=POLICY), NOW)


def _started(ago: float) -> RolloutState:
    """A rollout whose pods started ``ago`` seconds before now, its stored deadline the configured one."""
    return RolloutState(CURRENT, started_at=NOW - ago, deadline=NOW - ago + POLICY.rollout_deadline_seconds)


def test_slow_start_past_the_configured_deadline_still_waits() -> None:
    d = _decide(_started(1000), restart_seconds=1260.0)  # 21-minute starts: the deadline is 1890 s
    assert (d.action, d.trigger, d.failed) == (Action.HOLD, Trigger.ROLLOUT_IN_PROGRESS, None)
    assert "890s to deadline" in d.reason


def test_slow_start_past_its_own_deadline_fails() -> None:
    d = _decide(_started(1900), restart_seconds=1260.0)
    assert (d.action, d.trigger, d.failed) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED, CURRENT)
    assert d.settings == GOOD
    assert "not Ready within 1890s" in d.reason


def test_fast_start_keeps_the_configured_deadline() -> None:
    d = _decide(_started(901), restart_seconds=150.0)
    assert (d.action, d.failed) == (Action.ROLLBACK, CURRENT)


def test_prediction_from_the_checkpoint_when_nothing_is_measured() -> None:
    big = dataclasses.replace(BUDGET, weights_gib=600.0)
    assert _decide(_started(1000), budget=big).trigger == Trigger.ROLLOUT_IN_PROGRESS
    assert _decide(_started(2071), budget=big).action == Action.ROLLBACK


def test_extension_counts_from_the_newest_pods_start() -> None:
    """The stored deadline counts from the newest pod's start (a pod that waited for a GPU used none of it):
    the extension moves that deadline, not one counted from the patch."""
    pod_start = NOW - 1000
    waited = RolloutState(CURRENT, NOW - 3000, deadline=pod_start + POLICY.rollout_deadline_seconds)
    d = _decide(waited, restart_seconds=1260.0)  # its pod started 1000 s ago
    assert d.trigger == Trigger.ROLLOUT_IN_PROGRESS
