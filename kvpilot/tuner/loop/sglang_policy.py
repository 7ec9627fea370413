"""The closed loop for SGLang: hold or retune, and why. Pure and deterministic.

:func:`compute_sglang_decision` is :func:`kvpilot.tuner.loop.policy.compute_decision`'s counterpart in
SGLang's terms (:class:`~kvpilot.tuner.sglang.SglangSettings`, SGLang's memory model), reading the window
in the seam's shared meanings (:class:`~kvpilot.tuner.engines.MetricSeries`: ``kv_usage`` is SGLang's
token usage, ``preemption_rate`` its retractions per second, ``waiting`` its queued requests) and the
restarts as the seam classifies them (:meth:`~kvpilot.tuner.engines.SglangEngine.classify_failure`). The
first step with something to say decides:

0. **rollout** -- a change on its way to the pods (mode Auto): judged as vLLM's are
   (:func:`kvpilot.tuner.loop.rollout.judge_rollout`): probation once every replica is Ready, success after
   it, a crash or the deadline rolls back to the last good flags and rules the new ones out;
1. **crash** -- a restart of the current settings: its failure's rule (:mod:`.sglang_rules`); a restart
   no rule cures holds and says so; crash remedies skip the cooldown and mark the settings failed;
2. **metrics gate** -- missing, stale or too few samples since the last change: hold;
3. **pressure** -- token usage high with retractions (or SGLang's "KV cache pool is full" text);
4. **latency** -- the TTFT objective missed;
5. **idle** -- a queue at the running-request limit with token usage low;
6. otherwise hold.

A chosen candidate then passes the gates vLLM's does: the minimum interval between changes, the cooldown
after a retune (metrics-driven changes only), the changes-per-hour limit. What vLLM's policy has and this
does not (yet): the restart-cost trade, fp8 KV, GPU-memory telemetry, scale-out recommendations,
lengths-based sizing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import sglang
from kvpilot.tuner.engines import EngineFailure, SglangEngine
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import rollout as rollout_step
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.decision import (
    Action,
    MetricsStatus,
    Trigger,
    compute_cooldown,
    compute_metrics_status,
)
from kvpilot.tuner.loop.sglang_fit import FailedRun, SglangMemory, SglangProposal, SglangSituation

__all__ = [
    "SglangChange",
    "SglangContext",
    "SglangDecision",
    "SglangEvidence",
    "SglangLoopState",
    "SglangRestart",
    "SglangRollout",
    "classify_restart",
    "compute_sglang_decision",
]

UNCLASSIFIED = "Other"
"""The trigger of a restart whose log SGLang's texts do not explain."""
ROLLOUT_FAILED = fit.ROLLOUT_FAILED

_CRASH_ORDER = ("start_memory_short", "start_oom", "runtime_oom")


@dataclass(frozen=True, slots=True)
class SglangRestart:
    """One container termination of a pod running the current settings."""

    time: float
    failure: EngineFailure | None
    """The seam's classification of its log (``None``: nothing SGLang's texts explain)."""
    pod: str = ""


def classify_restart(time: float, log: str, pod: str = "") -> SglangRestart:
    """A termination and its log, classified by the seam (:meth:`SglangEngine.classify_failure`)."""
    return SglangRestart(time, SglangEngine().classify_failure(log), pod)


@dataclass(frozen=True, slots=True)
class SglangChange:
    """A change the loop made (not a hold): when, why, and whether it was the initial plan."""

    time: float
    trigger: str
    planned: bool = False


@dataclass(frozen=True, slots=True)
class SglangRollout:
    """``status.rollout`` of an SGLang service (mode Auto): flags on their way to the pods."""

    settings: sglang.SglangSettings
    started_at: float
    deadline: float
    """Not Ready by then = failed (does not apply while on probation)."""
    probation_until: float | None = None


@dataclass(frozen=True, slots=True)
class SglangLoopState:
    """What the service's status remembers between ticks."""

    current: sglang.SglangSettings
    """The settings on the Deployment now, as rendered (``None``: SGLang's default)."""
    failed: tuple[FailedRun, ...] = ()
    changes: tuple[SglangChange, ...] = ()
    rollout: SglangRollout | None = None
    last_good: sglang.SglangSettings | None = None
    """The flags that last passed probation (``status.lastGoodEngineArgs``), where a rollout returns."""


@dataclass(frozen=True, slots=True)
class SglangEvidence:
    """What this tick observed of the current settings."""

    window: obs.ObservationWindow
    restarts: tuple[SglangRestart, ...] = ()
    restart_seconds: float | None = None
    ready: bool = False
    """Every replica runs the current settings and is Ready."""
    not_started: bool = False
    """A pod of the current settings has not started (no node with a free GPU, weights downloading)."""


