"""The EngineTuner's closed loop for a target whose container runs SGLang or TGI: the shared engine loop,
reading the target's pods. Pure.

The InferenceService's engine loop (:mod:`kvpilot.operator.inferenceservice.engine_loop`) with what an
EngineTuner can see, as :mod:`.target_loop` is vLLM's:

* **The recommendation plays ``appliedEngineArgs``.** It is the plan's flags (``status.history`` holds a
  ``Planned`` entry with them, ``toEngineArgs``), as ``Retuned`` and ``RolledBack`` entries changed them
  since (:func:`compute_current`); a new plan (a spec change, another GPU) is a new ``Planned`` entry and
  the loop starts again from it. kvpilot "rolls out" by writing the recommendation; the webhook and Auto's
  evictions (or, in Recommend, the owner) put it on the pods.
* **The evidence: the target's pods that run it.** Each pod of the target is read as the engine's loop reads
  an InferenceService's (:func:`kvpilot.operator.pods.engine_pods.build_pod_of`: readiness, start, the last
  termination classified by the engine's own texts, from the message or the previous log), the flags being
  the recommendation's when the container tuned runs them (:func:`.target.pod_carries`, the pod's shape
  aside), ``None`` otherwise (:func:`build_target_pod`): the owner's pods judge nothing.
* **The rules: the engine's own** (:data:`kvpilot.operator.loop.engine_profiles.PROFILES`, in the context
  of the InferenceService spec the target plans as), on the state the status keeps
  (:func:`kvpilot.operator.loop.engine_reading.build_state_of`: ``failedEngineArgs``, the history's changes,
  ``rollout``, ``lastGoodEngineArgs``) and the metrics of the pods that run it. A rollout's deadline counts
  from the start of the newest pod running it (:func:`shift_rollout`): no such pod yet is waiting, never
  failure.
* **The record:** :func:`kvpilot.operator.status.engine_patch.build_engine_patch` for an EngineTuner
  (no ``appliedEngineArgs``; the recommendation is :mod:`kvpilot.operator.status.engine_tuner_status`'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.loop import engine_reading
from kvpilot.operator.loop.engine_reading import Profile
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import engine_pods
from kvpilot.operator.pods.engine_pods import Codec, EnginePod
from kvpilot.operator.pods.pod_view import parse_time
from kvpilot.operator.status import engine_patch
from kvpilot.operator.status.engine_tuner_status import EngineTunerLoop
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.loop import HistoryAction, ObservationWindow, PolicyConfig
from kvpilot.tuner.loop.engine_state import EngineRollout

S = TypeVar("S")


def compute_current(
    codec: Codec[S], history: Sequence[Mapping[str, Any]], planned: EngineArgs
) -> tuple[S, tuple[str, ...]] | None:
    """The flags the loop stands by for the plan ``planned``, and their args as recorded: the newest change
    after the newest ``Planned`` entry of these flags; ``None`` when the history has no such entry (a new
    plan)."""
    try:
        plan = codec.parse(planned.args)
    except tuner_errors.TunerError:  # the plan's own flags parse (the planner rendered them)
        return None
    current: tuple[S, tuple[str, ...]] | None = None
    for entry in history:
        to = engine_patch.read_args(codec, entry, "toEngineArgs")
        args = tuple(str(a) for a in entry.get("toEngineArgs") or ())
        if entry.get("action") == HistoryAction.PLANNED:
            current = (to, args) if to is not None and to == plan else None
        elif current is not None and entry.get("action") in ("Retuned", "RolledBack") and to is not None:
            current = (to, args)
    return current


def build_target_pod(
    codec: Codec[S],
    container: str,
    current: S,
    recommended: EngineArgs,
    pod: Mapping[str, Any],
    log: str | None = None,
) -> EnginePod[S]:
    """One pod of the target as the engine's loop reads an InferenceService's: ``current`` its flags when its
    ``container`` runs the recommendation (:func:`.target.pod_carries`), ``None`` when it runs anything
    else; its restart classified by the engine's texts (``log``: the previous log, when read)."""
    carries = target.pod_carries(pod, container, recommended)
    return engine_pods.build_pod_of(codec, pod, container, current if carries else None, log)


def compute_newest_start(
    pods: Sequence[Mapping[str, Any]], container: str, recommended: EngineArgs
) -> float | None:
    """When the newest pod running the recommendation was created (``None``: none runs it)."""
    starts = [
        parse_time((p.get("metadata") or {}).get("creationTimestamp"))
        for p in pods
        if target.pod_carries(p, container, recommended)
    ]
    return max((s for s in starts if s is not None), default=None)


def shift_rollout(rollout: EngineRollout[S] | None, newest_start: float | None) -> EngineRollout[S] | None:
    """The rollout with its deadline counted from the start of the newest pod running it, when that is
    later than the change (the owner's controller, or Auto's evictions one at a time, roll the pods)."""
    if rollout is None or newest_start is None or newest_start <= rollout.started_at:
        return rollout
    return dataclasses.replace(rollout, deadline=rollout.deadline + (newest_start - rollout.started_at))


def compute_engine_loop(
    profile: Profile[S],
    read: EngineTarget,
    old: Mapping[str, Any],
    current: tuple[S, tuple[str, ...]],
    pods: Sequence[EnginePod[S]],
    *,
    window: ObservationWindow,
    policy: PolicyConfig,
    replicas: int,
    newest_start: float | None,
    now: float,
) -> EngineTunerLoop:
    """One judged tick: the engine's rules on the state the status keeps and the pods that run ``current``
    (the standing recommendation, and its args), and what to record; the recommendation to stand by next
    (the decision's flags when it changes them)."""
    codec, (settings, args) = profile.codec, current
    state, evidence = engine_reading.build_state_of(
        codec,
        settings,
        pods,
        window,
        old,
        rolls_out=True,
        replicas=max(1, replicas),
        now=now,
        settle_seconds=policy.window_seconds,
    )
    state = dataclasses.replace(state, rollout=shift_rollout(state.rollout, newest_start))
    inputs = resolve.Inputs(read.model, read.gpu)
    decision = profile.decide(state, evidence, read.plan_spec, inputs, policy, now)
    patch = engine_patch.build_engine_patch(
        codec,
        old,
        decision,
        "Auto",
        generation=read.generation,
        now=now,
        deadline_seconds=policy.rollout_deadline_seconds,
        kind=api.ENGINE_TUNER_KIND,
    )
    after = tuple(codec.build(decision.settings)) if decision.changes else args
    return EngineTunerLoop(after, patch=patch, decision=decision)


def running(pods: Sequence[EnginePod[Any]]) -> tuple[str, ...]:
    """The live pods that run the recommendation: whose metrics judge it."""
    return tuple(p.name for p in pods if p.settings is not None and not p.terminating)
