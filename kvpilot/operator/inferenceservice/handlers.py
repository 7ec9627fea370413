"""The reconciliation behind kopf's create / update(spec) / resume handlers.

Kubernetes objects in, tuner types through, patches out::

    spec --parse--> api.InferenceServiceSpec --resolve (thread)--> model + GPU
         --plan_choice (status.applied kept, or desired.build_desired from the TuningProfile)--> plan,
           mode decision, Service + Deployment
         --apply (thread, server-side apply)--> cluster
    status <- reconcile_status.build_success_status / build_failure_status  (patch.status; conditions and
              history as a patch function on the freshest object, kopf.Patch.fns), with its events:
              one of Planned, Recommended or Reported (+ PlanWarning) on first sight of a generation or
              a change of the applied settings; or a Warning with the failure's reason

Every failure becomes ``Ready=False`` with a reason and a message that says what to
change, a Warning event, and ``kopf.TemporaryError`` (back-off) where a retry can help
or ``kopf.PermanentError`` (wait for the next spec change) where it cannot. Nothing is
applied until the whole desired state has been built, so a failure never leaves a
half-applied Deployment. Collaborators come in a :class:`~.reconcile_deps.Deps`, so tests run every
path without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kopf

from kvpilot.operator import errors
from kvpilot.operator.clients import metrics
from kvpilot.operator.inferenceservice import autoscalers, desired, plan_choice
from kvpilot.operator.inferenceservice.reconcile_deps import Deps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import workloads
from kvpilot.operator.status import reconcile_status, status_patch
from kvpilot.tuner import vllm

CREATED, SPEC_CHANGED, RESUMED = "Created", "SpecChanged", "Resumed"


def _record(deps: Deps, fn: Callable[[str], None], value: str) -> None:
    if deps.record_metrics:
        fn(value)


async def reconcile(
    *,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
    retry: int,
    logger: Any,
    trigger: str,
    deps: Deps,
    diff: Any = None,
) -> None:
    """Bring the Deployment and Service in line with ``spec``; write status; emit events.

    The engine settings in ``status.applied`` are kept (not re-planned) in mode Auto when the
    closed loop may have retuned them and nothing the planner reads changed
    (:func:`~.plan_choice.read_kept`).
    """
    now, generation = deps.now(), meta.get("generation")
    namespace = meta.get("namespace") or "default"
    old = dict(status or {})
    first_visit = old.get("observedGeneration") != generation
    try:
        parsed = desired.parse_spec(spec)
        if deps.kube is not None:  # without a client the apply below says so
            await workloads.fetch_workload_served(deps.kube, parsed)
        inputs = await resolve.fetch_inputs(parsed, namespace, deps.kube, deps.hub)
        stands = plan_choice.compute_plan_stands(
            old,
            resumed=trigger == RESUMED,
            spec_changed=trigger == SPEC_CHANGED,
            first_visit=first_visit,
            diff=diff,
        )
        keep = plan_choice.read_kept(old, parsed, stands=stands)
        wanted = await plan_choice.fetch_wanted(deps.kube, deps.plan_fn, meta, parsed, inputs, keep, logger)
        if deps.kube is None:
            raise errors.ApplyFailed("no Kubernetes client configured")
        manifests = wanted.manifests  # a first create replaces no pod: the default (surge) strategy
        if trigger != CREATED:
            manifests = await workloads.fetch_rollout_strategy(deps.kube, parsed, manifests)
        await workloads.apply_workloads(manifests, deps.kube, deps.owners)
        hpas = await autoscalers.fetch_autoscalers(deps.kube, parsed, namespace)
    except Exception as exc:
        failure = errors.classify(exc)
        if failure.reason == "InternalError":
            logger.exception("reconciliation failed unexpectedly")
        out = reconcile_status.build_failure_status(
            old, generation=generation, now=now, failure=failure, trigger=trigger
        )
        _write(deps, body, patch, old, out)
        _record(deps, metrics.record_error, failure.reason)
        _record(deps, metrics.record_reconcile, "temporary_error" if failure.retry else "permanent_error")
        raise errors.to_kopf(failure, retry) from None

    name = str(meta.get("name") or "")
    if wanted.engine_plan is not None:  # another engine (spec.engine.kind): its plan's own status
        engine_out = reconcile_status.build_engine_success_status(
            generation=generation,
            now=now,
            inputs=inputs,
            plan=wanted.engine_plan,
            selector=workloads.build_label_selector(name),
            announce=first_visit,
            replanned=not stands,
        )
        _write(deps, body, patch, old, engine_out)
        _record(deps, metrics.record_reconcile, "success")
        logger.info(f"reconciled ({trigger}): {wanted.engine_plan.summary}")
        return
    if wanted.decision is None:
        raise ValueError("a Desired carries vLLM's decision or another engine's plan")
    conflict = autoscalers.compute_autoscaler_conflict(parsed, name, hpas)
    out = reconcile_status.build_success_status(
        old,
        generation=generation,
        now=now,
        inputs=inputs,
        decision=wanted.decision,
        trigger=trigger,
        selector=workloads.build_label_selector(name),
        conflict=(autoscalers.REASON, conflict) if conflict is not None else None,
        replanned=keep is None,
        announce=first_visit,
    )
    if deps.record_metrics and name:  # the applied settings first: the decision series start at zero
        metrics.record_service(namespace, name, wanted.decision.deploy)
    _write(deps, body, patch, old, out)
    _record(deps, metrics.record_reconcile, "success")
    logger.info(f"reconciled ({trigger}): {vllm.describe_settings(wanted.decision.deploy)}")


def _write(
    deps: Deps,
    body: Mapping[str, Any],
    patch: kopf.Patch,
    old: Mapping[str, Any],
    out: status_patch.StatusPatch,
) -> None:
    """The status into kopf's patch (one PATCH on create: :func:`.status_patch.is_first_write`), then its
    events and decision counts."""
    out.add_to(patch, merged_on=old if status_patch.is_first_write(old) else None)
    for type_, reason, message in out.events:
        deps.emit(body, type_, reason, message)
    meta = body.get("metadata") or {}
    for kind in out.decisions:  # fleet-wide and for this service (the dashboard's annotations)
        if deps.record_metrics:
            metrics.record_decision(kind, meta.get("namespace") or "default", meta.get("name") or None)
