"""The steps an engine's own decision chain (SGLang's, TGI's) shares, whatever its flags. Pure.

Each chain (:func:`kvpilot.tuner.loop.sglang_policy.compute_sglang_decision`,
:func:`kvpilot.tuner.loop.tgi_policy.compute_tgi_decision`) is: the rollout (:mod:`.engine_rollout`), a
crash of the current flags, the metrics gate, the engine's metrics rules, a hold. What they share is here:

* :func:`compute_gates` -- vLLM's stability gates: the minimum interval between changes and the hourly
  limit for every change; the cooldown after a retune (:func:`~.decision.compute_cooldown`) for
  metrics-driven ones; a rollout the cluster does not allow now (``EngineEvidence.rollout_blocked``, as
  vLLM's ``Evidence.rollout_blocked``) for every change;
* :func:`select_crash` -- which restart of the current flags a remedy answers: the most telling failure
  (:data:`~.engine_state.CRASH_ORDER`), else a hold for a restart no text explains;
* :func:`select_window` and :func:`check_samples` -- the window since the last change, and the metrics gate;
* :func:`choose` -- a rule's proposal turned into a decision: its first candidate the engine's fit accepts
  (:class:`Fit`), held by a gate with what it would have rolled out, or infeasible / held when none is left;
  a metrics-driven one also weighed against its restart (:class:`Costs`, :func:`compute_costs`: vLLM's
  restart-cost trade, :mod:`.restart_trade`, with the engine's own gain per trigger, :attr:`Fit.gain`);
  a metrics rule with nothing left under sustained pressure also recommends more replicas (:class:`Replicas`:
  vLLM's :func:`.scaling.recommend_scale_out`);
* :func:`leave_defaults` and :func:`describe_flag_change` -- a candidate's flags left to the engine where its
  default is the value, and a change in words; :func:`clamp_sequences`, :func:`clamp_context` and the
  0.01 grid of memory shares (:func:`ceil_grid`, :func:`floor_grid`) every engine's fit bounds a candidate by;
* :func:`run_chain` -- the order: the rollout (:mod:`.engine_rollout`), the engine's steps, a steady hold,
  the flags marked good.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvpilot.tuner.engines import EngineFailure
from kvpilot.tuner.loop import engine_rollout, restart_trade, scaling
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.decision import Action, MetricsStatus, Trigger, compute_cooldown
from kvpilot.tuner.loop.engine_state import (
    CRASH_ORDER,
    UNCLASSIFIED,
    EngineChange,
    EngineDecision,
    EngineEvidence,
    EngineFailedRun,
    EngineHold,
    EngineLoopState,
    EngineProposal,
    EngineRestart,
    kind_of,
    running_before,
)

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Gates:
    """Why a change cannot roll out now: any change, and a metrics-driven one (``None``: it can)."""

    any_change: str | None
    metrics_driven: str | None


def compute_gates(
    state: EngineLoopState[Any], evidence: EngineEvidence, policy: PolicyConfig, now: float
) -> Gates:
    """vLLM's stability gates over the loop's changes: the minimum interval and the hourly limit for
    every change; the cooldown after a retune (a restart plus a window) for metrics-driven ones, which also
    wait for the current flags to be proven (the last good ones, or Ready for a probation since the last
    change: the plan's too, which no cooldown counts) and for the replica count to settle."""
    p, changes = policy, state.changes
    last = max((c.time for c in changes), default=None)
    retunes = [c.time for c in changes if not c.planned]
    any_change = None
    if last is not None and now - last < p.min_change_interval_seconds:
        any_change = (
            f"only {now - last:.0f}s since the last change (minimum {p.min_change_interval_seconds:.0f}s)"
        )
    elif sum(1 for t in retunes if t > now - 3600.0) >= p.max_changes_per_hour:
        any_change = f"{p.max_changes_per_hour} changes in the last hour (the limit)"
    cooldown = compute_cooldown(p, evidence.restart_seconds)
    metrics_driven = any_change
    if metrics_driven is None and retunes and now - max(retunes) < cooldown:
        metrics_driven = f"cooldown for {cooldown - (now - max(retunes)):.0f}s more"
    proven = state.last_good == state.current or (
        evidence.ready and (last is None or now - last >= p.probation_seconds)
    )
    if metrics_driven is None and not proven:
        # the current flags have not yet served Ready through a probation (as the plan's must before they
        # are the last good ones, engine_rollout.compute_good): a change now would have nothing to roll back
        # to, and a raise that runs out of memory could only be answered by less memory
        metrics_driven = (
            f"the current flags are not yet proven (Ready and crash-free for {p.probation_seconds:.0f}s)"
        )
    if metrics_driven is None and evidence.replicas_changing is not None:
        # as vLLM's (scaling.compute_replica_change): a window that spans two replica counts judges neither;
        # crash remedies and the GPU-memory warning still act (``any_change``)
        metrics_driven = f"the replica count is changing ({evidence.replicas_changing})"
    # a change that cannot roll out now (no spare GPU, one replica, no downtime allowed), after the other
    # gates, as vLLM's: held with it recommended (a crash's remedy too: its pod still serves)
    blocked = evidence.rollout_blocked
    return Gates(any_change or blocked, metrics_driven or blocked)


@dataclass(frozen=True, slots=True)
class Costs:
    """What a metrics-driven change's restart costs (vLLM's trade, :mod:`.restart_trade`): the cooldown the
    gain counts over, the restart, the share of the capacity the rollout loses, and how long the loop has
    held for each trigger (the gain counts over that too, at most ``persistence_max_seconds``)."""

    cooldown_seconds: float
    restart_seconds: float
    lost_fraction: float
    holds: tuple[EngineHold, ...] = ()
    persistence_max_seconds: float = 0.0
    now: float = 0.0

    def weigh(self, trigger: str, gain_fraction: float) -> restart_trade.Trade:
        """A change for ``trigger`` expected to win back ``gain_fraction`` of the capacity, against its
        restart (no compile cache in kvpilot's model of these engines: nothing of the restart is skipped)."""
        held = compute_held_since(self.holds, trigger)
        return restart_trade.weigh(
            gain_fraction,
            cooldown_seconds=self.cooldown_seconds,
            restart_seconds=self.restart_seconds,
            lost_fraction=self.lost_fraction,
            persisted_seconds=restart_trade.compute_persisted_seconds(
                held, self.now, self.persistence_max_seconds
            ),
        )


def compute_costs(
    state: EngineLoopState[Any], evidence: EngineEvidence, policy: PolicyConfig, now: float
) -> Costs:
    """The trade's inputs as vLLM's loop takes them: the cooldown after a retune, the measured restart
    (``PolicyConfig.restart_seconds`` when none is), the rollout's lost share, the holds of the history."""
    restart = policy.restart_seconds if evidence.restart_seconds is None else evidence.restart_seconds
    return Costs(
        compute_cooldown(policy, evidence.restart_seconds),
        restart,
        evidence.rollout_lost_fraction,
        state.holds,
        policy.trade_persistence_max_seconds,
        now,
    )


def compute_held_since(holds: Sequence[EngineHold], trigger: str) -> float | None:
    """Since when the loop has held for ``trigger`` without a break: the oldest of the newest holds in a row
    that are for ``trigger``, ``None`` when the newest is for another (as vLLM's
    :func:`kvpilot.tuner.loop.history.compute_held_since`)."""
    since = None
    for hold in reversed(holds):
        if hold.trigger != trigger:
            break
        since = hold.time
    return since


def select_window(
    window: obs.ObservationWindow,
    restarts: Sequence[EngineRestart],
    changes: Sequence[EngineChange[Any]],
    now: float,
) -> tuple[obs.ObservationWindow, tuple[EngineRestart, ...]]:
    """The window and the restarts since the last change (all of them before any)."""
    last = max((c.time for c in changes), default=None)
    since = last if last is not None else float("-inf")
    return (
        window.since(last) if last is not None else window,
        tuple(r for r in restarts if since <= r.time <= now),
    )


@dataclass(frozen=True)
class Crash(Generic[S]):
    """The restart a remedy answers, and the run it rules out."""

    failure: EngineFailure
    ran: EngineFailedRun[S]


def select_crash(
    restarts: Sequence[EngineRestart],
    current: S,
    effective: S,
    window: obs.ObservationWindow,
    engine: str,
) -> Crash[S] | EngineDecision[S] | None:
    """The crash of the current flags a remedy answers (the most telling kind, the latest), with the run it
    rules out (``effective``; a run-time OOM with the running requests seen before it); a hold when only
    restarts ``engine``'s texts do not explain happened; ``None`` without a crash."""
    crashes = [r for r in restarts if r.failure is None or r.failure.kind in CRASH_ORDER]
    if not crashes:
        return None
    known = [r for r in crashes if r.failure is not None]
    if not known:
        r = max(crashes, key=lambda x: x.time)
        return EngineDecision(
            Action.HOLD,
            current,
            UNCLASSIFIED,
            f"a restart on {r.pod or 'a pod'} that {engine}'s failure texts do not explain: not something "
            "engine arguments can fix",
        )
    event = min(known, key=lambda r: (CRASH_ORDER.index(kind_of(r)), -r.time, r.pod))
    failure = event.failure
    assert failure is not None
    running = (
        running_before(window, event.time, (failure.running,)) if failure.kind == "runtime_oom" else None
    )
    return Crash(failure, EngineFailedRun(effective, failure.kind, running))


def check_samples(
    current: S, window: obs.ObservationWindow, metrics: MetricsStatus, policy: PolicyConfig
) -> EngineDecision[S] | None:
    """The metrics gate: a hold while the metrics are missing or stale, or too few samples since the last
    change; ``None``: the rules may read the window."""
    if not metrics.available:
        return EngineDecision(Action.HOLD, current, Trigger.METRICS_UNAVAILABLE, metrics.message)
    count = sum(1 for x in window.samples if x.kv_usage is not None)
    if count < policy.min_samples:
        reason = f"{count} samples since the last change; {policy.min_samples} needed"
        return EngineDecision(Action.HOLD, current, Trigger.INSUFFICIENT_DATA, reason)
    return None


@dataclass(frozen=True)
class Fit(Generic[S]):
    """What :func:`choose` asks of an engine's fit of one situation."""

    current: S
    pick: Callable[[EngineProposal[S]], S | None]
    """The first candidate that, within the bounds, changes something and was not ruled out."""
    describe_change: Callable[[S, S], str]
    explain: Callable[[S], tuple[str, ...]] = lambda _: ()
    """Lines the memory model adds for the chosen settings."""
    gain: Callable[[str, S, float], float] = lambda _trigger, _settings, _cooldown: restart_trade.WHOLE
    """The share of the capacity a change for a trigger to the chosen settings is expected to win back over
    a cooldown of the given seconds, in the engine's terms (:mod:`.restart_trade`; 1: no measure to
    discount it by)."""


@dataclass(frozen=True, slots=True)
class Replicas:
    """What a scale-out recommendation starts from, as vLLM's loop has it: the window the rules judged (since
    the last change), ``spec.replicas`` and why the count is changing (``EngineEvidence.replicas``,
    ``replicas_changing``)."""

    window: obs.ObservationWindow
    count: int = 1
    changing: str | None = None

    @classmethod
    def of(cls, evidence: EngineEvidence, window: obs.ObservationWindow) -> Replicas:
        return cls(window, evidence.replicas, evidence.replicas_changing)

    def recommend(self, trigger: str) -> int | None:
        """The replicas a rule for ``trigger`` with nothing left recommends (``None``: none)."""
        return scaling.recommend_scale_out(trigger, self.window, self.count, self.changing)


def choose(
    fit: Fit[S],
    proposal: EngineProposal[S],
    failed: EngineFailedRun[S] | None,
    blocked: str | None,
    costs: Costs | None = None,
    replicas: Replicas | None = None,
) -> EngineDecision[S]:
    """The proposal's first acceptable candidate rolled out, or held by ``blocked`` (a gate) with it
    recommended; none left: infeasible (a crash's rule) or a hold, saying why, and (``replicas`` given: the
    metrics rules') with the replicas to recommend (:meth:`Replicas.recommend`). A metrics-driven change
    (``costs`` given; never a crash's remedy) that passes the gates goes ahead only when its gain outweighs
    its restart (:meth:`Costs.weigh` of :attr:`Fit.gain`), else it is held as vLLM's: "it is not worth a
    restart (...)", with it recommended. A rollout that loses nothing (a surge) costs nothing: the change
    goes ahead whatever gain the engine's terms measure (TGI's refused demand is not measured at all)."""
    settings = fit.pick(proposal)
    if settings is None:
        action = Action.INFEASIBLE if proposal.infeasible_when_exhausted else Action.HOLD
        return EngineDecision(
            action,
            fit.current,
            proposal.trigger,
            f"{proposal.evidence}; {proposal.exhausted}",
            proposal.explanation,
            failed=failed,
            scale_out=replicas.recommend(proposal.trigger) if replicas is not None else None,
        )
    explanation = (*proposal.explanation, *fit.explain(settings))
    change = fit.describe_change(fit.current, settings)
    if blocked is None and costs is not None and not proposal.crash:
        worth = costs.weigh(proposal.trigger, fit.gain(proposal.trigger, settings, costs.cooldown_seconds))
        if not worth.worth_it and worth.cost_seconds > 0:  # a rollout that loses nothing costs nothing
            blocked = f"it is not worth a restart ({worth.describe()})"
    if blocked is not None:
        return EngineDecision(
            Action.HOLD,
            fit.current,
            proposal.trigger,
            f"{proposal.evidence}; would retune ({change}) but {blocked}",
            explanation,
            failed=failed,
            recommended=settings,
        )
    return EngineDecision(
        Action.RETUNE,
        settings,
        proposal.trigger,
        f"{proposal.evidence}: {change}",
        explanation,
        failed=failed,
    )


def run_chain(
    subject: engine_rollout.Subject[S],
    state: EngineLoopState[S],
    evidence: EngineEvidence,
    restarts: tuple[EngineRestart, ...],
    metrics: MetricsStatus,
    steps: Sequence[Callable[[], EngineDecision[S] | None]],
    steady: Callable[[], EngineDecision[S]],
    now: float,
) -> EngineDecision[S]:
    """The rollout first, then the first of the engine's ``steps`` with something to say, else ``steady``;
    the flags marked good where they are (:func:`engine_rollout.compute_good`), the metrics' status kept."""
    decision = engine_rollout.compute_rollout_step(subject, state, evidence, restarts, now)
    for step in steps:
        if decision is not None:
            break
        decision = step()
    decision = engine_rollout.compute_good(subject, state, evidence, restarts, decision or steady(), now)
    return dataclasses.replace(decision, metrics=metrics)


def leave_defaults(settings: S, current: S, effective: Callable[[S], S]) -> S:
    """Leave unset what ``current`` leaves unset, where the engine's default (``effective``) is the
    candidate's value: the flags keep to what the engine would choose itself."""
    target = effective(settings)
    out = settings
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        if getattr(current, f.name) is None and getattr(out, f.name) is not None:
            trial = dataclasses.replace(out, **{f.name: None})  # type: ignore[type-var]
            if effective(trial) == target:
                out = trial
    return out


def describe_flag_change(before: S, after: S, flags: Mapping[str, str]) -> str:
    """``--flag a -> b`` for every field of ``flags`` (field -> flag) that differs (unset: the default)."""
    parts = []
    for name, flag in flags.items():
        a, b = getattr(before, name), getattr(after, name)
        if a != b:
            parts.append(f"{flag} {'default' if a is None else a} -> {'default' if b is None else b}")
    return ", ".join(parts) or "no change"


FRACTION_STEP = 0.01
"""Memory shares the rules propose are on a grid of 0.01."""


def ceil_grid(value: float) -> float:
    return round(math.ceil(value / FRACTION_STEP - 1e-9) * FRACTION_STEP, 3)


def floor_grid(value: float) -> float:
    return round(math.floor(value / FRACTION_STEP + 1e-9) * FRACTION_STEP, 3)


def clamp_sequences(value: int | None, bounds: TuningBounds) -> int | None:
    """A limit on concurrent requests within the sequence bounds (``spec.tuning.bounds.maxNumSeqs``)."""
    if value is None:
        return None
    value = max(value, bounds.min_max_num_seqs)
    return min(value, bounds.max_max_num_seqs) if bounds.max_max_num_seqs is not None else value


def clamp_context(value: int | None, bounds: TuningBounds) -> int | None:
    """A context within the context bounds (``serving.minContextLength`` .. ``maxContextLength``)."""
    if value is not None and bounds.min_max_model_len is not None:
        value = max(value, bounds.min_max_model_len)
    if value is not None and bounds.max_max_model_len is not None:
        value = min(value, bounds.max_max_model_len)
    return value