@dataclass(frozen=True, slots=True)
class SglangContext:
    """What one SGLang service is tuned on and within."""

    memory: SglangMemory
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    ttft_p95_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SglangDecision:
    """What to do now. ``settings`` = what should run next (the current ones on a hold)."""

    action: Action
    settings: sglang.SglangSettings
    trigger: str
    reason: str
    """The evidence and the change (or why none), in one line."""
    explanation: tuple[str, ...] = ()
    """The memory model's steps behind a change of the fraction, the prefill chunk or the context."""
    failed: FailedRun | None = None
    """The current settings, ruled out by the crash this decision answers."""
    recommended: sglang.SglangSettings | None = None
    """A hold of the gates: the settings it would have rolled out."""
    metrics: MetricsStatus | None = None
    probation_until: float | None = None
    """The rollout on probation until then (``status.rollout.probationUntil``)."""
    good: sglang.SglangSettings | None = None
    """The rollout succeeded: these flags are the last good ones."""

    @property
    def changes(self) -> bool:
        return self.action in (Action.RETUNE, Action.ROLLBACK)


def compute_sglang_decision(
    state: SglangLoopState, evidence: SglangEvidence, context: SglangContext, now: float
) -> SglangDecision:
    """Decide what to do with ``state.current`` at ``now``."""
    last_change = max((c.time for c in state.changes), default=None)
    window = evidence.window.since(last_change) if last_change is not None else evidence.window
    situation = SglangSituation(
        current=state.current,
        effective=fit.compute_effective(state.current, context.memory),
        window=window,
        memory=context.memory,
        failed=state.failed,
        bounds=context.bounds,
        policy=context.policy,
        ttft_p95_objective=context.ttft_p95_seconds,
    )
    since = last_change if last_change is not None else float("-inf")
    restarts = tuple(r for r in evidence.restarts if since <= r.time <= now)
    metrics = compute_metrics_status(evidence.window, context.policy, now)
    gates = _compute_gates(state, evidence, context, now)
    decision = _rollout_step(situation, state, evidence, restarts, now)
    if decision is None:
        decision = _crash_step(situation, restarts, gates)
    if decision is None:
        decision = _metrics_step(situation, restarts, metrics, gates)
    return dataclasses.replace(decision or _steady(situation), metrics=metrics)


@dataclass(frozen=True, slots=True)
class _Gates:
    """Why a change cannot roll out now: any change, and a metrics-driven one (``None``: it can)."""

    any_change: str | None
    metrics_driven: str | None


def _compute_gates(
    state: SglangLoopState, evidence: SglangEvidence, context: SglangContext, now: float
) -> _Gates:
    """vLLM's stability gates: the minimum interval between changes and the hourly limit for every
    change; the cooldown after a retune (a restart plus a window, :func:`compute_cooldown`) for
    metrics-driven ones."""
    p = context.policy
    last = max((c.time for c in state.changes), default=None)
    retunes = [c.time for c in state.changes if not c.planned]
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
    return _Gates(any_change, metrics_driven)


def _crash_step(
    s: SglangSituation, restarts: tuple[SglangRestart, ...], gates: _Gates
) -> SglangDecision | None:
    crashes = [r for r in restarts if r.failure is None or r.failure.kind in _CRASH_ORDER]
    if not crashes:
        return None
    known = [r for r in crashes if r.failure is not None]
    if not known:
        r = max(crashes, key=lambda x: x.time)
        return SglangDecision(
            Action.HOLD,
            s.current,
            UNCLASSIFIED,
            f"a restart on {r.pod or 'a pod'} that SGLang's failure texts do not explain: not something "
            "engine arguments can fix",
        )
    event = min(known, key=lambda r: (_CRASH_ORDER.index(_kind(r)), -r.time, r.pod))
    failure = event.failure
    assert failure is not None
    ran = FailedRun(s.effective, failure.kind)
    s = dataclasses.replace(s, failed=(*s.failed, ran))  # the crash rules the current settings out too
    if failure.kind == "start_memory_short":
        proposal = rules.propose_for_memory_short(s, failure.text)
    else:
        proposal = rules.propose_for_oom(s, failure.kind, failure.text)
    return _choose(s, proposal, ran, gates.any_change)


def _rollout_step(
    s: SglangSituation,
    state: SglangLoopState,
    evidence: SglangEvidence,
    restarts: tuple[SglangRestart, ...],
    now: float,
) -> SglangDecision | None:
    """A rollout in progress, judged as vLLM's (:func:`rollout_step.judge_rollout`); ``None`` when there is
    none, or when its flags crashed with nothing safe to go back to (the crash step cures them)."""
    rollout = state.rollout
    if rollout is None:
        return None
    since = tuple(r for r in restarts if r.time >= rollout.started_at and _kind(r) != "kv_pressure")
    latest = max(since, key=lambda r: (r.time, r.pod), default=None)
    judged = rollout_step.judge_rollout(
        started_at=rollout.started_at,
        deadline=rollout.deadline,
        probation_until=rollout.probation_until,
        crash=None if latest is None else f"{_kind(latest)} on {latest.pod or 'a pod'}",
        ready=evidence.ready,
        not_started=evidence.not_started,
        now=now,
        probation_seconds=s.policy.probation_seconds,
    )
    verdict, flags = judged.verdict, fit.describe_settings(s.current)
    if verdict == rollout_step.Verdict.PENDING:
        why = "the new flags' pods have not started (no node with a free GPU, or their weights download)"
        return SglangDecision(Action.HOLD, s.current, Trigger.ROLLOUT_PENDING, f"{why}; not marked failed")
    if verdict == rollout_step.Verdict.SUCCEEDED:
        ran = f", ran {s.policy.probation_seconds:.0f}s without a crash" if judged.probation_until else ""
        why = f"every replica runs the new flags and is Ready{ran}: {flags}"
        return SglangDecision(Action.HOLD, s.current, Trigger.ROLLOUT_SUCCEEDED, why, good=s.current)
    if verdict in (rollout_step.Verdict.PROBATION_STARTS, rollout_step.Verdict.ON_PROBATION):
        why = judged.why or f"{s.policy.probation_seconds:.0f}s, a crash until then rolls back"
        return SglangDecision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"new flags on probation ({why}): {flags}",
            probation_until=judged.probation_until,
        )
    if verdict == rollout_step.Verdict.IN_PROGRESS:
        return SglangDecision(
            Action.HOLD, s.current, Trigger.ROLLOUT_IN_PROGRESS, f"waiting for the rollout ({judged.why})"
        )
    return _rollout_failed(s, state, since, judged.why)


