"""TGI's ``IdleCapacity`` rule (:func:`kvpilot.tuner.loop.tgi_idle.propose_for_idle`): the limit binding by
running + queued at it or by the router's 429s (``MetricsSample.rejected_rate``), the raise by the room
the window measured (:mod:`kvpilot.tuner.loop.engine_room`), the flap guard
(:mod:`kvpilot.tuner.loop.engine_flap`) after KV pressure or the latency objective found
``--max-concurrent-requests`` too many, and raises that failed approached from below -- each shared with
SGLang's loop."""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import gpus, tgi
from kvpilot.tuner.loop import (
    Action,
    EngineFailedRun,
    PolicyConfig,
    TgiChange,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    Trigger,
    TuningBounds,
    compute_tgi_decision,
    engine_flap,
    tgi_fit,
)
from kvpilot.tuner.loop import tgi_rules as rules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY

BARE = TgiMemory(gpus.lookup_gpu("H100-SXM"))
NOW = 100_000.0
POLICY = PolicyConfig()
BOUNDS = TuningBounds()


def limited(n: int, fraction: float | None = None) -> tgi.TgiSettings:
    return tgi.TgiSettings(
        max_total_tokens=8192, max_input_tokens=8000, max_concurrent_requests=n, cuda_memory_fraction=fraction
    )


