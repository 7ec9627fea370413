"""The closed loop for an engine with rules of its own (SGLang, TGI): its pods and metrics read, the engine's
rules asked, the answer kept and, in mode Auto, rolled out.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for a ``spec.engine.kind`` of
:data:`kvpilot.operator.planning.engines.RECOMMENDING_KINDS`, in modes Auto and Recommend, the same for every
such engine (its :class:`~kvpilot.operator.loop.engine_reading.Profile`, shared with the EngineTuner: how its
flags read and render, and its policy)::

    pods (args, readiness, lastState.terminated, the previous log when the message says nothing)
        --pods.engine_pods--> the flags they run, Ready or not started, their restarts (the seam classifies)
    Prometheus (the seam's MetricSeries) --> ObservationWindow
    model + GPU (resolve), spec.tuning.bounds, spec.serving --> the engine's context
    status (appliedEngineArgs, rollout, lastGoodEngineArgs, failedEngineArgs, lastChangeTime) --> the state
        --the engine's policy--> its decision (a rollout judged first, as vLLM's)
        --Auto, a change: decided again with what its rollout would lose (the strategy the cluster allows
          now: Surge 0, Replace k/N, Recreate 1; a metrics-driven one weighed against its gain and the
          restart the pods were measured to take, as vLLM's), or held when it cannot roll out (one
          replica, no spare GPU, no allowDowntime: rollout_strategy.HELD_MESSAGE, as vLLM's)
        --status.engine_patch--> one conditional status PATCH (with status.startupSeconds, the start the
          pods were measured to take), events
        --Auto, a change: the Deployment with the new flags (engine_desired, the rollout strategy for the
          cluster as it is), applied after the record

In mode Recommend the pods keep the engine's own defaults (the plan's flags are not rendered) and the loop
only records what it would change; in Auto the flags it rolled out are ``status.appliedEngineArgs``, which the
reconciler keeps (:func:`kvpilot.operator.inferenceservice.plan_choice.read_kept`) and drift repair
re-applies. One rollout at a time: probation once every replica is Ready, a crash or the deadline rolls back
to ``status.lastGoodEngineArgs`` (``docs/engines/sglang.md``, ``docs/engines/tgi.md``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypeVar

from kvpilot.operator.inferenceservice import engine_actions, loop_observing
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop import engine_reading, loop_settings
from kvpilot.operator.loop.engine_reading import Profile
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import engine_pods
from kvpilot.operator.status import engine_patch
from kvpilot.operator.status.status_patch import reconcile_succeeded
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.loop import Action
from kvpilot.tuner.loop.engine_state import EngineDecision

S = TypeVar("S", sglang.SglangSettings, tgi.TgiSettings)


async def run_engine_tick(
    profile: Profile[S], deps: LoopDeps, svc: Service, patch: Any, logger: Any
) -> EngineDecision[S] | None:
    """One tick; ``None`` while there is nothing to decide (the reconciler has not applied, the model or
    the pods cannot be read: the next tick tries again). Never raises for a cluster or Prometheus failure."""
    if not reconcile_succeeded(svc.old):
        return None
    codec, name = profile.codec, profile.codec.name
    policy = loop_settings.build_policy(svc.spec, deps.pace)
    try:
        inputs = await resolve.fetch_inputs(svc.spec, svc.namespace, deps.kube, deps.hub)
        pods = (
            await asyncio.to_thread(engine_pods.read_engine_pods, codec, deps.pods, svc.namespace, svc.name)
            if deps.pods
            else []
        )
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports a bad model; an API hiccup: next tick
        logger.warning(f"closed loop ({name}): cannot read the model or the pods ({exc}); skipping this tick")
        return None
    live = [p.name for p in pods if not p.terminating]
    window = await loop_observing.fetch_service_window(deps, svc, live, policy, codec.engine.metrics)
    state, evidence = engine_reading.build_state_and_evidence(
        codec,
        profile.default,
        pods,
        window,
        svc.old,
        mode=svc.mode,
        replicas=svc.spec.replicas,
        now=svc.now,
        settle_seconds=policy.window_seconds,
    )
    decision = profile.decide(state, evidence, svc.spec, inputs, policy, svc.now)
    serving = engine_pods.compute_engine_serving(codec, pods, state.current)
    costs, costed = None, decision.settings
    if svc.mode == "Auto" and decision.action == Action.RETUNE:  # a rollback is never weighed or held
        costs = await engine_actions.fetch_rollout_costs(
            deps,
            svc,
            inputs,
            decision.settings,
            serving=any(p.ready and not p.terminating for p in pods),
            not_serving_why=serving.degraded_reason or "",
        )
        if costs is not None and (costs.lost_fraction or costs.blocked):  # as vLLM's fetch_rollout
            weighed = dataclasses.replace(
                evidence, rollout_lost_fraction=costs.lost_fraction, rollout_blocked=costs.blocked
            )
            decision = profile.decide(state, weighed, svc.spec, inputs, policy, svc.now)
    out = engine_patch.build_engine_patch(
        codec,
        svc.old,
        decision,
        svc.mode,
        generation=svc.generation,
        now=svc.now,
        deadline_seconds=policy.rollout_deadline_seconds,
        serving=serving,
        startup_seconds=engine_reading.compute_startup_seconds(pods, state.current),
    )
    if not await engine_actions.apply_engine_status(deps, patch, svc, out, logger):
        return decision  # nothing recorded: nothing rolled out; the next tick decides again
    for type_, reason, message in out.events:
        deps.emit(svc.body, type_, reason, message)
    if svc.mode == "Auto" and decision.changes:  # recorded: now the Deployment follows
        # the strategy the change was weighed on; another change's (a rollback's): read now
        chosen = costs if decision.action == Action.RETUNE and decision.settings == costed else None
        await engine_actions.apply_flags(deps, svc, inputs, decision.settings, logger, chosen)
    if out.events:
        logger.info(f"closed loop ({name}): {decision.action} ({decision.trigger}): {decision.reason}")
    return decision