def _rollout_failed(
    s: SglangSituation, state: SglangLoopState, crashes: tuple[SglangRestart, ...], why: str
) -> SglangDecision | None:
    """The new flags failed: back to the last good ones (the new ones ruled out, by the crash's kind or
    exactly); ``None`` for a crash the crash step cures when there is nothing to go back to."""
    known = [r.failure.kind for r in crashes if r.failure is not None and r.failure.kind in _CRASH_ORDER]
    kind = min(known, key=_CRASH_ORDER.index) if known else ROLLOUT_FAILED
    ran = FailedRun(s.effective, kind)
    target = state.last_good
    ruled_out = dataclasses.replace(s, failed=(*s.failed, ran))
    if target is not None and target != s.current and not fit.is_ruled_out(target, ruled_out):
        change = fit.describe_change(s.current, target)
        return SglangDecision(
            Action.ROLLBACK,
            target,
            Trigger.ROLLOUT_FAILED,
            f"new flags failed ({why}); rolling back: {change}",
            failed=ran,
        )
    if known:
        return None
    why = f"new flags failed ({why}) and there are no known-good flags to return to"
    return SglangDecision(Action.HOLD, s.current, Trigger.ROLLOUT_FAILED, why, failed=ran)


def _kind(r: SglangRestart) -> str:
    return r.failure.kind if r.failure is not None else UNCLASSIFIED


def _metrics_step(
    s: SglangSituation, restarts: tuple[SglangRestart, ...], metrics: MetricsStatus, gates: _Gates
) -> SglangDecision | None:
    texts = sum(1 for r in restarts if r.failure is not None and r.failure.kind == "kv_pressure")
    if not metrics.available:
        return SglangDecision(Action.HOLD, s.current, Trigger.METRICS_UNAVAILABLE, metrics.message)
    count = sum(1 for x in s.window.samples if x.kv_usage is not None)
    if count < s.policy.min_samples:
        reason = f"{count} samples since the last change; {s.policy.min_samples} needed"
        return SglangDecision(Action.HOLD, s.current, Trigger.INSUFFICIENT_DATA, reason)
    for proposal in (
        rules.propose_for_pressure(s, texts),
        rules.propose_for_ttft(s),
        rules.propose_for_idle(s),
    ):
        if proposal is not None:
            return _choose(s, proposal, None, gates.metrics_driven)
    return None


def _steady(s: SglangSituation) -> SglangDecision:
    mean = obs.compute_mean(s.window.samples, obs.kv_usage) or 0.0
    p = s.policy
    return SglangDecision(
        Action.HOLD,
        s.current,
        Trigger.STEADY,
        f"mean token usage {mean:.2f}, band [{p.kv_usage_low:.2f}, {p.kv_usage_high:.2f}]: no sustained "
        "pressure with retractions, no queue at the running-request limit, no objective missed",
    )


def _choose(
    s: SglangSituation, proposal: SglangProposal, failed: FailedRun | None, blocked: str | None
) -> SglangDecision:
    settings = fit.pick(s, proposal)
    if settings is None:
        action = Action.INFEASIBLE if proposal.infeasible_when_exhausted else Action.HOLD
        return SglangDecision(
            action,
            s.current,
            proposal.trigger,
            f"{proposal.evidence}; {proposal.exhausted}",
            proposal.explanation,
            failed=failed,
        )
    pool = fit.explain_pool(fit.compute_effective(settings, s.memory), s.memory)
    explanation = (*proposal.explanation, *([pool] if pool else []))
    change = fit.describe_change(s.current, settings)
    if blocked is not None:
        return SglangDecision(
            Action.HOLD,
            s.current,
            proposal.trigger,
            f"{proposal.evidence}; would retune ({change}) but {blocked}",
            explanation,
            failed=failed,
            recommended=settings,
        )
    return SglangDecision(
        Action.RETUNE,
        settings,
        proposal.trigger,
        f"{proposal.evidence}: {change}",
        explanation,
        failed=failed,
    )
