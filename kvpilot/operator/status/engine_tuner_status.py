"""The status of an EngineTuner whose target runs SGLang or TGI, built in one go from what its reconcile read.

The counterpart of :func:`kvpilot.operator.status.tuner_status.build_tuner_status` for another engine than
vLLM: the same fields and conditions, in the engine's own terms. ``status.discovered`` says the engine and
the flags it runs (``engine``, ``engineArgs``; ``settings`` are vLLM's and stay unset),
``status.recommendation.engineArgs`` the flags the closed loop stands by (the plan's, the InferenceService
planner's for that engine, as the loop changed them since: :class:`EngineTunerLoop`), with the budget step
by step, or the loop's reason, in its ``reason``; the ``Planned`` condition the plan's summary. The loop's
memory is in the engine's flags: ``history`` (``fromEngineArgs`` / ``toEngineArgs``, a ``Planned`` entry
first), ``failedEngineArgs``, ``lastGoodEngineArgs``, ``rollout.engineArgs``
(:func:`kvpilot.operator.status.engine_patch.build_engine_patch` for an EngineTuner). ``status.budget``
(vLLM's memory model) and vLLM's ``failedSettings`` and ``lastGoodSettings`` stay unset. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.status import events
from kvpilot.operator.status.status_patch import (
    WARNINGS_LIMIT,
    ListPatch,
    StatusPatch,
    Update,
    build_history_entry,
    cap,
    format_time,
)
from kvpilot.operator.status.tuner_status import (
    READY_REASONS,
    Eviction,
    build_planned_or_waiting_patch,
    build_rewritable,
    build_serving_conditions,
)
from kvpilot.tuner.loop import HistoryAction
from kvpilot.tuner.loop.engine_state import EngineDecision

NO_EVICTION = Eviction()


@dataclass(frozen=True)
class EngineTunerLoop:
    """What the closed loop made of this reconcile (:mod:`kvpilot.operator.enginetuner.target_engine_loop`):
    the flags to stand by, and what to record. ``patch``: a judged tick's share of the status;
    ``planned_from``: a new plan, from these discovered flags; ``not_running``: no live pod runs the
    recommendation. None of them: mode Off (the plan alone)."""

    recommended: tuple[str, ...]
    patch: StatusPatch | None = None
    decision: EngineDecision[Any] | None = None
    planned_from: tuple[str, ...] | None = None
    not_running: bool = False


@dataclass(frozen=True)
class EngineTunerFound:
    """What the reconcile read and planned for a target of another engine: ``current`` the tuned flags it
    runs, ``recommended`` the plan's, ``summary`` and ``explanation`` the plan's words
    (:class:`kvpilot.operator.planning.engines.EnginePlan`)."""

    generation: int | None
    now: float
    mode: str
    target: str
    """``Kind name`` of ``spec.targetRef``."""
    discovered: api.Discovered
    discovered_message: str
    current: tuple[str, ...]
    recommended: tuple[str, ...]
    summary: str
    explanation: tuple[str, ...]
    gpu_name: str
    gpu_memory_gib: float
    warnings: tuple[str, ...] = ()
    serving: Serving | None = None
    """The target's pods: the ``Available`` and ``Degraded`` conditions (:func:`build_serving_conditions`)."""


def describe_args(args: Sequence[str], kind: str | None) -> str:
    return " ".join(args) or (f"{kind}'s defaults" if kind else "the engine's defaults")


def build_engine_tuner_status(
    old: Mapping[str, Any],
    found: EngineTunerFound,
    loop: EngineTunerLoop | None = None,
    eviction: Eviction = NO_EVICTION,
) -> StatusPatch:
    """The EngineTuner's whole status after a reconcile of an SGLang or TGI target: the discovery, GPU and
    warnings, the recommendation, the loop's share (:func:`build_engine_loop_patch`), the eviction, the
    conditions, and the events (the loop's, then ``Recommended`` when the recommendation changed)."""
    now = format_time(found.now)
    looped = build_engine_loop_patch(old, loop or EngineTunerLoop(found.recommended), now)
    d = found.discovered
    new: dict[str, Any] = {
        "observedGeneration": found.generation,
        "discovered": d.wire(),
        "gpu": {
            "product": d.gpu_product,
            "catalogueName": found.gpu_name,
            "count": d.gpu_count,
            "memoryGiB": round(found.gpu_memory_gib, 2),
        },
        "budget": None,
        "warnings": list(found.warnings)[:WARNINGS_LIMIT],
        "recommendation": None,
        "failedSettings": None,
        "lastGoodSettings": None,
        **looped.status,  # failedEngineArgs, lastGoodEngineArgs, rollout
    }
    changed = _args_changed(old, found.recommended)
    if found.mode != "Off":
        new["recommendation"] = _build_recommendation(old, found, loop, changed, now)
    if eviction.evicted:
        new["lastEvictionTime"] = now
        new["evictions"] = int(old.get("evictions") or 0) + 1
    rewritable, refused = build_rewritable(old, eviction)
    assert looped.lists is not None
    lists = ListPatch(
        found.generation,
        now,
        updates=[
            *looped.lists.updates,
            *_build_updates(found, eviction),
            *rewritable,
            *build_serving_conditions(found.serving),
        ],
        history=looped.lists.history,
        keep=HistoryAction.PLANNED,  # the plan's entry: where the loop starts
    )
    out = StatusPatch(
        status=new, lists=lists, events=[*looped.events, *refused], decisions=list(looped.decisions)
    )
    if found.mode != "Off" and changed:
        text = (
            f"{describe_args(found.recommended, d.engine)} (the target runs "
            f"{describe_args(found.current, d.engine)})"
        )
        out.events.append((events.NORMAL, "Recommended", text))
    return out


