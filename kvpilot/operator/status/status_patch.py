"""The status document: the one place that writes ``status`` (never via handler return values).

Both writers build their merge patch here: the reconciler (:func:`build_success_status`,
:func:`build_failure_status`) and the closed loop (:func:`build_loop_patch`, from one
:class:`kvpilot.tuner.loop.Decision`). This module owns the status vocabulary: the rollout
phases, which loop decisions are routine, how history is appended (one rule:
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
from kvpilot.operator.errors import Failure
from kvpilot.operator.planning.modes import ModeDecision
from kvpilot.operator.planning.resolve import Inputs
from kvpilot.operator.pods.pod_status import Serving
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import events
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import Action, Decision, HistoryAction, LoopState, RestartKind, Trigger
from kvpilot.tuner.types import GIB, EngineSettings


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

ROLLING_OUT, PROBATION = "RollingOut", "Probation"
"""``status.rollout.phase``: waiting for Ready, then on probation until ``probationUntil``."""
QUIET_TRIGGERS = frozenset(
    {
        Trigger.STEADY,
        Trigger.INSUFFICIENT_DATA,
        Trigger.ROLLOUT_IN_PROGRESS,
        Trigger.ROLLOUT_PROBATION,
        Trigger.ROLLOUT_SUCCEEDED,
    }
)
"""Loop holds that are routine: no history entry, no event. Also quiet: a ``MetricsUnavailable`` hold of a
service whose metrics were never available (:func:`is_quiet_hold`)."""


def is_quiet_hold(decision: Decision, old: Mapping[str, Any]) -> bool:
    """Whether the hold ``decision`` is routine (:data:`QUIET_TRIGGERS`), or "no metrics" for a service whose
    ``MetricsAvailable`` was never True: nothing observed yet (no Prometheus configured, no series yet) is
    no decision; the condition says it, and a Prometheus failure of its own reason (TLS, 401, ...) posts a
    Warning when it starts. (At 1000 new services a ``Held`` entry and event each would be 2000 writes
    saying "no data yet".) Metrics that were there and went are a notable hold."""
    if decision.trigger in QUIET_TRIGGERS:
        return True
    if decision.trigger != Trigger.METRICS_UNAVAILABLE:
        return False
    was = conditions.find_condition(old.get("conditions"), conditions.METRICS_AVAILABLE) or {}
    return was.get("status") != conditions.TRUE
OOM_TRIGGERS = frozenset({RestartKind.CUDA_OOM, RestartKind.HOST_OOM_KILLED})

_SETTINGS_KEYS = tuple(f.alias or n for n, f in api.Settings.model_fields.items())
_BUDGET_KEYS = tuple(f.alias or n for n, f in api.Budget.model_fields.items())

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
    *, time: str, action: HistoryAction, trigger: str, reason: str,
    from_settings: EngineSettings | None = None, to_settings: EngineSettings | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One ``status.history`` entry; ``from`` / ``to`` only when given."""
    entry: dict[str, Any] = {
        "time": time, "action": str(action), "trigger": str(trigger), "reason": cap(reason)
    }  # fmt: skip
    if from_settings is not None:
        entry["from"] = api.Settings.from_engine(from_settings).wire()
    if to_settings is not None:
        entry["to"] = api.Settings.from_engine(to_settings).wire()
    return entry


def append_history(
    old: Sequence[Mapping[str, Any]], entry: Mapping[str, Any], *, dedupe: bool = False,
    keep: str | None = None,
) -> list[dict[str, Any]] | None:  # fmt: skip
    """The history with ``entry`` appended (the newest :data:`HISTORY_LIMIT` kept); ``None`` when
    ``dedupe`` and the newest entry already says the same: the same action for the same trigger, to
    the same settings (a hold or a verdict that persists is recorded once, not once per tick).
    ``keep``: an action whose newest entry stays, first, when older entries are dropped (an EngineTuner's
    ``Planned`` entry: where its loop starts from,
    :func:`kvpilot.operator.enginetuner.target_loop.compute_current`)."""
    if dedupe and old:
        last = old[-1]
        if (last.get("action"), last.get("trigger"), compact(last.get("to"))) == (
            entry.get("action"), entry.get("trigger"), compact(entry.get("to"))
        ):  # fmt: skip
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
        "settings": build_settings(settings), "reason": cap(reason), "trigger": str(trigger), "time": time
    }  # fmt: skip


