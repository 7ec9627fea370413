"""The EngineTuner's status, built here in one go from what its reconcile found, planned, decided and did.

:mod:`kvpilot.operator.enginetuner.target_handlers` hands over three values and writes the patch it gets
back; it edits nothing:

* :class:`TunerFound` -- the target's discovery in wire form, the plan and the budget of the
  recommendation, the mode;
* :class:`TunerLoop` -- what the EngineTuner's loop made of this reconcile
  (:func:`kvpilot.operator.enginetuner.target_loop.compute_loop`): a new plan (a ``Planned`` history entry,
  where the loop starts from), no pod running the recommendation (nothing judges it), or a judged tick
  (:func:`kvpilot.operator.status.loop_patch.build_loop_patch`, less the fields an EngineTuner lacks);
* :class:`Eviction` -- in mode Auto, what the eviction step did.

A failed reconcile is :func:`build_tuner_failure_status`: ``Ready=False`` and the failing condition, and a
Warning event when the verdict is new.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.errors import Failure
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.status import events
from kvpilot.operator.status.loop_patch import LoopTick, build_loop_patch
from kvpilot.operator.status.status_patch import (
    WARNINGS_LIMIT,
    ListPatch,
    StatusPatch,
    Update,
    build_history_entry,
    build_recommendation,
    build_serving_updates,
    cap,
    compact,
    format_time,
)
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import Decision, HistoryAction
from kvpilot.tuner.types import EngineSettings, MemoryBudget, Plan

NOT_RUNNING = (
    "no pod of the target runs the recommendation yet (the owner rolls its pods; in Auto, kvpilot's "
    "evictions): the metrics and crashes of other settings do not judge it"
)
"""Why nothing judges the recommendation while no pod runs it."""
NOT_RUNNING_REASON = "RecommendationNotRunning"
"""The ``MetricsAvailable=False`` reason then."""
READY_REASONS = {"Off": "Reporting", "Recommend": "Recommending", "Initial": "Tuning", "Auto": "Tuning"}
"""``Ready=True``'s reason in each mode."""


@dataclass(frozen=True)
class TunerFound:
    """What the reconcile read and planned: ``current`` the settings the target runs, ``budget`` the memory
    model's budget of the recommendation, ``pods`` / ``pods_tuned`` how many run the recommendation."""

    generation: int | None
    now: float
    mode: str
    target: str
    """``Kind name`` of ``spec.targetRef``."""
    discovered: api.Discovered
    discovered_message: str
    """What discovery read, in words (the ``Discovered`` condition)."""
    plan: Plan
    budget: MemoryBudget
    current: EngineSettings
    serving: Serving | None = None
    """The target's pods: the ``Available`` and ``Degraded`` conditions (:func:`build_serving_conditions`)."""


@dataclass(frozen=True)
class TunerLoop:
    """What the loop made of this reconcile: the recommendation to stand by, and what to record. ``tick``: a
    judged tick; ``planned_from``: a new plan, from these discovered settings; ``not_running``: no live pod
    runs the recommendation. None of them: mode Off (the plan alone)."""

    settings: EngineSettings
    decision: Decision | None = None
    tick: LoopTick | None = None
    planned_from: EngineSettings | None = None
    not_running: bool = False


@dataclass(frozen=True)
class Eviction:
    """Mode Auto: what the eviction step did (``message``: the end of ``Ready``'s message)."""

    message: str = ""
    evicted: bool = False
    checked: bool = False
    """Whether the webhook's rewrite was checked against the target's pod templates (every mode but Off)."""
    refused: str | None = None
    """Why the webhook cannot put the recommendation on the target's new pods (what to change), when
    it cannot (:func:`kvpilot.operator.enginetuner.target_webhook.compute_refusal`)."""


REWRITTEN = "the webhook's rewrite puts the recommendation on the target's new pods"
"""``Rewritable=True``'s message."""