def is_engine_published(old: Mapping[str, Any], generation: Any, recommended: Sequence[str]) -> bool:
    """Whether the status already read holds the flags ``recommended`` for this generation with
    ``Ready=True``: what the webhook's index needs before an eviction (as
    :func:`~kvpilot.operator.status.tuner_status.is_published` for vLLM's settings)."""
    ready = conditions.find_condition(old.get("conditions"), conditions.READY) or {}
    return (
        old.get("observedGeneration") == generation
        and ready.get("status") == conditions.TRUE
        and not _args_changed(old, recommended)
    )


def _args_changed(old: Mapping[str, Any], recommended: Sequence[str]) -> bool:
    was = (old.get("recommendation") or {}).get("engineArgs")
    return list(was or ()) != list(recommended) or was is None


def build_engine_loop_patch(old: Mapping[str, Any], loop: EngineTunerLoop, now: str) -> StatusPatch:
    """The loop's share of the status: a judged tick's patch, a new plan's ``Planned`` entry (and the old
    recommendation's rollout dropped), or the two conditions of a recommendation no pod runs."""
    if loop.patch is not None:
        return loop.patch
    if loop.planned_from is not None:
        entry = build_history_entry(
            time=now,
            action=HistoryAction.PLANNED,
            trigger="Discovered",
            reason=f"planned {describe_args(loop.recommended, None)} (the target runs "
            f"{describe_args(loop.planned_from, None)})",
            from_engine_args=loop.planned_from,
            to_engine_args=loop.recommended,
        )
        return build_planned_or_waiting_patch(old, now, entry, loop.not_running)
    return build_planned_or_waiting_patch(old, now, None, loop.not_running)


def _build_recommendation(
    old: Mapping[str, Any], found: EngineTunerFound, loop: EngineTunerLoop | None, changed: bool, now: str
) -> dict[str, Any]:
    """``status.recommendation``: the flags, and why (the plan's budget step by step, or the closed loop's
    change just now); kept as it was (reason, trigger, time) while the flags stay."""
    d = found.discovered
    reason = (
        f"planned for {d.gpu_count}x {found.gpu_name}: {describe_args(found.recommended, d.engine)} (the "
        f"target runs {describe_args(found.current, d.engine)}); " + "; ".join(found.explanation)
    )
    trigger = "Discovered"
    decision = loop.decision if loop is not None else None
    if decision is not None and decision.changes:  # the closed loop changed it just now
        why = "; ".join(decision.explanation)
        reason, trigger = decision.reason + (f" [{why}]" if why else ""), decision.trigger
    kept = {} if changed else dict(old.get("recommendation") or {})
    return {
        "engineArgs": list(found.recommended),
        "reason": cap(str(kept.get("reason") or reason)),
        "trigger": str(kept.get("trigger") or trigger),
        "time": str(kept.get("time") or now),
    }


def _build_updates(found: EngineTunerFound, eviction: Eviction) -> list[Update]:
    """``TargetFound``, ``Discovered``, ``Planned`` and ``Ready`` (how many pods run the recommendation)."""
    d = found.discovered
    pods = f"{d.pods_tuned}/{d.pods} pods run the recommendation"
    return [
        (conditions.TARGET_FOUND, conditions.TRUE, "Found", found.target),
        (conditions.DISCOVERED, conditions.TRUE, "Discovered", found.discovered_message),
        (conditions.PLANNED, conditions.TRUE, "Planned", found.summary),
        (
            conditions.READY,
            conditions.TRUE,
            READY_REASONS[found.mode],
            f"{found.mode}: {pods}{eviction.message}",
        ),
    ]