def build_rollout(
    settings: EngineSettings, started: float, deadline: float, choice: RolloutChoice | None = None
) -> dict[str, Any]:
    """``status.rollout`` of a change just applied: rolling out until Ready or ``deadline``, with the
    strategy it uses and why (``choice``)."""
    return {
        "settings": api.Settings.from_engine(settings).wire(),
        "startedAt": format_time(started),
        "deadline": format_time(deadline),
        "phase": ROLLING_OUT,
        "probationUntil": None,
        "strategy": choice.strategy if choice is not None else None,
        "reason": cap(choice.reason) if choice is not None else None,
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
        fields = {
            k: v for k, v in self.status.items() if not (old.get(k) == v and (k in old or v is None))
        }  # fmt: skip
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
    {"Applied", "Serving", "Starting", "StartupFailure", "CrashLoopBackOff", "ImagePullBackOff",
     "ErrImagePull", "InvalidImageName", "Unschedulable", "Downloading",
     "ReplicaLost"}
)  # fmt: skip
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
        (conditions.AVAILABLE, conditions.TRUE if serving.available else conditions.FALSE,
         "Serving" if serving.available else not_serving, serving.message),
        (conditions.DEGRADED, conditions.TRUE if degraded else conditions.FALSE,
         serving.degraded_reason or "Healthy", serving.message if degraded else "no pod reports a fault"),
    ]  # fmt: skip
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


def build_serving_patch(
    old: Mapping[str, Any], serving: Serving, *, generation: int | None, now: float
) -> StatusPatch:
    """The status patch of the pods' view alone (mode Off, where the loop decides nothing)."""
    updates, fields = build_serving_updates(serving)
    return StatusPatch(
        status=fields, lists=ListPatch(generation, format_time(now), updates=updates, serving=serving)
    )


VANISHED_REASONS = frozenset({"ConfigNotFound"})
"""Resolution failures the closed loop reports between reconciles: a Secret, key or ConfigMap the spec
names that is gone (the reconciler runs on spec changes only, and a Hub-config cache hit needs no read)."""


def build_resolution_updates(
    old: Mapping[str, Any], failure: Failure | None
) -> tuple[list[Update], list[tuple[str, str, str]]]:
    """The closed loop's ``ConfigResolved`` from its own resolve of this tick, and the events: False with the
    reason when a reference vanished (a Warning the first time), True again once it is back. Other
    failures (a Hub outage) and an unchanged verdict write nothing: the reconciler's stands."""
    current = conditions.find_condition(old.get("conditions"), conditions.CONFIG_RESOLVED) or {}
    if failure is not None and failure.reason in VANISHED_REASONS:
        update = (conditions.CONFIG_RESOLVED, conditions.FALSE, failure.reason, failure.message)
        fresh = (current.get("status"), current.get("reason")) != (conditions.FALSE, failure.reason)
        return [update], ([(events.WARNING, failure.reason, failure.message)] if fresh else [])
    vanished = current.get("status") == conditions.FALSE and current.get("reason") in VANISHED_REASONS
    if failure is None and vanished:
        back = "the ConfigMap, Secret and keys the spec names are readable again"
        update = (conditions.CONFIG_RESOLVED, conditions.TRUE, "Resolved", back)
        return [update], [(events.NORMAL, "Resolved", back)]
    return [], []


# --- the reconciler -------------------------------------------------------------------------------------


def build_success_status(
    old: Mapping[str, Any], *, generation: int | None, now: str, inputs: Inputs, decision: ModeDecision,
    trigger: str, selector: str | None = None,
) -> StatusPatch:  # fmt: skip
    """Status after the Deployment and Service were applied with ``decision.deploy``; ``selector``: the pods'
    label selector (``status.selector``, which the ``/scale`` subresource serves to autoscalers)."""
    plan, gpu = decision.plan, inputs.gpu
    applied = build_settings(decision.deploy)
    planned_text = vllm.describe_settings(plan.settings)
    b = plan.budget
    updates = [
        (conditions.CONFIG_RESOLVED, conditions.TRUE, "Resolved",
         f"model config from {inputs.model.origin}; GPU {gpu.gpu.name} from {gpu.origin}"),
        (conditions.PLANNED, conditions.TRUE, "Planned",
         f"{planned_text}; KV cache {b.available_kv_cache_gib:.2f} GiB = {b.kv_cache_tokens} tokens, "
         f"{plan.concurrency_at_max_len:.1f} requests at max-model-len"),
        (conditions.INFEASIBLE, conditions.FALSE, "Feasible", "the plan fits the GPUs"),
        (conditions.READY, conditions.TRUE, "Applied", _ready_message(decision)),
    ]  # fmt: skip
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
        "warnings": [*gpu.warnings, *plan.warnings][:WARNINGS_LIMIT],
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
            time=now, action=HistoryAction.PLANNED, trigger=trigger,
            reason=f"{decision.mode}: {vllm.describe_settings(decision.deploy)}",
        )  # fmt: skip
        if old_applied:
            entry["from"] = compact(old_applied)
        entry["to"] = compact(applied)
        lists.history.append((entry, False))
    return StatusPatch(status=patch, lists=lists)


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
    """Status after a failed reconciliation: Ready=False with the reason; the Deployment is untouched."""
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
    return StatusPatch(status={"observedGeneration": generation}, lists=lists)


