"""The rollout gates of the policy: a metrics-driven change goes ahead only when its expected gain outweighs
its restart cost under the rollout strategy in use; a change that cannot roll out holds with the reason."""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner.loop import Action, Decision, PolicyConfig, Trigger, TuningBounds, compute_decision, trade
from kvpilot.tuner.loop.history import (
    HistoryAction,
    HistoryEntry,
    compute_compiled_settings,
    compute_held_since,
)
from kvpilot.tuner.loop.observations import ObservationWindow, RestartKind
from tests.tuner.policy_fixtures import CURRENT, NOW, context, entry, restart, state_and_evidence, window

BOUNDS = TuningBounds(min_max_model_len=4096)
SHALLOW_QUEUE = window(kv=0.3, waiting=12, running=256, prompt=300, output=200)
"""12 requests wait behind 256 running: raising to 320 sequences wins 12/256 = 4.7 % of the capacity."""
DEEP_QUEUE = window(kv=0.2, waiting=256, running=256, prompt=100, output=100)
"""As many wait as run: raising to 512 sequences doubles what runs (the gain is capped at the whole)."""


def decide(
    win: ObservationWindow,
    *,
    lost: float,
    restart_s: float = 180.0,
    blocked: str | None = None,
    restarts: tuple = (),
    history: tuple[HistoryEntry, ...] = (),
) -> Decision:
    state, evidence = state_and_evidence(CURRENT, win, restarts, history, restart_seconds=restart_s)
    evidence = dataclasses.replace(evidence, rollout_lost_fraction=lost, rollout_blocked=blocked)
    return compute_decision(state, evidence, context(BOUNDS, PolicyConfig()), NOW)


def test_a_small_gain_goes_ahead_when_the_rollout_loses_nothing() -> None:
    d = decide(SHALLOW_QUEUE, lost=0.0)  # Surge: a new pod beside the old one
    assert (d.action, d.trigger, d.settings.max_num_seqs) == (Action.RETUNE, Trigger.IDLE_CAPACITY, 320)


@pytest.mark.parametrize("lost", [1.0, 0.5])  # Recreate of one replica; Replace of one of two
def test_a_small_gain_is_not_worth_lost_serving(lost: float) -> None:
    d = decide(SHALLOW_QUEUE, lost=lost)
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, Trigger.IDLE_CAPACITY, CURRENT)
    # gain 12/256 x 480 s cooldown = 22 s; cost lost x 180 s restart
    assert "not worth a restart (expected gain 22s of full capacity over 480s" in d.reason
    assert f"restart cost {lost * 180:.0f}s" in d.reason
    assert d.recommended is not None and d.recommended.max_num_seqs == 320


def held(ago: float, trigger: str = Trigger.IDLE_CAPACITY) -> HistoryEntry:
    return entry(ago, trigger, HistoryAction.HELD)


def test_a_small_gain_that_persists_wins_its_restart() -> None:
    """12/256 of the capacity is 22 s over the 480 s cooldown against a 180 s restart; counted over the
    cooldown plus the time already held for it, it goes once the hold has lasted 3,360 s (22.5 s per
    480 s: 0.047 x 3,840 = 180 s) and not before. The persistence is capped at an hour."""
    retune = (entry(7200.0, Trigger.IDLE_CAPACITY),)
    assert decide(SHALLOW_QUEUE, lost=1.0, history=(*retune, held(3000.0))).action == Action.HOLD
    d = decide(SHALLOW_QUEUE, lost=1.0, history=(*retune, held(3500.0)))
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 320)
    # 3,500 s held for another trigger, or interrupted by a change since: the clock starts again
    assert decide(SHALLOW_QUEUE, lost=1.0, history=(held(3500.0, Trigger.KV_PRESSURE),)).action == Action.HOLD
    assert decide(SHALLOW_QUEUE, lost=1.0, history=(held(3500.0), entry(600.0))).action == Action.HOLD
    # a trickle of gain never outweighs the restart, however long it lasts: the horizon stops at an hour
    tiny = window(kv=0.3, waiting=2, running=256, prompt=300, output=200)
    assert decide(tiny, lost=1.0, history=(held(86_400.0),)).action == Action.HOLD


