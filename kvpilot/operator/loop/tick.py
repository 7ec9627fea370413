"""One tick of the closed loop, shared by both kinds: from what was read to the decision.

The InferenceService's loop (:mod:`kvpilot.operator.inferenceservice.closed_loop`) and the EngineTuner's
(:mod:`kvpilot.operator.enginetuner.target_loop`) differ in how they read (pods of a Deployment they
render, or pods of a workload they only watch), in how a decision lands (a Deployment patch, or a
recommendation in status) and in their status. What a tick does with what it read is one thing, here:

* :func:`compute_tick` -- the rollout being judged (its deadline counted from the newest pod of its
  settings), the :class:`Evidence` and the :class:`Decision`; the status says it all
  (:func:`kvpilot.operator.status.loop_patch.build_loop_patch`, with the rollout judged here).

The kind-specific parts come in as data (:class:`TickReading`, a :class:`TuningContext`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.operator.loop import loop_state
from kvpilot.operator.pods.pod_summary import PodSummary
from kvpilot.operator.pods.pod_view import PodView
from kvpilot.tuner.loop import (
    Decision,
    Evidence,
    LoopState,
    ObservationWindow,
    RolloutState,
    TuningContext,
    compute_decision,
)
from kvpilot.tuner.loop.scaling import ReplicaView, compute_replica_change
from kvpilot.tuner.types import MemoryBudget


@dataclass(frozen=True)
class TickReading:
    """What one kind's tick read: ``pods`` are those a rollout's deadline counts from; ``summary`` and
    ``replica_view`` are the kind's own reading of them; ``replicas`` the count the evidence judges."""

    budget: MemoryBudget
    window: ObservationWindow
    pods: Sequence[PodView]
    summary: PodSummary
    replica_view: ReplicaView
    replicas: int
    restart_seconds: float | None
    compile_cache_persistent: bool = False
    """The pods keep vLLM's compile cache on a writable volume
    (:func:`kvpilot.operator.pods.storage.keeps_compile_cache`)."""
    checkpoint_gib: float | None = None
    """The model's whole checkpoint, when the kind knows the model (predicts a cold start's download)."""
    weights_cached: bool = False
    """Every pod's start finds the checkpoint on a shared volume
    (:func:`kvpilot.operator.pods.storage.keeps_weights`)."""


@dataclass(frozen=True)
class Tick:
    """The tick's answer: the state it judged (``loop``, with ``rollout``), its evidence and decision."""

    rollout: RolloutState | None
    loop: LoopState
    evidence: Evidence
    decision: Decision


def compute_rollout(
    state: LoopState, pods: Sequence[PodView], deadline_seconds: float
) -> RolloutState | None:
    """The rollout still being judged: only one of the current settings, its deadline counted from the
    newest pod of them (:func:`loop_state.with_pod_deadline`)."""
    rollout = state.rollout if state.rollout is not None and state.rollout.settings == state.current else None
    return loop_state.with_pod_deadline(rollout, pods, deadline_seconds)


def compute_tick(state: LoopState, reading: TickReading, context: TuningContext, now: float) -> Tick:
    """The decision of this tick on ``reading`` (``state.current``: the settings the pods should run)."""
    policy = context.policy
    rollout = compute_rollout(state, reading.pods, policy.rollout_deadline_seconds)
    evidence = Evidence(
        budget=reading.budget,
        window=reading.window,
        restarts=reading.summary.restarts,
        ready=reading.summary.ready,
        not_started=reading.summary.not_started,
        restart_seconds=reading.restart_seconds,
        replicas=reading.replicas,
        compile_cache_persistent=reading.compile_cache_persistent,
        checkpoint_gib=reading.checkpoint_gib,
        weights_cached=reading.weights_cached,
        replicas_changing=compute_replica_change(reading.replica_view, now, policy.window_seconds),
    )
    loop = dataclasses.replace(state, rollout=rollout)
    return Tick(rollout, loop, evidence, compute_decision(loop, evidence, context, now))
