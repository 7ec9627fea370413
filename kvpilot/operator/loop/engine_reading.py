"""What the closed-loop tick of an engine with rules of its own (SGLang, TGI) reads into its policy: the state
its status keeps and the evidence of its pods, in the engine's flags. Pure; shared by both kinds.

:func:`build_state_and_evidence` (an InferenceService's; mode Auto: the flags the status says the
Deployment runs, the rollout, the last good flags; every mode: the ruled-out runs, the last change, and the
restarts, readiness and start of the pods running the current flags, and the start they were measured to
take: :func:`compute_startup_seconds`, and ``spec.replicas`` with whether the pods show the count changing,
which a scale-out recommendation waits out), for
:func:`kvpilot.operator.inferenceservice.engine_loop.run_engine_tick`; :func:`build_state_of` with the
current flags given (an EngineTuner's: its standing recommendation,
:mod:`kvpilot.operator.enginetuner.target_engine_loop`). The context each engine tunes within is its own
(:mod:`.engine_profiles`), asked by its :class:`Profile`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvpilot.operator import api
from kvpilot.operator.loop import loop_state
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import pod_summary
from kvpilot.operator.pods.engine_pods import Codec, EnginePod
from kvpilot.operator.pods.pod_view import parse_time
from kvpilot.operator.status import engine_patch
from kvpilot.tuner.loop import HistoryAction, ObservationWindow, PolicyConfig, scaling
from kvpilot.tuner.loop.engine_state import (
    EngineChange,
    EngineDecision,
    EngineEvidence,
    EngineHold,
    EngineLoopState,
)

S = TypeVar("S")


def compute_current(pods: Sequence[EnginePod[S]], default: Callable[[], S]) -> S:
    """The settings most live pods run (``default()``, the engine's defaults, when no pod says)."""
    counts = Counter(p.settings for p in pods if p.settings is not None and not p.terminating)
    if not counts:
        return default()
    found = max(counts, key=lambda s: (counts[s], -list(counts).index(s)))
    assert found is not None
    return found


def build_state_and_evidence(
    codec: Codec[S],
    default: Callable[[], S],
    pods: Sequence[EnginePod[S]],
    window: ObservationWindow,
    status: Mapping[str, Any],
    *,
    mode: str = "Recommend",
    replicas: int = 1,
    now: float | None = None,
    settle_seconds: float = 0.0,
) -> tuple[EngineLoopState[S], EngineEvidence]:
    """The policy's inputs: the current settings (mode Auto: ``status.appliedEngineArgs``, else what the
    pods run) and :func:`build_state_of` them (the rollout and last good flags in mode Auto only)."""
    applied = engine_patch.read_args(codec, status, "appliedEngineArgs") if mode == "Auto" else None
    current = applied if applied is not None else compute_current(pods, default)
    return build_state_of(
        codec,
        current,
        pods,
        window,
        status,
        rolls_out=mode == "Auto",
        replicas=replicas,
        now=now,
        settle_seconds=settle_seconds,
    )


def build_state_of(
    codec: Codec[S],
    current: S,
    pods: Sequence[EnginePod[S]],
    window: ObservationWindow,
    status: Mapping[str, Any],
    *,
    rolls_out: bool,
    replicas: int = 1,
    now: float | None = None,
    settle_seconds: float = 0.0,
) -> tuple[EngineLoopState[S], EngineEvidence]:
    """The policy's inputs for ``current``: the ruled-out runs, last change and newest holds of the status
    (``rolls_out``: also its rollout and last good flags), the restart a change costs (the start its pods
    were just measured to take, :func:`compute_startup_seconds`, else ``status.startupSeconds``, as vLLM's
    loop reads it; ``None``: the policy's assumption), and the restarts,
    readiness and start of the pods that run ``current`` (ready: ``replicas`` of them Ready and no live pod
    running anything else); with ``now``, whether the replica count is changing as vLLM's loop judges it
    (:func:`~kvpilot.tuner.loop.scaling.compute_replica_change`: pods missing or not Ready, or one that
    joined within ``settle_seconds``, the metrics window): no scale-out is recommended then."""
    live = [p for p in pods if not p.terminating]
    mine = [p for p in live if p.settings == current]
    restarts = tuple(p.restart for p in pods if p.restart is not None and p.settings == current)
    ready = replicas > 0 and sum(1 for p in mine if p.ready) >= replicas and len(mine) == len(live)
    state = EngineLoopState(
        current,
        engine_patch.read_failed_runs(codec, status),
        read_changes(codec, status),
        engine_patch.read_rollout(codec, status, current) if rolls_out else None,
        engine_patch.read_args(codec, status, "lastGoodEngineArgs") if rolls_out else None,
        read_holds(status),
    )
    not_started = any(p.not_started for p in mine) and not restarts
    measured = compute_startup_seconds(pods, current)
    restart_seconds = measured if measured is not None else loop_state.read_startup_seconds(status)
    view = pod_summary.compute_replica_view(pods, replicas)
    changing = scaling.compute_replica_change(view, now, settle_seconds) if now is not None else None
    return state, EngineEvidence(
        window,
        restarts,
        restart_seconds=restart_seconds,
        ready=ready,
        not_started=not_started,
        replicas=replicas,
        replicas_changing=changing,
    )


def compute_startup_seconds(pods: Sequence[EnginePod[S]], current: S) -> float | None:
    """Seconds from start to Ready of the newest live pod running ``current`` that became Ready without a
    restart (``None``: none did), measured as vLLM's
    (:func:`kvpilot.operator.pods.pod_summary.compute_startup_seconds`): the restart a change costs, which
    the status keeps (``status.startupSeconds``,
    :func:`kvpilot.operator.status.engine_patch.build_engine_patch`)."""
    return pod_summary.compute_startup_seconds(pods, current)


def read_holds(status: Mapping[str, Any]) -> tuple[EngineHold, ...]:
    """The newest ``Held`` entries of ``status.history`` in a row, oldest first (none when the newest entry is
    anything else): how long the loop has held a change back for a trigger, which the restart-cost trade
    counts the gain over (:mod:`kvpilot.tuner.loop.restart_trade`), as vLLM's
    :func:`kvpilot.tuner.loop.history.compute_held_since` reads vLLM's history."""
    holds: list[EngineHold] = []
    for entry in reversed(status.get("history") or ()):
        when = parse_time(entry.get("time"))
        if entry.get("action") != HistoryAction.HELD or when is None:
            break
        holds.append(EngineHold(when, str(entry.get("trigger") or "")))
    return tuple(reversed(holds))


def read_changes(codec: Codec[S], status: Mapping[str, Any]) -> tuple[EngineChange[S], ...]:
    """The changes the loop made, for the gates (the minimum interval, the cooldown, the hourly limit) and
    the flap guard (the flags each changed from and to): the ``Retuned`` and ``RolledBack`` entries of
    ``status.history`` in the engine's flags, the ``Planned`` ones as the plan (the hourly limit and the
    cooldown count no plan, as vLLM's gates do not: the plan judged nothing), and ``lastChangeTime`` when the
    history no longer holds it."""
    history = status.get("history") or ()
    changes = [
        EngineChange(
            when,
            str(entry.get("trigger") or ""),
            before=engine_patch.read_args(codec, entry, "fromEngineArgs"),
            after=engine_patch.read_args(codec, entry, "toEngineArgs"),
        )
        for entry in history
        if entry.get("action") in ("Retuned", "RolledBack") and entry.get("toEngineArgs") is not None
        if (when := parse_time(entry.get("time"))) is not None
    ]
    changes += [
        EngineChange(when, str(entry.get("trigger") or ""), planned=True)
        for entry in history
        if entry.get("action") == HistoryAction.PLANNED
        if (when := parse_time(entry.get("time"))) is not None
    ]
    last = parse_time(status.get("lastChangeTime"))
    if last is not None and all(c.time != last for c in changes):
        changes.append(EngineChange(last, "lastChangeTime"))
    return tuple(changes)


Decide = Callable[
    [EngineLoopState[S], EngineEvidence, api.InferenceServiceSpec, resolve.Inputs, PolicyConfig, float],
    EngineDecision[S],
]


@dataclass(frozen=True)
class Profile(Generic[S]):
    """One engine's loop: how its flags read and render (:class:`Codec`), its defaults (no flags), and its
    policy given the state, the evidence, the spec, the model and GPU, the pace and the time."""

    codec: Codec[S]
    default: Callable[[], S]
    decide: Decide[S]