def build_rewritable(
    old: Mapping[str, Any], eviction: Eviction
) -> tuple[list[Update], list[tuple[str, str, str]]]:
    """``Rewritable=False`` (reason ``RewriteRefused``, what to change) and a Warning event when that is
    new; back to True when it was False and the check passes now; nothing while it never failed."""
    was = conditions.find_condition(old.get("conditions"), conditions.REWRITABLE) or {}
    if eviction.refused is not None:
        update = (conditions.REWRITABLE, conditions.FALSE, "RewriteRefused", eviction.refused)
        new = (was.get("status"), was.get("message")) != (conditions.FALSE, cap(eviction.refused))
        return [update], [(events.WARNING, "RewriteRefused", eviction.refused)] if new else []
    if eviction.checked and was and was.get("status") != conditions.TRUE:
        return [(conditions.REWRITABLE, conditions.TRUE, "Rewritable", REWRITTEN)], []
    return [], []


def build_tuner_status(
    old: Mapping[str, Any], found: TunerFound, loop: TunerLoop, eviction: Eviction = Eviction()
) -> StatusPatch:
    """The EngineTuner's whole status after a reconcile: the discovery, GPU, budget and warnings, the
    recommendation, the loop's share (:func:`build_tuner_loop_patch`), the eviction, the conditions, and
    the events (the loop's, then ``Recommended`` when the recommendation changed)."""
    now = format_time(found.now)
    looped = build_tuner_loop_patch(old, loop, now)
    plan, b = found.plan, found.budget
    new: dict[str, Any] = {
        "observedGeneration": found.generation,
        "discovered": found.discovered.wire(),
        "gpu": {"product": found.discovered.gpu_product, "catalogueName": plan.gpu, "count": plan.gpu_count},
        "budget": api.Budget.from_budget(b).wire(),
        "warnings": list(plan.warnings)[:WARNINGS_LIMIT],
        "recommendation": None,
        **looped.status,  # failedSettings, lastGoodSettings, rollout
    }
    changed = _recommendation_changed(old, loop.settings)
    if found.mode != "Off":
        new["recommendation"] = _build_tuner_recommendation(old, found, loop, changed, now)
    if eviction.evicted:
        new["lastEvictionTime"] = now
        new["evictions"] = int(old.get("evictions") or 0) + 1
    assert looped.lists is not None
    rewritable, refused = build_rewritable(old, eviction)
    lists = ListPatch(
        found.generation,
        now,
        updates=[
            *looped.lists.updates,
            *_build_tuner_updates(found, loop, eviction),
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
        planned, current = vllm.describe_settings(loop.settings), vllm.describe_settings(found.current)
        out.events.append((events.NORMAL, "Recommended", f"{planned} (the target runs {current})"))
    return out


def build_serving_conditions(serving: Serving | None) -> list[Update]:
    """An EngineTuner's ``Available`` and ``Degraded``, from its target's pods as an InferenceService's are
    from its own (none before the pods are read); its ``replicas`` fields stay the target's own status's."""
    return build_serving_updates(serving)[0] if serving is not None else []


def build_tuner_failure_status(
    old: Mapping[str, Any], *, generation: int | None, now: float, failure: Failure
) -> StatusPatch:
    """A failed reconcile: ``Ready=False`` (and the failing condition) with the reason; a Warning event when
    ``Ready`` said otherwise."""
    failed: list[Update] = [(conditions.READY, conditions.FALSE, failure.reason, failure.message)]
    if failure.condition != conditions.READY:
        failed.append((failure.condition, conditions.FALSE, failure.reason, failure.message))
    out = StatusPatch(
        status={"observedGeneration": generation},
        lists=ListPatch(generation, format_time(now), updates=failed),
    )
    ready = conditions.find_condition(old.get("conditions"), conditions.READY) or {}
    if (ready.get("reason"), ready.get("message")) != (failure.reason, cap(failure.message)):
        out.events.append((events.WARNING, failure.reason, failure.message))
    return out


def build_tuner_loop_patch(old: Mapping[str, Any], loop: TunerLoop, now: str) -> StatusPatch:
    """The loop's share of the status: a judged tick's patch, a new plan's ``Planned`` entry (and the old
    recommendation's rollout dropped), or the two conditions of a recommendation no pod runs."""
    if loop.tick is not None:
        return build_loop_patch(old, loop.tick)
    if loop.planned_from is not None:
        entry = build_history_entry(
            time=now,
            action=HistoryAction.PLANNED,
            trigger="Discovered",
            reason=f"planned {vllm.describe_settings(loop.settings)} (the target runs "
            f"{vllm.describe_settings(loop.planned_from)})",
            from_settings=loop.planned_from,
            to_settings=loop.settings,
        )
        return build_planned_or_waiting_patch(old, now, entry, loop.not_running)
    return build_planned_or_waiting_patch(old, now, None, loop.not_running)


def build_planned_or_waiting_patch(
    old: Mapping[str, Any], now: str, planned: dict[str, Any] | None, not_running: bool
) -> StatusPatch:
    """A new plan's ``Planned`` history entry (the old recommendation's rollout dropped), or, without one,
    the two conditions of a recommendation no pod runs: what every engine's tuner loop writes between
    judged ticks."""
    if planned is not None:
        fields = {"rollout": None} if old.get("rollout") else {}
        return StatusPatch(status=fields, lists=ListPatch(None, now, history=[(planned, True)]))
    updates: list[Update] = []
    if not_running:
        updates.append((conditions.METRICS_AVAILABLE, conditions.FALSE, NOT_RUNNING_REASON, NOT_RUNNING))
        if old.get("rollout"):
            updates.append((conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, "Waiting", NOT_RUNNING))
    return StatusPatch(lists=ListPatch(None, now, updates))


def is_published(old: Mapping[str, Any], generation: Any, recommended: EngineSettings) -> bool:
    """Whether the status already read holds ``recommended`` for this generation with ``Ready=True``: what
    the webhook's index needs (:func:`~kvpilot.operator.enginetuner.target_webhook.index_tuner`) before an
    eviction."""
    ready = conditions.find_condition(old.get("conditions"), conditions.READY) or {}
    return (
        old.get("observedGeneration") == generation
        and ready.get("status") == conditions.TRUE
        and not _recommendation_changed(old, recommended)
    )


def _recommendation_changed(old: Mapping[str, Any], recommended: EngineSettings) -> bool:
    was = (old.get("recommendation") or {}).get("settings")
    return compact(was) != compact(api.Settings.from_engine(recommended).wire())


def _build_tuner_recommendation(
    old: Mapping[str, Any], found: TunerFound, loop: TunerLoop, changed: bool, now: str
) -> dict[str, Any]:
    """``status.recommendation``: why, from the plan or the loop's change just now; kept as it was (reason,
    trigger, time) while the settings stay."""
    plan = found.plan
    planned, current = vllm.describe_settings(loop.settings), vllm.describe_settings(found.current)
    reason = f"planned for {plan.gpu_count}x {plan.gpu}: {planned} (the target runs {current})"
    trigger = "Discovered"
    if loop.decision is not None and loop.decision.changes:  # the closed loop lowered it just now
        reason, trigger = loop.decision.reason, loop.decision.trigger
    kept = {} if changed else dict(old.get("recommendation") or {})
    return build_recommendation(
        loop.settings,
        str(kept.get("reason") or reason),
        str(kept.get("trigger") or trigger),
        str(kept.get("time") or now),
    )


def _build_tuner_updates(found: TunerFound, loop: TunerLoop, eviction: Eviction) -> list[Update]:
    """``TargetFound``, ``Discovered``, ``Planned`` and ``Ready`` (how many pods run the recommendation)."""
    b, d = found.budget, found.discovered
    planned = vllm.describe_settings(loop.settings)
    pods = f"{d.pods_tuned}/{d.pods} pods run the recommendation"
    return [
        (conditions.TARGET_FOUND, conditions.TRUE, "Found", found.target),
        (conditions.DISCOVERED, conditions.TRUE, "Discovered", found.discovered_message),
        (
            conditions.PLANNED,
            conditions.TRUE,
            "Planned",
            f"{planned}; KV cache {b.available_kv_cache_gib:.2f} GiB = {b.kv_cache_tokens} tokens",
        ),
        (
            conditions.READY,
            conditions.TRUE,
            READY_REASONS[found.mode],
            f"{found.mode}: {pods}{eviction.message}",
        ),
    ]
