"""The status the closed-loop tick of an engine with rules of its own (SGLang, TGI) writes: its
recommendation, rollout, the flags ruled out, in the engine's own flags
(:class:`~kvpilot.operator.pods.engine_pods.Codec`; ``status.applied`` and ``status.failedSettings`` are
vLLM's settings, not these):

* ``status.recommendation.engineArgs`` -- the flags of the latest change the loop decided (or would have,
  past a gate), with its ``reason``, ``trigger`` and ``time``; rewritten only when the flags or the trigger
  change, with a Normal ``Recommended`` event unless the change was rolled out;
* mode Auto: ``status.appliedEngineArgs`` (the flags on the Deployment), ``status.rollout`` (``engineArgs``,
  ``startedAt``, ``deadline``, ``phase``, ``probationUntil``), ``status.lastGoodEngineArgs`` and
  ``lastChangeTime``, with ``Retuned``, ``RolledBack`` and ``RolloutSucceeded`` events and the
  ``RolloutInProgress`` condition (``Held`` while a gate holds a change back: no spare GPU for a surge pod,
  the restart-cost trade), as vLLM's rollouts (:mod:`kvpilot.operator.status.loop_patch`);
* ``status.recommendation.replicas`` -- pressure or a latency objective with nothing left to tune: the
  replicas to recommend, with a Normal ``ScaleOutRecommended`` event when it is new, withdrawn once the
  pressure is gone (a ``Steady`` or ``IdleCapacity`` decision), as vLLM's
  (:func:`~kvpilot.operator.status.loop_patch.add_scale_out`);
* ``status.startupSeconds`` -- the start the pods were measured to take (the restart the trade prices), as
  vLLM's;
* ``status.history`` -- ``Retuned`` and ``RolledBack`` (mode Auto), ``Infeasible``, and ``Held`` when a gate
  held a change back (the cooldown, the restart-cost trade, no spare GPU for a surge pod: ``toEngineArgs``
  the flags it would have rolled out), each verdict that persists once, a ``Held`` one with a Normal
  ``Held`` event, as vLLM's; the newest ``Held`` entries in a row say how long the
  loop has held for a trigger, which the restart-cost trade counts the gain over
  (:func:`kvpilot.operator.loop.engine_reading.read_holds`);
* ``status.failedEngineArgs`` -- the flags that failed and how (the seam's failure kind, or
  ``rollout_failed``); read back into the policy's ruled-out runs (:func:`read_failed_runs`), with a Warning
  event named by the trigger when a failure is first recorded;
* ``ClosedLoop=True`` (reason ``Tuning`` in mode Auto, ``Recommending`` in Recommend) saying what the loop
  does and what it last decided (its message changes only with the action and trigger, so a steady service
  is not rewritten each tick), and ``MetricsAvailable`` as for vLLM. A newly infeasible decision is a
  Warning ``Infeasible`` event.

Pure: builds the patch; :func:`kvpilot.operator.inferenceservice.engine_loop.run_engine_tick` writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from kvpilot.operator import api, conditions
from kvpilot.operator.pods.engine_pods import Codec
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.pods.pod_view import parse_time
from kvpilot.operator.status import events
from kvpilot.operator.status.loop_patch import (
    KIND_FIELDS,
    ROLLING_OUT,
    add_judged_rollout,
    add_scale_out,
    build_rollout_idle,
    build_startup,
)
from kvpilot.operator.status.status_patch import (
    ListPatch,
    StatusPatch,
    Update,
    append_history,
    build_history_entry,
    build_serving_updates,
    cap,
    format_time,
)
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.loop import Action, HistoryAction
from kvpilot.tuner.loop.engine_state import RUN_FAILURES, EngineDecision, EngineFailedRun, EngineRollout

S = TypeVar("S")

RECOMMENDING, TUNING = "Recommending", "Tuning"
FAILED_LIMIT = 32
"""``status.failedEngineArgs`` keeps this many (the CRD's ``maxItems``)."""


def read_failed_runs(codec: Codec[S], status: Mapping[str, Any]) -> tuple[EngineFailedRun[S], ...]:
    """``status.failedEngineArgs`` as the policy's ruled-out runs (an entry that does not parse: skipped)."""
    runs: list[EngineFailedRun[S]] = []
    for item in status.get("failedEngineArgs") or ():
        kind = next((k for k in RUN_FAILURES if k == item.get("failure")), None)
        settings = read_args(codec, item, "args")
        if kind is not None and settings is not None:
            running = item.get("runningRequests")
            runs.append(EngineFailedRun(settings, kind, running if isinstance(running, int) else None))
    return tuple(runs)


def read_args(codec: Codec[S], status: Mapping[str, Any], field: str) -> S | None:
    """``status.<field>`` (the engine's flags) parsed; ``None`` when unset or it no longer parses."""
    args = status.get(field)
    if not args:
        return None
    try:
        return codec.parse([str(a) for a in args])
    except tuner_errors.TunerError:
        return None


def read_rollout(codec: Codec[S], status: Mapping[str, Any], current: S) -> EngineRollout[S] | None:
    """``status.rollout`` of the engine's flags, while it is the rollout of ``current`` (a re-plan since ended
    it); ``None`` otherwise."""
    wire = status.get("rollout") or {}
    settings = read_args(codec, wire, "engineArgs")
    started, deadline = parse_time(wire.get("startedAt")), parse_time(wire.get("deadline"))
    if settings != current or settings is None or started is None or deadline is None:
        return None
    return EngineRollout(settings, started, deadline, parse_time(wire.get("probationUntil")))


def describe_loop(codec: Codec[Any], mode: str, kind: str = api.KIND) -> str:
    """What the loop does for the engine in ``mode`` (the ``ClosedLoop`` condition's first sentence)."""
    name = codec.name
    if kind == api.ENGINE_TUNER_KIND:
        return (
            f"the closed loop tunes {name} flags with {name}'s own rules on the target's pods that run the "
            "recommendation (status.recommendation.engineArgs; probation, then status.lastGoodEngineArgs; a "
            "failed one goes back)"
        )
    if mode == "Auto":
        return (
            f"the closed loop tunes {name} flags with {name}'s own rules and rolls them out "
            "(status.appliedEngineArgs; probation, then status.lastGoodEngineArgs; a failed rollout goes "
            "back)"
        )
    return (
        f"the closed loop recommends {name} flags (status.recommendation.engineArgs); mode {mode}: the pods "
        f"keep {name}'s own defaults"
    )


def build_engine_patch(
    codec: Codec[S],
    old: Mapping[str, Any],
    decision: EngineDecision[S],
    mode: str,
    *,
    generation: int | None,
    now: float,
    deadline_seconds: float = 900.0,
    serving: Serving | None = None,
    kind: str = api.KIND,
    startup_seconds: float | None = None,
) -> StatusPatch:
    """The tick's status (:mod:`this module <kvpilot.operator.status.engine_patch>`) and its events; in mode
    Auto a change is recorded as rolled out (``deadline_seconds``: the configured rollout deadline). With the
    pods' ``serving`` state: ``replicas``, ``readyReplicas`` and the ``Available`` and ``Degraded``
    conditions, as for vLLM (:func:`~kvpilot.operator.status.status_patch.build_serving_updates`); with the
    start the pods were measured to take (``startup_seconds``), ``status.startupSeconds`` when it is new, as
    vLLM's (:func:`~kvpilot.operator.status.loop_patch.build_startup`).

    An EngineTuner's (``kind``; mode Auto: kvpilot's "rollout" is the recommendation in its status, which
    the webhook and Auto's evictions or the owner put on the pods) has no ``appliedEngineArgs`` or
    ``lastChangeTime``: the history's ``fromEngineArgs`` is the recommendation it stood by, and the
    recommendation itself is its reconcile's to write (:mod:`kvpilot.operator.status.engine_tuner_status`),
    as :data:`~kvpilot.operator.status.loop_patch.KIND_FIELDS` says for vLLM's loop."""
    stamp = format_time(now)
    last = f"last decision: {decision.action} ({decision.trigger})"
    reason = TUNING if mode == "Auto" else RECOMMENDING
    updates: list[Update] = [
        (conditions.CLOSED_LOOP, conditions.TRUE, reason, f"{describe_loop(codec, mode, kind)}; {last}")
    ]
    metrics = decision.metrics
    if metrics is not None:
        available = conditions.TRUE if metrics.available else conditions.FALSE
        updates.append((conditions.METRICS_AVAILABLE, available, metrics.reason, metrics.message))
    out = StatusPatch(status={}, lists=ListPatch(generation, stamp, updates=updates))
    if serving is not None:
        served, fields = build_serving_updates(serving)
        updates.extend(served)
        out.status.update(fields)
    out.status.update(build_startup(old, startup_seconds))
    _add_failed(codec, old, decision, out)
    rolled = mode == "Auto" and decision.changes
    tuner = kind == api.ENGINE_TUNER_KIND
    before = (old.get("recommendation") or {}).get("engineArgs") if tuner else old.get("appliedEngineArgs")
    if not tuner:
        _add_recommendation(codec, old, decision, out, stamp, announce=not rolled)
        add_scale_out(old, decision, stamp, out)
    if mode == "Auto":
        updates.extend(_add_rollout(codec, old, decision, out, now, deadline_seconds, before))
    was = conditions.find_condition(old.get("conditions"), conditions.CLOSED_LOOP) or {}
    if decision.action == Action.INFEASIBLE and last not in str(was.get("message") or ""):
        out.events.append((events.WARNING, "Infeasible", decision.reason))
    if decision.action == Action.INFEASIBLE:
        _add_history(old, decision, out, HistoryAction.INFEASIBLE, stamp, before, to_args=None, dedupe=True)
    if decision.action == Action.HOLD and decision.recommended is not None:  # a gate held a change back
        held = codec.build(decision.recommended)
        if _add_history(old, decision, out, HistoryAction.HELD, stamp, before, to_args=held, dedupe=True):
            out.events.append((events.NORMAL, "Held", cap(decision.reason)))  # once, as vLLM's
            out.decisions.append("Held")
    if kind in KIND_FIELDS:
        out.status = {k: v for k, v in out.status.items() if k in KIND_FIELDS[kind]}
    return out


def _add_history(
    old: Mapping[str, Any],
    decision: EngineDecision[Any],
    out: StatusPatch,
    action: HistoryAction,
    stamp: str,
    before: list[str] | None,
    *,
    to_args: list[str] | None,
    dedupe: bool,
) -> bool:
    """One ``status.history`` entry in the engine's flags (``fromEngineArgs``: ``before``, what the status
    says the Deployment runs, or an EngineTuner's recommendation), appended by the :class:`ListPatch` on the
    freshest history; a verdict that persists (``dedupe``) is recorded once. Whether it is new."""
    entry = build_history_entry(
        time=stamp,
        action=action,
        trigger=decision.trigger,
        reason=decision.reason,
        from_engine_args=before,
        to_engine_args=to_args,
    )
    if append_history(old.get("history") or (), entry, dedupe=dedupe) is None or out.lists is None:
        return False
    out.lists.history.append((entry, dedupe))
    return True


def _add_failed(
    codec: Codec[S], old: Mapping[str, Any], decision: EngineDecision[S], out: StatusPatch
) -> None:
    if decision.failed is None:
        return
    entry: dict[str, Any] = {
        "args": codec.build(decision.failed.settings),
        "failure": decision.failed.kind,
    }
    if decision.failed.running is not None:
        entry["runningRequests"] = decision.failed.running
    recorded = list(old.get("failedEngineArgs") or ())
    if entry in recorded:
        return
    out.status["failedEngineArgs"] = [*recorded, entry][-FAILED_LIMIT:]
    out.events.append((events.WARNING, decision.trigger, decision.reason))


def _add_rollout(
    codec: Codec[S],
    old: Mapping[str, Any],
    decision: EngineDecision[S],
    out: StatusPatch,
    now: float,
    deadline_seconds: float,
    before: list[str] | None,
) -> list[Update]:
    """Mode Auto: a change recorded as rolled out (``appliedEngineArgs``, a new ``rollout``, ``Retuned`` or
    ``RolledBack``), else the rollout being judged (probation, ended, succeeded); the last good flags."""
    if decision.good is not None:
        good = codec.build(decision.good)
        if old.get("lastGoodEngineArgs") != good:
            out.status["lastGoodEngineArgs"] = good
    if decision.changes:
        args = codec.build(decision.settings)
        out.status["appliedEngineArgs"] = args
        out.status["lastChangeTime"] = format_time(now)
        out.status["rollout"] = {
            "engineArgs": args,
            "startedAt": format_time(now),
            "deadline": format_time(now + deadline_seconds),
            "phase": ROLLING_OUT,
            "probationUntil": None,
        }
        retuned = decision.action == Action.RETUNE
        kind, reason = (events.NORMAL, "Retuned") if retuned else (events.WARNING, "RolledBack")
        action = HistoryAction.RETUNED if retuned else HistoryAction.ROLLED_BACK
        _add_history(old, decision, out, action, format_time(now), before, to_args=args, dedupe=False)
        out.events.append((kind, reason, cap(decision.reason)))
        out.decisions.append(reason)
        return [(conditions.ROLLOUT_IN_PROGRESS, conditions.TRUE, reason, cap(decision.reason))]
    wire = old.get("rollout") or {}
    judged = add_judged_rollout(wire, decision.trigger, decision.probation_until, cap(decision.reason), out)
    if judged is not None:
        return judged
    return build_rollout_idle(decision.recommended is not None, cap(decision.reason))


def _add_recommendation(
    codec: Codec[S],
    old: Mapping[str, Any],
    decision: EngineDecision[S],
    out: StatusPatch,
    stamp: str,
    *,
    announce: bool,
) -> None:
    target = decision.settings if decision.changes else decision.recommended
    if target is None:
        return
    args = codec.build(target)
    was = old.get("recommendation") or {}
    if was.get("engineArgs") == args and was.get("trigger") == decision.trigger:
        return
    out.status["recommendation"] = {
        "engineArgs": args,
        "reason": cap(decision.reason),
        "trigger": decision.trigger,
        "time": stamp,
    }
    why = "; ".join(decision.explanation)
    if announce:  # a change rolled out is announced as Retuned or RolledBack
        out.events.append(
            (events.NORMAL, "Recommended", cap(f"{decision.reason}" + (f" [{why}]" if why else "")))
        )