# --- the closed loop ------------------------------------------------------------------------------------


SCALE_OUT_CLEARED_BY = frozenset({Trigger.STEADY, Trigger.IDLE_CAPACITY})
"""Triggers that say the pressure is gone: a standing scale-out recommendation is withdrawn."""


def build_scale_out(
    old: Mapping[str, Any], decision: Decision, stamp: str, out_events: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """``status.recommendation.replicas`` (a merge into the recommendation) and a ``ScaleOutRecommended``
    event when the decision recommends more replicas than the standing recommendation; the replicas withdrawn
    once the pressure is gone. Nothing when neither changes."""
    was = (old.get("recommendation") or {}).get("replicas")
    if decision.scale_out is not None and decision.scale_out != was:
        out_events.append((events.NORMAL, "ScaleOutRecommended",
                           f"tuning is at its floor; {decision.scale_out} replicas recommended "
                           f"(spec.replicas or the autoscaler decides): {decision.reason}"))  # fmt: skip
        return {"recommendation": {"replicas": decision.scale_out, "reason": decision.reason,
                                   "trigger": str(decision.trigger), "time": stamp}}  # fmt: skip
    if decision.scale_out is None and was is not None and decision.trigger in SCALE_OUT_CLEARED_BY:
        return {"recommendation": {"replicas": None}}
    return {}


def build_loop_patch(
    old: Mapping[str, Any],
    state: LoopState,
    decision: Decision,
    *,
    mode: str,
    now: float,
    generation: int | None,
    applied: bool,
    rollout_deadline_seconds: float,
    serving: Serving | None = None,
    rollout_choice: RolloutChoice | None = None,
    extra_conditions: Sequence[Update] = (),
) -> StatusPatch:
    """The status after ``decision``. ``applied``: the Deployment was updated with ``decision.settings``
    using ``rollout_choice``'s strategy; ``serving``: what the pods say (``Available``, ``Degraded``,
    ``Ready``, replica counts); ``extra_conditions``: the loop's other views (``Schedulable``)."""
    out = StatusPatch()
    stamp = format_time(now)
    metrics_status, observed_kv_tokens = decision.metrics, decision.observed_kv_tokens
    if metrics_status is None:
        raise ValueError("a Decision from compute_decision carries its metrics status")
    available = conditions.TRUE if metrics_status.available else conditions.FALSE
    conds: list[Update] = [
        (conditions.METRICS_AVAILABLE, available, metrics_status.reason, metrics_status.message)
    ]
    was = conditions.find_condition(old.get("conditions"), conditions.METRICS_AVAILABLE) or {}
    if metrics_status.reason in conditions.PROMETHEUS_FAILURES and was.get("reason") != metrics_status.reason:
        out.events.append((events.WARNING, metrics_status.reason, metrics_status.message))  # TLS, 401, ...
    lists = out.lists = ListPatch(generation, stamp)
    history: list[dict[str, Any]] = [dict(e) for e in old.get("history") or ()]
    change = decision.changes and mode == "Auto" and applied

    def add_history(action: HistoryAction, *, dedupe: bool) -> bool:
        """Append an entry (on the freshest history, by :class:`ListPatch`); whether it is new here."""
        nonlocal history
        entry = build_history_entry(
            time=stamp, action=action, trigger=decision.trigger, reason=decision.reason,
            from_settings=state.current, to_settings=decision.recommended or decision.settings,
        )  # fmt: skip
        new = append_history(history, entry, dedupe=dedupe)
        if new is None:
            return False
        history = new
        lists.history.append((entry, dedupe))
        return True

    # failed and good settings: evidence, whatever the mode
    if decision.failed is not None and decision.failed not in state.failed:
        out.status["failedSettings"] = append_failed(old.get("failedSettings") or (), decision.failed)
        if decision.trigger in OOM_TRIGGERS:
            out.events.append((events.WARNING, "OOMDetected", decision.reason))
    if decision.good is not None and decision.good != state.last_good:
        out.status["lastGoodSettings"] = build_settings(decision.good)

    rollout_active = state.rollout is not None and decision.trigger in (
        Trigger.ROLLOUT_IN_PROGRESS,
        Trigger.ROLLOUT_PROBATION,
        Trigger.ROLLOUT_PENDING,
    )
    if change:
        action = HistoryAction.RETUNED if decision.action == Action.RETUNE else HistoryAction.ROLLED_BACK
        add_history(action, dedupe=False)
        out.status["applied"] = build_settings(decision.settings)
        out.status["lastChangeTime"] = stamp
        out.status["rollout"] = build_rollout(
            decision.settings, now, now + rollout_deadline_seconds, rollout_choice
        )
        out.status["calibration"] = None  # vLLM's report was for the old settings
        out.status["recommendation"] = build_recommendation(
            decision.settings, decision.reason, decision.trigger, stamp
        )
        reason = "Retuned" if action == HistoryAction.RETUNED else "RolledBack"
        kind = events.NORMAL if action == HistoryAction.RETUNED else events.WARNING
        how = f" [rollout {rollout_choice.strategy}: {rollout_choice.reason}]" if rollout_choice else ""
        out.events.append((kind, reason, decision.reason + how))
        out.decisions.append(reason)
        conds.append((conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, reason, decision.reason))
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
            conds.append((conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, "Probation", decision.reason))
        elif rollout_active:
            conds.append((conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, "Waiting", decision.reason))
        elif decision.recommended is not None:
            conds.append((conditions.ROLLOUT_IN_PROGRESS, conditions.FALSE, "Held", decision.reason))
        else:
            conds.append((conditions.ROLLOUT_IN_PROGRESS, conditions.FALSE, "Idle", "no rollout in progress"))
        if decision.changes and mode == "Recommend":
            rec = build_recommendation(decision.settings, decision.reason, decision.trigger, stamp)
            old_rec = old.get("recommendation") or {}
            if (
                compact(old_rec.get("settings")) != compact(rec["settings"])
                or old_rec.get("trigger") != rec["trigger"]
            ):
                out.status["recommendation"] = rec
                out.events.append((events.NORMAL, "Recommended", f"mode Recommend: {decision.reason}"))
        elif decision.action == Action.INFEASIBLE:
            conds.append((conditions.INFEASIBLE, conditions.TRUE, str(decision.trigger), decision.reason))
            if add_history(HistoryAction.INFEASIBLE, dedupe=True):
                out.events.append((events.WARNING, "Infeasible", decision.reason))
                out.decisions.append("Infeasible")
        elif (
            decision.action == Action.HOLD
            and not is_quiet_hold(decision, old)
            and add_history(HistoryAction.HELD, dedupe=True)
        ):
            warning = decision.trigger in (
                *OOM_TRIGGERS, RestartKind.OTHER, RestartKind.INVALID_ENGINE_ARGS, Trigger.ROLLOUT_FAILED
            )
            out.events.append((events.WARNING if warning else events.NORMAL, "Held", decision.reason))
            out.decisions.append("Held")
            if decision.trigger == RestartKind.HOST_OOM_KILLED:
                out.events.append((events.WARNING, "OOMDetected", decision.reason))

    if decision.recommended is not None:  # a rollout gate held it: what it would do stays visible
        rec = build_recommendation(decision.recommended, decision.reason, decision.trigger, stamp)
        was = old.get("recommendation") or {}
        if compact(was.get("settings")) != compact(rec["settings"]) or was.get("trigger") != rec["trigger"]:
            out.status["recommendation"] = rec
    scale_out = build_scale_out(old, decision, stamp, out.events).get("recommendation")
    if scale_out is not None:
        out.status["recommendation"] = {**(out.status.get("recommendation") or {}), **scale_out}
    if observed_kv_tokens and not change and observed_kv_tokens != state.observed_kv_tokens:
        out.status["calibration"] = {"observedKvCacheTokens": observed_kv_tokens}
    if serving is not None:
        updates, fields = build_serving_updates(serving)
        conds.extend(updates)
        out.status.update(fields)
        lists.serving = serving
    conds.extend(extra_conditions)
    lists.updates = conds
    return out