def test_held_since_is_the_start_of_the_newest_run_of_holds_for_the_trigger() -> None:
    history = (held(900.0, Trigger.KV_PRESSURE), held(800.0), held(500.0), held(100.0))
    assert compute_held_since(history, Trigger.IDLE_CAPACITY) == NOW - 800.0
    assert compute_held_since(history, Trigger.KV_PRESSURE) is None
    assert compute_held_since((*history, entry(50.0)), Trigger.IDLE_CAPACITY) is None
    assert compute_held_since((), Trigger.IDLE_CAPACITY) is None


def test_a_large_gain_outweighs_full_downtime() -> None:
    d = decide(DEEP_QUEUE, lost=1.0)
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 512)


def test_a_slow_start_makes_the_same_change_not_worth_it() -> None:
    """The cost follows the measured start-up time: 10 s to Ready makes the shallow-queue change worth a
    full restart (4.7 % of a 310 s cooldown = 14.5 s > 10 s), 600 s does not (the cooldown grows with it
    too, but the gain is only a share of it)."""
    assert decide(SHALLOW_QUEUE, lost=1.0, restart_s=10.0).action == Action.RETUNE
    assert decide(SHALLOW_QUEUE, lost=1.0, restart_s=600.0).action == Action.HOLD


def test_pressure_gain_counts_preemptions_per_running_request() -> None:
    storm = window(kv=0.97, preempt=2.0, running=100)
    trickle = window(kv=0.97, preempt=0.06, running=100)  # 0.06/s x 480 s / 100 = 29 % of 480 s < 180 s
    assert decide(storm, lost=1.0).action == Action.RETUNE  # 2/s x 480 s over 100 running: the whole
    held = decide(trickle, lost=1.0)
    assert (held.action, held.trigger) == (Action.HOLD, Trigger.KV_PRESSURE)
    assert "not worth a restart" in held.reason


def test_crash_remedies_always_go_ahead() -> None:
    crash = (restart(RestartKind.CUDA_OOM, ago=10, count=2),)
    d = decide(window(kv=0.5), lost=1.0, restart_s=3600.0, restarts=crash)
    assert d.action == Action.RETUNE and d.trigger == RestartKind.CUDA_OOM


def test_a_change_that_cannot_roll_out_holds_with_the_reason_and_the_recommendation() -> None:
    why = "no spare GPU for a surge pod; allow downtime or add capacity"
    d = decide(DEEP_QUEUE, lost=0.0, blocked=why)
    assert (d.action, d.settings) == (Action.HOLD, CURRENT)
    assert d.reason.endswith(f"but {why}")
    assert d.recommended is not None and d.recommended.max_num_seqs == 512


def test_the_trade_in_figures() -> None:
    t = trade.compute_trade(
        "IdleCapacity",
        SHALLOW_QUEUE,
        CURRENT,
        CURRENT.replace(max_num_seqs=320),
        cooldown_seconds=480.0,
        restart_seconds=180.0,
        lost_fraction=0.5,
    )
    assert (round(t.gain_seconds, 1), t.cost_seconds, t.worth_it) == (22.5, 90.0, False)


def test_a_restart_onto_a_warm_compile_cache_skips_the_compile() -> None:
    """Only ``gpu_memory_utilization`` stays out of vLLM's compile hash: changing it alone on pods with a
    persistent cache costs the restart less the compile; any other change, or no persistent cache, the
    whole restart."""
    memory_only, seqs = CURRENT.replace(gpu_memory_utilization=0.88), CURRENT.replace(max_num_seqs=320)
    warm = trade.compute_warm_compile_seconds
    assert warm(CURRENT, memory_only, persistent=True, compile_seconds=30.0, restart_seconds=180.0) == 30.0
    assert warm(CURRENT, memory_only, persistent=False, compile_seconds=30.0, restart_seconds=180.0) == 0.0
    assert warm(CURRENT, seqs, persistent=True, compile_seconds=30.0, restart_seconds=180.0) == 0.0
    assert warm(CURRENT, memory_only, persistent=True, compile_seconds=300.0, restart_seconds=180.0) == 180.0
    t = trade.compute_trade(
        "IdleCapacity",
        SHALLOW_QUEUE,
        CURRENT,
        memory_only,
        cooldown_seconds=480.0,
        restart_seconds=180.0,
        lost_fraction=0.5,
        warm_compile_seconds=30.0,
    )
    assert t.cost_seconds == 75.0  # half the capacity for 180 - 30 s
    assert t.describe().endswith("restart cost 75s (warm compile cache: 30s less)")


