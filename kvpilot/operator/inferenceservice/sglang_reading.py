"""What an SGLang service's closed-loop tick reads into SGLang's policy: the state its status keeps, the
evidence of its pods, the context it tunes within. Pure.

:func:`build_state_and_evidence` (mode Auto: the flags the status says the Deployment runs, the rollout, the
last good flags; every mode: the ruled-out runs, the last change, and the restarts, readiness and start of
the pods running the current flags) and :func:`build_sglang_context`, for
:func:`kvpilot.operator.inferenceservice.sglang_loop.run_sglang_tick`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.pod_status import parse_time
from kvpilot.operator.pods.sglang_pods import SglangPod
from kvpilot.operator.status import sglang_patch
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import (
    HistoryAction,
    ObservationWindow,
    PolicyConfig,
    SglangChange,
    SglangContext,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
)


def compute_current(pods: Sequence[SglangPod]) -> sglang.SglangSettings:
    """The settings most live pods run (SGLang's defaults when no pod says)."""
    counts = Counter(p.settings for p in pods if p.settings is not None and not p.terminating)
    if not counts:
        return sglang.SglangSettings()
    return max(counts, key=lambda s: (counts[s], -list(counts).index(s)))


def build_state_and_evidence(
    pods: Sequence[SglangPod],
    window: ObservationWindow,
    status: Mapping[str, Any],
    *,
    mode: str = "Recommend",
    replicas: int = 1,
) -> tuple[SglangLoopState, SglangEvidence]:
    """The policy's inputs: the current settings (mode Auto: ``status.appliedEngineArgs``, else what the
    pods run), the rollout, last good flags, ruled-out runs and last change of the status, and the restarts,
    readiness and start of the pods that run the current settings."""
    applied = sglang_patch.read_args(status, "appliedEngineArgs") if mode == "Auto" else None
    current = applied if applied is not None else compute_current(pods)
    live = [p for p in pods if not p.terminating]
    mine = [p for p in live if p.settings == current]
    restarts = tuple(p.restart for p in pods if p.restart is not None and p.settings == current)
    ready = replicas > 0 and sum(1 for p in mine if p.ready) >= replicas and len(mine) == len(live)
    state = SglangLoopState(
        current,
        sglang_patch.read_failed_runs(status),
        read_changes(status),
        sglang_patch.read_rollout(status, current) if mode == "Auto" else None,
        sglang_patch.read_args(status, "lastGoodEngineArgs") if mode == "Auto" else None,
    )
    not_started = any(p.not_started for p in mine) and not restarts
    return state, SglangEvidence(window, restarts, ready=ready, not_started=not_started)


def build_sglang_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> SglangContext:
    """What the policy tunes within: the GPU and the model, ``spec.tuning.bounds`` (the memory-share bounds
    bound ``--mem-fraction-static``), the TTFT and inter-token latency objectives of ``spec.serving.slo``."""
    memory = SglangMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, False, None)
    return SglangContext(
        memory,
        bounds,
        policy,
        slo.ttft_p95_seconds if slo is not None else None,
        slo.itl_p95_seconds if slo is not None else None,
    )


def read_changes(status: Mapping[str, Any]) -> tuple[SglangChange, ...]:
    """The changes the loop made, for the gates (the minimum interval, the cooldown, the hourly limit) and
    the flap guard (the flags each changed from and to): the ``Retuned`` and ``RolledBack`` entries of
    ``status.history`` in SGLang's flags, the ``Planned`` ones as the plan (the hourly limit and the
    cooldown count no plan, as vLLM's gates do not: the plan judged nothing), and ``lastChangeTime`` when the
    history no longer holds it."""
    history = status.get("history") or ()
    changes = [
        SglangChange(
            when,
            str(entry.get("trigger") or ""),
            before=sglang_patch.read_args(entry, "fromEngineArgs"),
            after=sglang_patch.read_args(entry, "toEngineArgs"),
        )
        for entry in history
        if entry.get("action") in ("Retuned", "RolledBack") and entry.get("toEngineArgs") is not None
        if (when := parse_time(entry.get("time"))) is not None
    ]
    changes += [
        SglangChange(when, str(entry.get("trigger") or ""), planned=True)
        for entry in history
        if entry.get("action") == HistoryAction.PLANNED
        if (when := parse_time(entry.get("time"))) is not None
    ]
    last = parse_time(status.get("lastChangeTime"))
    if last is not None and all(c.time != last for c in changes):
        changes.append(SglangChange(last, "lastChangeTime"))
    return tuple(changes)
