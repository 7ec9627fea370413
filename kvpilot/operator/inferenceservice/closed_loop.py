"""The closed loop: a kopf timer per InferenceService that watches vLLM and retunes it.

Every ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds (default 30; the pace: :mod:`.loop_settings`) for each
service in mode ``Auto`` or ``Recommend`` that the reconciler has applied (``status.applied`` set)::

    pods (args, readiness, lastState.terminated) --pod_status--> restarts of the current settings, ready?
    Prometheus (vLLM metrics)              --prometheus--> ObservationWindow
    model + GPU (resolve, cached)          --memory------> MemoryBudget of the current settings
    status (applied, lastGood, failed, rollout, history, calibration) --loop_state--> LoopState
        --tuner.loop.compute_decision--> Decision
        --a change in Auto: nodes + unfinished pods (workloads.fetch_capacity) --rollout_strategy--> Surge,
          Replace, Recreate or held; decided again with what that costs (Evidence.rollout_lost_fraction,
          rollout_blocked)
        --loop_patch.build_loop_patch--> one conditional status PATCH (status_write; refused: the tick ends)
        --> events (Retuned, RolledBack, OOMDetected, Held, ...)
        --Auto, a change: workloads.build_deployment with the settings and strategy, applied after the record

This module only orders that I/O, as a chain of named steps (:func:`run_once`): read the service,
resolve the model and GPU, read the pods and metrics, decide, record, act. The reading is
:mod:`.loop_reading`'s, the acting :mod:`.loop_actions`'s, the status
:mod:`kvpilot.operator.status.loop_patch`'s; the pieces are pure elsewhere. One rollout at a time: while
``status.rollout`` is set, the policy only waits, puts the settings on probation (Ready),
succeeds (probation passed) or rolls back (a crash before Ready or on probation, or the
deadline). All state is in the status, so an operator restarted mid-rollout picks up where it
left off. The loop never raises to kopf: a failing Prometheus becomes ``MetricsAvailable=False``
and a hold; a failing apply is logged and retried on the next tick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from kvpilot.operator.clients import metrics
from kvpilot.operator.inferenceservice import loop_actions, loop_reading
from kvpilot.operator.inferenceservice.loop_reading import Resolved, Service
from kvpilot.operator.loop import loop_settings, tick
from kvpilot.operator.loop.loop_deps import LoopDeps, default_deps
from kvpilot.operator.pods import pod_cache, pod_status
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import loop_patch, status_patch, status_write
from kvpilot.tuner.loop import Decision, PolicyConfig, compute_decision


async def closed_loop_tick(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
    logger: kopf.Logger, vllm_pods: kopf.Index[pod_cache.PodKey, Any] | None = None, **_: Any,
) -> None:  # fmt: skip
    """The kopf timer's handler (registered in :mod:`kvpilot.operator.main`): one tick, never raising."""
    deps = default_deps()
    if vllm_pods is not None and deps.pods is not None:  # pods from kopf's index, not a LIST (pod_cache)
        deps = dataclasses.replace(deps, pods=pod_cache.IndexedPods(vllm_pods, deps.pods))
    try:
        await run_once(body=body, spec=spec, meta=meta, status=status, patch=patch, logger=logger, deps=deps)
    except Exception:  # noqa: BLE001 -- a bug must not stop the loop for every other service
        logger.exception("closed loop: tick failed")


# --- one tick: six named steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What the tick read of the running service: its pods, what they say, its metrics and start-up time."""

    views: list[pod_status.PodView]
    serving: pod_status.Serving
    reading: tick.TickReading
    startup: float | None


@dataclass(frozen=True)
class Judged:
    """What the tick decided: the shared tick's answer, the decision after the rollout's cost, the strategy
    it rolls out with, and whether it is a change to apply now (mode Auto)."""

    tick: tick.Tick
    decision: Decision
    choice: RolloutChoice | None
    cluster: loop_actions.Cluster | None
    change: bool


