"""The EngineTuner's closed loop: a crash of the recommendation lowers it, by the InferenceService's policy.

Pure: the plan, the EngineTuner's status and the target's pods in, the recommendation to stand by and
what to record out. Each reconcile (create, spec change, the timer) after the plan:

* The recommendation is the plan's, as changed by the loop since: ``status.history`` holds a ``Planned``
  entry for the plan (added when the plan is new: a spec change, another GPU) and ``Retuned`` entries from
  there; the newest change after the plan's entry is what kvpilot stands by (:func:`compute_current`).
* Restarts of the target's pods that run it (``lastState.terminated``, classified as for an
  InferenceService: :func:`kvpilot.operator.pod_status.build_restart_event`) go to
  :func:`kvpilot.tuner.loop.compute_decision` with the spec's bounds and policy, and a metrics window that
  says none is read. So only the crash rules act (CUDA OOM, a KV cache too small at start-up, no cache
  blocks, insufficient free memory: :mod:`kvpilot.tuner.loop.remedies`), with the same filters (bounds,
  failed settings, "would vLLM start"); a remedy becomes the recommendation, the crashed settings go to
  ``status.failedSettings`` (never recommended again), and a ``Retuned`` entry records why.

What does not run for EngineTuners: Prometheus pressure, SLOs, idle capacity, rollback and probation
(kvpilot does not roll the target out; in mode Auto, :mod:`.target_handlers` evicts pods one at a time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, loop_settings, loop_state, pod_status, status_patch, target
from kvpilot.tuner import memory, vllm
from kvpilot.tuner.loop import Action, Decision, Evidence, ObservationWindow, TuningContext, compute_decision
from kvpilot.tuner.loop.history import HistoryAction, HistoryEntry
from kvpilot.tuner.loop.observations import RestartEvent
from kvpilot.tuner.model.spec import ModelSpec
from kvpilot.tuner.plan.topology import compute_pipeline_parallel
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget, Plan

NO_METRICS = "EngineTuners read no Prometheus metrics: only crashes of the recommendation retune it"
"""The metrics window's reason: the policy's metric steps hold on it."""


@dataclass(frozen=True, slots=True)
class LoopOutcome:
    """What one reconcile of the loop decided."""

    settings: EngineSettings
    """The recommendation to stand by."""
    history: list[dict[str, Any]]
    """``status.history`` entries to append (dedupe: the newest entry already says the same)."""
    failed: EngineSettings | None = None
    """Settings to add to ``status.failedSettings``."""
    decision: Decision | None = None
    """The policy's decision, when a restart of the recommendation was judged."""


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


def compute_restarts(
    pods: Sequence[Mapping[str, Any]], container: str, settings: EngineSettings
) -> tuple[RestartEvent, ...]:
    """The last terminations of the vLLM containers of the pods that run ``settings``."""
    out = []
    for pod in pods:
        if not target.pod_carries(pod, container, settings):
            continue
        for status_c in (pod.get("status") or {}).get("containerStatuses") or ():
            if status_c.get("name") == container:
                event, _ = pod_status.build_restart_event(str(pod["metadata"]["name"]), status_c)
                if event is not None:
                    out.append(event)
    return tuple(out)


def _ready(pods: Sequence[Mapping[str, Any]], container: str, settings: EngineSettings) -> bool:
    return bool(pods) and all(
        target.pod_carries(p, container, settings)
        and any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or ())
        for p in pods
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoopInputs:
    """What the planner already resolved for the target."""

    plan_spec: api.InferenceServiceSpec
    plan: Plan
    model: ModelSpec
    gpu: GpuSpec
    vllm_version: str
    checkpoint_bytes: int | None = None


def compute_budget(inputs: LoopInputs, settings: EngineSettings) -> MemoryBudget:
    """The memory model's budget of ``settings`` in the target's topology (the plan's own when they are
    the plan's)."""
    if same_settings(settings, inputs.plan.settings):
        return inputs.plan.budget
    tp = settings.tensor_parallel_size or 1
    return memory.compute_budget(
        inputs.model, inputs.gpu, settings.replace(tensor_parallel_size=tp),
        pipeline_parallel_size=compute_pipeline_parallel(inputs.plan_spec.gpu.count, tp),
        vllm_version=inputs.vllm_version, weights_total_bytes=inputs.checkpoint_bytes,
    )  # fmt: skip


def compute_loop(
    inputs: LoopInputs, status: Mapping[str, Any], discovered: EngineSettings,
    pods: Sequence[Mapping[str, Any]], container: str, *, now: float, time: str,
) -> LoopOutcome:  # fmt: skip
    """The recommendation to stand by, and what to record (``time``: ``now`` as RFC 3339)."""
    planned = inputs.plan.settings
    state = loop_state.build_loop_state(status)
    current = compute_current(state.history, planned)
    if current is None:  # a new plan: the loop starts from it
        entry = status_patch.build_history_entry(
            time=time, action=HistoryAction.PLANNED, trigger="Discovered",
            reason=f"planned {vllm.describe_settings(planned)} (the target runs "
                   f"{vllm.describe_settings(discovered)})",
            from_settings=discovered, to_settings=planned,
        )  # fmt: skip
        return LoopOutcome(planned, [entry])
    restarts = compute_restarts(pods, container, current)
    if not restarts:
        return LoopOutcome(current, [])
    context = TuningContext(
        gpu=inputs.gpu,
        default_max_model_len=inputs.model.default_max_model_len(vllm.parse_version(inputs.vllm_version)),
        bounds=loop_settings.build_bounds(inputs.plan_spec, inputs.gpu.fp8_kv),
        policy=loop_settings.build_policy(inputs.plan_spec),
        vllm_version=inputs.vllm_version,
    )
    evidence = Evidence(
        budget=compute_budget(inputs, current), window=ObservationWindow.unavailable(NO_METRICS, now),
        restarts=restarts, ready=_ready(pods, container, current), replicas=max(1, len(pods)),
    )  # fmt: skip
    decision = compute_decision(dataclasses.replace(state, current=current), evidence, context, now)
    if decision.changes:
        entry = status_patch.build_history_entry(
            time=time, action=HistoryAction.RETUNED, trigger=decision.trigger, reason=decision.reason,
            from_settings=current, to_settings=decision.settings,
        )  # fmt: skip
        return LoopOutcome(decision.settings, [entry], decision.failed, decision)
    if decision.trigger in {str(r.cause.kind) for r in restarts}:  # a crash no argument fixes: say so, once
        action = HistoryAction.INFEASIBLE if decision.action == Action.INFEASIBLE else HistoryAction.HELD
        entry = status_patch.build_history_entry(
            time=time, action=action, trigger=decision.trigger, reason=decision.reason,
            from_settings=current, to_settings=current,
        )  # fmt: skip
        new = status_patch.append_history(status.get("history") or (), entry, dedupe=True) is not None
        return LoopOutcome(current, [entry] if new else [], None, decision)
    return LoopOutcome(current, [], None, decision)
