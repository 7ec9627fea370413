"""The closed loop's state in the cluster, both ways: status -> tuner types, decision -> status patch.

Everything the loop remembers lives in the InferenceService's ``status`` (api-contract.md):
``applied``, ``lastGoodSettings``, ``failedSettings``, ``rollout``, ``calibration``,
``history``, ``lastChangeTime``, ``recommendation`` and the ``MetricsAvailable`` /
``RolloutInProgress`` conditions. An operator restarted mid-rollout reads the same status
and carries on: nothing is kept in memory between ticks.

:func:`build_loop_state` reads the status; :func:`build_status_patch` turns one
:class:`~kvpilot.tuner.loop.policy.Decision` into a JSON merge patch plus the events to post.
Both are pure (``now`` is an argument); :mod:`kvpilot.operator.closed_loop` does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import api, conditions, events
from kvpilot.operator import status as statuses
from kvpilot.operator.pod_status import format_time, parse_time
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import (
    Action,
    Decision,
    HistoryAction,
    HistoryEntry,
    LoopState,
    RestartKind,
    RolloutState,
    Trigger,
)
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget

METRICS_AVAILABLE = "MetricsAvailable"
ROLLOUT_IN_PROGRESS = "RolloutInProgress"
FAILED_LIMIT = 32
"""``status.failedSettings`` keeps the newest this many (the CRD's maxItems)."""

QUIET_TRIGGERS = frozenset(
    {
        Trigger.STEADY,
        Trigger.INSUFFICIENT_DATA,
        Trigger.ROLLOUT_IN_PROGRESS,
        Trigger.ROLLOUT_PROBATION,
        Trigger.ROLLOUT_SUCCEEDED,
    }
)
"""Holds that are routine: no history entry, no event."""
OOM_TRIGGERS = frozenset({RestartKind.CUDA_OOM, RestartKind.HOST_OOM_KILLED})
ROLLING_OUT, PROBATION = "RollingOut", "Probation"
"""``status.rollout.phase``: waiting for Ready, then on probation until ``probationUntil``."""


def _settings(wire: Mapping[str, Any] | None) -> EngineSettings | None:
    if not wire:
        return None
    return api.Settings.model_validate({k: v for k, v in wire.items() if v is not None}).to_engine()


def read_budget(status: Mapping[str, Any]) -> MemoryBudget | None:
    """``status.budget`` (of the planned settings): the fallback when the memory model cannot run."""
    wire = status.get("budget")
    b = api.Budget.model_validate({k: v for k, v in (wire or {}).items() if v is not None})
    if not b.kv_cache_tokens or b.kv_cache_gi_b is None or b.gpu_total_gi_b is None:
        return None
    return MemoryBudget(
        gpu_total_gib=b.gpu_total_gi_b,
        requested_gib=b.requested_gi_b or 0.0,
        weights_gib=b.weights_gi_b or 0.0,
        activation_gib=b.activation_gi_b or 0.0,
        non_torch_gib=b.non_torch_gi_b or 0.0,
        cuda_graph_gib=b.cuda_graph_gi_b or 0.0,
        available_kv_cache_gib=b.kv_cache_gi_b,
        kv_bytes_per_token=max(1, round(b.kv_cache_gi_b * GIB / b.kv_cache_tokens)),
        num_gpu_blocks=b.kv_cache_tokens // vllm.default_block_size(vllm.parse_version(api.VLLM_VERSION)),
        kv_cache_tokens=b.kv_cache_tokens,
        max_concurrency=b.max_concurrency or 0.0,
        starts=True,
    )


def _history_entry(wire: Mapping[str, Any]) -> HistoryEntry | None:
    when = parse_time(wire.get("time"))
    try:
        action = HistoryAction(wire.get("action"))
    except ValueError:
        return None
    if when is None:
        return None
    return HistoryEntry(
        time=when,
        action=action,
        trigger=str(wire.get("trigger") or ""),
        reason=str(wire.get("reason") or ""),
        from_settings=_settings(wire.get("from")) or EngineSettings(),
        to_settings=_settings(wire.get("to")) or EngineSettings(),
    )


def build_loop_state(status: Mapping[str, Any]) -> LoopState:
    """The loop's memory, from ``status`` (``applied`` must be set)."""
    current = _settings(status.get("applied")) or EngineSettings()
    rollout = None
    wire_rollout = status.get("rollout") or {}
    started, deadline = parse_time(wire_rollout.get("startedAt")), parse_time(wire_rollout.get("deadline"))
    rollout_settings = _settings(wire_rollout.get("settings"))
    if rollout_settings is not None and started is not None and deadline is not None:
        rollout = RolloutState(
            rollout_settings,
            started,
            deadline,
            probation_until=parse_time(wire_rollout.get("probationUntil")),
        )
    history = tuple(e for e in (_history_entry(w) for w in status.get("history") or ()) if e is not None)
    failed = tuple(s for s in (_settings(w) for w in status.get("failedSettings") or ()) if s is not None)
    tokens = (status.get("calibration") or {}).get("observedKvCacheTokens")
    return LoopState(
        current=current,
        last_good=_settings(status.get("lastGoodSettings")),
        failed=failed,
        rollout=rollout,
        history=history,
        observed_kv_tokens=int(tokens) if tokens else None,
    )


@dataclass
class StatusPatch:
    """A merge patch for ``status`` and the events that go with it."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """``(type, reason, message)``."""
    decisions: list[str] = field(default_factory=list)
    """``kvpilot_decisions_total`` kinds to count."""


def _wire(settings: EngineSettings) -> dict[str, Any]:
    return api.Settings.from_engine(settings).wire()


def _append_history(
    old: Sequence[Mapping[str, Any]], entry: dict[str, Any], *, dedupe: bool
) -> list[dict[str, Any]] | None:
    if dedupe and old:
        last = old[-1]
        if last.get("action") == entry["action"] and last.get("trigger") == entry["trigger"]:
            return None
    return [*(dict(e) for e in old), entry][-statuses.HISTORY_LIMIT :]


def build_status_patch(
    old: Mapping[str, Any],
    state: LoopState,
    decision: Decision,
    *,
    mode: str,
    now: float,
    generation: int | None,
    applied: bool,
    rollout_deadline_seconds: float,
) -> StatusPatch:
    """The status after ``decision``. ``applied``: the Deployment was updated with ``decision.settings``."""
    out = StatusPatch()
    stamp = format_time(now)
    metrics_status, observed_kv_tokens = decision.metrics, decision.observed_kv_tokens
    if metrics_status is None:
        raise ValueError("a Decision from compute_decision carries its metrics status")
    conds: list[tuple[str, str, str, str]] = [
        (
            METRICS_AVAILABLE,
            conditions.TRUE if metrics_status.available else conditions.FALSE,
            metrics_status.reason,
            metrics_status.message,
        )
    ]
    history = list(old.get("history") or [])
    history_changed = False
    change = decision.changes and mode == "Auto" and applied

    def add_history(action: HistoryAction, *, dedupe: bool) -> bool:
        nonlocal history, history_changed
        entry = {
            "time": stamp,
            "action": str(action),
            "trigger": str(decision.trigger),
            "reason": decision.reason[:1000],
            "from": _wire(state.current),
            "to": _wire(decision.settings),
        }
        new = _append_history(history, entry, dedupe=dedupe)
        if new is None:
            return False
        history, history_changed = new, True
        return True

    # failed and good settings: evidence, whatever the mode
    failed = [dict(w) for w in old.get("failedSettings") or ()]
    if decision.failed is not None and decision.failed not in state.failed:
        failed = [*failed, _wire(decision.failed)][-FAILED_LIMIT:]
        out.status["failedSettings"] = failed
        if decision.trigger in OOM_TRIGGERS:
            out.events.append((events.WARNING, "OOMDetected", decision.reason))
    if decision.good is not None and decision.good != state.last_good:
        out.status["lastGoodSettings"] = statuses.build_settings(decision.good)

    rollout_active = state.rollout is not None and decision.trigger in (
        Trigger.ROLLOUT_IN_PROGRESS,
        Trigger.ROLLOUT_PROBATION,
    )
    if change:
        action = HistoryAction.RETUNED if decision.action == Action.RETUNE else HistoryAction.ROLLED_BACK
        add_history(action, dedupe=False)
        out.status["applied"] = statuses.build_settings(decision.settings)
        out.status["lastChangeTime"] = stamp
        out.status["rollout"] = {
            "settings": _wire(decision.settings),
            "startedAt": stamp,
            "deadline": format_time(now + rollout_deadline_seconds),
            "phase": ROLLING_OUT,
            "probationUntil": None,
        }
        out.status["calibration"] = None  # vLLM's report was for the old settings
        out.status["recommendation"] = _recommendation(decision, stamp)
        reason = "Retuned" if action == HistoryAction.RETUNED else "RolledBack"
        kind = events.NORMAL if action == HistoryAction.RETUNED else events.WARNING
        out.events.append((kind, reason, decision.reason))
        out.decisions.append(reason)
        conds.append((ROLLOUT_IN_PROGRESS, conditions.TRUE, reason, decision.reason[:1000]))
    else:
        if state.rollout is not None and not rollout_active:
            out.status["rollout"] = None
            if decision.trigger == Trigger.ROLLOUT_SUCCEEDED:
                out.events.append((events.NORMAL, "RolloutSucceeded", decision.reason))
        if rollout_active and decision.trigger == Trigger.ROLLOUT_PROBATION:
            until = decision.probation_until
            if state.rollout is not None and state.rollout.probation_until is None and until is not None:
                wire = dict(old.get("rollout") or {})
                out.status["rollout"] = {**wire, "phase": PROBATION, "probationUntil": format_time(until)}
            conds.append((ROLLOUT_IN_PROGRESS, conditions.TRUE, "Probation", decision.reason[:1000]))
        elif rollout_active:
            conds.append((ROLLOUT_IN_PROGRESS, conditions.TRUE, "Waiting", decision.reason))
        else:
            conds.append((ROLLOUT_IN_PROGRESS, conditions.FALSE, "Idle", "no rollout in progress"))
        if decision.changes and mode == "Recommend":
            rec = _recommendation(decision, stamp)
            old_rec = old.get("recommendation") or {}
            if (
                _compact(old_rec.get("settings")) != _compact(rec["settings"])
                or old_rec.get("trigger") != rec["trigger"]
            ):
                out.status["recommendation"] = rec
                out.events.append((events.NORMAL, "Recommended", f"mode Recommend: {decision.reason}"))
        elif decision.action == Action.INFEASIBLE:
            conds.append(
                (conditions.INFEASIBLE, conditions.TRUE, str(decision.trigger), decision.reason[:1000])
            )
            if add_history(HistoryAction.INFEASIBLE, dedupe=True):
                out.events.append((events.WARNING, "Infeasible", decision.reason))
                out.decisions.append("Infeasible")
        elif (
            decision.action == Action.HOLD
            and decision.trigger not in QUIET_TRIGGERS
            and add_history(HistoryAction.HELD, dedupe=True)
        ):
            warning = decision.trigger in (*OOM_TRIGGERS, RestartKind.OTHER, Trigger.ROLLOUT_FAILED)
            out.events.append((events.WARNING if warning else events.NORMAL, "Held", decision.reason))
            out.decisions.append("Held")
            if decision.trigger == RestartKind.HOST_OOM_KILLED:
                out.events.append((events.WARNING, "OOMDetected", decision.reason))

    if history_changed:
        out.status["history"] = history
    if observed_kv_tokens and not change and observed_kv_tokens != state.observed_kv_tokens:
        out.status["calibration"] = {"observedKvCacheTokens": observed_kv_tokens}
    out.status["conditions"] = conditions.set_conditions(
        old.get("conditions") or [], conds, generation=generation, now=stamp
    )
    return out


def _compact(wire: Mapping[str, Any] | None) -> dict[str, Any]:
    """A settings object without its null keys (a merge patch deletes them)."""
    return {k: v for k, v in (wire or {}).items() if v is not None}


def _recommendation(decision: Decision, stamp: str) -> dict[str, Any]:
    return {
        "settings": statuses.build_settings(decision.settings),
        "reason": decision.reason[:1000],
        "trigger": str(decision.trigger),
        "time": stamp,
    }
