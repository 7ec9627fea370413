"""The closed loop for an SGLang service: its pods and metrics read, SGLang's rules asked, the answer kept
and, in mode Auto, rolled out.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for ``spec.engine.kind`` SGLang
(:data:`kvpilot.operator.planning.engines.RECOMMENDING_KINDS`), in modes Auto and Recommend::

    pods (args, readiness, lastState.terminated, the previous log when the message says nothing)
        --pods.sglang_pods--> the flags they run, Ready or not started, their restarts (the seam classifies)
    Prometheus (the seam's MetricSeries: token usage, retractions, queued, TTFT/ITL) --> ObservationWindow
    model + GPU (resolve) --> SglangMemory; spec.tuning.bounds, spec.serving.slo --> SglangContext
    status (appliedEngineArgs, rollout, lastGoodEngineArgs, failedEngineArgs, lastChangeTime) --> the state
        --tuner.loop.compute_sglang_decision--> SglangDecision (a rollout judged first, as vLLM's)
        --status.sglang_patch--> one conditional status PATCH, events
        --Auto, a change: the Deployment with the new flags (engine_desired, the rollout strategy for the
          cluster as it is), applied after the record

In mode Recommend the pods keep SGLang's own defaults and the loop only records what it would change; in
Auto the flags it rolled out are ``status.appliedEngineArgs``, which the reconciler keeps
(:func:`kvpilot.operator.inferenceservice.plan_choice.read_kept`) and drift repair re-applies. One rollout
at a time: probation once every replica is Ready, a crash or the deadline rolls back to
``status.lastGoodEngineArgs`` (``docs/engines/sglang.md``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvpilot.operator.inferenceservice import loop_observing, sglang_actions
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.inferenceservice.sglang_reading import (
    build_sglang_context,
    build_state_and_evidence,
    compute_current,
)
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.sglang_pods import ENGINE, SglangPod, compute_sglang_serving, read_sglang_pods
from kvpilot.operator.status import sglang_patch
from kvpilot.operator.status.status_patch import reconcile_succeeded
from kvpilot.tuner.loop import SglangDecision, compute_sglang_decision

__all__ = [
    "SglangPod",
    "build_sglang_context",
    "build_state_and_evidence",
    "compute_current",
    "read_sglang_pods",
    "run_sglang_tick",
]


async def run_sglang_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> SglangDecision | None:
    """One tick; ``None`` while there is nothing to decide (the reconciler has not applied, the model or
    the pods cannot be read: the next tick tries again). Never raises for a cluster or Prometheus failure."""
    if not reconcile_succeeded(svc.old):
        return None
    policy = loop_settings.build_policy(svc.spec, deps.pace)
    try:
        inputs = await resolve.fetch_inputs(svc.spec, svc.namespace, deps.kube, deps.hub)
        pods = (
            await asyncio.to_thread(read_sglang_pods, deps.pods, svc.namespace, svc.name) if deps.pods else []
        )
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports a bad model; an API hiccup: next tick
        logger.warning(f"closed loop (SGLang): cannot read the model or the pods ({exc}); skipping this tick")
        return None
    live = [p.name for p in pods if not p.terminating]
    window = await loop_observing.fetch_service_window(deps, svc, live, policy, ENGINE.metrics)
    state, evidence = build_state_and_evidence(
        pods, window, svc.old, mode=svc.mode, replicas=svc.spec.replicas
    )
    decision = compute_sglang_decision(
        state, evidence, build_sglang_context(svc.spec, inputs, policy), svc.now
    )
    out = sglang_patch.build_sglang_patch(
        svc.old,
        decision,
        svc.mode,
        generation=svc.generation,
        now=svc.now,
        deadline_seconds=policy.rollout_deadline_seconds,
        serving=compute_sglang_serving(pods, state.current),
    )
    if not await sglang_actions.apply_sglang_status(deps, patch, svc, out, logger):
        return decision  # nothing recorded: nothing rolled out; the next tick decides again
    for type_, reason, message in out.events:
        deps.emit(svc.body, type_, reason, message)
    if svc.mode == "Auto" and decision.changes:  # recorded: now the Deployment follows
        await sglang_actions.apply_flags(deps, svc, inputs, decision.settings, logger)
    if out.events:
        logger.info(f"closed loop (SGLang): {decision.action} ({decision.trigger}): {decision.reason}")
    return decision