def window(
    kv: float,
    running: float,
    waiting: float = 0.0,
    kvs: list[float] | None = None,
    rejected: list[float | None] | None = None,
) -> ObservationWindow:
    usages = kvs or [kv] * 10
    refused = rejected or [None] * len(usages)
    samples = tuple(
        MetricsSample(
            time=NOW - 30 * (len(usages) - 1 - i),
            kv_usage=u,
            running=running,
            waiting=waiting,
            rejected_rate=r,
        )
        for i, (u, r) in enumerate(zip(usages, refused, strict=True))
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(
    current: tgi.TgiSettings,
    w: ObservationWindow,
    changes: tuple[TgiChange, ...] = (),
    failed: tuple[EngineFailedRun[tgi.TgiSettings], ...] = (),
    bounds: TuningBounds = BOUNDS,
) -> TgiDecision:
    return compute_tgi_decision(
        TgiLoopState(current, failed, changes, last_good=current),
        TgiEvidence(w, ready=True),
        TgiContext(BARE, bounds, POLICY),
        NOW,
    )


def change(ago: float, trigger: str, before: tgi.TgiSettings, after: tgi.TgiSettings) -> TgiChange:
    return TgiChange(NOW - ago, trigger, before=before, after=after)


# --- the flap guard -------------------------------------------------------------------------------


def test_within_the_hour_after_kv_pressure_found_the_kv_full_at_n_a_raise_stays_below_n() -> None:
    """Pressure grew the fraction and kept 64: what the KV was full at. A raise back over it within the hour
    is the flap (bench sglang-retractions: 11 rollouts before SGLang's guard); after the hour it is not."""
    current = limited(64, 0.9)
    grew = change(1800, rules.KV_PRESSURE, limited(64, 0.85), current)
    held = decide(current, window(kv=0.3, running=56, waiting=8), (grew,))
    assert (held.action, held.trigger) == (Action.HOLD, Trigger.STEADY)
    old = change(4000, rules.KV_PRESSURE, limited(64, 0.85), current)
    raised = decide(current, window(kv=0.3, running=56, waiting=8), (old,))
    assert raised.trigger == IDLE_CAPACITY and (raised.settings.max_concurrent_requests or 0) > 64


def test_after_the_latency_objective_cut_the_limit_a_raise_stays_below_where_it_was_missed() -> None:
    current = limited(56)
    cut = change(1800, rules.LATENCY_SLO, limited(64), current)
    decision = decide(current, window(kv=0.3, running=50, waiting=6), (cut,))
    assert decision.trigger != IDLE_CAPACITY or decision.action == Action.HOLD
    assert decision.settings == current


def test_kv_pressure_that_came_back_within_the_hour_holds_the_limit_it_set() -> None:
    current = limited(36)
    changes = (
        change(3000, rules.KV_PRESSURE, limited(64), limited(48)),
        change(1000, rules.KV_PRESSURE, limited(48), current),
    )
    decision = decide(current, window(kv=0.3, running=30, waiting=6), changes)
    assert decision.settings == current and decision.action == Action.HOLD


def test_a_raise_within_the_hour_must_be_worth_a_flap_sized_step() -> None:
    """Below the ceiling the raise still has to be worth ``flap_min_raise`` (a quarter)."""
    guarded = engine_flap.guard_raise(
        60, (engine_flap.PressureChange(NOW - 600, 64, 48),), NOW, POLICY, "the KV tokens"
    )
    assert (guarded.target, guarded.least) == (60, POLICY.flap_min_raise)
    capped = engine_flap.guard_raise(80, (engine_flap.PressureChange(NOW - 600, 64, 48),), NOW, POLICY)
    assert capped.target == 63 and capped.cap is not None and "64" in capped.cap
    assert engine_flap.guard_raise(80, (), NOW, POLICY).least == POLICY.min_seqs_raise


def test_tgis_pressure_changes_name_tgis_default_limit() -> None:
    """TGI's default admission limit is a constant (128), so a change from it names what it found full."""
    changes = (
        change(600, rules.KV_PRESSURE, tgi.TgiSettings(), limited(96)),
        change(300, IDLE_CAPACITY, limited(96), limited(120)),
    )
    (found,) = engine_flap.compute_pressure_changes(changes, tgi_fit.concurrency_of)
    assert (found.pressured, found.left) == (tgi.MAX_CONCURRENT_REQUESTS_DEFAULT, 96)


# --- the room the window measured -----------------------------------------------------------------


def test_low_kv_raises_the_limit_to_the_measured_room_in_one_rollout() -> None:
    """30 running fill a fifth of the KV tokens: 132 fill 0.88 of them. A fixed +25 % would take 40, then 50,
    63, 79, 99, 124: six restarts of TGI for what the window already measured."""
    decision = decide(limited(32), window(kv=0.2, running=30, waiting=2))
    assert (decision.action, decision.trigger) == (Action.RETUNE, IDLE_CAPACITY)
    assert decision.settings.max_concurrent_requests == 132
    assert "room at 0.88" in decision.reason


def test_inside_the_band_the_raise_is_the_measured_room_or_none() -> None:
    banded = decide(limited(32), window(kv=0.6, running=30, waiting=2))
    assert banded.settings.max_concurrent_requests == 44  # 0.88 x 30 / 0.6
    full = decide(limited(32), window(kv=0.85, running=30, waiting=2))  # room 31: no more fits
    assert (full.action, full.trigger, full.settings) == (Action.HOLD, Trigger.STEADY, limited(32))


def test_inside_the_band_a_raise_must_clear_the_rooms_own_noise() -> None:
    """Usage alternating 0.52 / 0.88 sample to sample: the mean room (37) stands over 32 x 1.05 = 33.6, but
    not by its standard error (about 3.5): noise, not room."""
    noisy = window(kv=0.0, running=30, waiting=2, kvs=[0.52, 0.88] * 5)
    assert decide(limited(32), noisy).settings == limited(32)
    steady = window(kv=0.0, running=30, waiting=2, kvs=[0.7, 0.71] * 5)
    assert decide(limited(32), steady).settings.max_concurrent_requests == 37


def test_a_raise_that_ran_out_of_memory_before_its_batch_filled_stays_below_what_ran() -> None:
    """64 ran out of memory with 40 running: the raise stays below 40, whatever room the KV shows."""
    oom = EngineFailedRun(tgi_fit.compute_effective(limited(64), BARE), "runtime_oom", running=40)
    decision = decide(limited(32), window(kv=0.2, running=30, waiting=2), failed=(oom,))
    assert decision.settings.max_concurrent_requests == 39
    assert "below 40" in decision.reason


def test_a_raise_whose_rollout_failed_is_approached_by_a_step_not_retried_one_less() -> None:
    failed = EngineFailedRun(tgi_fit.compute_effective(limited(60), BARE), "rollout_failed")
    decision = decide(limited(32), window(kv=0.2, running=30, waiting=2), failed=(failed,))
    assert decision.settings.max_concurrent_requests == 40  # one +25 % step towards 60
    at_less = limited(32, 0.9)
    elsewhere = EngineFailedRun(tgi_fit.compute_effective(limited(60, 0.95), BARE), "rollout_failed")
    larger = decide(at_less, window(kv=0.2, running=30, waiting=2), failed=(elsewhere,))
    assert larger.settings == dataclasses.replace(at_less, max_concurrent_requests=132)
    # a failure at a larger fraction (less room outside TGI's share) does not bind the raise at a smaller one


# --- the 429s the router answers beyond the limit ---------------------------------------------------


def test_429s_in_most_samples_with_spare_kv_raise_the_limit_to_the_measured_room() -> None:
    """20 running, none queued, under the limit of 32 at every sample (the gauges miss the moments the router
    was full), but 429s refused at each: the limit binds. 20 fill a fifth of the KV: 88 fill 0.88."""
    refusing = window(kv=0.2, running=20, rejected=[2.0] * 10)
    decision = decide(limited(32), refusing)
    assert (decision.action, decision.trigger) == (Action.RETUNE, IDLE_CAPACITY)
    assert decision.settings.max_concurrent_requests == 88
    assert "429s" in decision.reason and "in 100%, 2.00/s on average" in decision.reason


def test_no_429s_and_no_queue_at_the_limit_hold() -> None:
    quiet = decide(limited(32), window(kv=0.2, running=20, rejected=[0.0] * 10))
    assert (quiet.action, quiet.trigger, quiet.settings) == (Action.HOLD, Trigger.STEADY, limited(32))
    unread = decide(limited(32), window(kv=0.2, running=20))  # no series at all: the same
    assert (unread.action, unread.settings) == (Action.HOLD, limited(32))


def test_429s_in_a_few_samples_are_not_most() -> None:
    """A burst refused in 3 samples of 10 (under ``sustain_fraction``): not a limit that binds."""
    burst = window(kv=0.2, running=20, rejected=[0.0] * 7 + [1.5] * 3)
    assert decide(limited(32), burst).settings == limited(32)


def test_429s_with_the_kv_at_the_high_band_hold() -> None:
    """The router refuses, but the KV tokens are full: a higher limit admits nothing more into the batch."""
    full = decide(limited(32), window(kv=0.92, running=20, rejected=[3.0] * 10))
    assert (full.action, full.settings) == (Action.HOLD, limited(32))
    assert full.trigger != IDLE_CAPACITY


def test_429s_raise_within_the_flap_guard_and_below_a_failed_raise() -> None:
    """The rate says the limit binds; how far it may go stays the guards': a raise that ran out of memory
    with 40 running caps it below 40, as with a queue at the limit."""
    oom = EngineFailedRun(tgi_fit.compute_effective(limited(64), BARE), "runtime_oom", running=40)
    refusing = window(kv=0.2, running=20, rejected=[2.0] * 10)
    assert decide(limited(32), refusing, failed=(oom,)).settings.max_concurrent_requests == 39
    current = limited(64, 0.9)
    grew = change(1800, rules.KV_PRESSURE, limited(64, 0.85), current)
    held = decide(current, window(kv=0.3, running=40, rejected=[2.0] * 10), (grew,))
    assert (held.action, held.settings) == (Action.HOLD, current)


def test_the_evidence_names_the_429_rate_beside_a_limit_held_full() -> None:
    at_limit = decide(limited(32), window(kv=0.2, running=30, waiting=2, rejected=[0.5] * 5 + [0.0] * 5))
    assert at_limit.trigger == IDLE_CAPACITY
    assert f'429s ("{tgi.OVERLOADED}") in 50%, 0.25/s on average' in at_limit.reason
