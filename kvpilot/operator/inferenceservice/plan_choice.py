"""Which settings a reconcile deploys: ``status.applied`` kept, or a plan from the fleet's TuningProfile.

The engine settings in ``status.applied`` (SGLang's flags: ``status.appliedEngineArgs``) are kept (not
re-planned) in mode Auto when the closed loop may have retuned them and nothing the planner reads changed
(:func:`read_kept`); otherwise the planner plans,
and plans again from the matching TuningProfile when one exists (:func:`fetch_wanted`). Only plans read
profiles: a profile's change re-plans no running service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.clients.kube import Kube
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import modes, profile_scope, profiles, resolve
from kvpilot.operator.pods import engine_pods
from kvpilot.operator.status import engine_patch, status_patch


def compute_plan_stands(
    old: Mapping[str, Any], *, resumed: bool, spec_changed: bool, first_visit: bool, diff: Any
) -> bool:
    """Whether the last reconcile's plan still stands: it succeeded, and this is a resume of an observed
    generation (``resumed``, not ``first_visit``) or a plan-neutral spec change (replicas, image, env,
    resources, tolerations, the closed loop's knobs). Else the planner plans again, and what the closed
    loop decided against the old plan (its recommendation) is void."""
    if not status_patch.reconcile_succeeded(old):
        return False
    if resumed:
        return not first_visit
    return spec_changed and diff is not None and not modes.compute_replan_needed(diff)


def read_kept(old: Mapping[str, Any], spec: api.InferenceServiceSpec, *, stands: bool) -> desired.Kept | None:
    """``status.applied`` (which the closed loop may have retuned; another engine's flags:
    ``status.appliedEngineArgs``) when it is re-applied instead of a plan: the plan stands
    (:func:`compute_plan_stands`) and the status records it; ``None``: plan."""
    if not stands or not (old.get("applied") or old.get("appliedEngineArgs")):
        return None
    return read_applied(old, spec)


def read_applied(old: Mapping[str, Any], spec: api.InferenceServiceSpec) -> desired.Kept | None:
    """The settings on the Deployment as the status records them, in the engine's own type: vLLM's
    ``applied``; the flags of an engine whose closed loop rolls them out (SGLang's and TGI's
    ``appliedEngineArgs``);
    ``None`` for any other engine, or flags that no longer parse (planned again)."""
    if spec.engine.kind == "vLLM":
        return api.Settings.model_validate(old["applied"]) if old.get("applied") else None
    if spec.engine.kind == "TGI":
        return engine_patch.read_args(engine_pods.TGI, old, "appliedEngineArgs")
    return engine_patch.read_args(engine_pods.SGLANG, old, "appliedEngineArgs")


async def fetch_wanted(
    kube: Kube | None,
    plan_fn: modes.PlanFn | None,
    meta: Mapping[str, Any],
    parsed: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    keep: desired.Kept | None,
    logger: Any,
) -> desired.Desired:
    """The desired state: with ``keep`` deployed, else planned (from the TuningProfile when one matches)."""
    wanted = desired.build_desired(meta, parsed, inputs, deploy_override=keep, plan_fn=plan_fn)
    if keep is not None:
        return wanted
    return await _with_profile(kube, plan_fn, meta, parsed, inputs, wanted, logger)


async def _with_profile(
    kube: Kube | None,
    plan_fn: modes.PlanFn | None,
    meta: Mapping[str, Any],
    parsed: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    wanted: desired.Desired,
    logger: Any,
) -> desired.Desired:
    """``wanted`` planned again from the matching TuningProfile (the key needs the first plan's KV dtype and
    layout): the namespace's own, or the shared one where the namespace shares (:mod:`.profile_scope`);
    ``wanted`` itself without a store or a profile."""
    if wanted.decision is None:  # another engine: no TuningProfile of its plans yet
        return wanted
    first = wanted.decision.plan
    namespace = meta.get("namespace") or "default"
    model, gpu = inputs.model.config_key, inputs.gpu.gpu.name
    keys = profile_scope.compute_keys(model, gpu, parsed, first.settings, namespace)
    learned = await profiles.fetch_plan_learned(profiles.store_for(kube), keys, logger)
    if learned is None:
        return wanted
    return desired.build_desired(meta, parsed, inputs, plan_fn=plan_fn, learned=learned)