async def run_once(
    *, body: Mapping[str, Any], spec: Mapping[str, Any], meta: Mapping[str, Any], status: Mapping[str, Any],
    patch: Any, logger: Any, deps: LoopDeps,
) -> Decision | None:  # fmt: skip
    """One observation-decision-action cycle for one InferenceService. Never raises.

    Its status goes out as one conditional PATCH, and a change is recorded before it is applied
    (:mod:`kvpilot.operator.status.status_write`); ``patch`` (kopf's) is used only without a Kubernetes
    client. The steps: :func:`~.loop_reading.read_service`, (mode Off: :func:`tick_off`),
    :func:`~.loop_reading.fetch_resolved`, :func:`fetch_observed`, :func:`decide`, :func:`record`,
    :func:`act`."""
    svc = loop_reading.read_service(body, spec, meta, status, deps.clock())
    if svc is None:
        return None
    if svc.mode == "Off":  # nothing to decide; the pods still say whether the service serves
        await tick_off(deps, svc, patch, logger)
        return None
    policy = loop_settings.build_policy(svc.spec, deps.pace)
    resolved = await loop_reading.fetch_resolved(deps, svc, logger)
    if resolved is None:
        return None
    observed = await fetch_observed(deps, svc, resolved, policy, logger)
    if observed is None:
        return None
    judged = await decide(deps, svc, resolved, observed, policy, logger)
    out, written = await record(deps, svc, resolved, observed, judged, policy, patch, logger)
    if written not in (status_write.WRITTEN, status_write.UNCHANGED):
        if judged.change and written == status_write.UNKNOWN:  # applied next tick if status.applied says so
            deps.pending.add(svc.namespace, svc.name, (judged.decision.settings, judged.choice))
        return judged.decision  # nothing recorded: nothing applied, no event; the next tick decides again
    await act(deps, svc, resolved, observed, judged, out, logger)
    return judged.decision


