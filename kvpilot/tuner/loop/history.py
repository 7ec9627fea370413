"""The tuning history: what kvpilot decided, when and why (``status.history`` in the cluster).

A bounded, append-only record, newest last. The policy reads it to enforce cooldown and
the changes-per-hour limit, to escalate repeated OOM remedies and to avoid raising a
setting straight back to where pressure forced it down. The operator converts it to and
from ``status.history`` entries (``time`` as RFC 3339 there, epoch seconds here).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvpilot.tuner.types import EngineSettings

HISTORY_LIMIT = 20
"""Entries kept in ``status.history`` (the API contract's bound)."""


class HistoryAction(enum.StrEnum):
    """``status.history[].action``."""

    PLANNED = "Planned"
    RETUNED = "Retuned"
    ROLLED_BACK = "RolledBack"
    HELD = "Held"
    INFEASIBLE = "Infeasible"


CHANGES = frozenset({HistoryAction.PLANNED, HistoryAction.RETUNED, HistoryAction.ROLLED_BACK})
"""Actions that changed the Deployment's settings."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One decision. ``from_settings``/``to_settings`` are equal for holds, except a hold of the rollout
    gates (``Decision.recommended``): ``to_settings`` is what it would have rolled out."""

    time: float
    action: HistoryAction
    trigger: str
    reason: str
    from_settings: EngineSettings
    to_settings: EngineSettings

    @property
    def is_change(self) -> bool:
        return self.action in CHANGES and self.from_settings != self.to_settings


def compute_last_change_time(history: tuple[HistoryEntry, ...]) -> float | None:
    """When the settings last changed (Planned entries count: the first rollout is a change)."""
    times = [e.time for e in history if e.action in CHANGES]
    return max(times) if times else None


def compute_last_retune_time(history: tuple[HistoryEntry, ...]) -> float | None:
    """When the settings last changed other than by the initial plan (the cooldown counts from here:
    the plan judged nothing, so the first metrics-driven change waits only for fresh samples)."""
    times = [e.time for e in history if e.action in CHANGES and e.action != HistoryAction.PLANNED]
    return max(times) if times else None


def compute_compiled_settings(history: tuple[HistoryEntry, ...]) -> tuple[EngineSettings, ...]:
    """Settings that ran since the latest plan: the ``from`` side of every retune and rollback after it
    (each ran until that change; the current settings are the caller's). vLLM compiled their graphs when
    they started (the profile run compiles before the KV cache is checked), so on a persistent compile
    cache a change back to one of them starts warm. A plan may change the model, release or image, which
    all enter vLLM's hash: nothing before it counts."""
    plans = [i for i, e in enumerate(history) if e.action == HistoryAction.PLANNED]
    since = plans[-1] + 1 if plans else 0
    return tuple(e.from_settings for e in history[since:] if e.is_change)


def compute_changes_since(history: tuple[HistoryEntry, ...], since: float) -> int:
    """Retunes and rollbacks strictly after ``since`` (the initial plan is not counted)."""
    return sum(1 for e in history if e.is_change and e.action != HistoryAction.PLANNED and e.time > since)


def compute_recent_streak(history: tuple[HistoryEntry, ...], trigger: str, since: float) -> int:
    """How many of the latest changes after ``since`` in a row were made for ``trigger``."""
    streak = 0
    for entry in reversed(history):
        if entry.time <= since:
            break
        if not entry.is_change:
            continue
        if entry.trigger != trigger:
            break
        streak += 1
    return streak


def compute_held_since(history: tuple[HistoryEntry, ...], trigger: str) -> float | None:
    """Since when the loop has held for ``trigger`` without a break: the oldest of the newest entries in
    a row that are holds for ``trigger`` (whatever they would have rolled out), ``None`` when the newest
    entry is anything else. A hold persists in the history once (the operator dedupes it), so this is
    how long the condition has lasted, not how many ticks saw it."""
    since = None
    for entry in reversed(history):
        if entry.action != HistoryAction.HELD or entry.trigger != trigger:
            break
        since = entry.time
    return since


def compute_pressure_ceiling(history: tuple[HistoryEntry, ...], trigger: str, since: float) -> int | None:
    """The lowest ``max_num_seqs`` at which a ``trigger`` change after ``since`` found pressure: the value it
    lowered *from*, or the value it kept while it grew the KV cache instead (:func:`compute_pressured_seqs`).

    Raising back to it would re-enter the state that caused the pressure, so the idle
    rule stays below it for a while (anti-flapping).
    """
    ceilings = [
        seqs
        for e in history
        if e.time > since
        for seqs in (compute_pressured_seqs(e, trigger),)
        if seqs is not None
    ]
    return min(ceilings) if ceilings else None


def compute_pressured_seqs(entry: HistoryEntry, trigger: str) -> int | None:
    """The ``max_num_seqs`` that ``entry``, a ``trigger`` change, found under pressure, or ``None``: the value
    it cut from, or the value it kept while it grew the KV cache (fp8, more utilisation, a smaller prefill
    chunk). Either way that many sequences filled the cache the service had then; a growth that keeps the
    limit answers the pressure no less than a cut does, and a raise past the limit straight after it is
    what the pressure ruled out (bench long-output-bursts: pressure at 139 grew the cache by 5 %, the next
    calm window raised 139 -> 146, and the next burst cut it to 109: a fourth rollout)."""
    if not entry.is_change or entry.trigger != trigger:
        return None
    before, after = entry.from_settings.max_num_seqs, entry.to_settings.max_num_seqs
    if before is None or after is None or after > before:
        return None
    return before


def compute_recurring_cut(
    history: tuple[HistoryEntry, ...], trigger: str, *, since: float, gap: float
) -> int | None:
    """The ``max_num_seqs`` the latest ``trigger`` cut after ``since`` set, when another ``trigger`` change
    came at most ``gap`` seconds before it (``None`` otherwise): pressure that came back is the service's
    peak load, not a transient, and what its last cut settled on is what that peak holds."""
    changes = [e for e in history if e.is_change and e.trigger == trigger]
    cuts = [
        e
        for e in changes
        if e.time > since
        and e.from_settings.max_num_seqs is not None
        and e.to_settings.max_num_seqs is not None
        and e.to_settings.max_num_seqs < e.from_settings.max_num_seqs
    ]
    if not cuts:
        return None
    last = cuts[-1]
    if not any(last.time - gap <= e.time < last.time for e in changes):
        return None
    return last.to_settings.max_num_seqs


def compute_unanswered_cut(history: tuple[HistoryEntry, ...], trigger: str) -> int | None:
    """The ``max_num_seqs`` the latest ``trigger`` change found under pressure (cut from, or kept while the
    cache grew: :func:`compute_pressured_seqs`), when no change has raised ``max_num_seqs`` since (``None``
    otherwise): the cut is still what the service knows of its peak load."""
    for e in reversed(history):
        if not e.is_change or e.from_settings.max_num_seqs is None or e.to_settings.max_num_seqs is None:
            continue
        if e.to_settings.max_num_seqs > e.from_settings.max_num_seqs:
            return None
        pressured = compute_pressured_seqs(e, trigger)
        if pressured is not None:
            return pressured
    return None


def build_history(
    history: tuple[HistoryEntry, ...], entry: HistoryEntry, limit: int = HISTORY_LIMIT
) -> tuple[HistoryEntry, ...]:
    """``history`` with ``entry`` appended, oldest entries dropped beyond ``limit``."""
    return (*history, entry)[-limit:]
