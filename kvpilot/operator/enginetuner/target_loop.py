"""The EngineTuner's closed loop: the InferenceService's policy, reading the target's pods.

Pure: the plan, the EngineTuner's status, the target's pods and their metrics window in; the
recommendation to stand by and what to record out (:class:`~kvpilot.operator.status.tuner_status.TunerLoop`).
Each reconcile (create, spec change, the timer) after the plan, in every mode but Off:

* The recommendation is the plan's, as changed by the loop since: ``status.history`` holds a ``Planned``
  entry for the plan (added when the plan is new: a spec change, another GPU) and ``Retuned`` /
  ``RolledBack`` entries from there; the newest change after the plan's entry is what kvpilot stands by
  (:func:`compute_current`). It plays the InferenceService's ``status.applied``.
* The pods that run it (their vLLM command line says so:
  :func:`kvpilot.operator.enginetuner.target.pod_carries`) are
  the evidence, as an InferenceService's pods of its current settings are (:func:`build_views`: the same
  :class:`~kvpilot.operator.pods.pod_status.PodView`, a restart the termination message does not explain
  classified from the previous log the reconcile read, or saying why it could not be read:
  :func:`kvpilot.operator.pods.pod_status.build_logged_view`): their restarts, readiness and start times,
  and their metrics (:func:`compute_metric_pods`; the window comes from the InferenceService loop's shared
  per-tick snapshot, :func:`kvpilot.operator.clients.prometheus.fetch_observations`). Pods running other
  settings
  (the owner's, not rolled yet) judge nothing.
* :func:`kvpilot.tuner.loop.compute_decision` decides with the spec's bounds, SLO and policy and the
  operator's pace: crash remedies, GPU memory, KV pressure, KV-bound queues, the SLO, idle capacity, the
  gates (cooldown, changes per hour, the cost of a restart), and a retune's rollout: once pods running a new
  recommendation are Ready it is on probation; a crash of them or a deadline passed without Ready reverts
  it to the last good settings (``RolledBack``, the failed ones in ``status.failedSettings``). No pod
  running it yet is not failure (``not_started``): in Recommend and Initial the owner rolls its pods when
  it does, in Auto kvpilot's evictions do.
* :mod:`kvpilot.operator.status.tuner_status` writes it with
  :func:`kvpilot.operator.status.loop_patch.build_loop_patch`, as for an InferenceService, less the fields
  an EngineTuner does not have (kvpilot applies nothing: no ``applied``, ``lastChangeTime``,
  ``calibration``; the reconcile writes ``recommendation``).

Not for EngineTuners: fleet learning (``TuningProfile``s) and scale-out recommendations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target
from kvpilot.operator.loop import loop_settings, loop_state, tick
from kvpilot.operator.pods import pod_status
from kvpilot.operator.pods.pod_status import PodView
from kvpilot.operator.status import status_patch
from kvpilot.operator.status.loop_patch import LoopTick
from kvpilot.operator.status.tuner_status import TunerLoop
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import (
    ObservationWindow,
    PolicyConfig,
    TuningContext,
)
from kvpilot.tuner.loop.history import HistoryAction, HistoryEntry
from kvpilot.tuner.model.spec import ModelSpec
from kvpilot.tuner.plan.topology import compute_topology_budget
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, MemoryBudget, Plan


def same_settings(a: EngineSettings, b: EngineSettings) -> bool:
    return status_patch.compact(status_patch.build_settings(a)) == status_patch.compact(
        status_patch.build_settings(b)
    )


def compute_current(history: Sequence[HistoryEntry], planned: EngineSettings) -> EngineSettings | None:
    """The settings the loop stands by for ``planned``: the newest change after the newest ``Planned``
    entry of these settings; ``None`` when the history has no such entry (a new plan)."""
    current: EngineSettings | None = None
    for entry in history:
        if entry.action == HistoryAction.PLANNED:
            current = entry.to_settings if same_settings(entry.to_settings, planned) else None
        elif current is not None and entry.is_change:
            current = entry.to_settings
    return current


def with_container(pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    """The pod with its vLLM container alone (what :func:`pod_status.build_pod_view` reads)."""
    spec, status = dict(pod.get("spec") or {}), dict(pod.get("status") or {})
    spec["containers"] = [c for c in spec.get("containers") or () if c.get("name") == container]
    status["containerStatuses"] = [
        c for c in status.get("containerStatuses") or () if c.get("name") == container
    ]
    return {**pod, "spec": spec, "status": status}


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def build_views(
    pods: Sequence[Mapping[str, Any]],
    container: str,
    settings: EngineSettings,
    logs: Mapping[str, pod_status.PreviousLog] | None = None,
) -> list[PodView]:
    """The target's pods as the InferenceService's loop sees its own: ``settings`` on those whose vLLM
    container runs them, ``None`` on the others; Ready by the pod's condition; a restart whose previous log
    was read (``logs``, by pod: :func:`kvpilot.operator.enginetuner.target_logs.read_logs`) classified
    from it, or saying why it could not be."""
    logs = logs or {}
    views = []
    for pod in pods:
        only, name = with_container(pod, container), str((pod.get("metadata") or {}).get("name") or "")
        view = (
            pod_status.build_logged_view(only, logs[name])
            if name in logs
            else pod_status.build_pod_view(only)
        )
        carries = target.pod_carries(pod, container, settings)
        views.append(dataclasses.replace(view, ready=_ready(pod), settings=settings if carries else None))
    return views


def compute_target_serving(pods: Sequence[Mapping[str, Any]], container: str) -> pod_status.Serving:
    """Whether the target serves, from its pods as the InferenceService's ``Available`` and ``Degraded``
    read its own: available when a replica is Ready whatever flags it runs (its owner rolls its pods, not
    kvpilot), degraded with the most telling fault a pod of the engine's ``container`` shows (a crash
    loop, no node, an image, a download)."""
    views = [
        dataclasses.replace(pod_status.build_pod_view(with_container(p, container)), ready=_ready(p))
        for p in pods
    ]
    return pod_status.compute_serving(views, None)


def compute_metric_pods(
    plan: Plan, status: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], container: str
) -> tuple[str, ...]:
    """The pods whose metrics judge the standing recommendation: the live ones that run it."""
    current = compute_current(loop_state.build_loop_state(status).history, plan.settings)
    if current is None:
        return ()
    return tuple(
        v.name for v in build_views(pods, container, current) if v.settings is not None and not v.terminating
    )


@dataclass(frozen=True, slots=True)
class LoopInputs:
    """What the planner already resolved for the target."""

    plan_spec: api.InferenceServiceSpec
    plan: Plan
    model: ModelSpec
    gpu: GpuSpec
    vllm_version: str
    checkpoint_bytes: int | None = None
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE
    """The target's model runner and untuned memory flags (:mod:`kvpilot.tuner.vllm.engine_flags`)."""


