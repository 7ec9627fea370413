"""The closed loop for TGI: hold or retune, and why. Pure and deterministic.

:func:`compute_tgi_decision` is :func:`kvpilot.tuner.loop.sglang_policy.compute_sglang_decision`'s
counterpart in TGI's terms (:class:`~kvpilot.tuner.tgi.TgiSettings`, TGI's warm-up memory model), with the
same chain (:func:`kvpilot.tuner.loop.engine_chain.run_chain`), reading the window in the seam's shared
meanings (``kv_usage``: ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``; ``running``:
``tgi_batch_current_size``; ``waiting``: ``tgi_queue_size``) and the restarts as the seam classifies them
(:meth:`~kvpilot.tuner.engines.TgiEngine.classify_failure`). The first step with something to say decides:

0. **rollout** -- a change on its way to the pods (mode Auto), judged as vLLM's and SGLang's
   (:mod:`.engine_rollout`): probation once every replica is Ready, success after it, a crash or the deadline
   rolls back to the last good flags and rules the new ones out;
1. **crash** -- a restart of the current settings: its failure's rule (:mod:`.tgi_rules`: the warm-up's
   prefill, a ``--max-total-tokens`` the KV cannot hold, a CUDA OOM while serving); a restart no rule cures
   holds and says so; crash remedies skip the cooldown and mark the settings failed;
1b. **GPU memory** -- dcgm-exporter's free framebuffer below the floor, or falling towards it, while serving
   (vLLM's engine-neutral early warning, :func:`.gpu_memory.detect_memory_warning`): the run-time OOM's
   remedy one step ahead of the crash, a *smaller* ``--cuda-memory-fraction`` first
   (:func:`.tgi_rules.propose_for_gpu_memory`); urgent (no cooldown, no restart trade), not a crash;
2. **metrics gate** -- missing, stale or too few samples since the last change: hold;
3. **pressure** -- the KV tokens full with a queue: more of the GPU where the fraction allows; else (TGI
   never evicts: a cut of the admission limit would only refuse what the queue will serve) the latency and
   idle rules may still change something, and without them it holds and recommends more replicas;
4. **latency** -- the inter-token latency objective missed (:func:`.tgi_rules.propose_for_itl`: a halved
   prefill where long prompts share the steps, else fewer concurrent requests);
5. **idle** -- the admission limit binds (running + queued at it, or 429s refused, in most samples) with
   spare KV tokens: the room the window measured, within the flap guard after pressure or the latency
   objective found the limit too many (:mod:`.tgi_idle`);
6. otherwise hold.

A chosen candidate then passes vLLM's gates (:func:`~.engine_chain.compute_gates`) and, metrics-driven
ones, vLLM's restart-cost trade (:mod:`.restart_trade`: its gain against the capacity the rollout loses while
TGI restarts, ``TgiEvidence.rollout_lost_fraction`` x the restart), with the gain in TGI's terms
(:func:`compute_gain_fraction`). Pressure or the latency objective with nothing left to propose holds and
recommends more replicas (``TgiDecision.scale_out``, as vLLM's: :meth:`.engine_chain.Replicas.recommend`),
while the replica count is not changing. Not (yet) in TGI's loop: a TTFT objective (TGI's only series for it
is its queue time, a lower bound).
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import tgi
from kvpilot.tuner.loop import engine_chain, engine_flap, engine_rollout, tgi_idle
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import restart_trade as rt
from kvpilot.tuner.loop import tgi_fit as fit
from kvpilot.tuner.loop import tgi_rules as rules
from kvpilot.tuner.loop.decision import Action, MetricsStatus, Trigger, compute_metrics_status
from kvpilot.tuner.loop.engine_chain import Costs, Gates
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY
from kvpilot.tuner.loop.tgi_fit import FailedRun, TgiSituation
from kvpilot.tuner.loop.tgi_state import TgiContext, TgiDecision, TgiEvidence, TgiLoopState, TgiRestart

__all__ = ["compute_gain_fraction", "compute_tgi_decision"]


def compute_tgi_decision(
    state: TgiLoopState, evidence: TgiEvidence, context: TgiContext, now: float
) -> TgiDecision:
    """Decide what to do with ``state.current`` at ``now``."""
    window, restarts = engine_chain.select_window(evidence.window, evidence.restarts, state.changes, now)
    s = TgiSituation(
        current=state.current,
        effective=fit.compute_effective(state.current, context.memory),
        window=window,
        memory=context.memory,
        failed=state.failed,
        bounds=context.bounds,
        policy=context.policy,
        now=now,
        itl_p95_objective=context.itl_p95_seconds,
        pressure=engine_flap.compute_pressure_changes(
            state.changes, fit.concurrency_of, (rules.KV_PRESSURE, rules.LATENCY_SLO)
        ),
    )
    metrics = compute_metrics_status(evidence.window, context.policy, now)
    gates = engine_chain.compute_gates(state, evidence, context.policy, now)
    costs = engine_chain.compute_costs(state, evidence, context.policy, now)
    replicas = engine_chain.Replicas.of(evidence, window)
    return engine_chain.run_chain(
        build_subject(s),
        state,
        evidence,
        restarts,
        metrics,
        (
            lambda: _crash_step(s, restarts, gates),
            lambda: _gpu_memory_step(s, gates),
            lambda: _metrics_step(s, metrics, gates, costs, replicas),
        ),
        lambda: _steady(s),
        now,
    )


def build_subject(s: TgiSituation) -> engine_rollout.Subject[tgi.TgiSettings]:
    """The rollout step's view of TGI's flags (what the history rules out: :func:`fit.is_ruled_out`)."""

    def ruled_out(settings: tgi.TgiSettings, failed: tuple[FailedRun, ...]) -> bool:
        return fit.is_ruled_out(settings, dataclasses.replace(s, failed=failed))

    return engine_rollout.Subject.of(
        s, fit.describe_settings, fit.describe_change, ruled_out, s.memory.weights_total_bytes
    )


def build_fit(s: TgiSituation) -> engine_chain.Fit[tgi.TgiSettings]:
    """:func:`engine_chain.choose`'s view of TGI: :func:`fit.pick`, the KV tokens a choice holds, and its gain
    (:func:`compute_gain_fraction`)."""
    return engine_chain.Fit(
        s.current,
        lambda p: fit.pick(s, p),
        fit.describe_change,
        lambda x: fit.explain_kv(fit.compute_effective(x, s.memory), s.memory),
        lambda trigger, x, cooldown: compute_gain_fraction(s, trigger, x, cooldown),
    )


def compute_gain_fraction(
    s: TgiSituation, trigger: str, settings: tgi.TgiSettings, cooldown_seconds: float
) -> float:
    """The share of the service's capacity a change to ``settings`` for ``trigger`` is expected to win back
    (0..1), in TGI's terms of vLLM's trade (:mod:`.restart_trade`), from the window it was proposed on:

    * **IdleCapacity** (the admission limit, ``--max-concurrent-requests``, binding with spare KV tokens): the
      requests the raise admits, per running request (:func:`~.restart_trade.compute_admission_share`), the
      demand being the 429s TGI answers beyond its limit (``MetricsSample.rejected_rate``) -- each refused
      request taken as one request's work lost over the cooldown, as vLLM's preemptions: the window carries no
      request time to turn the rate into concurrency -- or the queue, whichever is more;
    * **KvPressure** (the KV tokens full with a queue): TGI does not preempt, its queue waits for KV tokens
      -- vLLM's KV-bound queue: more KV admits ``kv_growth - 1`` more per running request, at most the
      queue's (:func:`~.restart_trade.compute_kv_bound_share`, the growth from TGI's warm-up model); a change
      that grows no KV (fewer concurrent requests) or one the model cannot size: 1, no measure to discount
      it by;
    * any other trigger (the latency objective): 1.
    """
    w = s.window
    running = obs.compute_mean(w.samples, obs.running) or 0.0
    waiting = obs.compute_mean(w.samples, obs.waiting) or 0.0
    if trigger == IDLE_CAPACITY:
        refused = obs.compute_mean(w.samples, obs.rejected_rate) or 0.0
        demand = max(waiting, max(0.0, refused) * cooldown_seconds)
        added = fit.concurrency_of(settings) - fit.concurrency_of(s.effective)
        return rt.compute_admission_share(demand, float(added), running)
    if trigger == rules.KV_PRESSURE:
        before = fit.predict_kv_tokens(s.effective, s.memory)
        after = fit.predict_kv_tokens(fit.compute_effective(settings, s.memory), s.memory)
        if before and after and after > before:
            return rt.compute_kv_bound_share(waiting, running, after / before)
    return rt.WHOLE


def _crash_step(s: TgiSituation, restarts: tuple[TgiRestart, ...], gates: Gates) -> TgiDecision | None:
    crash = engine_chain.select_crash(restarts, s.current, s.effective, s.window, "TGI")
    if not isinstance(crash, engine_chain.Crash):
        return crash
    failure = crash.failure
    ran = _as_said(crash.ran, s.current, failure.text)
    s = dataclasses.replace(s, failed=(*s.failed, ran))  # the crash rules the current settings out too
    if failure.kind == "start_oom":
        proposal = rules.propose_for_prefill(s, failure.text)
    elif failure.kind == "start_memory_short":
        proposal = rules.propose_for_total_tokens(s, failure.text)
    else:
        proposal = rules.propose_for_oom(s, failure.text)
    return engine_chain.choose(build_fit(s), proposal, ran, gates.any_change)


def _as_said(ran: FailedRun, current: tgi.TgiSettings, text: str) -> FailedRun:
    """The failed run with the value TGI's text names where the flags left it to TGI (the prefill its
    warm-up ran, the ``max_total_tokens`` its router refused): TGI's word over the memory model's default."""
    said = tgi.classify_log(text)
    if said is None or said.tokens is None:
        return ran
    settings = ran.settings
    if said.kind == "prefill_too_large" and current.max_batch_prefill_tokens is None:
        settings = dataclasses.replace(settings, max_batch_prefill_tokens=said.tokens)
    elif said.kind == "total_tokens_too_large" and current.max_total_tokens is None:
        settings = dataclasses.replace(settings, max_total_tokens=said.tokens)
    return dataclasses.replace(ran, settings=settings)


def _gpu_memory_step(s: TgiSituation, gates: Gates) -> TgiDecision | None:
    """Ahead of the metrics gate, as vLLM's: dcgm-exporter's early warning of a run-time OOM acts on the
    serving samples there are (:func:`.tgi_rules.propose_for_gpu_memory`). Urgent: only the gates every
    change passes (the minimum interval, the hourly limit), no cooldown and no restart trade; not a crash:
    nothing is marked failed."""
    proposal = rules.propose_for_gpu_memory(s)
    if proposal is None:
        return None
    return engine_chain.choose(build_fit(s), proposal, None, gates.any_change)


def _metrics_step(
    s: TgiSituation, metrics: MetricsStatus, gates: Gates, costs: Costs, replicas: engine_chain.Replicas
) -> TgiDecision | None:
    """The metrics rules in order; the first with something to say decides. Pressure with nothing to propose
    (the fraction at its bound, or its raise ruled out) comes last, as vLLM's KV-bound rule falls through: the
    latency objective may still cut the limit and the idle rule raise it; else it holds and recommends more
    replicas (:meth:`engine_chain.Replicas.recommend`), as the latency objective's does with nothing left."""
    held = engine_chain.check_samples(s.current, s.window, metrics, s.policy)
    if held is not None:
        return held
    view = build_fit(s)
    pressure = rules.propose_for_pressure(s)
    ahead = pressure if pressure is not None and view.pick(pressure) is not None else None
    for proposal in (ahead, rules.propose_for_itl(s), tgi_idle.propose_for_idle(s), pressure):
        if proposal is not None:
            return engine_chain.choose(view, proposal, None, gates.metrics_driven, costs, replicas)
    return None


def _steady(s: TgiSituation) -> TgiDecision:
    mean = obs.compute_mean(s.window.samples, obs.kv_usage) or 0.0
    p = s.policy
    band = f"mean KV tokens used {mean:.2f} (band [{p.kv_usage_low:.2f}, {p.kv_usage_high:.2f}])"
    return TgiDecision(
        Action.HOLD,
        s.current,
        Trigger.STEADY,
        f"{band}: no KV full with a queue, no admission limit binding with spare KV tokens",
    )
