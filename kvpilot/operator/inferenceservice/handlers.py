"""The reconciliation behind kopf's create / update(spec) / resume handlers: thin.

Kubernetes objects in, tuner types through, patches out::

    spec --parse--> api.InferenceServiceSpec --resolve (thread)--> model + GPU
         --desired.build_desired--> plan, mode decision, Service + Deployment
         --apply (thread, server-side apply)--> cluster
    status <- status_patch.build_success_status / build_failure_status  (patch.status; conditions and
              history as a patch function on the freshest object, kopf.Patch.fns)
    events <- one of Planned, Recommended or Reported (+ PlanWarning) on first sight of a generation or
              a change of the applied settings; or a Warning with the failure's reason

Every failure becomes ``Ready=False`` with a reason and a message that says what to
change, a Warning event, and ``kopf.TemporaryError`` (back-off) where a retry can help
or ``kopf.PermanentError`` (wait for the next spec change) where it cannot. Nothing is
applied until the whole desired state has been built, so a failure never leaves a
half-applied Deployment. Collaborators come in a :class:`Deps`, so tests run every
path without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from kvpilot.operator import api, errors
from kvpilot.operator.clients import metrics
from kvpilot.operator.clients.kube import Kube
from kvpilot.operator.inferenceservice import autoscalers, desired
from kvpilot.operator.planning import modes, profile_scope, profiles, resolve
from kvpilot.operator.pods import workloads
from kvpilot.operator.status import events, status_patch
from kvpilot.tuner import vllm
from kvpilot.tuner.types import Plan

CREATED, SPEC_CHANGED, RESUMED = "Created", "SpecChanged", "Resumed"


def utc_now() -> str:
    return status_patch.format_time(time.time())


@dataclass
class Deps:
    """What a reconciliation talks to. ``kube=None`` only in unit tests that never get that far."""

    kube: Kube | None
    emit: events.Emitter = events.kopf_emitter
    now: Callable[[], str] = utc_now
    hub: resolve.HubDownload = resolve.download_hub_config
    plan_fn: modes.PlanFn | None = None
    record_metrics: bool = True


_deps: Deps | None = None


def default_deps() -> Deps:
    """The process-wide dependencies (the real cluster), created on first use."""
    global _deps
    if _deps is None:
        from kvpilot.operator.clients.kube import get_kube

        _deps = Deps(kube=get_kube())
    return _deps


def _record(deps: Deps, fn: Callable[[str], None], value: str) -> None:
    if deps.record_metrics:
        fn(value)


async def reconcile(
    *, body: Mapping[str, Any], spec: Mapping[str, Any], meta: Mapping[str, Any], status: Mapping[str, Any],
    patch: kopf.Patch, retry: int, logger: Any, trigger: str, deps: Deps, diff: Any = None,
) -> None:  # fmt: skip
    """Bring the Deployment and Service in line with ``spec``; write status; emit events.

    The engine settings in ``status.applied`` are kept (not re-planned) in mode Auto when the
    closed loop may have retuned them and nothing the planner reads changed: on resume with the
    generation already observed, and on a spec change that only touches plan-neutral fields
    (replicas, image, env, resources, tolerations, the closed loop's knobs).
    """
    now, generation = deps.now(), meta.get("generation")
    namespace = meta.get("namespace") or "default"
    old = dict(status or {})
    first_visit = old.get("observedGeneration") != generation
    try:
        parsed = desired.parse_spec(spec)
        inputs = await resolve.fetch_inputs(parsed, namespace, deps.kube, deps.hub)
        keep = None
        if _keeps_applied(old, trigger, first_visit, diff):
            keep = api.Settings.model_validate(old["applied"])
        wanted = desired.build_desired(meta, parsed, inputs, deploy_override=keep, plan_fn=deps.plan_fn)
        if keep is None:  # a plan: start it from the fleet's TuningProfile when one matches
            wanted = await _with_profile(deps, meta, parsed, inputs, wanted, logger)
        if deps.kube is None:
            raise errors.ApplyFailed("no Kubernetes client configured")
        manifests = wanted.manifests  # a first create replaces no pod: the default (surge) strategy
        if trigger != CREATED:
            manifests = await workloads.fetch_rollout_strategy(deps.kube, parsed, manifests)
        await workloads.apply_workloads(manifests, deps.kube)
        hpas = await autoscalers.fetch_autoscalers(deps.kube, parsed, namespace)
    except Exception as exc:
        failure = errors.classify(exc)
        if failure.reason == "InternalError":
            logger.exception("reconciliation failed unexpectedly")
        status_patch.build_failure_status(
            old, generation=generation, now=now, failure=failure, trigger=trigger
        ).add_to(patch, merged_on=old if status_patch.is_first_write(old) else None)
        deps.emit(body, events.WARNING, failure.reason, failure.message)
        _record(deps, metrics.record_error, failure.reason)
        _record(deps, metrics.record_reconcile, "temporary_error" if failure.retry else "permanent_error")
        if failure.infeasible and deps.record_metrics:
            metrics.record_decision("Infeasible", namespace, str(meta.get("name") or ""))
        raise errors.to_kopf(failure, retry) from None

    new = status_patch.build_success_status(
        old, generation=generation, now=now, inputs=inputs, decision=wanted.decision, trigger=trigger,
        selector=workloads.build_label_selector(str(meta.get("name") or "")),
    )  # fmt: skip
    conflict = autoscalers.compute_autoscaler_conflict(parsed, str(meta.get("name") or ""), hpas)
    if conflict is not None:
        new.status["warnings"] = [conflict, *new.status.get("warnings", [])][: status_patch.WARNINGS_LIMIT]
        if conflict not in (old.get("warnings") or []):
            deps.emit(body, events.WARNING, autoscalers.REASON, conflict)
    if keep is None:
        new.status["profile"] = _profile_status(wanted.decision.plan)
    new.add_to(patch, merged_on=old if status_patch.is_first_write(old) else None)  # one PATCH on create
    _record(deps, metrics.record_reconcile, "success")
    changed = "lastChangeTime" in new.status
    if deps.record_metrics and meta.get("name"):
        metrics.record_service(namespace, str(meta["name"]), wanted.decision.deploy)
    if changed and deps.record_metrics:
        metrics.record_decision("Planned", namespace, str(meta.get("name") or ""))
    if first_visit or changed:
        _emit_success(deps, body, inputs, wanted)
    logger.info(f"reconciled ({trigger}): {vllm.describe_settings(wanted.decision.deploy)}")


async def _with_profile(
    deps: Deps, meta: Mapping[str, Any], parsed: api.InferenceServiceSpec, inputs: resolve.Inputs,
    wanted: desired.Desired, logger: Any,
) -> desired.Desired:  # fmt: skip
    """``wanted`` planned again from the matching TuningProfile (the key needs the first plan's KV dtype and
    layout): the namespace's own, or the shared one where the namespace shares (:mod:`.profile_scope`);
    ``wanted`` itself without a store or a profile. Only plans read profiles: a profile's change re-plans
    no running service."""
    first = wanted.decision.plan
    namespace = meta.get("namespace") or "default"
    model, gpu = inputs.model.config_key, inputs.gpu.gpu.name
    keys = profile_scope.compute_keys(model, gpu, parsed, first.settings, namespace)
    learned = await profiles.fetch_plan_learned(profiles.store_for(deps.kube), keys, logger)
    if learned is None:
        return wanted
    return desired.build_desired(meta, parsed, inputs, plan_fn=deps.plan_fn, learned=learned)


def _profile_status(plan: Plan) -> dict[str, Any] | None:
    """``status.profile``: the profile the plan started from (``None`` clears it: the memory model's plan)."""
    if plan.profile is None:
        return None
    out: dict[str, Any] = {"name": plan.profile, "message": plan.profile_note}
    if plan.learned_kv_cache_tokens is not None:
        out["learnedKvCacheTokens"] = plan.learned_kv_cache_tokens
    return out


def _keeps_applied(old: Mapping[str, Any], trigger: str, first_visit: bool, diff: Any) -> bool:
    """Whether to re-apply ``status.applied`` (which the closed loop may have retuned) instead of the plan:
    the last reconcile succeeded, and this is a resume of an observed generation or a plan-neutral spec
    change."""
    if not old.get("applied") or not status_patch.reconcile_succeeded(old):
        return False
    if trigger == RESUMED:
        return not first_visit
    return trigger == SPEC_CHANGED and diff is not None and not modes.compute_replan_needed(diff)


def _emit_success(
    deps: Deps, body: Mapping[str, Any], inputs: resolve.Inputs, wanted: desired.Desired
) -> None:
    """One Normal event per decision (an event is a write: at 1000 services each one counts), named by
    the mode: ``Planned`` (Auto), ``Recommended`` or ``Reported``; it says the plan and where the model
    config and GPU came from (the ``ConfigResolved`` condition says the same). Then one Warning per plan
    warning."""
    d, gpu = wanted.decision, inputs.gpu
    b = d.plan.budget
    plan = (f"{vllm.describe_settings(d.plan.settings)}: weights {b.weights_gib:.2f} GiB, KV cache "
            f"{b.available_kv_cache_gib:.2f} GiB ({b.kv_cache_tokens} tokens) per GPU"
            + (f"; from {d.plan.profile_note}" if d.plan.profile else
               f"; {d.plan.profile_note}" if d.plan.profile_note else ""))  # fmt: skip
    resolved = (f"model config from {inputs.model.origin}; "
                f"GPU {gpu.gpu.name} x{d.plan.gpu_count} from {gpu.origin}")  # fmt: skip
    reason, mode = {
        "Recommend": ("Recommended", "mode Recommend: the plan is in status.recommendation; the Deployment "
                      "keeps the user's settings. "),
        "Off": ("Reported", "mode Off: plan reported only; the Deployment keeps the user's settings. "),
    }.get(d.mode, ("Planned", ""))  # fmt: skip
    deps.emit(body, events.NORMAL, reason, f"{mode}{plan}; {resolved}")
    for warning in (*gpu.warnings, *d.plan.warnings):
        deps.emit(body, events.WARNING, "PlanWarning", warning)
