"""The closed loop's memory, read from the cluster: ``status`` -> the tuner's :class:`LoopState`.

Everything the loop remembers lives in the InferenceService's ``status`` (api-contract.md):
``applied``, ``lastGoodSettings``, ``failedSettings``, ``rollout``, ``calibration``,
``history``, ``lastChangeTime``, ``recommendation`` and the ``MetricsAvailable`` /
``RolloutInProgress`` conditions. An operator restarted mid-rollout reads the same status
and carries on: nothing is kept in memory between ticks.

:func:`build_loop_state` reads the status and :func:`read_budget` the planned budget; the way
back, a :class:`~kvpilot.tuner.loop.Decision` to a merge patch, is
:func:`kvpilot.operator.status.loop_patch.build_loop_patch`. Pure;
:mod:`kvpilot.operator.inferenceservice.closed_loop`
does the I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.pods.pod_summary import compute_newest_start
from kvpilot.operator.pods.pod_view import PodView, parse_time
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import HistoryAction, HistoryEntry, LoopState, RolloutState
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget


def _settings(wire: Mapping[str, Any] | None) -> EngineSettings | None:
    if not wire:
        return None
    return api.Settings.model_validate({k: v for k, v in wire.items() if v is not None}).to_engine()


def read_budget(status: Mapping[str, Any], vllm_version: str = api.VLLM_VERSION) -> MemoryBudget | None:
    """``status.budget`` (of the planned settings): the fallback when the memory model cannot run;
    ``vllm_version`` is the release the service runs
    (:func:`kvpilot.operator.planning.release.resolve_release`),
    whose default block size turns the recorded tokens into blocks."""
    wire = status.get("budget")
    b = api.Budget.model_validate({k: v for k, v in (wire or {}).items() if v is not None})
    if not b.kv_cache_tokens or b.kv_cache_gi_b is None or b.gpu_total_gi_b is None:
        return None
    return MemoryBudget(
        gpu_total_gib=b.gpu_total_gi_b,
        requested_gib=b.requested_gi_b or 0.0,
        weights_gib=b.weights_gi_b or 0.0,
        activation_gib=b.activation_gi_b or 0.0,
        non_torch_gib=b.non_torch_gi_b or 0.0,
        cuda_graph_gib=b.cuda_graph_gi_b or 0.0,
        available_kv_cache_gib=b.kv_cache_gi_b,
        kv_bytes_per_token=max(1, round(b.kv_cache_gi_b * GIB / b.kv_cache_tokens)),
        num_gpu_blocks=b.kv_cache_tokens // vllm.default_block_size(vllm.parse_version(vllm_version)),
        kv_cache_tokens=b.kv_cache_tokens,
        max_concurrency=b.max_concurrency or 0.0,
        starts=True,
        lora_gib=b.lora_gi_b or 0.0,
        speculative_gib=b.speculative_gi_b or 0.0,
        kv_connector_gib=b.kv_connector_gi_b or 0.0,
    )


def read_startup_seconds(status: Mapping[str, Any]) -> float | None:
    """``status.startupSeconds``: the last measured start-to-Ready seconds of a pod of this service."""
    value = status.get("startupSeconds")
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def with_pod_deadline(
    rollout: RolloutState | None, pods: Sequence[PodView], deadline_seconds: float
) -> RolloutState | None:
    """``rollout`` with its deadline counted from when the newest pod of its settings started
    (``status.startTime``), not from the patch: a pod that waited for a GPU or an image has used none of
    it. Unchanged while no such pod has started (Pending is not failure: the policy holds)."""
    if rollout is None:
        return None
    started = compute_newest_start(pods, rollout.settings)
    if started is None or started < rollout.started_at:
        return rollout
    return dataclasses.replace(rollout, deadline=started + deadline_seconds)


def _history_entry(wire: Mapping[str, Any]) -> HistoryEntry | None:
    when = parse_time(wire.get("time"))
    try:
        action = HistoryAction(str(wire.get("action")))
    except ValueError:
        return None
    if when is None:
        return None
    return HistoryEntry(
        time=when,
        action=action,
        trigger=str(wire.get("trigger") or ""),
        reason=str(wire.get("reason") or ""),
        from_settings=_settings(wire.get("from")) or EngineSettings(),
        to_settings=_settings(wire.get("to")) or EngineSettings(),
    )


def build_loop_state(status: Mapping[str, Any]) -> LoopState:
    """The loop's memory, from ``status`` (``applied`` must be set)."""
    current = _settings(status.get("applied")) or EngineSettings()
    rollout = None
    wire_rollout = status.get("rollout") or {}
    started, deadline = parse_time(wire_rollout.get("startedAt")), parse_time(wire_rollout.get("deadline"))
    rollout_settings = _settings(wire_rollout.get("settings"))
    if rollout_settings is not None and started is not None and deadline is not None:
        rollout = RolloutState(
            rollout_settings,
            started,
            deadline,
            probation_until=parse_time(wire_rollout.get("probationUntil")),
        )
    history = tuple(e for e in (_history_entry(w) for w in status.get("history") or ()) if e is not None)
    failed = tuple(s for s in (_settings(w) for w in status.get("failedSettings") or ()) if s is not None)
    tokens = (status.get("calibration") or {}).get("observedKvCacheTokens")
    return LoopState(
        current=current,
        last_good=_settings(status.get("lastGoodSettings")),
        failed=failed,
        rollout=rollout,
        history=history,
        observed_kv_tokens=int(tokens) if tokens else None,
    )
