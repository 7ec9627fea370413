"""The closed loop: a kopf timer per InferenceService that watches vLLM and retunes it.

Every ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds (default 30; the pace: :mod:`.loop_settings`) for each
service in mode ``Auto`` or ``Recommend`` that the reconciler has applied (``status.applied`` set)::

    pods (args, readiness, lastState.terminated) --pod_summary--> restarts of the current settings, ready?
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

This module only orders that I/O, as a chain of named steps (:func:`run_once`, after VPA's ``RunOnce``):
read the service, resolve its model and GPU (:mod:`.loop_reading`), observe its pods and metrics
(:mod:`.loop_observing`), decide (the shared :mod:`kvpilot.operator.loop.tick`, and the rollout's cost:
:mod:`.loop_actions`), record (:mod:`.loop_record`: the status of
:mod:`kvpilot.operator.status.loop_patch`), act (the Deployment, :mod:`.loop_learning`, the metrics); the
pieces are pure elsewhere. One rollout at a time: while
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

from kvpilot.operator import fairness
from kvpilot.operator.inferenceservice import (
    loop_actions,
    loop_learning,
    loop_observing,
    loop_reading,
    loop_record,
)
from kvpilot.operator.inferenceservice.loop_observing import Observed
from kvpilot.operator.inferenceservice.loop_reading import Resolved, Service
from kvpilot.operator.loop import tick
from kvpilot.operator.loop.loop_deps import LoopDeps, default_deps
from kvpilot.operator.pods import pod_cache
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.tuner.loop import Decision, compute_decision


async def closed_loop_tick(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    logger: kopf.Logger,
    vllm_pods: kopf.Index[pod_cache.PodKey, Any] | None = None,
    **_: Any,
) -> None:
    """The kopf timer's handler (registered in :mod:`kvpilot.operator.main`): one tick, never raising."""
    deps = default_deps()
    if vllm_pods is not None and deps.pods is not None:  # pods from kopf's index, not a LIST (pod_cache)
        deps = dataclasses.replace(deps, pods=pod_cache.IndexedPods(vllm_pods, deps.pods))
    async with fairness.gate().slot(str(meta.get("namespace") or "default")):  # namespaces take turns
        try:
            await run_once(
                body=body, spec=spec, meta=meta, status=status, patch=patch, logger=logger, deps=deps
            )
        except Exception:  # noqa: BLE001 -- a bug must not stop the loop for every other service
            logger.exception("closed loop: tick failed")


