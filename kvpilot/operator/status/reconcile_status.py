"""The reconciler's status: built here in one go, with its events, after an apply or a failure.

:func:`kvpilot.operator.inferenceservice.handlers.reconcile` hands over what it planned and applied (or why it
failed) and writes the :class:`~.status_patch.StatusPatch` it gets back, then posts its events and counts its
decisions; it edits nothing. The vocabulary (settings, history, caps, lists) is :mod:`.status_patch`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.errors import Failure
from kvpilot.operator.planning.engines import EnginePlan
from kvpilot.operator.planning.modes import ModeDecision
from kvpilot.operator.planning.resolve import Inputs
from kvpilot.operator.status import events
from kvpilot.operator.status.status_patch import (
    WARNINGS_LIMIT,
    ListPatch,
    StatusPatch,
    Update,
    build_history_entry,
    build_recommendation,
    build_settings,
    compact,
)
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import HistoryAction
from kvpilot.tuner.types import GIB, Plan

_BUDGET_KEYS = tuple(f.alias or n for n, f in api.Budget.model_fields.items())


def build_success_status(
    old: Mapping[str, Any],
    *,
    generation: int | None,
    now: str,
    inputs: Inputs,
    decision: ModeDecision,
    trigger: str,
    selector: str | None = None,
    conflict: tuple[str, str] | None = None,
    replanned: bool = False,
    announce: bool = False,
) -> StatusPatch:
    """Status after the Deployment and Service were applied with ``decision.deploy``, and its events.

    ``selector``: the pods' label selector (``status.selector``, which the ``/scale`` subresource serves to
    autoscalers); ``conflict``: an autoscaler that fights the spec, ``(reason, message)``: the first warning,
    and a Warning event when new; ``replanned``: the plan is new (not ``status.applied`` kept), so
    ``status.profile`` says where it started; ``announce``: the first sight of this generation, so the
    decision is announced even if the applied settings stay (:func:`build_success_events`; a change of them
    always is, and counted as a ``Planned`` decision)."""
    plan, gpu = decision.plan, inputs.gpu
    applied = build_settings(decision.deploy)
    planned_text = vllm.describe_settings(plan.settings)
    b = plan.budget
    updates = [
        (
            conditions.CONFIG_RESOLVED,
            conditions.TRUE,
            "Resolved",
            f"model config from {inputs.model.origin}; GPU {gpu.gpu.name} from {gpu.origin}",
        ),
        (
            conditions.PLANNED,
            conditions.TRUE,
            "Planned",
            f"{planned_text}; KV cache {b.available_kv_cache_gib:.2f} GiB = {b.kv_cache_tokens} tokens, "
            f"{plan.concurrency_at_max_len:.1f} requests at max-model-len",
        ),
        (conditions.INFEASIBLE, conditions.FALSE, "Feasible", "the plan fits the GPUs"),
        (conditions.READY, conditions.TRUE, "Applied", _ready_message(decision)),
    ]
    lists = ListPatch(generation, now, updates=list(updates))
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "gpu": {
            "product": ", ".join(gpu.products) or None,
            "catalogueName": gpu.gpu.name,
            "count": plan.gpu_count,
            "memoryGiB": round(gpu.gpu.total_bytes / GIB, 2),
        },
        "applied": applied,
        "budget": {**dict.fromkeys(_BUDGET_KEYS), **api.Budget.from_budget(b).wire()},
        "warnings": [*([conflict[1]] if conflict else []), *gpu.warnings, *plan.warnings][:WARNINGS_LIMIT],
        "recommendation": None,
    }
    if selector is not None:
        patch["selector"] = selector
    if decision.recommendation is not None:
        patch["recommendation"] = build_recommendation(
            decision.recommendation, f"planned for {plan.gpu_count}x {plan.gpu}: {planned_text}", trigger, now
        )
    old_applied = old.get("applied")
    if compact(old_applied) != compact(applied):
        patch["lastChangeTime"] = now
        entry = build_history_entry(
            time=now,
            action=HistoryAction.PLANNED,
            trigger=trigger,
            reason=f"{decision.mode}: {vllm.describe_settings(decision.deploy)}",
        )
        if old_applied:
            entry["from"] = compact(old_applied)
        entry["to"] = compact(applied)
        lists.history.append((entry, False))
    if replanned:
        patch["profile"] = build_profile(plan)
    out = StatusPatch(status=patch, lists=lists)
    if conflict is not None and conflict[1] not in (old.get("warnings") or []):
        out.events.append((events.WARNING, *conflict))
    changed = "lastChangeTime" in patch
    if changed:
        out.decisions.append("Planned")
    if announce or changed:
        out.events.extend(build_success_events(inputs, decision))
    return out


def build_engine_success_status(
    *,
    generation: int | None,
    now: str,
    inputs: Inputs,
    plan: EnginePlan,
    selector: str | None = None,
    announce: bool = False,
    replanned: bool = True,
) -> StatusPatch:
    """Status after another engine's Deployment (``spec.engine.kind`` SGLang) was applied: the plan in its
    own terms in ``Planned`` (``status.applied`` and ``budget`` are vLLM's settings and stay unset), the
    flags deployed in mode Auto in ``appliedEngineArgs`` (the closed loop's, when the reconcile kept them),
    ``Ready``, and a ``Planned`` event on the first sight of a generation. The closed loop's
    ``recommendation`` (in the engine's flags) is voided by a new plan only (``replanned``): a reconcile
    that kept the flags keeps it, so the loop does not announce it again."""
    gpu = inputs.gpu
    deployed = (
        f"the flags {' '.join(plan.planned)}"
        if plan.mode == "Auto"
        else f"the engine's own defaults (mode {plan.mode}: the plan is reported only)"
    )
    updates: list[Update] = [
        (
            conditions.CONFIG_RESOLVED,
            conditions.TRUE,
            "Resolved",
            f"model config from {inputs.model.origin}; GPU {gpu.gpu.name} from {gpu.origin}",
        ),
        (conditions.PLANNED, conditions.TRUE, "Planned", plan.summary),
        (conditions.INFEASIBLE, conditions.FALSE, "Feasible", "the plan fits the GPUs"),
        (conditions.READY, conditions.TRUE, "Applied", f"{plan.kind} Deployment applied with {deployed}"),
    ]
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "gpu": {
            "product": ", ".join(gpu.products) or None,
            "catalogueName": gpu.gpu.name,
            "count": plan.gpu_count,
            "memoryGiB": round(gpu.gpu.total_bytes / GIB, 2),
        },
        "warnings": list(gpu.warnings)[:WARNINGS_LIMIT],
        "appliedEngineArgs": list(plan.planned) if plan.mode == "Auto" else None,
    }
    if replanned:
        patch["recommendation"] = None
    if selector is not None:
        patch["selector"] = selector
    out = StatusPatch(status=patch, lists=ListPatch(generation, now, updates=updates))
    if announce:
        text = (
            f"{plan.summary}; model config from {inputs.model.origin}; GPU {gpu.gpu.name} from {gpu.origin}"
        )
        out.events.append((events.NORMAL, "Planned", text))
        out.decisions.append("Planned")
    return out


def build_profile(plan: Plan) -> dict[str, Any] | None:
    """``status.profile``: the TuningProfile the plan started from (``None`` clears it: the memory model's
    plan)."""
    if plan.profile is None:
        return None
    out: dict[str, Any] = {"name": plan.profile, "message": plan.profile_note}
    if plan.learned_kv_cache_tokens is not None:
        out["learnedKvCacheTokens"] = plan.learned_kv_cache_tokens
    return out


def build_success_events(inputs: Inputs, decision: ModeDecision) -> list[tuple[str, str, str]]:
    """One Normal event per decision (an event is a write: at 1000 services each one counts), named by
    the mode: ``Planned`` (Auto), ``Recommended`` or ``Reported``; it says the plan and where the model
    config and GPU came from (the ``ConfigResolved`` condition says the same). Then one Warning per plan
    warning."""
    d, gpu = decision, inputs.gpu
    b = d.plan.budget
    plan = (
        f"{vllm.describe_settings(d.plan.settings)}: weights {b.weights_gib:.2f} GiB, KV cache "
        f"{b.available_kv_cache_gib:.2f} GiB ({b.kv_cache_tokens} tokens) per GPU"
        + (
            f"; from {d.plan.profile_note}"
            if d.plan.profile
            else f"; {d.plan.profile_note}"
            if d.plan.profile_note
            else ""
        )
    )
    resolved = (
        f"model config from {inputs.model.origin}; GPU {gpu.gpu.name} x{d.plan.gpu_count} from {gpu.origin}"
    )
    reason, mode = {
        "Recommend": (
            "Recommended",
            "mode Recommend: the plan is in status.recommendation; the Deployment "
            "keeps the user's settings. ",
        ),
        "Off": ("Reported", "mode Off: plan reported only; the Deployment keeps the user's settings. "),
    }.get(d.mode, ("Planned", ""))
    out = [(events.NORMAL, reason, f"{mode}{plan}; {resolved}")]
    out.extend((events.WARNING, "PlanWarning", warning) for warning in (*gpu.warnings, *d.plan.warnings))
    return out


def _ready_message(decision: ModeDecision) -> str:
    if decision.mode == "Auto":
        return f"Deployment applied with the plan: {vllm.describe_settings(decision.deploy)}"
    what = (
        "the recommendation is in status.recommendation"
        if decision.mode == "Recommend"
        else "plan reported only"
    )
    return f"Deployment applied with the user's settings ({vllm.describe_settings(decision.deploy)}); {what}"


def build_failure_status(
    old: Mapping[str, Any], *, generation: int | None, now: str, failure: Failure, trigger: str
) -> StatusPatch:
    """Status after a failed reconciliation: Ready=False with the reason, a Warning event (and an
    ``Infeasible`` decision counted when no plan fits); the Deployment is untouched."""
    updates: list[Update] = []
    if failure.condition != conditions.READY:
        updates.append((failure.condition, conditions.FALSE, failure.reason, failure.message))
    if failure.infeasible:
        updates.append((conditions.INFEASIBLE, conditions.TRUE, failure.reason, failure.message))
    elif failure.condition == conditions.PLANNED:
        updates.append((conditions.INFEASIBLE, conditions.FALSE, "NotPlanned", "no plan was made"))
    updates.append((conditions.READY, conditions.FALSE, failure.reason, failure.message))
    lists = ListPatch(generation, now, updates=updates)
    if failure.infeasible:
        entry = build_history_entry(
            time=now, action=HistoryAction.INFEASIBLE, trigger=trigger, reason=failure.message
        )
        lists.history.append((entry, True))
    out = StatusPatch(status={"observedGeneration": generation}, lists=lists)
    out.events.append((events.WARNING, failure.reason, failure.message))
    if failure.infeasible:
        out.decisions.append("Infeasible")
    return out
