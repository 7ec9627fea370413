"""The closed loop's status: one tick's whole patch, built in one go from a :class:`LoopTick`.

Both kinds' ticks (:mod:`kvpilot.operator.inferenceservice.closed_loop`,
:mod:`kvpilot.operator.enginetuner.target_loop`) hand over what they read and decided; no caller edits the
patch after it is built. :func:`build_loop_patch` is a chain of named steps (:data:`LOOP_STEPS`), each
adding its fields, events and history entries to the patch under construction and returning its condition
updates, in the order the conditions are set:

1. ``MetricsAvailable``, and a Warning when Prometheus starts failing for a reason of its own;
2. the evidence: ``failedSettings`` (and ``OOMDetected``), ``lastGoodSettings``;
3. a change applied (mode Auto): its history entry, ``applied``, ``rollout``, the event;
4. otherwise the rollout being judged (cleared, on probation, waiting) and ``RolloutInProgress``;
5. otherwise the verdict: a recommendation (mode Recommend), ``Infeasible``, or a notable hold;
6. a recommendation a rollout gate held back, the scale-out recommendation, vLLM's KV report;
7. what the pods say (``Available``, ``Degraded``, the replica counts) and the tick's other views;
8. the rollout's deadline moved by a new pod, the measured start-up time, ``ConfigResolved``;
9. the kind's own fields (an EngineTuner applies nothing: no ``applied``, no ``calibration``).

The vocabulary the loop's status shares with the reconciler's (settings, history, caps, lists) is
:mod:`.status_patch`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpilot.operator import api, conditions
from kvpilot.operator.errors import Failure
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import events
from kvpilot.operator.status.status_patch import (
    ListPatch,
    StatusPatch,
    Update,
    append_failed,
    append_history,
    build_history_entry,
    build_recommendation,
    build_serving_updates,
    build_settings,
    cap,
    compact,
    format_time,
    reconcile_succeeded,
)
from kvpilot.tuner.loop import Action, Decision, HistoryAction, LoopState, RestartKind, RolloutState, Trigger
from kvpilot.tuner.types import EngineSettings

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
OOM_TRIGGERS = frozenset({RestartKind.CUDA_OOM, RestartKind.HOST_OOM_KILLED})
ROLLOUT_ACTIVE = frozenset({Trigger.ROLLOUT_IN_PROGRESS, Trigger.ROLLOUT_PROBATION, Trigger.ROLLOUT_PENDING})
"""Triggers of a rollout still being judged."""
SCALE_OUT_CLEARED_BY = frozenset({Trigger.STEADY, Trigger.IDLE_CAPACITY})
"""Triggers that say the pressure is gone: a standing scale-out recommendation is withdrawn."""
VANISHED_REASONS = frozenset({"ConfigNotFound"})
"""Resolution failures the closed loop reports between reconciles: a Secret, key or ConfigMap the spec
names that is gone (the reconciler runs on spec changes only, and a Hub-config cache hit needs no read)."""
KIND_FIELDS: Mapping[str, frozenset[str]] = {
    api.ENGINE_TUNER_KIND: frozenset(f.alias or n for n, f in api.EngineTunerStatus.model_fields.items())
    - {"recommendation"}
}
"""The loop's fields a kind's status has, where not all (an EngineTuner applies nothing; its reconcile
writes the recommendation: :mod:`.tuner_status`)."""


@dataclass(frozen=True)
class LoopTick:
    """What one tick read and decided: everything its status says.

    ``state``: the state read from the status; ``rollout``: the rollout the tick judged (its deadline counted
    from the newest pod of the settings; ``None``: none, or replaced); ``applied``: the workload was updated
    with ``decision.settings`` using ``rollout_choice``'s strategy; ``serving``: what the pods say;
    ``extra_conditions``: the tick's other views (``Schedulable``); ``startup_seconds``: the start-up time
    measured on the pods; ``resolve_failure``: why resolving the model or GPU failed this tick."""

    state: LoopState
    decision: Decision
    rollout: RolloutState | None
    now: float
    generation: int | None
    rollout_deadline_seconds: float
    mode: str = "Auto"
    applied: bool = False
    serving: Serving | None = None
    rollout_choice: RolloutChoice | None = None
    extra_conditions: Sequence[Update] = ()
    startup_seconds: float | None = None
    resolve_failure: Failure | None = None
    kind: str = api.KIND

    @property
    def stamp(self) -> str:
        return format_time(self.now)

    @property
    def changed(self) -> bool:
        """Whether this tick applied a change (mode Auto)."""
        return bool(self.decision.changes) and self.mode == "Auto" and self.applied


Step = Callable[[Mapping[str, Any], LoopTick, StatusPatch], list[Update]]
"""One step of :func:`build_loop_patch`: adds to the patch, returns its condition updates."""


def build_loop_patch(old: Mapping[str, Any], tick: LoopTick) -> StatusPatch:
    """The status after ``tick`` (the chain of :data:`LOOP_STEPS`), on the status ``old`` it read."""
    out = StatusPatch(lists=ListPatch(tick.generation, tick.stamp))
    updates = [update for step in LOOP_STEPS for update in step(old, tick, out)]
    assert out.lists is not None
    out.lists.updates = updates
    return out


def build_off_patch(
    old: Mapping[str, Any],
    serving: Serving,
    *,
    generation: int | None,
    now: float,
    extra_conditions: Sequence[Update] = (),
) -> StatusPatch:
    """The status of the pods' view alone (mode Off, where the loop decides nothing), with the tick's other
    views (``Schedulable``)."""
    updates, fields = build_serving_updates(serving)
    lists = ListPatch(generation, format_time(now), updates=[*updates, *extra_conditions], serving=serving)
    return StatusPatch(status=fields, lists=lists)


ENGINE_NOT_TUNED = "EngineNotTuned"


def build_engine_hold_patch(
    old: Mapping[str, Any], kind: str, mode: str, *, generation: int | None, now: float
) -> StatusPatch | None:
    """The status of a service whose engine the loop has no rules for (``spec.engine.kind`` TGI):
    ``ClosedLoop=False`` (reason ``EngineNotTuned``) saying it holds, and a Normal ``Held`` event; ``None``
    when the condition already says so (at a thousand services each tick's write counts), or while the
    reconciler's verdict is not "applied" (a refused engine: its ``Ready=False`` says enough)."""
    if not reconcile_succeeded(old):
        return None
    running = "the reconciler's plan" if mode == "Auto" else f"{kind}'s own defaults (mode {mode})"
    message = (
        f"the closed loop has no {kind} rules yet (issue 29): it holds and changes nothing (vLLM's remedies "
        f"do not apply to {kind}'s memory model); the pods keep {running}. Retune by changing the spec"
    )
    was = conditions.find_condition(old.get("conditions"), conditions.CLOSED_LOOP) or {}
    if (was.get("status"), was.get("reason"), was.get("message")) == (
        conditions.FALSE,
        ENGINE_NOT_TUNED,
        message,
    ):
        return None
    update = (conditions.CLOSED_LOOP, conditions.FALSE, ENGINE_NOT_TUNED, message)
    out = StatusPatch(status={}, lists=ListPatch(generation, format_time(now), updates=[update]))
    out.events.append((events.NORMAL, "Held", message))
    return out


# --- the steps, in order ---------------------------------------------------------------------------------


def add_metrics(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """``MetricsAvailable``, and a Warning when a Prometheus failure of its own reason (TLS, 401, ...)
    starts."""
    metrics_status = tick.decision.metrics
    if metrics_status is None:
        raise ValueError("a Decision from compute_decision carries its metrics status")
    was = conditions.find_condition(old.get("conditions"), conditions.METRICS_AVAILABLE) or {}
    if metrics_status.reason in conditions.PROMETHEUS_FAILURES and was.get("reason") != metrics_status.reason:
        out.events.append((events.WARNING, metrics_status.reason, metrics_status.message))
    available = conditions.TRUE if metrics_status.available else conditions.FALSE
    return [(conditions.METRICS_AVAILABLE, available, metrics_status.reason, metrics_status.message)]


def add_evidence(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """Failed and good settings: evidence, whatever the mode."""
    decision, state = tick.decision, tick.state
    if decision.failed is not None and decision.failed not in state.failed:
        out.status["failedSettings"] = append_failed(old.get("failedSettings") or (), decision.failed)
        if decision.trigger in OOM_TRIGGERS:
            out.events.append((events.WARNING, "OOMDetected", decision.reason))
    if decision.good is not None and decision.good != state.last_good:
        out.status["lastGoodSettings"] = build_settings(decision.good)
    return []


def add_change(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """A change applied: recorded (history, ``applied``, a new ``rollout``), announced, counted."""
    if not tick.changed:
        return []
    decision, stamp, choice = tick.decision, tick.stamp, tick.rollout_choice
    action = HistoryAction.RETUNED if decision.action == Action.RETUNE else HistoryAction.ROLLED_BACK
    _add_history(old, tick, out, action, dedupe=False)
    out.status["applied"] = build_settings(decision.settings)
    out.status["lastChangeTime"] = stamp
    out.status["rollout"] = build_rollout(
        decision.settings, tick.now, tick.now + tick.rollout_deadline_seconds, choice
    )
    out.status["calibration"] = None  # vLLM's report was for the old settings
    rec = build_recommendation(decision.settings, decision.reason, decision.trigger, stamp)
    out.status["recommendation"] = rec
    reason = "Retuned" if action == HistoryAction.RETUNED else "RolledBack"
    kind = events.NORMAL if action == HistoryAction.RETUNED else events.WARNING
    how = f" [rollout {choice.strategy}: {choice.reason}]" if choice else ""
    out.events.append((kind, reason, decision.reason + how))
    out.decisions.append(reason)
    return [(conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, reason, decision.reason)]


def add_rollout_progress(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """No change: the rollout being judged ends (``RolloutSucceeded``), goes on probation or waits; else
    ``RolloutInProgress`` says why nothing rolls out."""
    if tick.changed:
        return []
    decision = tick.decision
    wire = (old.get("rollout") or {}) if tick.state.rollout is not None else {}
    judged = add_judged_rollout(wire, decision.trigger, decision.probation_until, decision.reason, out)
    if judged is not None:
        return judged
    return build_rollout_idle(decision.recommended is not None, decision.reason)


def add_judged_rollout(
    wire: Mapping[str, Any], trigger: str, probation_until: float | None, reason: str, out: StatusPatch
) -> list[Update] | None:
    """The rollout in ``status.rollout`` (``wire``; empty when there is none), for every engine: it ends
    (cleared, with ``RolloutSucceeded`` when it succeeded), goes on probation (``probationUntil`` recorded
    once) or waits. ``None`` when no rollout is being judged now."""
    active = bool(wire) and trigger in ROLLOUT_ACTIVE
    if wire and not active:
        out.status["rollout"] = None
        if trigger == Trigger.ROLLOUT_SUCCEEDED:
            out.events.append((events.NORMAL, "RolloutSucceeded", reason))
    if not active:
        return None
    if trigger == Trigger.ROLLOUT_PROBATION:
        if wire.get("probationUntil") is None and probation_until is not None:
            until = format_time(probation_until)
            out.status["rollout"] = {**wire, "phase": PROBATION, "probationUntil": until}
        return [(conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, "Probation", reason)]
    return [(conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, "Waiting", reason)]


def add_verdict(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """No change: a recommendation (mode Recommend), ``Infeasible``, or a hold worth a history entry and an
    event (:func:`is_quiet_hold`)."""
    decision = tick.decision
    if tick.changed:
        return []
    if decision.changes and tick.mode == "Recommend":
        rec = build_recommendation(decision.settings, decision.reason, decision.trigger, tick.stamp)
        if _new_recommendation(old, rec):
            out.status["recommendation"] = rec
            out.events.append((events.NORMAL, "Recommended", f"mode Recommend: {decision.reason}"))
        return []
    if decision.action == Action.INFEASIBLE:
        if _add_history(old, tick, out, HistoryAction.INFEASIBLE, dedupe=True):
            out.events.append((events.WARNING, "Infeasible", decision.reason))
            out.decisions.append("Infeasible")
        return [(conditions.INFEASIBLE, conditions.TRUE, str(decision.trigger), decision.reason)]
    if (
        decision.action == Action.HOLD
        and not is_quiet_hold(decision, old)
        and _add_history(old, tick, out, HistoryAction.HELD, dedupe=True)
    ):
        warning = decision.trigger in (
            *OOM_TRIGGERS,
            RestartKind.OTHER,
            RestartKind.INVALID_ENGINE_ARGS,
            RestartKind.DISTRIBUTED_TIMEOUT,
            Trigger.ROLLOUT_FAILED,
        )
        out.events.append((events.WARNING if warning else events.NORMAL, "Held", decision.reason))
        out.decisions.append("Held")
        if decision.trigger == RestartKind.HOST_OOM_KILLED:
            out.events.append((events.WARNING, "OOMDetected", decision.reason))
    return []


def add_recommendations(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """What a rollout gate held back stays visible; the scale-out recommendation (:func:`build_scale_out`);
    vLLM's KV report when it is new."""
    decision, state = tick.decision, tick.state
    if decision.recommended is not None:
        rec = build_recommendation(decision.recommended, decision.reason, decision.trigger, tick.stamp)
        if _new_recommendation(old, rec):
            out.status["recommendation"] = rec
    add_scale_out(old, decision, tick.stamp, out)
    tokens = decision.observed_kv_tokens
    if tokens and not tick.changed and tokens != state.observed_kv_tokens:
        out.status["calibration"] = {"observedKvCacheTokens": tokens}
    return []


def add_serving(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """What the pods say (``Available``, ``Degraded``, ``Ready`` on the freshest object, the replica counts),
    then the tick's other views."""
    updates: list[Update] = []
    if tick.serving is not None:
        updates, fields = build_serving_updates(tick.serving)
        out.status.update(fields)
        assert out.lists is not None
        out.lists.serving = tick.serving
    return [*updates, *tick.extra_conditions]


def add_rollout_deadline(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """The ``status.rollout`` the steps before left out: ``None`` when a spec change, a new plan or a
    rollback replaced the settings being rolled out; the new deadline when a new pod of the settings
    started."""
    state, rollout = tick.state, tick.rollout
    if state.rollout is not None and rollout is None and "rollout" not in out.status:
        out.status["rollout"] = None
    elif rollout is not None and state.rollout is not None and rollout.deadline != state.rollout.deadline:
        wire = out.status.get("rollout", old.get("rollout"))
        if isinstance(wire, Mapping):  # still rolling out: the deadline now counts from the new pod's start
            out.status["rollout"] = {**wire, "deadline": format_time(rollout.deadline)}
    return []


def add_startup(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """``startupSeconds``, when the pods measured a new one (:func:`build_startup`)."""
    out.status.update(build_startup(old, tick.startup_seconds))
    return []


def build_startup(old: Mapping[str, Any], startup: float | None) -> dict[str, Any]:
    """``{"startupSeconds": ...}`` when the pods measured a start (``startup``) the status ``old`` does not
    hold yet, else nothing: every engine's loop keeps its measured restart so (SGLang's and TGI's:
    :func:`kvpilot.operator.status.engine_patch.build_engine_patch`)."""
    if startup is None or round(startup, 1) == old.get("startupSeconds"):
        return {}
    return {"startupSeconds": round(startup, 1)}


def build_rollout_idle(recommended: bool, reason: str) -> list[Update]:
    """``RolloutInProgress`` while no rollout is being judged and nothing rolled out: ``Held`` (with the
    decision's ``reason``) when a gate held a change back with it ``recommended`` (no spare GPU for a surge
    pod: :data:`~kvpilot.operator.pods.rollout_strategy.HELD_MESSAGE`, the restart-cost trade, the
    cooldown), else ``Idle``; every engine's loop says it so."""
    if recommended:
        return [(conditions.ROLLOUT_IN_PROGRESS, conditions.FALSE, "Held", reason)]
    return [(conditions.ROLLOUT_IN_PROGRESS, conditions.FALSE, "Idle", "no rollout in progress")]


def add_resolution(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """``ConfigResolved`` from the tick's own resolve (:func:`build_resolution_updates`)."""
    updates, resolve_events = build_resolution_updates(old, tick.resolve_failure)
    out.events.extend(resolve_events)
    return updates


def keep_kind_fields(old: Mapping[str, Any], tick: LoopTick, out: StatusPatch) -> list[Update]:
    """Only the fields the kind's status has (:data:`KIND_FIELDS`)."""
    fields = KIND_FIELDS.get(tick.kind)
    if fields is not None:
        out.status = {k: v for k, v in out.status.items() if k in fields}
    return []


LOOP_STEPS: tuple[Step, ...] = (
    add_metrics,
    add_evidence,
    add_change,
    add_rollout_progress,
    add_verdict,
    add_recommendations,
    add_serving,
    add_rollout_deadline,
    add_startup,
    add_resolution,
    keep_kind_fields,
)
"""The chain of :func:`build_loop_patch`."""


# --- the parts --------------------------------------------------------------------------------------------


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


class ScaleOutDecision(Protocol):
    """What :func:`build_scale_out` reads of a decision: vLLM's :class:`Decision`, or an engine's
    :class:`~kvpilot.tuner.loop.engine_state.EngineDecision` (SGLang, TGI)."""

    @property
    def scale_out(self) -> int | None: ...
    @property
    def trigger(self) -> str: ...
    @property
    def reason(self) -> str: ...


def add_scale_out(old: Mapping[str, Any], decision: ScaleOutDecision, stamp: str, out: StatusPatch) -> None:
    """:func:`build_scale_out` merged into the recommendation this patch writes (if any), its event added:
    every engine's loop writes the scale-out recommendation this way."""
    scale_out = build_scale_out(old, decision, stamp, out.events).get("recommendation")
    if scale_out is not None:
        out.status["recommendation"] = {**(out.status.get("recommendation") or {}), **scale_out}


def build_scale_out(
    old: Mapping[str, Any], decision: ScaleOutDecision, stamp: str, out_events: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """``status.recommendation.replicas`` (a merge into the recommendation) and a ``ScaleOutRecommended``
    event when the decision recommends more replicas than the standing recommendation; the replicas withdrawn
    once the pressure is gone. Nothing when neither changes."""
    was = (old.get("recommendation") or {}).get("replicas")
    if decision.scale_out is not None and decision.scale_out != was:
        out_events.append(
            (
                events.NORMAL,
                "ScaleOutRecommended",
                f"tuning is at its floor; {decision.scale_out} replicas recommended "
                f"(spec.replicas or the autoscaler decides): {decision.reason}",
            )
        )
        return {
            "recommendation": {
                "replicas": decision.scale_out,
                "reason": decision.reason,
                "trigger": str(decision.trigger),
                "time": stamp,
            }
        }
    if decision.scale_out is None and was is not None and decision.trigger in SCALE_OUT_CLEARED_BY:
        return {"recommendation": {"replicas": None}}
    return {}


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


def _new_recommendation(old: Mapping[str, Any], rec: Mapping[str, Any]) -> bool:
    was = old.get("recommendation") or {}
    return compact(was.get("settings")) != compact(rec["settings"]) or was.get("trigger") != rec["trigger"]


def _add_history(
    old: Mapping[str, Any], tick: LoopTick, out: StatusPatch, action: HistoryAction, *, dedupe: bool
) -> bool:
    """Append the decision's entry (on the freshest history, by the :class:`ListPatch`); whether it is new
    on the history read (a tick adds one entry at most)."""
    decision = tick.decision
    entry = build_history_entry(
        time=tick.stamp,
        action=action,
        trigger=decision.trigger,
        reason=decision.reason,
        from_settings=tick.state.current,
        to_settings=decision.recommended or decision.settings,
    )
    if append_history(old.get("history") or (), entry, dedupe=dedupe) is None:
        return False
    assert out.lists is not None
    out.lists.history.append((entry, dedupe))
    return True