def compute_budget(inputs: LoopInputs, settings: EngineSettings) -> MemoryBudget:
    """The memory model's budget of ``settings`` in the target's topology (the plan's own when they are
    the plan's)."""
    if same_settings(settings, inputs.plan.settings):
        return inputs.plan.budget
    gpus = inputs.plan_spec.gpu.count * inputs.plan_spec.gpu.nodes_per_replica  # TP x PP over the group
    return compute_topology_budget(
        inputs.model,
        inputs.gpu,
        gpus,
        settings,
        inputs.vllm_version,
        inputs.checkpoint_bytes,
        inputs.engine,
    )


def compute_loop(
    inputs: LoopInputs,
    status: Mapping[str, Any],
    discovered: EngineSettings,
    pods: Sequence[Mapping[str, Any]],
    container: str,
    *,
    window: ObservationWindow,
    policy: PolicyConfig,
    replicas: int,
    now: float,
    logs: Mapping[str, pod_status.PreviousLog] | None = None,
) -> TunerLoop:
    """The recommendation to stand by, and what to record (:class:`~.tuner_status.TunerLoop`: a new plan, a
    recommendation no pod runs, or a judged tick); ``window``: the metrics of :func:`compute_metric_pods`;
    ``replicas``: the target's ``spec.replicas``; ``logs``: the previous logs the reconcile read."""
    state = loop_state.build_loop_state(status)
    current = compute_current(state.history, inputs.plan.settings)
    if current is None:  # a new plan: the loop starts again from it
        return TunerLoop(inputs.plan.settings, planned_from=discovered)
    state = dataclasses.replace(state, current=current)
    views = build_views(pods, container, current, logs)
    mine = [v for v in views if v.settings is not None and not v.terminating]
    if not mine:  # nothing judges it: a rollout waits, its deadline counts from the first such pod's start
        return TunerLoop(current, not_running=True)
    context = TuningContext(
        gpu=inputs.gpu,
        default_max_model_len=inputs.model.default_max_model_len(vllm.parse_version(inputs.vllm_version)),
        bounds=loop_settings.build_bounds(inputs.plan_spec, inputs.gpu.fp8_kv),
        policy=policy,
        vllm_version=inputs.vllm_version,
        slo=loop_settings.build_slo(inputs.plan_spec),
        max_num_active_seqs=inputs.engine.max_num_active_seqs,
    )
    reading = tick.TickReading(
        budget=compute_budget(inputs, current),
        window=window,
        pods=mine,
        # the others judge nothing; a group's crashed pods, gone since, do; a group is one replica
        summary=pod_status.compute_pod_summary(
            [*mine, *(v for v in views if v.gone)], current, sum(1 for v in mine if not v.group_worker)
        ),
        replica_view=pod_status.compute_replica_view(views, max(1, replicas)),
        replicas=max(1, replicas),
        restart_seconds=pod_status.compute_startup_seconds(mine, current),
        checkpoint_gib=inputs.checkpoint_bytes / GIB if inputs.checkpoint_bytes else None,
    )
    judged = tick.compute_tick(state, reading, context, now)
    decision = judged.decision
    # kvpilot's "apply" is the recommendation in the status (the webhook reads it there): always done
    record = LoopTick(
        state=state,
        decision=decision,
        rollout=judged.rollout,
        now=now,
        generation=None,
        rollout_deadline_seconds=policy.rollout_deadline_seconds,
        mode="Auto",
        applied=True,
        kind=api.ENGINE_TUNER_KIND,
    )
    return TunerLoop(decision.settings if decision.changes else current, decision, tick=record)