async def tick_off(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> None:
    """Mode Off: the pods' view alone (``Available``, ``Degraded``, ``Ready``, ``Schedulable``)."""
    try:
        views = await loop_reading.fetch_pods(deps, svc.namespace, svc.name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: the next tick retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return
    serving = pod_status.compute_serving(views, svc.state.current)
    schedulable = await loop_actions.fetch_schedulable(deps, svc, None, views, None)
    out = loop_patch.build_off_patch(
        svc.old, serving, generation=svc.meta.get("generation"), now=svc.now, extra_conditions=schedulable
    )
    await _write(deps, patch, svc, out, logger)


async def fetch_observed(
    deps: LoopDeps, svc: Service, resolved: Resolved, policy: PolicyConfig, logger: Any
) -> Observed | None:
    """The pods (``None``: unreadable, the next tick retries), a recorded change whose apply failed applied
    again, then the metrics window."""
    try:
        views = await loop_reading.fetch_pods(deps, svc.namespace, svc.name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: skip this tick, the next one retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return None
    await _retry_pending(deps, svc, resolved, logger)
    window = await loop_reading.fetch_window(deps, svc, views, policy)
    startup = pod_status.compute_startup_seconds(views, svc.state.current)
    serving = pod_status.compute_serving(views, svc.state.current)
    return Observed(
        views, serving, loop_reading.build_reading(svc, resolved, views, window, startup), startup
    )


async def _retry_pending(deps: LoopDeps, svc: Service, resolved: Resolved, logger: Any) -> None:
    """A change recorded by an earlier tick and not applied yet (:class:`.status_write.PendingApplies`)."""
    retry = deps.pending.take(svc.namespace, svc.name, svc.state.current)
    if retry is None or svc.mode != "Auto":
        return
    applied = await loop_actions.apply_settings(
        deps, svc, resolved.inputs, retry[0], "the recorded change", logger, retry[1]
    )
    if not applied:
        deps.pending.add(svc.namespace, svc.name, retry)


async def decide(
    deps: LoopDeps, svc: Service, resolved: Resolved, observed: Observed, policy: PolicyConfig, logger: Any
) -> Judged:
    """The shared tick's decision; a change in Auto decided again with what its rollout costs
    (:func:`.loop_actions.fetch_rollout`); a change that cannot be applied said so (a ``RetuneFailed``)."""
    context = loop_reading.build_context(svc, resolved, policy)
    judged = tick.compute_tick(svc.state, observed.reading, context, svc.now)
    decision, inputs = judged.decision, resolved.inputs
    cluster: loop_actions.Cluster | None = None
    choice: RolloutChoice | None = None
    if decision.changes and svc.mode == "Auto" and inputs is not None and deps.kube is not None:

        def redecide(lost: float, blocked: str | None) -> Decision:
            costs = dataclasses.replace(judged.evidence, rollout_lost_fraction=lost, rollout_blocked=blocked)
            return compute_decision(judged.loop, costs, context, svc.now)

        decision, choice, cluster = await loop_actions.fetch_rollout(
            deps, svc, inputs, observed.views, observed.serving, decision, redecide
        )
    change = bool(decision.changes) and svc.mode == "Auto"
    if change and (inputs is None or deps.kube is None):  # cannot be applied: say so, record nothing
        what = str(decision.action)
        change = await loop_actions.apply_settings(deps, svc, inputs, decision.settings, what, logger)
    return Judged(judged, decision, choice, cluster, change)


async def record(
    deps: LoopDeps, svc: Service, resolved: Resolved, observed: Observed, judged: Judged,
    policy: PolicyConfig, patch: Any, logger: Any,
) -> tuple[status_patch.StatusPatch, str]:  # fmt: skip
    """The tick's whole status (:func:`.loop_patch.build_loop_patch`) as one conditional PATCH: the patch
    and what became of it."""
    schedulable = await loop_actions.fetch_schedulable(
        deps, svc, resolved.inputs, observed.views, judged.cluster
    )
    out = loop_patch.build_loop_patch(
        svc.old,
        loop_patch.LoopTick(
            state=svc.state, decision=judged.decision, rollout=judged.tick.rollout, now=svc.now,
            generation=svc.meta.get("generation"), rollout_deadline_seconds=policy.rollout_deadline_seconds,
            mode=svc.mode, applied=judged.change, serving=observed.serving, rollout_choice=judged.choice,
            extra_conditions=schedulable, startup_seconds=observed.startup, resolve_failure=resolved.failure,
        ),
    )  # fmt: skip
    return out, await _write(deps, patch, svc, out, logger)


async def act(
    deps: LoopDeps, svc: Service, resolved: Resolved, observed: Observed, judged: Judged,
    out: status_patch.StatusPatch, logger: Any,
) -> None:  # fmt: skip
    """After the record: the events, the Deployment following the change, fleet learning, the metrics."""
    decision, inputs = judged.decision, resolved.inputs
    for type_, reason, message in out.events:
        deps.emit(svc.body, type_, reason, message)
    if judged.change and inputs is not None:  # recorded: now the Deployment follows
        what = str(decision.action)
        if not await loop_actions.apply_settings(
            deps, svc, inputs, decision.settings, what, logger, judged.choice
        ):
            deps.pending.add(svc.namespace, svc.name, (decision.settings, judged.choice))
    if inputs is not None:  # fleet learning: what this tick saw goes to the matching TuningProfile
        await loop_actions.apply_learning(
            deps, svc, inputs, decision, resolved.budget, out.status, observed.startup, logger
        )
    if deps.record_metrics:
        for kind in out.decisions:
            metrics.record_decision(kind)
    if out.events:
        logger.info(f"closed loop: {decision.action} ({decision.trigger}): {decision.reason}")


async def _write(deps: LoopDeps, patch: Any, svc: Service, out: status_patch.StatusPatch, logger: Any) -> str:
    """The tick's status as one conditional PATCH (:func:`status_write.apply_status`): what became of it.
    Without a Kubernetes client, kopf's ``patch`` carries it."""
    if deps.kube is None:
        out.add_to(patch, old=svc.old)
        return status_write.WRITTEN
    return await status_write.apply_status(
        deps.kube, svc.namespace, svc.name, svc.version, out, svc.old, logger
    )
