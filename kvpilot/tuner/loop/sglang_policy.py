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
4. **latency** -- the inter-token latency objective missed (a smaller prefill chunk where long prompts share
   the steps, else fewer running requests), else the TTFT objective (a smaller prefill chunk);
5. **idle** -- a queue at the running-request limit with room in the pool (usage low, or measured room
   inside the band);
6. otherwise hold.

A chosen candidate then passes the gates vLLM's does: the minimum interval between changes, the cooldown
after a retune (metrics-driven changes only), the changes-per-hour limit. What vLLM's policy has and this
does not (yet): the restart-cost trade, fp8 KV, GPU-memory telemetry, scale-out recommendations,
lengths-based sizing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_idle, sglang_rollout
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.decision import (
    Action,
    MetricsStatus,
    Trigger,
    compute_cooldown,
    compute_metrics_status,
)
from kvpilot.tuner.loop.sglang_fit import FailedRun, PressureChange, SglangProposal, SglangSituation
from kvpilot.tuner.loop.sglang_state import (
    CRASH_ORDER,
    UNCLASSIFIED,
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangRestart,
    kind_of,
)

__all__ = ["compute_sglang_decision"]


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
        itl_p95_objective=context.itl_p95_seconds,
        pressure=compute_pressure_changes(state.changes),
        now=now,
    )
    since = last_change if last_change is not None else float("-inf")
    restarts = tuple(r for r in evidence.restarts if since <= r.time <= now)
    metrics = compute_metrics_status(evidence.window, context.policy, now)
    gates = _compute_gates(state, evidence, context, now)
    decision = sglang_rollout.compute_rollout_step(situation, state, evidence, restarts, now)
    if decision is None:
        decision = _crash_step(situation, restarts, gates)
    if decision is None:
        decision = _metrics_step(situation, restarts, metrics, gates)
    decision = sglang_rollout.compute_good(
        situation, state, evidence, restarts, decision or _steady(situation), now
    )
    return dataclasses.replace(decision, metrics=metrics)


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
    metrics-driven ones, which also wait for the current flags to be proven (the last good ones, or Ready
    for a probation since the last change: the plan's too, which no cooldown counts)."""
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
    proven = state.last_good == state.current or (
        evidence.ready and (last is None or now - last >= p.probation_seconds)
    )
    if metrics_driven is None and not proven:
        # the current flags have not yet served Ready through a probation (as the plan's must before they
        # are the last good ones, sglang_rollout.compute_good): a change now would have nothing to roll back
        # to, and a raise that runs out of memory could only be answered by a smaller fraction
        metrics_driven = (
            f"the current flags are not yet proven (Ready and crash-free for {p.probation_seconds:.0f}s)"
        )
    return _Gates(any_change, metrics_driven)


def compute_pressure_changes(changes: tuple[SglangChange, ...]) -> tuple[PressureChange, ...]:
    """The ``KvPressure`` changes, with the running requests they found full and left where the flags name
    them (a change from SGLang's default, unset, names none: what it found full is not known)."""
    out = []
    for c in changes:
        if c.trigger != rules.KV_PRESSURE:
            continue
        before = c.before.max_running_requests if c.before is not None else None
        after = c.after.max_running_requests if c.after is not None else None
        out.append(PressureChange(c.time, before, after if after is not None else before))
    return tuple(sorted(out, key=lambda x: x.time))


def _crash_step(
    s: SglangSituation, restarts: tuple[SglangRestart, ...], gates: _Gates
) -> SglangDecision | None:
    crashes = [r for r in restarts if r.failure is None or r.failure.kind in CRASH_ORDER]
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
    event = min(known, key=lambda r: (CRASH_ORDER.index(kind_of(r)), -r.time, r.pod))
    failure = event.failure
    assert failure is not None
    running = fit.running_before(s.window, event.time) if failure.kind == "runtime_oom" else None
    ran = FailedRun(s.effective, failure.kind, running)
    s = dataclasses.replace(s, failed=(*s.failed, ran))  # the crash rules the current settings out too
    if failure.kind == "start_memory_short":
        proposal = rules.propose_for_memory_short(s, failure.text)
    else:
        proposal = rules.propose_for_oom(s, failure.kind, failure.text)
    return _choose(s, proposal, ran, gates.any_change)


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
        rules.propose_for_itl(s),
        rules.propose_for_ttft(s),
        sglang_idle.propose_for_idle(s),
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