# --- one tick: six named steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """What the tick decided: the shared tick's answer, the decision after the rollout's cost, the strategy
    it rolls out with (and the cluster read for it), and whether it is a change to apply now (mode Auto)."""

    tick: tick.Tick
    decision: Decision
    choice: RolloutChoice | None
    cluster: loop_observing.Cluster | None
    change: bool


async def run_once(
    *,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: Any,
    logger: Any,
    deps: LoopDeps,
) -> Decision | None:
    """One observation-decision-action cycle for one InferenceService. Never raises.

    Its status goes out as one conditional PATCH, and a change is recorded before it is applied
    (:mod:`kvpilot.operator.status.status_write`); ``patch`` (kopf's) is used only without a Kubernetes
    client. The steps: :func:`~.loop_reading.parse_service` (mode Off: :func:`~.loop_record.apply_off`;
    another engine: :func:`~.loop_record.apply_other_engine`, SGLang's loop that recommends, or a hold),
    :func:`~.loop_reading.fetch_resolved`, :func:`fetch_evidence`, :func:`fetch_decision`,
    :func:`~.loop_record.apply_record`, :func:`apply_decision`."""
    svc = loop_reading.parse_service(body, spec, meta, status, deps.clock())
    if svc is None:
        return None
    if not svc.engine_tuned:  # another engine: its own rules recommend (SGLang), else a hold
        await loop_record.apply_other_engine(deps, svc, patch, logger)
        return None
    if svc.mode == "Off":  # nothing to decide; the pods still say whether the service serves
        await loop_record.apply_off(deps, svc, patch, logger)
        return None
    resolved = await loop_reading.fetch_resolved(deps, svc, logger)
    if resolved is None:
        return None
    observed = await fetch_evidence(deps, svc, resolved, logger)
    if observed is None:
        return None
    judged = await fetch_decision(deps, svc, resolved, observed, logger)
    recorded = await loop_record.apply_record(
        deps,
        svc,
        resolved,
        observed,
        judged.decision,
        judged.tick.rollout,
        changed=judged.change,
        choice=judged.choice,
        cluster=judged.cluster,
        patch=patch,
        logger=logger,
    )
    if not recorded.landed:
        if judged.change and recorded.written == loop_record.UNKNOWN:  # applied next tick if it landed
            deps.pending.add(svc.namespace, svc.name, (judged.decision.settings, judged.choice))
        return judged.decision  # nothing recorded: nothing applied, no event; the next tick decides again
    await apply_decision(deps, svc, resolved, observed, judged, recorded, logger)
    return judged.decision


async def fetch_evidence(deps: LoopDeps, svc: Service, resolved: Resolved, logger: Any) -> Observed | None:
    """The pods (``None``: unreadable, the next tick retries), a recorded change whose apply failed applied
    again, then the metrics window (:func:`~.loop_observing.fetch_observed`)."""
    try:
        views = await loop_observing.fetch_pods(deps, svc.namespace, svc.name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: skip this tick, the next one retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return None
    await apply_pending(deps, svc, resolved, logger)
    return await loop_observing.fetch_observed(deps, svc, resolved, views)


async def apply_pending(deps: LoopDeps, svc: Service, resolved: Resolved, logger: Any) -> None:
    """A change recorded by an earlier tick and not applied yet (:class:`.status_write.PendingApplies`)."""
    retry = deps.pending.take(svc.namespace, svc.name, svc.state.current)
    if retry is None or svc.mode != "Auto":
        return
    applied = await loop_actions.apply_settings(
        deps, svc, resolved.inputs, retry[0], "the recorded change", logger, retry[1]
    )
    if not applied:
        deps.pending.add(svc.namespace, svc.name, retry)


async def fetch_decision(
    deps: LoopDeps, svc: Service, resolved: Resolved, observed: Observed, logger: Any
) -> Judged:
    """The shared tick's decision; a change in Auto decided again with what its rollout costs
    (:func:`.loop_actions.fetch_rollout`); a change that cannot be applied said so (a ``RetuneFailed``)."""
    context = loop_reading.build_context(svc, resolved)
    judged = tick.compute_tick(svc.state, observed.reading, context, svc.now)
    decision, inputs = judged.decision, resolved.inputs
    cluster: loop_observing.Cluster | None = None
    choice: RolloutChoice | None = None
    if decision.changes and svc.mode == "Auto" and inputs is not None and deps.kube is not None:

        def redecide(lost: float, blocked: str | None) -> Decision:
            costs = dataclasses.replace(judged.evidence, rollout_lost_fraction=lost, rollout_blocked=blocked)
            return compute_decision(judged.loop, costs, context, svc.now)

        decision, choice, cluster = await loop_actions.fetch_rollout(
            deps, svc, inputs, observed, decision, redecide
        )
    change = bool(decision.changes) and svc.mode == "Auto"
    if change and (inputs is None or deps.kube is None):  # cannot be applied: say so, record nothing
        what = str(decision.action)
        change = await loop_actions.apply_settings(deps, svc, inputs, decision.settings, what, logger)
    return Judged(judged, decision, choice, cluster, change)


async def apply_decision(
    deps: LoopDeps,
    svc: Service,
    resolved: Resolved,
    observed: Observed,
    judged: Judged,
    recorded: loop_record.Recorded,
    logger: Any,
) -> None:
    """After the record: the events, the Deployment following the change, fleet learning, the metrics."""
    decision, inputs = judged.decision, resolved.inputs
    for type_, reason, message in recorded.events:
        deps.emit(svc.body, type_, reason, message)
    if judged.change and inputs is not None:  # recorded: now the Deployment follows
        what = str(decision.action)
        applied = await loop_actions.apply_settings(
            deps, svc, inputs, decision.settings, what, logger, judged.choice
        )
        if not applied:
            deps.pending.add(svc.namespace, svc.name, (decision.settings, judged.choice))
    if inputs is not None:  # fleet learning: what this tick saw goes to the matching TuningProfile
        await loop_learning.apply_learning(
            deps, svc, inputs, decision, resolved.budget, recorded.status, observed.startup, logger
        )
    if deps.record_metrics:
        loop_record.record_metrics(svc, resolved, decision, judged.change, recorded)
    if recorded.events:
        logger.info(f"closed loop: {decision.action} ({decision.trigger}): {decision.reason}")
