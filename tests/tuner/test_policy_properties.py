"""Hypothesis properties of the closed-loop policy over arbitrary inputs.

- a retune stays within the bounds and changes something;
- a retune or rollback never returns to settings that failed;
- the same inputs give the same decision;
- missing or stale metrics hold (when no crash or rollout speaks);
- metrics-driven changes respect the cooldown, every change the minimum interval and the hourly limit;
- a crash of a rollout's settings, before Ready or on probation, rolls back to usable last-good settings;
- settings become good only once Ready, crash-free and past their probation;
- a simulated run under constant load never flaps.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_fixtures import BUDGET, NOW, context, state_and_evidence

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import remedies
from kvpilot.tuner.loop.history import HistoryAction, HistoryEntry
from kvpilot.tuner.loop.observations import (
    LengthSummary,
    MetricsSample,
    ObservationWindow,
    RestartCause,
    RestartEvent,
    RestartKind,
)
from kvpilot.tuner.loop.policy import (
    Action,
    Decision,
    PolicyConfig,
    RolloutState,
    Trigger,
    TuningBounds,
    compute_decision,
)
from kvpilot.tuner.types import EngineSettings, MemoryBudget

POLICY = PolicyConfig()

gmus = st.integers(50, 95).map(lambda x: x / 100)
seqs = st.integers(1, 2048)
lengths = st.sampled_from([2048, 4096, 8192, 32768, 131072, 440000])

settings_st = st.builds(
    EngineSettings,
    max_model_len=st.one_of(st.none(), lengths),
    max_num_seqs=st.one_of(st.none(), seqs),
    gpu_memory_utilization=st.one_of(st.none(), gmus),
    kv_cache_dtype=st.sampled_from([None, "auto", "fp8"]),
    max_num_batched_tokens=st.one_of(st.none(), st.integers(256, 16384)),
)


@st.composite
def bounds_st(draw: st.DrawFn) -> TuningBounds:
    lo_g, hi_g = sorted(draw(st.lists(gmus, min_size=2, max_size=2)))
    lo_s = draw(st.integers(1, 512))
    hi_s = draw(st.one_of(st.none(), st.integers(lo_s, 4096)))
    lo_l = draw(st.one_of(st.none(), st.sampled_from([1024, 4096, 16384, 100000])))
    hi_l = draw(st.one_of(st.none(), st.sampled_from([131072, 200000])))
    return TuningBounds(lo_s, hi_s, lo_g, hi_g, lo_l, hi_l, draw(st.booleans()))


@st.composite
def window_st(draw: st.DrawFn) -> ObservationWindow:
    if draw(st.integers(0, 5)) == 0:
        return ObservationWindow.unavailable("Prometheus unreachable", NOW)
    end = NOW - draw(st.sampled_from([0.0, 15.0, 60.0, 119.0, 121.0, 900.0]))
    n = draw(st.integers(0, 12))
    sample = st.builds(
        MetricsSample,
        time=st.just(0.0),
        kv_usage=st.one_of(st.none(), st.floats(0, 1)),
        preemption_rate=st.one_of(st.none(), st.floats(0, 5)),
        running=st.one_of(st.none(), st.floats(0, 2048)),
        waiting=st.one_of(st.none(), st.floats(0, 100)),
    )
    raw = draw(st.lists(sample, min_size=n, max_size=n))
    samples = tuple(
        MetricsSample(end - (n - 1 - i) * 30.0, s.kv_usage, s.preemption_rate, s.running, s.waiting)
        for i, s in enumerate(raw)
    )
    summary = st.one_of(st.none(), st.builds(LengthSummary, st.floats(1, 20000)))
    return ObservationWindow(
        start=end - 300,
        end=end,
        samples=samples,
        prompt_tokens=draw(summary),
        generation_tokens=draw(summary),
        kv_capacity_tokens=draw(st.one_of(st.none(), st.integers(1000, 2_000_000))),
        pods=1,
    )


causes = st.one_of(
    st.builds(RestartCause, st.sampled_from(list(RestartKind))),
    st.builds(
        RestartCause,
        st.just(RestartKind.KV_CACHE_TOO_SMALL),
        max_model_len=st.one_of(st.none(), lengths),
        estimated_max_model_len=st.one_of(st.none(), st.integers(1, 500000)),
    ),
    st.builds(
        RestartCause,
        st.just(RestartKind.CUDA_OOM),
        tried_gib=st.one_of(st.none(), st.floats(0.01, 40)),
        free_gib=st.one_of(st.none(), st.floats(0, 20)),
        total_gib=st.just(79.19),
    ),
    st.builds(
        RestartCause,
        st.just(RestartKind.INSUFFICIENT_FREE_MEMORY),
        free_gib=st.floats(1, 79),
        total_gib=st.just(79.19),
    ),
)
restarts_st = st.lists(
    st.builds(
        RestartEvent,
        time=st.floats(NOW - 4000, NOW),
        cause=causes,
        pod=st.sampled_from(["a", "b"]),
        restart_count=st.integers(1, 5),
    ),
    max_size=2,
).map(tuple)


@st.composite
def history_st(draw: st.DrawFn) -> tuple[HistoryEntry, ...]:
    ages = sorted(draw(st.lists(st.floats(1, 8000), max_size=6)), reverse=True)
    entries = []
    for age in ages:
        action = draw(st.sampled_from(list(HistoryAction)))
        before, after = draw(settings_st), draw(settings_st)
        trigger = draw(st.sampled_from(["KvPressure", "IdleCapacity", "CudaOOM", "Planned", "RolloutFailed"]))
        entries.append(HistoryEntry(NOW - age, action, trigger, "r", before, after))
    return tuple(entries)


@st.composite
def inputs_st(draw: st.DrawFn) -> dict:
    current = draw(settings_st)
    failed = draw(st.lists(settings_st, max_size=3))
    # often fail exactly what the remedies would pick, to exercise the skip
    if draw(st.booleans()):
        eff = remedies.compute_effective(current, context(policy=POLICY))
        failed += [remedies.lower_gmu(eff, 1, POLICY), remedies.cut_seqs(eff, POLICY)]
    rollout = None
    if draw(st.integers(0, 3)) == 0:
        start = NOW - draw(st.floats(0, 2000))
        until = draw(st.one_of(st.none(), st.floats(start, NOW + 400)))  # on probation (maybe over)
        rollout = RolloutState(current, start, start + 900, probation_until=until)
    return {
        "current": current,
        "budget": BUDGET,
        "window": draw(window_st()),
        "restarts": draw(restarts_st),
        "bounds": draw(bounds_st()),
        "policy": POLICY,
        "history": draw(history_st()),
        "failed": tuple(failed),
        "now": NOW,
        "rollout": rollout,
        "last_good": draw(st.one_of(st.none(), settings_st)),
        "ready": draw(st.booleans()),
        "observed_kv_tokens": draw(st.one_of(st.none(), st.integers(1000, 2_000_000))),
        "restart_seconds": draw(st.one_of(st.none(), st.floats(0, 1200))),
    }


def decide(
    *,
    current: EngineSettings,
    budget: MemoryBudget,
    window: ObservationWindow,
    restarts: tuple,
    bounds: TuningBounds,
    policy: PolicyConfig,
    history: tuple,
    failed: tuple,
    now: float,
    rollout: RolloutState | None,
    last_good: EngineSettings | None,
    ready: bool,
    observed_kv_tokens: int | None,
    restart_seconds: float | None = None,
) -> Decision:
    """``compute_decision`` from the flat inputs the strategies draw."""
    state, evidence = state_and_evidence(
        current,
        window,
        restarts,
        history,
        failed,
        budget=budget,
        rollout=rollout,
        last_good=last_good,
        ready=ready,
        observed_kv_tokens=observed_kv_tokens,
        restart_seconds=restart_seconds,
    )
    return compute_decision(state, evidence, context(bounds, policy), now)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _eff(s: EngineSettings) -> EngineSettings:
    return remedies.compute_effective(s, context(policy=POLICY))


@FAST
@given(inputs_st())
def test_retune_stays_within_bounds_and_changes_something(inputs: dict) -> None:
    d = decide(**inputs)
    if d.action == Action.RETUNE:
        _assert_within(d.settings, inputs["bounds"])
        assert _eff(d.settings) != _eff(inputs["current"])
    if not d.changes:
        assert d.settings == inputs["current"]


def _assert_within(settings: EngineSettings, b: TuningBounds) -> None:
    """Field by field, not with ``TuningBounds.contains`` (it uses the same ``clamp`` as the policy)."""
    seqs, gmu, length = settings.max_num_seqs, settings.gpu_memory_utilization, settings.max_model_len
    if seqs is not None:
        assert seqs >= b.min_max_num_seqs, settings
        assert b.max_max_num_seqs is None or seqs <= b.max_max_num_seqs, settings
    if gmu is not None:
        assert b.min_gpu_memory_utilization <= gmu <= b.max_gpu_memory_utilization, settings
    if length is not None:
        assert b.min_max_model_len is None or length >= b.min_max_model_len, settings
        assert b.max_max_model_len is None or length <= b.max_max_model_len, settings


@FAST
@given(inputs_st())
def test_fp8_only_when_allowed(inputs: dict) -> None:
    d = decide(**inputs)
    if d.action == Action.RETUNE and not inputs["bounds"].allow_fp8_kv:
        was = vllm.is_fp8(_eff(inputs["current"]).kv_cache_dtype)
        assert was or not vllm.is_fp8(_eff(d.settings).kv_cache_dtype), d


@FAST
@given(inputs_st())
def test_never_returns_to_failed_settings(inputs: dict) -> None:
    d = decide(**inputs)
    if d.changes:
        assert _eff(d.settings) not in {_eff(f) for f in inputs["failed"]}, d


@FAST
@given(inputs_st())
def test_same_inputs_same_decision(inputs: dict) -> None:
    assert decide(**inputs) == decide(**dict(inputs))


@FAST
@given(inputs_st())
def test_missing_or_stale_metrics_hold(inputs: dict) -> None:
    inputs = {**inputs, "restarts": (), "rollout": None}
    window: ObservationWindow = inputs["window"]
    last = window.last_sample_time
    if window.available and last is not None and NOW - last <= POLICY.staleness_seconds:
        return
    d = decide(**inputs)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.METRICS_UNAVAILABLE)


@FAST
@given(inputs_st())
def test_stability_gates(inputs: dict) -> None:
    d = decide(**inputs)
    if d.action != Action.RETUNE:
        return
    last = history_mod.compute_last_change_time(inputs["history"])
    if last is not None:
        assert NOW - last >= POLICY.min_change_interval_seconds
    retune = history_mod.compute_last_retune_time(inputs["history"])
    if retune is not None and d.trigger in (Trigger.KV_PRESSURE, Trigger.IDLE_CAPACITY):
        # the cooldown counts from the last retune (not the plan), and is at least a restart + a window
        measured = inputs["restart_seconds"]
        restart = measured if measured is not None else POLICY.restart_seconds
        assert NOW - retune >= max(POLICY.cooldown_seconds, restart + POLICY.window_seconds)
    assert history_mod.compute_changes_since(inputs["history"], NOW - 3600) < POLICY.max_changes_per_hour


@FAST
@given(inputs_st(), st.floats(0, 300), causes)
def test_crash_of_a_rollout_rolls_back(inputs: dict, ago: float, cause: RestartCause) -> None:
    rollout: RolloutState | None = inputs["rollout"]
    good = inputs["last_good"]
    if rollout is None or good is None or _eff(good) == _eff(inputs["current"]):
        return
    if _eff(good) in {_eff(f) for f in inputs["failed"]}:
        return
    last = history_mod.compute_last_change_time(inputs["history"]) or rollout.started_at
    crash = RestartEvent(max(rollout.started_at, last, NOW - ago), cause, pod="a")
    d = decide(**{**inputs, "restarts": (crash,)})
    assert (d.action, d.settings, d.failed) == (Action.ROLLBACK, good, inputs["current"]), d


@FAST
@given(inputs_st())
def test_good_only_after_probation(inputs: dict) -> None:
    d = decide(**inputs)
    if d.good is None:
        return
    assert inputs["ready"] and d.good == inputs["current"]
    rollout: RolloutState | None = inputs["rollout"]
    if rollout is not None:
        assert rollout.probation_until is not None and rollout.probation_until <= NOW
    else:
        last = history_mod.compute_last_change_time(inputs["history"])
        assert last is None or NOW - last >= POLICY.probation_seconds


# --- a run over time ---------------------------------------------------------------------------


def _simulate(
    kv_at_seqs: float, preempt: float, waiting: float, ticks: int = 720
) -> list[tuple[float, EngineSettings]]:
    """Six hours of 30 s ticks under a load whose KV usage grows with max_num_seqs; Auto mode."""
    current = EngineSettings(max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92)
    history: tuple[HistoryEntry, ...] = ()
    changes = []
    for tick in range(ticks):
        now = NOW + tick * 30.0
        s = current.max_num_seqs or 256
        kv = min(1.0, kv_at_seqs * s / 256)
        samples = tuple(
            MetricsSample(now - 270 + 30 * i, kv, preempt if kv >= 0.9 else 0.0, float(s), waiting)
            for i in range(10)
        )
        window = ObservationWindow(now - 300, now, samples, LengthSummary(800), LengthSummary(200), pods=1)
        state, evidence = state_and_evidence(current, window, history=history, ready=True)
        d = compute_decision(state, evidence, context(TuningBounds(), POLICY), now)
        if d.changes:
            entry = HistoryEntry(now, HistoryAction.RETUNED, d.trigger, d.reason, current, d.settings)
            history = history_mod.build_history(history, entry)
            changes.append((now, d.settings))
            current = d.settings
    return changes


def test_constant_storm_converges_without_flapping() -> None:
    changes = _simulate(kv_at_seqs=1.0, preempt=1.0, waiting=0.0)
    seq = [s.max_num_seqs for _, s in changes]
    assert seq == sorted(seq, reverse=True)  # only ever down
    assert all(b - a >= POLICY.cooldown_seconds for (a, _), (b, _) in zip(changes, changes[1:], strict=False))


def test_idle_queue_grows_then_stops_below_pressure() -> None:
    changes = _simulate(kv_at_seqs=0.3, preempt=1.0, waiting=20.0)
    seq = [s.max_num_seqs for _, s in changes]
    assert seq and seq == sorted(seq)  # only ever up ...
    assert 0.3 * seq[-1] / 256 < 0.9  # ... and never into the pressure band


def test_storm_with_a_queue_settles_without_flapping() -> None:
    """A storm while requests also wait: the cut is followed by at most one raise to what fits at the
    target usage (inside the band), never back into the pressure band, and then nothing moves."""
    changes = _simulate(kv_at_seqs=1.0, preempt=1.0, waiting=20.0)
    seq = [s.max_num_seqs or 0 for _, s in changes]
    assert seq and seq[0] < 256
    turns = sum(1 for a, b, c in zip(seq, seq[1:], seq[2:], strict=False) if (b - a) * (c - b) < 0)
    assert turns == 0, seq  # down, then at most up: never down again
    assert all(s * 1.0 / 256 < POLICY.kv_usage_high for s in seq[1:]), seq
    assert changes[-1][0] < NOW + 3 * 3600, changes  # settled within the first half of the run


def test_eased_load_recovers_after_a_cut() -> None:
    """Weakness 3: after a storm cut, the load eases (KV per sequence -25 %) with a queue: KV usage then
    sits inside the band at the cut setting, and raises resume past where the cut came from."""
    changes = _simulate_shift(before=1.0, after=0.75, waiting=20.0)
    seq = [s.max_num_seqs or 0 for _, s in changes]
    low = min(seq)
    assert low < 256 and seq[-1] > 256, seq  # cut under the storm, then back past where it started
    assert all(b >= a for a, b in zip(seq[seq.index(low) :], seq[seq.index(low) + 1 :], strict=False)), seq


def _simulate_shift(before: float, after: float, waiting: float) -> list[tuple[float, EngineSettings]]:
    """As :func:`_simulate`, but the KV usage per sequence changes from ``before`` to ``after`` at 1 h."""
    current = EngineSettings(max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92)
    history: tuple[HistoryEntry, ...] = ()
    changes = []
    for tick in range(720):
        now = NOW + tick * 30.0
        s = current.max_num_seqs or 256
        kv = min(1.0, (before if tick < 120 else after) * s / 256)
        samples = tuple(
            MetricsSample(now - 270 + 30 * i, kv, 1.0 if kv >= 0.9 else 0.0, float(s), waiting)
            for i in range(10)
        )
        window = ObservationWindow(now - 300, now, samples, LengthSummary(800), LengthSummary(200), pods=1)
        state, evidence = state_and_evidence(current, window, history=history, ready=True)
        d = compute_decision(state, evidence, context(TuningBounds(), POLICY), now)
        if d.changes:
            entry = HistoryEntry(now, HistoryAction.RETUNED, d.trigger, d.reason, current, d.settings)
            history = history_mod.build_history(history, entry)
            changes.append((now, d.settings))
            current = d.settings
    return changes
