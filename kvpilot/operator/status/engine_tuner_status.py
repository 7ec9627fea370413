"""The status of an EngineTuner whose target runs SGLang or TGI, built in one go from what its reconcile read.

The counterpart of :func:`kvpilot.operator.status.tuner_status.build_tuner_status` for another engine than
vLLM: the same fields and conditions, in the engine's own terms. ``status.discovered`` says the engine and
the flags it runs (``engine``, ``engineArgs``; ``settings`` are vLLM's and stay unset),
``status.recommendation.engineArgs`` the plan's flags (the InferenceService planner's for that engine, as an
InferenceService of ``spec.engine.kind`` SGLang or TGI reports them) with the budget step by step in its
``reason``, the ``Planned`` condition the plan's summary. ``status.budget`` (vLLM's memory model) stays
unset, and so do the vLLM closed loop's ``failedSettings``, ``lastGoodSettings`` and ``rollout``: the
recommendation is the plan's. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.status import events
from kvpilot.operator.status.status_patch import (
    WARNINGS_LIMIT,
    ListPatch,
    StatusPatch,
    Update,
    cap,
    format_time,
)
from kvpilot.operator.status.tuner_status import READY_REASONS, Eviction, build_rewritable

NO_EVICTION = Eviction()


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


def describe_args(args: Sequence[str], kind: str | None) -> str:
    return " ".join(args) or f"{kind}'s defaults"


def build_engine_tuner_status(
    old: Mapping[str, Any], found: EngineTunerFound, eviction: Eviction = NO_EVICTION
) -> StatusPatch:
    """The EngineTuner's whole status after a reconcile of an SGLang or TGI target, and its events
    (``Recommended`` when the recommendation changed)."""
    now = format_time(found.now)
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
        "rollout": None,
    }
    changed = _args_changed(old, found.recommended)
    if found.mode != "Off":
        new["recommendation"] = _build_recommendation(old, found, changed, now)
    if eviction.evicted:
        new["lastEvictionTime"] = now
        new["evictions"] = int(old.get("evictions") or 0) + 1
    rewritable, refused = build_rewritable(old, eviction)
    lists = ListPatch(found.generation, now, updates=[*_build_updates(found, eviction), *rewritable])
    out = StatusPatch(status=new, lists=lists, events=refused)
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


def _build_recommendation(
    old: Mapping[str, Any], found: EngineTunerFound, changed: bool, now: str
) -> dict[str, Any]:
    """``status.recommendation``: the plan's flags, and why (the budget step by step); kept as it was
    (reason, time) while the flags stay."""
    d = found.discovered
    reason = (
        f"planned for {d.gpu_count}x {found.gpu_name}: {describe_args(found.recommended, d.engine)} (the "
        f"target runs {describe_args(found.current, d.engine)}); " + "; ".join(found.explanation)
    )
    kept = {} if changed else dict(old.get("recommendation") or {})
    return {
        "engineArgs": list(found.recommended),
        "reason": cap(str(kept.get("reason") or reason)),
        "trigger": str(kept.get("trigger") or "Discovered"),
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
