"""Vertical and horizontal, coordinated (kvpilot.tuner.loop.scaling and the policy's use of it)."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import CURRENT, NOW, context, state_and_evidence, window

from kvpilot.tuner.loop.config import TuningBounds
from kvpilot.tuner.loop.policy import Action, Decision, Trigger, compute_decision
from kvpilot.tuner.loop.scaling import MAX_REPLICAS, ReplicaView, compute_replica_change, compute_scale_out


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (ReplicaView(desired=3, live=1, ready=1, newest_start=NOW - 3600), "1 pod(s) for 3 replica(s)"),
        (ReplicaView(desired=1, live=3, ready=3, newest_start=NOW - 3600), "3 pod(s) for 1 replica(s)"),
        (ReplicaView(desired=3, live=3, ready=2, newest_start=NOW - 3600), "2 of 3 replica(s) Ready"),
        (ReplicaView(desired=3, live=3, ready=3, newest_start=NOW - 60), "a pod joined 60s ago"),
    ],
)
def test_a_changing_replica_count_says_why(view: ReplicaView, expected: str) -> None:
    reason = compute_replica_change(view, NOW, 300.0)
    assert reason is not None and reason.startswith(expected)


@pytest.mark.parametrize("start", [NOW - 301, None])
def test_a_settled_replica_count_is_not_changing(start: float | None) -> None:
    assert (
        compute_replica_change(ReplicaView(desired=3, live=3, ready=3, newest_start=start), NOW, 300) is None
    )


@pytest.mark.parametrize(
    ("running", "waiting", "replicas", "expected"),
    [
        (100.0, 0.0, 1, 2),  # no queue: one more replica
        (100.0, 100.0, 1, 2),  # demand twice what runs
        (100.0, 250.0, 2, 7),  # 2 * 350 / 100
        (0.0, 50.0, 3, 4),  # nothing running: one more
    ],
)
def test_scale_out_follows_the_demand(running: float, waiting: float, replicas: int, expected: int) -> None:
    assert compute_scale_out(window(running=running, waiting=waiting), replicas) == expected


def test_scale_out_stops_at_the_maximum_and_needs_a_replica() -> None:
    assert compute_scale_out(window(running=10.0, waiting=10_000.0), MAX_REPLICAS - 1) == MAX_REPLICAS
    # a demand too large to be a number (hypothesis found it through TGI's latency rule) is the maximum
    assert compute_scale_out(window(running=1e-300, waiting=1e300), 1) == MAX_REPLICAS
    assert compute_scale_out(window(), MAX_REPLICAS) is None
    assert compute_scale_out(window(), 0) is None


def _decide(win: object, bounds: TuningBounds, replicas: int = 1, changing: str | None = None) -> Decision:
    state, evidence = state_and_evidence(CURRENT, win)  # type: ignore[arg-type]
    evidence = dataclasses.replace(evidence, replicas=replicas, replicas_changing=changing)
    return compute_decision(state, evidence, context(bounds), NOW)


def test_pressure_at_the_floor_recommends_replicas() -> None:
    d = _decide(window(kv=0.97, preempt=0.5, running=256, waiting=256), TuningBounds(min_max_num_seqs=256), 2)
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, Trigger.KV_PRESSURE, 4)


def test_pressure_with_room_to_tune_retunes_and_recommends_no_replicas() -> None:
    d = _decide(window(kv=0.97, preempt=0.5, running=256), TuningBounds(min_max_model_len=4096))
    assert (d.action, d.scale_out) == (Action.RETUNE, None)


def test_no_scale_out_recommendation_while_the_count_changes() -> None:
    d = _decide(window(kv=0.97, preempt=0.5, running=256), TuningBounds(min_max_num_seqs=256), 2, "1 pod(s)")
    assert d.scale_out is None


def test_no_metrics_driven_retune_while_the_count_changes() -> None:
    win = window(kv=0.97, preempt=0.5, running=256)
    bounds = TuningBounds(min_max_model_len=4096)
    assert _decide(win, bounds).action is Action.RETUNE
    d = _decide(win, bounds, 3, "1 of 3 replica(s) Ready")
    assert d.action is Action.HOLD
    assert "the replica count is changing (1 of 3 replica(s) Ready)" in d.reason
