"""The status document: the one place that writes ``status`` (never via handler return values).

Every writer builds its merge patch in this package: the reconciler in :mod:`.reconcile_status`
(:func:`~.reconcile_status.build_success_status`, :func:`~.reconcile_status.build_failure_status`), the
closed loop in :mod:`.loop_patch` (from one tick's
:class:`~kvpilot.operator.status.loop_patch.LoopTick`), the EngineTuner in :mod:`.tuner_status`; none edits a
built patch. This module owns the status vocabulary: how history is appended (one rule:
:func:`append_history`), and the caps, which it asks of their homes: list lengths of the
pydantic status model (:class:`kvpilot.operator.api.InferenceServiceStatus`, drift-tested against
the CRD), the message cap of :data:`kvpilot.operator.status.events.MAX_MESSAGE`, the condition types
of :mod:`kvpilot.operator.conditions`.

kopf applies the fields as JSON merge patches, where an absent key keeps its old value;
so objects that must be *replaced* (the settings objects, the budget, the GPU) carry
every key, with ``None`` for the unset ones, which deletes them. Pure functions of the
old status and the decision; the clock comes in as ``now``.

One writer per field: the two lists two writers share, ``conditions`` (a list map keyed by ``type``
in the CRD) and ``history``, are never in the merge patch, which would replace them whole with what
the writer read when it started (so the closed loop's tick, begun before a spec update, would put back
the old ``Ready``). Each writer's :class:`ListPatch` instead sets only its own condition types and appends
its entries, on the freshest object: kopf runs it as a patch function (``kopf.Patch.fns``) on the body
the API server returned for the merge patch and sends the difference as a JSON patch guarded by a
``test`` of ``resourceVersion``, retried on conflict. Server-side apply with a field manager per writer
was the alternative; kopf writes status with merge and JSON patches only, and ``history`` is an atomic
list that SSA would replace whole as well.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.status import events
from kvpilot.tuner.loop import HistoryAction
from kvpilot.tuner.types import EngineSettings


def _max_items(name: str) -> int:
    """The ``max_length`` of a list of :class:`api.InferenceServiceStatus` (the CRD's ``maxItems``)."""
    for constraint in api.InferenceServiceStatus.model_fields[name].metadata:
        limit = getattr(constraint, "max_length", None)
        if isinstance(limit, int):
            return limit
    raise LookupError(f"status.{name} has no max_length")


HISTORY_LIMIT = _max_items("history")
"""``status.history`` keeps the newest this many entries."""
FAILED_LIMIT = _max_items("failed_settings")
"""``status.failedSettings`` keeps the newest this many."""
WARNINGS_LIMIT = _max_items("warnings")
"""``status.warnings`` keeps the first this many."""
MAX_MESSAGE = events.MAX_MESSAGE
"""Condition messages, history and recommendation reasons are cut here, like event messages."""

_SETTINGS_KEYS = tuple(f.alias or n for n, f in api.Settings.model_fields.items())

Update = tuple[str, str, str, str]
"""A condition update: ``(type, status, reason, message)``."""


# --- typed parts ---------------------------------------------------------------------------------------


def format_time(epoch: float) -> str:
    """Epoch seconds as the RFC 3339 text of every ``status`` time."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cap(message: str) -> str:
    """``message`` cut at :data:`MAX_MESSAGE` (the start carries the reason)."""
    return message[:MAX_MESSAGE]


def build_settings(settings: EngineSettings | None) -> dict[str, Any] | None:
    """A settings object in wire form with every key present (merge-patch replaces it whole)."""
    if settings is None:
        return None
    wire = api.Settings.from_engine(settings).wire()
    return {key: wire.get(key) for key in _SETTINGS_KEYS}


def compact(wire: Mapping[str, Any] | None) -> dict[str, Any]:
    """A settings object without its null keys (what a merge patch leaves in the object)."""
    return {k: v for k, v in (wire or {}).items() if v is not None}


def build_history_entry(
    *,
    time: str,
    action: HistoryAction,
    trigger: str,
    reason: str,
    from_settings: EngineSettings | None = None,
    to_settings: EngineSettings | None = None,
    from_engine_args: Sequence[str] | None = None,
    to_engine_args: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One ``status.history`` entry; ``from`` / ``to`` (vLLM's settings) and ``fromEngineArgs`` /
    ``toEngineArgs`` (another engine's flags) only when given."""
    entry: dict[str, Any] = {
        "time": time,
        "action": str(action),
        "trigger": str(trigger),
        "reason": cap(reason),
    }
    if from_settings is not None:
        entry["from"] = api.Settings.from_engine(from_settings).wire()
    if to_settings is not None:
        entry["to"] = api.Settings.from_engine(to_settings).wire()
    if from_engine_args is not None:
        entry["fromEngineArgs"] = list(from_engine_args)
    if to_engine_args is not None:
        entry["toEngineArgs"] = list(to_engine_args)
    return entry


def append_history(
    old: Sequence[Mapping[str, Any]],
    entry: Mapping[str, Any],
    *,
    dedupe: bool = False,
    keep: str | None = None,
) -> list[dict[str, Any]] | None:
    """The history with ``entry`` appended (the newest :data:`HISTORY_LIMIT` kept); ``None`` when
    ``dedupe`` and the newest entry already says the same: the same action for the same trigger, to
    the same settings (a hold or a verdict that persists is recorded once, not once per tick).
    ``keep``: an action whose newest entry stays, first, when older entries are dropped (an EngineTuner's
    ``Planned`` entry: where its loop starts from,
    :func:`kvpilot.operator.enginetuner.target_loop.compute_current`)."""
    if dedupe and old:
        last = old[-1]
        if (last.get("action"), last.get("trigger"), compact(last.get("to")), last.get("toEngineArgs")) == (
            entry.get("action"),
            entry.get("trigger"),
            compact(entry.get("to")),
            entry.get("toEngineArgs"),
        ):
            return None
    history = [*(dict(e) for e in old), dict(entry)]
    kept = max((i for i, e in enumerate(history) if keep is not None and e.get("action") == keep), default=-1)
    if 0 <= kept < len(history) - HISTORY_LIMIT:
        rest = history[:kept] + history[kept + 1 :]
        return [history[kept], *rest[-(HISTORY_LIMIT - 1) :]]
    return history[-HISTORY_LIMIT:]


def append_failed(old: Sequence[Mapping[str, Any]], settings: EngineSettings) -> list[dict[str, Any]]:
    """``status.failedSettings`` with ``settings`` added (the newest :data:`FAILED_LIMIT` kept)."""
    return [*(dict(w) for w in old), api.Settings.from_engine(settings).wire()][-FAILED_LIMIT:]


def build_recommendation(settings: EngineSettings, reason: str, trigger: str, time: str) -> dict[str, Any]:
    """``status.recommendation``."""
    return {
        "settings": build_settings(settings),
        "reason": cap(reason),
        "trigger": str(trigger),
        "time": time,
    }


def set_conditions(
    old: Mapping[str, Any], updates: Sequence[Update], *, generation: int | None, now: str
) -> list[dict[str, Any]]:
    """``status.conditions`` with ``updates`` applied, each message capped."""
    capped = [(type_, status, reason, cap(message)) for type_, status, reason, message in updates]
    return conditions.set_conditions(old.get("conditions") or [], capped, generation=generation, now=now)


@dataclass
class ListPatch:
    """One writer's share of ``status.conditions`` and ``status.history``, applied to the freshest object
    (a ``kopf.Patch.fns`` function: called with the raw body, changes it in place).

    ``updates`` set those condition types only; ``serving`` adds ``Ready`` from the pods when the *fresh*
    status says the reconciler applied this generation (:func:`build_ready_update`); ``history`` entries
    are appended (``dedupe``: not when the newest entry says the same; an entry already there, from an
    earlier try of the same patch, is not added twice)."""

    generation: int | None
    now: str
    updates: list[Update] = field(default_factory=list)
    history: list[tuple[dict[str, Any], bool]] = field(default_factory=list)
    serving: Serving | None = None
    keep: str | None = None
    """A history action whose newest entry is never dropped (:func:`append_history`)."""

    def __call__(self, body: MutableMapping[str, Any]) -> None:
        status = body.get("status")
        if not isinstance(status, MutableMapping):
            status = body["status"] = {}
        updates = list(self.updates)
        if self.serving is not None:
            updates.extend(build_ready_update(status, self.serving, generation=self.generation))
        if updates:
            status["conditions"] = set_conditions(status, updates, generation=self.generation, now=self.now)
        history = [dict(e) for e in status.get("history") or ()]
        changed = False
        for entry, dedupe in self.history:
            if entry in history:
                continue
            new = append_history(history, entry, dedupe=dedupe, keep=self.keep)
            if new is not None:
                history, changed = new, True
        if changed:
            status["history"] = history

    def apply_to(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """``status`` with this applied (a copy): what the writer's own later steps may read."""
        body: dict[str, Any] = {"status": dict(status)}
        self(body)
        return dict(body["status"])


@dataclass
class StatusPatch:
    """A merge patch for ``status``, the writer's :class:`ListPatch`, and the events that go with them."""

    status: dict[str, Any] = field(default_factory=dict)
    lists: ListPatch | None = None
    """``conditions`` and ``history``: ``kopf.Patch.fns``, never in :attr:`status`."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """``(type, reason, message)``."""
    decisions: list[str] = field(default_factory=list)
    """``kvpilot_decisions_total`` kinds to count."""

    def add_to(
        self, patch: Any, *, merged_on: Mapping[str, Any] | None = None, old: Mapping[str, Any] | None = None
    ) -> None:
        """Put it into a ``kopf.Patch``: the fields merged, the lists as a patch function.

        ``old``: the status read; a field that already has its value there is left out, so that a tick that
        changes nothing sends nothing (kopf sends a non-empty merge patch as it is: at 1000 services, one
        PATCH per service per tick otherwise; docs/operator.md, "Scale"). The lists' patch function is sent
        only when it changes something anyway.

        ``merged_on``: the status the lists are computed on, merged whole into the same merge patch
        instead: one PATCH instead of two (kopf sends a patch function as a second, JSON patch). Only for
        a writer that knows no other writer has touched the lists yet: the first reconcile of an object
        (no conditions, no history), which also sets the ``status.applied`` the closed loop waits for."""
        unchanged = {k for k, v in self.status.items() if old is not None and k in old and old[k] == v}
        patch.status.update({k: v for k, v in self.status.items() if k not in unchanged})
        if self.lists is None:
            return
        if merged_on is None:
            patch.fns.append(self.lists)
            return
        listed = self.lists.apply_to(merged_on)
        for key in ("conditions", "history"):
            if key in listed and listed[key] != merged_on.get(key):
                patch.status[key] = listed[key]

    def build_conditional(
        self, old: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any] | None:
        """The whole write as one merge patch of ``status`` made on ``old``: the fields that change, and the
        lists computed on ``old`` (so whole, as a merge patch replaces them), with ``resource_version`` (the
        one ``old`` was read at) as its precondition: the API server refuses it (HTTP 409) if any other
        writer came between, so the lists are never put back stale (the closed loop's single write:
        :mod:`kvpilot.operator.status.status_write`). ``None`` when it changes nothing."""
        fields = {k: v for k, v in self.status.items() if not (old.get(k) == v and (k in old or v is None))}
        if self.lists is not None:
            listed = self.lists.apply_to(old)
            for key in ("conditions", "history"):
                if key in listed and listed[key] != old.get(key):
                    fields[key] = listed[key]
        if not fields:
            return None
        out: dict[str, Any] = {"status": fields}
        if resource_version is not None:
            out["metadata"] = {"resourceVersion": resource_version}
        return out


def is_first_write(status: Mapping[str, Any]) -> bool:
    """Whether nobody has written ``status.conditions`` or ``status.history`` yet (see
    :meth:`StatusPatch.add_to`)."""
    return not status.get("conditions") and not status.get("history")


# --- serving: what the pods say --------------------------------------------------------------------------

SERVING_REASONS = frozenset(
    {
        "Applied",
        "Serving",
        "Starting",
        "StartupFailure",
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "Unschedulable",
        "Downloading",
        "ReplicaLost",
    }
)
"""``Ready`` reasons that mean "the reconciler applied the spec": only those may the pods' view turn into
serving or not; a reconcile failure (``InvalidSpec``, ...) keeps its own ``Ready``."""


def reconcile_succeeded(status: Mapping[str, Any]) -> bool:
    """Whether the reconciler's last verdict was "applied": ``Ready`` is True, or False only because the
    pods do not serve yet (a crash loop, no node, ...), which the closed loop decides, not the reconciler."""
    ready = next((c for c in status.get("conditions") or () if c.get("type") == conditions.READY), None)
    if ready is None:
        return False
    return ready.get("status") == conditions.TRUE or ready.get("reason") in SERVING_REASONS


def build_serving_updates(serving: Serving) -> tuple[list[Update], dict[str, Any]]:
    """The ``Available`` and ``Degraded`` conditions and ``replicas`` / ``readyReplicas`` from the pods."""
    not_serving = serving.degraded_reason or "Starting"
    degraded = serving.degraded_reason is not None
    updates: list[Update] = [
        (
            conditions.AVAILABLE,
            conditions.TRUE if serving.available else conditions.FALSE,
            "Serving" if serving.available else not_serving,
            serving.message,
        ),
        (
            conditions.DEGRADED,
            conditions.TRUE if degraded else conditions.FALSE,
            serving.degraded_reason or "Healthy",
            serving.message if degraded else "no pod reports a fault",
        ),
    ]
    return updates, {"replicas": serving.replicas, "readyReplicas": serving.ready_replicas}


def build_ready_update(
    status: Mapping[str, Any], serving: Serving, *, generation: int | None
) -> list[Update]:
    """``Ready`` from the pods, or nothing: it follows ``Available`` only while the reconciler's verdict for
    ``generation`` was "applied" in ``status`` (the freshest one: see :class:`ListPatch`); a spec the
    reconciler has not handled yet, or refused, keeps the reconciler's ``Ready``."""
    ready = conditions.find_condition(status.get("conditions"), conditions.READY)
    if ready is None or status.get("observedGeneration") != generation:
        return []
    if ready.get("reason") not in SERVING_REASONS:
        return []
    if serving.available:
        return [(conditions.READY, conditions.TRUE, "Serving", serving.message)]
    return [(conditions.READY, conditions.FALSE, serving.degraded_reason or "Starting", serving.message)]
