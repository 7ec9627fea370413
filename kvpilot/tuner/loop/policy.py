"""The closed-loop policy: hold, retune, roll back or give up, and why. Pure and deterministic.

:func:`compute_decision` is VPA's recommender + updater for vLLM engine arguments, as a
chain of small steps; the first step with something to say decides:

1. **rollout** -- a retune is rolling out: Ready = probation starts; Ready and crash-free
   for ``probation_seconds`` = it succeeded (the settings are *good*); a crash of the new
   pods (before Ready or on probation) or the deadline passed without Ready = roll back to
   the last good settings and mark the new ones failed; otherwise wait.
2. **crash** -- a container running the current settings stopped: classify
   (:mod:`kvpilot.tuner.loop.restarts`) and ask :mod:`kvpilot.tuner.loop.remedies` for candidates.
   Crash remedies skip the metrics cooldown; host OOM and unknown crashes hold.
3. **metrics gate** -- missing, stale or too few samples since the last change: hold
   (``MetricsAvailable=False`` on the resource).
4. **pressure** -- sustained KV usage >= high band with preemptions: fp8 KV or fewer sequences.
5. **idle** -- a queue at the sequence limit with room in the KV cache (sustained usage <= low band,
   or, inside the band, room at the target usage by the observed lengths and usage): more sequences;
   with that room spent, a larger KV cache and the sequences it holds.
6. otherwise hold (inside the hysteresis band).

Pressure or the SLO with every candidate exhausted (the tuning at its floor) also carries the replicas to
recommend (``Decision.scale_out``): only more replicas can help then.

Every candidate then passes the same filters, in order: clamp to the bounds -> round and
make consistent -> drop "no change" -> drop settings that failed before -> drop settings
predicted not to start -> stability gates (minimum interval, cooldown from the last retune -- not
from the initial plan -- at least a restart plus a metrics window, changes per hour, no metrics-driven change
while the replica count changes: :mod:`kvpilot.tuner.loop.scaling`) -> the rollout gates:
a change that cannot roll out now (``Evidence.rollout_blocked``: no spare GPU for a surge pod and no
downtime allowed) holds with the reason, and a metrics-driven change whose expected gain does not
outweigh its restart cost under the rollout strategy in use (:mod:`kvpilot.tuner.loop.trade`) holds;
both keep what they would have done in ``Decision.recommended``. Crash remedies skip the cost trade.

Time is the ``now`` argument (epoch seconds); nothing here reads a clock, the cluster or
Prometheus. The same inputs always give the same decision.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import candidates, crash_remedies, gpu_memory, kv_bound, remedies, scaling, slo, trade
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import rollout as rollout_mod
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.decision import (
    Action,
    Decision,
    Evidence,
    LoopState,
    MetricsStatus,
    RolloutState,
    Trigger,
    compute_cooldown,
    compute_metrics_status,
)
from kvpilot.tuner.loop.observations import ObservationWindow, RestartEvent, RestartKind
from kvpilot.tuner.loop.remedies import Proposal, Situation
from kvpilot.tuner.types import EngineSettings

__all__ = [
    "Action",
    "Decision",
    "Evidence",
    "LoopState",
    "MetricsStatus",
    "PolicyConfig",
    "RolloutState",
    "Trigger",
    "TuningBounds",
    "TuningContext",
    "compute_cooldown",
    "compute_decision",
    "compute_metrics_status",
]


@dataclass(frozen=True, slots=True)
class _Inputs:
    situation: Situation
    full_window: ObservationWindow
    restarts: tuple[RestartEvent, ...]
    """Restarts of the current settings only (after the last change)."""
    failed: tuple[EngineSettings, ...]
    rollout: RolloutState | None
    last_good: EngineSettings | None
    ready: bool
    not_started: bool
    last_change: float | None
    last_retune: float | None
    """The last change other than the initial plan: the cooldown counts from it."""
    cooldown: float
    metrics: MetricsStatus
    restart_seconds: float
    deadline_seconds: float
    lost_fraction: float
    blocked: str | None
    replicas: int = 1
    replicas_changing: str | None = None
    compile_cache_persistent: bool = False


def compute_decision(state: LoopState, evidence: Evidence, context: TuningContext, now: float) -> Decision:
    """Decide what to do with ``state.current`` at ``now``.

    The decision also carries what it was computed from (the effective settings, the metrics'
    status, vLLM's capacity report when it is for the current settings), so the caller never
    recomputes them.
    """
    inputs = _build_inputs(state, evidence, context, now)
    steps = (
        _rollout_step,
        _crash_step,
        _gpu_memory_step,
        _metrics_step,
        _pressure_step,
        _kv_bound_step,
        _slo_step,
        _idle_step,
    )
    for step in steps:
        decision = step(inputs)
        if decision is not None:
            return _finish(inputs, decision)
    return _finish(inputs, _steady(inputs))


def _build_inputs(state: LoopState, evidence: Evidence, context: TuningContext, now: float) -> _Inputs:
    history, rollout, window = state.history, state.rollout, evidence.window
    last_change = history_mod.compute_last_change_time(history)
    since = max(last_change or float("-inf"), rollout.started_at if rollout else float("-inf"))
    effective = remedies.compute_effective(state.current, context)
    fresh = window.since(since) if last_change is not None or rollout else window
    situation = Situation(
        current=state.current,
        effective=effective,
        budget=evidence.budget,
        window=fresh,
        context=context,
        history=history,
        now=now,
        capacity_tokens=remedies.compute_capacity_tokens(
            effective, evidence.budget, window, state.observed_kv_tokens
        ),
        failed=state.failed,
    )
    relevant = tuple(r for r in evidence.restarts if r.time >= since and r.time <= now)
    return _Inputs(
        situation,
        window,
        relevant,
        state.failed,
        rollout,
        state.last_good,
        evidence.ready,
        evidence.not_started,
        last_change,
        history_mod.compute_last_retune_time(history),
        compute_cooldown(context.policy, evidence.restart_seconds),
        compute_metrics_status(window, context.policy, now),
        context.policy.restart_seconds if evidence.restart_seconds is None else evidence.restart_seconds,
        _compute_deadline_seconds(state, evidence, context, effective),
        evidence.rollout_lost_fraction,
        evidence.rollout_blocked,
        evidence.replicas,
        evidence.replicas_changing,
        evidence.compile_cache_persistent,
    )


def _compute_deadline_seconds(
    state: LoopState, evidence: Evidence, context: TuningContext, effective: EngineSettings
) -> float:
    """The rollout deadline of ``state.current`` (:func:`rollout_mod.compute_deadline_seconds`): its start
    predicted from the checkpoint, the weight cache and the compile cache (warm coming from the last good
    settings, or back to settings that already ran)."""
    policy = context.policy
    before = remedies.compute_effective(state.last_good, context) if state.last_good is not None else None
    warm = (
        trade.compute_warm_compile_seconds(
            before,
            effective,
            persistent=evidence.compile_cache_persistent,
            compile_seconds=policy.compile_seconds,
            restart_seconds=policy.restart_seconds,
            compiled=(
                remedies.compute_effective(ran, context)
                for ran in history_mod.compute_compiled_settings(state.history)
            ),
        )
        if before is not None
        else 0.0
    )
    return rollout_mod.compute_deadline_seconds(
        policy,
        restart_seconds=evidence.restart_seconds,
        checkpoint_gib=evidence.checkpoint_gib or evidence.budget.weights_gib,
        weights_cached=evidence.weights_cached,
        warm_compile_seconds=warm,
    )


def _finish(inp: _Inputs, decision: Decision) -> Decision:
    s, window = inp.situation, inp.full_window
    reported = window.kv_capacity_tokens if remedies.report_matches(s.effective, window) else None
    return dataclasses.replace(
        _with_good(inp, decision), effective=s.effective, metrics=inp.metrics, observed_kv_tokens=reported
    )


# --- 1. rollout: :mod:`kvpilot.tuner.loop.rollout` ---------------------------------------------


def _rollout_step(inp: _Inputs) -> Decision | None:
    return rollout_mod.compute_rollout_step(
        inp.situation,
        inp.rollout,
        inp.restarts,
        ready=inp.ready,
        not_started=inp.not_started,
        last_good=inp.last_good,
        deadline_seconds=inp.deadline_seconds,
    )


# --- 2. crash ------------------------------------------------------------------------------------

_CRASH_PRIORITY = (
    RestartKind.KV_CACHE_TOO_SMALL,
    RestartKind.NO_CACHE_BLOCKS,
    RestartKind.MAMBA_CACHE_BLOCKS,
    RestartKind.INSUFFICIENT_FREE_MEMORY,
    RestartKind.CUDA_OOM,
    RestartKind.HOST_OOM_KILLED,
    RestartKind.INVALID_ENGINE_ARGS,
    RestartKind.DISTRIBUTED_TIMEOUT,
    RestartKind.OTHER,
)


def _crash_step(inp: _Inputs) -> Decision | None:
    if not inp.restarts:
        return None
    s = inp.situation
    event = _worst_restart(inp.restarts)
    kind = event.cause.kind
    if kind == RestartKind.KV_CACHE_TOO_SMALL:
        s = crash_remedies.calibrate_to_startup_error(s, event)
    proposal = crash_remedies.propose_for_restart(s, event)
    if proposal is None:
        advice = {
            RestartKind.HOST_OOM_KILLED: "host memory, not GPU memory: raise the container's memory limit",
            RestartKind.DISTRIBUTED_TIMEOUT: "a peer of the group or the network between its nodes failed, "
            "not the KV cache: see the group's other pods",
        }.get(kind, "not something engine arguments can fix")
        return Decision(
            Action.HOLD, s.current, kind, f"{kind} on {event.pod or 'a pod'} ({event.cause.detail}); {advice}"
        )
    return _choose(dataclasses.replace(inp, situation=s), proposal)


def _worst_restart(restarts: tuple[RestartEvent, ...]) -> RestartEvent:
    """The most actionable restart; ties go to the most restarts, then the latest, then the pod name."""
    return min(
        restarts,
        key=lambda r: (_CRASH_PRIORITY.index(r.cause.kind), -r.restart_count, -r.time, r.pod),
    )


# --- 3.-6. metrics ---------------------------------------------------------------------------------


def _metrics_step(inp: _Inputs) -> Decision | None:
    s = inp.situation
    status = inp.metrics
    if not status.available:
        return Decision(Action.HOLD, s.current, Trigger.METRICS_UNAVAILABLE, status.message)
    count = sum(1 for x in s.window.samples if x.kv_usage is not None)
    if count < s.policy.min_samples:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.INSUFFICIENT_DATA,
            f"{count} samples since the last change; {s.policy.min_samples} needed",
        )
    return None


def _pressure_step(inp: _Inputs) -> Decision | None:
    proposal = remedies.propose_for_pressure(inp.situation)
    return _choose(inp, kv_bound.with_growth(inp.situation, proposal)) if proposal is not None else None


def _gpu_memory_step(inp: _Inputs) -> Decision | None:
    """Ahead of the metrics' own checks: a warning of a CUDA OOM acts on the samples there are."""
    proposal = gpu_memory.propose_for_gpu_memory(inp.situation)
    return _choose(inp, proposal) if proposal is not None else None


def _kv_bound_step(inp: _Inputs) -> Decision | None:
    """A queue held back by a full KV cache: a larger one. Falls through to the later rules when no larger
    cache survives the filters (bounds, failed settings), since those rules may still help."""
    proposal = kv_bound.propose_for_kv_bound(inp.situation)
    if proposal is None or candidates.pick(inp.situation, proposal) is None:
        return None
    return _choose(inp, proposal)


def _slo_step(inp: _Inputs) -> Decision | None:
    proposal = slo.propose_for_slo(inp.situation)
    return _choose(inp, proposal) if proposal is not None else None


def _idle_step(inp: _Inputs) -> Decision | None:
    if not slo.allows_raise(inp.situation):
        return None  # raises stop at the latency objective
    s = inp.situation
    proposal = remedies.propose_for_idle(s)
    raised = candidates.pick(s, proposal) if proposal is not None else None
    if raised is None or _queue_outgrows(s, raised):
        # the room at the target usage is spent, or the raise it allows leaves a queue: a larger cache and
        # the sequences it holds, in the same rollout (falls through when none)
        grown = kv_bound.propose_growth_for_idle(s)
        picked = candidates.pick(s, grown) if grown is not None else None
        if grown is not None and picked is not None and (raised is None or _more_seqs(s, picked, raised)):
            return _choose(inp, grown)
    return _choose(inp, proposal) if proposal is not None else None


def _queue_outgrows(s: Situation, raised: EngineSettings) -> bool:
    """The window's queue asks for more sequences than ``raised`` runs: its requests would still wait."""
    queue = obs.compute_mean(s.window.samples, obs.waiting) or 0.0
    running = obs.compute_max(s.window.samples, obs.running) or 0.0
    return (s.effective_of(raised).max_num_seqs or 0) < running + queue


def _more_seqs(s: Situation, a: EngineSettings, b: EngineSettings) -> bool:
    return (s.effective_of(a).max_num_seqs or 0) > (s.effective_of(b).max_num_seqs or 0)


def _steady(inp: _Inputs) -> Decision:
    s = inp.situation
    mean = obs.compute_mean(s.window.samples, obs.kv_usage) or 0.0
    return Decision(
        Action.HOLD,
        s.current,
        Trigger.STEADY,
        f"mean KV usage {mean:.2f}, band [{s.policy.kv_usage_low:.2f}, {s.policy.kv_usage_high:.2f}]: "
        "no sustained pressure with preemptions, no queue at the sequence limit",
    )


# --- choosing and the gates ---------------------------------------------------------------------------


def _choose(inp: _Inputs, proposal: Proposal) -> Decision:
    s = inp.situation
    failed = s.current if proposal.crash else None
    settings = candidates.pick(inp.situation, proposal)
    if settings is not None:
        return _gate(inp, proposal, settings, failed)
    action = Action.INFEASIBLE if proposal.infeasible_when_exhausted else Action.HOLD
    scale_out = scaling.recommend_scale_out(proposal.trigger, s.window, inp.replicas, inp.replicas_changing)
    return Decision(
        action,
        s.current,
        proposal.trigger,
        f"{proposal.evidence}; {proposal.exhausted}",
        failed=failed,
        scale_out=scale_out,
    )


def _gate(
    inp: _Inputs, proposal: Proposal, settings: EngineSettings, failed: EngineSettings | None
) -> Decision:
    s, p = inp.situation, inp.situation.policy
    change = vllm.describe_change(s.current, settings)
    blocked = None
    if inp.last_change is not None and s.now - inp.last_change < p.min_change_interval_seconds:
        since = s.now - inp.last_change
        blocked = f"only {since:.0f}s since the last change (minimum {p.min_change_interval_seconds:.0f}s)"
    elif (
        not (proposal.crash or proposal.urgent)
        and inp.last_retune is not None
        and s.now - inp.last_retune < inp.cooldown
    ):
        blocked = f"cooldown for {inp.cooldown - (s.now - inp.last_retune):.0f}s more"
    if blocked is None:
        recent = history_mod.compute_changes_since(s.history, s.now - 3600.0)
        if recent >= p.max_changes_per_hour:
            blocked = f"{recent} changes in the last hour (limit {p.max_changes_per_hour})"
    if blocked is None and inp.replicas_changing is not None and not (proposal.crash or proposal.urgent):
        blocked = f"the replica count is changing ({inp.replicas_changing})"
    recommended = None
    if blocked is None and inp.blocked is not None:
        blocked, recommended = inp.blocked, settings
    if blocked is None and not (proposal.crash or proposal.urgent):
        proposed = s.effective_of(settings)
        before, after = remedies.predict_kv_tokens(s, s.effective), remedies.predict_kv_tokens(s, proposed)
        held_since = history_mod.compute_held_since(s.history, proposal.trigger)
        persisted = 0.0 if held_since is None else min(p.trade_persistence_max_seconds, s.now - held_since)
        warm = trade.compute_warm_compile_seconds(
            s.effective,
            proposed,
            persistent=inp.compile_cache_persistent,
            compile_seconds=p.compile_seconds,
            restart_seconds=inp.restart_seconds,
            compiled=map(s.effective_of, history_mod.compute_compiled_settings(s.history)),
        )
        worth = trade.compute_trade(
            proposal.trigger,
            s.window,
            s.effective,
            proposed,
            cooldown_seconds=inp.cooldown,
            restart_seconds=inp.restart_seconds,
            lost_fraction=inp.lost_fraction,
            kv_growth=after / before if before and after else None,
            persisted_seconds=persisted,
            warm_compile_seconds=warm,
        )
        if not worth.worth_it:
            blocked, recommended = f"it is not worth a restart ({worth.describe()})", settings
    if blocked is not None:
        return Decision(
            Action.HOLD,
            s.current,
            proposal.trigger,
            f"{proposal.evidence}; would retune ({change}) but {blocked}",
            failed=failed,
            recommended=recommended,
        )
    return Decision(
        Action.RETUNE, settings, proposal.trigger, f"{proposal.evidence}: {change}", failed=failed
    )


def _with_good(inp: _Inputs, decision: Decision) -> Decision:
    """Healthy, Ready and crash-free since the last change, at least ``probation_seconds`` ago: the
    current settings are good (outside a rollout, e.g. the first plan; a rollout's own step decides)."""
    if decision.good is not None or decision.failed is not None or inp.restarts or not inp.ready:
        return decision
    if inp.rollout is not None or inp.last_good == inp.situation.current:
        return decision
    s = inp.situation
    if inp.last_change is not None and s.now - inp.last_change < s.policy.probation_seconds:
        return decision
    return dataclasses.replace(decision, good=inp.situation.current)
