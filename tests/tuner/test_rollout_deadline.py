"""The rollout deadline follows the service's start time (``kvpilot.tuner.loop.rollout``): new settings
still loading their weights are never judged failed, and a service that starts fast keeps the configured
deadline."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import BUDGET, CURRENT, NOW, context, state_and_evidence, window

from kvpilot.tuner.loop.policy import Action, Decision, PolicyConfig, RolloutState, Trigger, compute_decision
from kvpilot.tuner.loop.rollout import compute_deadline_seconds, compute_predicted_start_seconds

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
        (5.0, 15.0, 900.0),  # a fast engine: 30 s download + 5 s, the configured deadline stands
        (5.0, 800.0, 2407.5),  # a fast engine, a 800 GiB download on a new node: (1600 s + 5 s) x 1.5
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
        CURRENT,
        window(),
        rollout=rollout,
        last_good=GOOD,
        ready=False,
        **kw,  # type: ignore[arg-type]
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


@pytest.mark.parametrize(
    ("checkpoint_gib", "weights_cached", "warm_compile", "expected"),
    [
        (600.0, False, 0.0, 1380.0),  # a download of 1200 s, then 180 s of load and start-up
        (600.0, True, 0.0, 180.0),  # on a shared volume: no download
        (600.0, True, 30.0, 150.0),  # and a warm compile cache: 30 s of torch.compile skipped
        (15.0, False, 30.0, 180.0),  # 30 s download + 150 s
        (15.0, False, 500.0, 30.0),  # the compile skipped is never more than the start
    ],
)
def test_predicted_start_knows_the_weight_and_compile_caches(
    checkpoint_gib: float, weights_cached: bool, warm_compile: float, expected: float
) -> None:
    got = compute_predicted_start_seconds(
        POLICY,
        checkpoint_gib=checkpoint_gib,
        weights_cached=weights_cached,
        warm_compile_seconds=warm_compile,
    )
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("measured", "weights_cached", "expected"),
    [
        (None, False, 210.0),  # nothing measured: 30 s download + the assumed 180 s
        (12.0, False, 42.0),  # seen to start in 12 s: 30 s download + 12 s
        (12.0, True, 12.0),  # and the weights on a volume
        (900.0, False, 210.0),  # a slow measured start may hold a download: the assumption, not 30 + 900
    ],
)
def test_a_measured_start_shorter_than_the_assumption_replaces_it(
    measured: float | None, weights_cached: bool, expected: float
) -> None:
    got = compute_predicted_start_seconds(
        POLICY,
        checkpoint_gib=15.0,
        weights_cached=weights_cached,
        warm_compile_seconds=0.0,
        measured_start_seconds=measured,
    )
    assert got == pytest.approx(expected)


def test_negative_prediction_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="negative start evidence"):
        compute_predicted_start_seconds(
            POLICY, checkpoint_gib=-1.0, weights_cached=False, warm_compile_seconds=0
        )
    with pytest.raises(ValueError, match="negative start evidence"):
        compute_predicted_start_seconds(
            POLICY, checkpoint_gib=1.0, weights_cached=False, warm_compile_seconds=-1
        )


def test_cached_weights_keep_the_configured_deadline_for_a_big_checkpoint() -> None:
    """A 600 GiB checkpoint on a shared volume starts in the configured time: a rollout 1000 s in has
    failed, where the same checkpoint downloaded on every start would still wait (2070 s)."""
    big = dataclasses.replace(BUDGET, weights_gib=600.0)
    state, evidence = state_and_evidence(
        CURRENT, window(), rollout=_started(1000), last_good=GOOD, budget=big
    )
    assert (
        compute_decision(state, evidence, context(policy=POLICY), NOW).trigger == Trigger.ROLLOUT_IN_PROGRESS
    )
    cached = dataclasses.replace(evidence, weights_cached=True)
    assert compute_decision(state, cached, context(policy=POLICY), NOW).action == Action.ROLLBACK


def test_the_whole_checkpoint_wins_over_one_ranks_weights() -> None:
    """``Evidence.checkpoint_gib`` (the operator's, the whole model) predicts the download, not the budget's
    one-rank weights: 600 GiB in all under tensor parallelism 8 is 2070 s, not the 900 s of 75 GiB."""
    rank = dataclasses.replace(BUDGET, weights_gib=75.0)
    state, evidence = state_and_evidence(
        CURRENT, window(), rollout=_started(1000), last_good=GOOD, budget=rank
    )
    assert compute_decision(state, evidence, context(policy=POLICY), NOW).action == Action.ROLLBACK
    whole = dataclasses.replace(evidence, checkpoint_gib=600.0)
    assert compute_decision(state, whole, context(policy=POLICY), NOW).trigger == Trigger.ROLLOUT_IN_PROGRESS


def test_a_warm_compile_cache_counts_only_when_the_change_keeps_the_compile_hash() -> None:
    """From the last good settings, a change of utilisation alone restarts onto the persistent compile
    cache (30 s less), a change of ``max_num_seqs`` compiles again. A 1000 GiB checkpoint: 2000 s of
    download + 180 s, x1.5 = 3270 s cold-compiled, 3225 s warm."""
    big = dataclasses.replace(BUDGET, weights_gib=1000.0)
    gmu_only = CURRENT.replace(gpu_memory_utilization=0.85)
    state, evidence = state_and_evidence(
        CURRENT, window(), rollout=_started(3250), last_good=gmu_only, budget=big
    )
    persistent = dataclasses.replace(evidence, compile_cache_persistent=True)
    assert (
        compute_decision(state, evidence, context(policy=POLICY), NOW).trigger == Trigger.ROLLOUT_IN_PROGRESS
    )
    assert compute_decision(state, persistent, context(policy=POLICY), NOW).action == Action.ROLLBACK
    seqs = dataclasses.replace(state, last_good=GOOD)  # max_num_seqs differs: a cold compile
    assert (
        compute_decision(seqs, persistent, context(policy=POLICY), NOW).trigger == Trigger.ROLLOUT_IN_PROGRESS
    )