def test_a_change_of_a_hashed_setting_pays_the_whole_restart_even_with_a_persistent_cache() -> None:
    """The trickle of preemptions wins 138 s against a 180 s restart; a 100 s compile taken off would make
    the cut of ``max_num_seqs`` worth it, but that change recompiles: it still holds at the full cost."""
    trickle = window(kv=0.97, preempt=0.06, running=100)
    state, evidence = state_and_evidence(CURRENT, trickle, (), (), restart_seconds=180.0)
    evidence = dataclasses.replace(evidence, rollout_lost_fraction=1.0, compile_cache_persistent=True)
    d = compute_decision(state, evidence, context(BOUNDS, PolicyConfig(compile_seconds=100.0)), NOW)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.KV_PRESSURE)
    assert "restart cost 180s)" in d.reason and "warm compile cache" not in d.reason


def test_a_change_back_to_settings_that_ran_since_the_plan_starts_warm() -> None:
    """The trickle's cut recompiles, so it holds at the full cost; but when the history shows the cut's
    settings ran on this volume after the plan (an earlier raise went from them to the current ones), their
    graphs are in the cache: the cut back costs the restart less the compile and goes ahead. Before the
    latest plan (the model, release or image may have changed) nothing counts."""
    trickle = window(kv=0.97, preempt=0.06, running=100)
    policy = context(BOUNDS, PolicyConfig(compile_seconds=100.0))

    def decide_with(history: tuple[HistoryEntry, ...]) -> Decision:
        state, evidence = state_and_evidence(CURRENT, trickle, (), history, restart_seconds=180.0)
        evidence = dataclasses.replace(evidence, rollout_lost_fraction=1.0, compile_cache_persistent=True)
        return compute_decision(state, evidence, policy, NOW)

    held = decide_with(())
    assert held.action == Action.HOLD and held.recommended is not None
    cut = held.recommended
    planned = entry(7200.0, "Planned", HistoryAction.PLANNED, CURRENT.replace(max_num_seqs=64), cut)
    raised = entry(5400.0, "IdleCapacity", HistoryAction.RETUNED, cut, CURRENT)
    warm = decide_with((planned, raised))
    assert (warm.action, warm.trigger, warm.settings) == (Action.RETUNE, Trigger.KV_PRESSURE, cut)
    spared = trade.compute_warm_compile_seconds(
        CURRENT, cut, persistent=True, compile_seconds=100.0, restart_seconds=180.0, compiled=(cut,)
    )
    assert spared == 100.0
    replanned = entry(3700.0, "Planned", HistoryAction.PLANNED, cut, CURRENT)
    cold = decide_with((planned, raised, replanned))
    assert cold.action == Action.HOLD and "restart cost 180s)" in cold.reason


def test_the_settings_that_ran_are_those_left_by_changes_since_the_latest_plan() -> None:
    a, b, c = (CURRENT.replace(max_num_seqs=n) for n in (64, 128, 192))
    history = (
        entry(900.0, "Planned", HistoryAction.PLANNED, CURRENT, a),
        entry(800.0, "IdleCapacity", HistoryAction.RETUNED, a, b),
        entry(700.0, "KvPressure", HistoryAction.HELD, b, b),
        entry(600.0, "Crash", HistoryAction.ROLLED_BACK, b, c),
    )
    assert compute_compiled_settings(history) == (a, b)
    assert compute_compiled_settings(history[1:]) == (a, b)  # no plan kept: all of it
    assert compute_compiled_settings((*history, entry(500.0, "Planned", HistoryAction.PLANNED, c, a))) == ()
