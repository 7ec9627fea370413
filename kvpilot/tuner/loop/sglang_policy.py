"""The closed loop for SGLang: hold or retune, and why. Pure and deterministic.

:func:`compute_sglang_decision` is :func:`kvpilot.tuner.loop.policy.compute_decision`'s counterpart in
SGLang's terms (:class:`~kvpilot.tuner.sglang.SglangSettings`, SGLang's memory model), reading the window
in the seam's shared meanings (:class:`~kvpilot.tuner.engines.MetricSeries`: ``kv_usage`` is SGLang's
token usage, ``preemption_rate`` its retractions per second, ``waiting`` its queued requests) and the
restarts as the seam classifies them (:meth:`~kvpilot.tuner.engines.SglangEngine.classify_failure`). The
first step with something to say decides:

0. **rollout** -- a change on its way to the pods (mode Auto): judged as vLLM's are
   (:mod:`.engine_rollout`, shared with TGI's chain): probation once every replica is Ready, success after
   it, a crash or the deadline rolls back to the last good flags and rules the new ones out;
1. **crash** -- a restart of the current settings: its failure's rule (:mod:`.sglang_rules`); a restart
   no rule cures holds and says so; crash remedies skip the cooldown and mark the settings failed;
1b. **GPU memory** -- dcgm-exporter's free framebuffer below the floor, or falling towards it, while serving
   (vLLM's engine-neutral early warning, :func:`.gpu_memory.detect_memory_warning`): the run-time OOM's
   remedy one step ahead of the crash, a *smaller* ``--mem-fraction-static`` first
   (:func:`.sglang_rules.propose_for_gpu_memory`); urgent (no cooldown, no restart trade), not a crash;
2. **metrics gate** -- missing, stale or too few samples since the last change: hold;
3. **pressure** -- token usage high with retractions (or SGLang's "KV cache pool is full" text): more pool
   under the fraction's ceiling, else an fp8 KV cache where allowed and supported, else fewer running
   requests; at their floor, a hold that recommends more replicas (below);
3b. **KV-bound** -- a queue while fewer run than the limit SGLang serves with and the pool is full (token
   usage at the target, or retractions): a larger pool (:mod:`.sglang_bound`, vLLM's ``KvBound``);
4. **latency** -- the inter-token latency objective missed (fewer running requests; not vLLM's smaller
   prefill chunk first, since SGLang runs a prefill batch alone), else the TTFT objective (a smaller prefill
   chunk); with nothing left, a hold that recommends more replicas;
5. **idle** -- a queue at the running-request limit with room in the pool (usage low, or measured room
   inside the band);
6. otherwise hold.

The steps every engine's own chain shares (the gates, which crash a remedy answers, the metrics gate, a
proposal's choice) are :mod:`.engine_chain`'s. A chosen candidate then passes the gates vLLM's does: the
minimum interval between changes, the cooldown
after a retune (metrics-driven changes only), the changes-per-hour limit, and (metrics-driven changes only)
vLLM's restart-cost trade (:mod:`.restart_trade`: its gain against the capacity the rollout loses while
SGLang restarts, ``SglangEvidence.rollout_lost_fraction`` x the restart), with the gain in SGLang's terms
(:func:`compute_gain_fraction`). Pressure or a latency objective with nothing left to propose (the running
requests at their floor) holds and recommends more replicas (``SglangDecision.scale_out``, as vLLM's:
:meth:`.engine_chain.Replicas.recommend`), while the replica count is not changing. What vLLM's policy has
and this does not (yet): the sizing of the early warning on memory that follows the batch (vLLM's
:func:`.gpu_memory.compute_limit_settings`), lengths-based sizing.
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import sglang
from kvpilot.tuner.loop import engine_chain, engine_flap, engine_rollout, sglang_bound, sglang_idle
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import restart_trade as rt
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.decision import Action, MetricsStatus, Trigger, compute_metrics_status
from kvpilot.tuner.loop.engine_chain import Costs, Gates
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY, KV_PRESSURE
from kvpilot.tuner.loop.sglang_fit import FailedRun, PressureChange, SglangProposal, SglangSituation
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangRestart,
)

__all__ = ["compute_gain_fraction", "compute_sglang_decision"]


def compute_sglang_decision(
    state: SglangLoopState, evidence: SglangEvidence, context: SglangContext, now: float
) -> SglangDecision:
    """Decide what to do with ``state.current`` at ``now``."""
    window, restarts = engine_chain.select_window(evidence.window, evidence.restarts, state.changes, now)
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
    metrics = compute_metrics_status(evidence.window, context.policy, now)
    gates = engine_chain.compute_gates(state, evidence, context.policy, now)
    costs = engine_chain.compute_costs(state, evidence, context.policy, now)
    replicas = engine_chain.Replicas.of(evidence, window)
    subject = build_subject(situation)
    decision = engine_rollout.compute_rollout_step(subject, state, evidence, restarts, now)
    if decision is None:
        decision = _crash_step(situation, restarts, gates)
    if decision is None:
        decision = _gpu_memory_step(situation, gates)
    if decision is None:
        decision = _metrics_step(situation, restarts, metrics, gates, costs, replicas)
    decision = engine_rollout.compute_good(
        subject, state, evidence, restarts, decision or _steady(situation), now
    )
    return dataclasses.replace(decision, metrics=metrics)


def build_subject(s: SglangSituation) -> engine_rollout.Subject[sglang.SglangSettings]:
    """The rollout step's view of SGLang's flags (what the history rules out: :func:`fit.is_ruled_out`)."""

    def ruled_out(settings: sglang.SglangSettings, failed: tuple[FailedRun, ...]) -> bool:
        return fit.is_ruled_out(settings, dataclasses.replace(s, failed=failed))

    return engine_rollout.Subject.of(
        s, fit.describe_settings, fit.describe_change, ruled_out, s.memory.weights_total_bytes
    )


def build_fit(s: SglangSituation, pool_full_texts: int = 0) -> engine_chain.Fit[sglang.SglangSettings]:
    """:func:`engine_chain.choose`'s view of SGLang: :func:`fit.pick`, the pool a choice holds, and its gain
    (:func:`compute_gain_fraction`; ``pool_full_texts``: the "KV cache pool is full" restarts)."""

    def explain(settings: sglang.SglangSettings) -> tuple[str, ...]:
        pool = fit.explain_pool(fit.compute_effective(settings, s.memory), s.memory)
        return (pool,) if pool else ()

    def gain(trigger: str, settings: sglang.SglangSettings, cooldown: float) -> float:
        return compute_gain_fraction(s, trigger, settings, cooldown, pool_full_texts)

    return engine_chain.Fit(s.current, lambda p: fit.pick(s, p), fit.describe_change, explain, gain)


def compute_gain_fraction(
    s: SglangSituation,
    trigger: str,
    settings: sglang.SglangSettings,
    cooldown_seconds: float,
    pool_full_texts: int = 0,
) -> float:
    """The share of the service's capacity a change to ``settings`` for ``trigger`` is expected to win back
    (0..1), in SGLang's terms of vLLM's trade (:mod:`.restart_trade`), from the window it was proposed on:

    * **IdleCapacity** (a queue at ``--max-running-requests``): the requests the new limit admits that now
      wait, per running request (:func:`~.restart_trade.compute_admission_share`; the limit left to SGLang
      is the most that ran, as :func:`.sglang_idle.propose_for_idle` takes it);
    * **KvPressure** (token usage high with retractions): SGLang's retractions are vLLM's preemptions -- a
      retracted request's KV is thrown away and recomputed -- so the share of the running requests retracted
      over the cooldown (:func:`~.restart_trade.compute_preemption_share`); a restart SGLang's "KV cache
      pool is full" text explains threw every running request away: the whole capacity;
    * **KvBound** (a queue behind a full pool, :mod:`.sglang_bound`): the requests the larger pool admits,
      per running request, at most the queue's (:func:`~.restart_trade.compute_kv_bound_share`, the growth
      from the memory model), as vLLM's;
    * any other trigger (the latency objectives): 1, no measure to discount it by.
    """
    w = s.window
    running = obs.compute_mean(w.samples, obs.running) or 0.0
    if trigger == IDLE_CAPACITY:
        waiting = obs.compute_mean(w.samples, obs.waiting) or 0.0
        peak = obs.compute_max(w.samples, obs.running) or 0.0
        limit = s.effective.max_running_requests or math.ceil(peak)
        raised = fit.compute_effective(settings, s.memory).max_running_requests or limit
        return rt.compute_admission_share(waiting, float(raised - limit), running)
    if trigger == KV_PRESSURE and not pool_full_texts:
        rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
        return rt.compute_preemption_share(rate, cooldown_seconds, running)
    if trigger == sglang_bound.KV_BOUND:
        waiting = obs.compute_mean(w.samples, obs.waiting) or 0.0
        return rt.compute_kv_bound_share(waiting, running, sglang_bound.compute_pool_gain(s, settings))
    return rt.WHOLE


def compute_pressure_changes(changes: tuple[SglangChange, ...]) -> tuple[PressureChange, ...]:
    """The ``KvPressure`` changes, with the running requests they found full and left where the flags name
    them (:func:`.engine_flap.compute_pressure_changes`; a change from SGLang's default, unset, names none:
    what it found full is not known)."""
    return engine_flap.compute_pressure_changes(changes, lambda x: x.max_running_requests)


def _crash_step(
    s: SglangSituation, restarts: tuple[SglangRestart, ...], gates: Gates
) -> SglangDecision | None:
    crash = engine_chain.select_crash(restarts, s.current, s.effective, s.window, "SGLang")
    if not isinstance(crash, engine_chain.Crash):
        return crash
    failure, ran = crash.failure, crash.ran
    s = dataclasses.replace(s, failed=(*s.failed, ran))  # the crash rules the current settings out too
    if failure.kind == "start_memory_short":
        proposal = rules.propose_for_memory_short(s, failure.text)
    else:
        proposal = rules.propose_for_oom(s, failure.kind, failure.text)
    return engine_chain.choose(build_fit(s), proposal, ran, gates.any_change)


def _gpu_memory_step(s: SglangSituation, gates: Gates) -> SglangDecision | None:
    """Ahead of the metrics gate, as vLLM's: dcgm-exporter's early warning of a run-time OOM acts on the
    serving samples there are (:func:`.sglang_rules.propose_for_gpu_memory`). Urgent: only the gates every
    change passes (the minimum interval, the hourly limit), no cooldown and no restart trade; not a crash:
    nothing is marked failed."""
    proposal = rules.propose_for_gpu_memory(s)
    if proposal is None:
        return None
    return engine_chain.choose(build_fit(s), proposal, None, gates.any_change)


def _metrics_step(
    s: SglangSituation,
    restarts: tuple[SglangRestart, ...],
    metrics: MetricsStatus,
    gates: Gates,
    costs: Costs,
    replicas: engine_chain.Replicas,
) -> SglangDecision | None:
    """The metrics rules in order; the first with something to say decides (with nothing left: a hold that
    recommends more replicas for pressure or a latency objective, :meth:`engine_chain.Replicas.recommend`)."""
    texts = sum(1 for r in restarts if r.failure is not None and r.failure.kind == "kv_pressure")
    held = engine_chain.check_samples(s.current, s.window, metrics, s.policy)
    if held is not None:
        return held
    for proposal in (
        rules.propose_for_pressure(s, texts),
        sglang_bound.propose_for_pool_bound(s),
        rules.propose_for_itl(s),
        rules.propose_for_ttft(s),
        _propose_for_idle(s),
    ):
        if proposal is not None:
            return engine_chain.choose(
                build_fit(s, texts), proposal, None, gates.metrics_driven, costs, replicas
            )
    return None


def _propose_for_idle(s: SglangSituation) -> SglangProposal | None:
    """More running requests where the room at the target usage allows
    (:func:`.sglang_idle.propose_for_idle`); only where that room is spent, a larger pool and the requests
    it holds, in one rollout (:func:`.sglang_idle.propose_growth_for_idle`).

    Not vLLM's ``_idle_step``, which grows the cache whenever the raise would leave the queue waiting: a
    larger ``--mem-fraction-static`` leaves less memory outside the share, where SGLang's run-time OOMs
    strike, so a raise of both that runs out of memory does not say which of the two did, and the next
    raise of the running requests alone cannot be kept below it (:func:`.sglang_idle._failed_running_target`
    reads failures at no larger a fraction). One move at a time keeps each failure telling (bench
    sglang-bad-new-settings: 64 -> 217 with the pool, an OOM, then 210 alone, a second one; 0.925 of the
    oracle, 0.973 with the raise alone first)."""
    proposal = sglang_idle.propose_for_idle(s)
    if proposal is not None and fit.pick(s, proposal) is not None:
        return proposal
    grown = sglang_idle.propose_growth_for_idle(s)
    return grown if grown is not None and fit.pick(s, grown) is not None else proposal


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
