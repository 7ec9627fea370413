"""The closed loop for an SGLang service: its pods and metrics read, SGLang's rules asked, the answer kept.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for ``spec.engine.kind`` SGLang
(:data:`kvpilot.operator.planning.engines.RECOMMENDING_KINDS`), in modes Auto and Recommend::

    pods (args, lastState.terminated, the previous log when the message says nothing)
        --pods.sglang_pods--> the settings they run, their restarts (classified by the seam)
    Prometheus (the seam's MetricSeries: token usage, retractions, queued, TTFT/ITL) --> ObservationWindow
    model + GPU (resolve) --> SglangMemory; spec.tuning.bounds, spec.serving.slo --> SglangContext
    status.failedEngineArgs --> the ruled-out runs
        --tuner.loop.compute_sglang_decision--> SglangDecision
        --status.sglang_patch--> one conditional status PATCH, events (Recommended, the failure, Infeasible)

It recommends and never rolls out: the Deployment keeps what the reconciler renders (mode Auto: the plan's
flags; Recommend: SGLang's own defaults). What Auto lacks to roll the flags out: the reconciler renders the
plan (:func:`kvpilot.operator.planning.engines.plan_sglang`), not a status-held setting, so a rolled-out
change would be reverted as drift; and the rollout's probation, rollback and ``lastGood`` are kept in
vLLM's :class:`~kvpilot.tuner.types.EngineSettings` (``docs/engines/sglang.md``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.sglang_pods import ENGINE, SglangPod, read_sglang_pods
from kvpilot.operator.status import sglang_patch, status_write
from kvpilot.operator.status.status_patch import StatusPatch, reconcile_succeeded
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import (
    ObservationWindow,
    PolicyConfig,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
    compute_sglang_decision,
)

__all__ = [
    "SglangPod",
    "build_sglang_context",
    "build_state_and_evidence",
    "read_sglang_pods",
    "run_sglang_tick",
]


def compute_current(pods: Sequence[SglangPod]) -> sglang.SglangSettings:
    """The settings most live pods run (SGLang's defaults when no pod says)."""
    counts = Counter(p.settings for p in pods if p.settings is not None and not p.terminating)
    if not counts:
        return sglang.SglangSettings()
    return max(counts, key=lambda s: (counts[s], -list(counts).index(s)))


def build_state_and_evidence(
    pods: Sequence[SglangPod], window: ObservationWindow, status: Mapping[str, Any]
) -> tuple[SglangLoopState, SglangEvidence]:
    """The policy's inputs: the current settings, the ruled-out runs of the status, and the restarts of the
    pods that run the current settings."""
    current = compute_current(pods)
    restarts = tuple(p.restart for p in pods if p.restart is not None and p.settings == current)
    return (
        SglangLoopState(current, sglang_patch.read_failed_runs(status)),
        SglangEvidence(window, restarts),
    )


def build_sglang_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> SglangContext:
    """What the policy tunes within: the GPU and the model, ``spec.tuning.bounds`` (the memory-share bounds
    bound ``--mem-fraction-static``), the TTFT objective of ``spec.serving.slo``."""
    memory = SglangMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, False, None)
    return SglangContext(memory, bounds, policy, slo.ttft_p95_seconds if slo is not None else None)


async def run_sglang_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> SglangDecision | None:
    """One tick; ``None`` while there is nothing to decide (the reconciler has not applied, the model or
    the pods cannot be read: the next tick tries again). Never raises for a cluster or Prometheus failure."""
    if not reconcile_succeeded(svc.old):
        return None
    policy = loop_settings.build_policy(svc.spec, deps.pace)
    try:
        inputs = await resolve.fetch_inputs(svc.spec, svc.namespace, deps.kube, deps.hub)
        pods = (
            await asyncio.to_thread(read_sglang_pods, deps.pods, svc.namespace, svc.name) if deps.pods else []
        )
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports a bad model; an API hiccup: next tick
        logger.warning(f"closed loop (SGLang): cannot read the model or the pods ({exc}); skipping this tick")
        return None
    window = await deps.fetch_window(
        deps.prometheus or deps.prom_url,
        svc.namespace,
        svc.name,
        svc.now,
        pods=tuple(p.name for p in pods if not p.terminating),
        window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds,
        max_age_seconds=deps.pace.interval_seconds,
        series=ENGINE.metrics,
    )
    state, evidence = build_state_and_evidence(pods, window, svc.old)
    decision = compute_sglang_decision(
        state, evidence, build_sglang_context(svc.spec, inputs, policy), svc.now
    )
    out = sglang_patch.build_sglang_patch(svc.old, decision, svc.mode, generation=svc.generation, now=svc.now)
    if await _apply(deps, patch, svc, out, logger) == status_write.WRITTEN:
        for type_, reason, message in out.events:
            deps.emit(svc.body, type_, reason, message)
    if out.events:
        logger.info(f"closed loop (SGLang): {decision.action} ({decision.trigger}): {decision.reason}")
    return decision


async def _apply(deps: LoopDeps, patch: Any, svc: Service, out: StatusPatch, logger: Any) -> str:
    """One conditional PATCH (:func:`status_write.apply_status`); kopf's ``patch`` without a client."""
    if deps.kube is None:
        out.add_to(patch, old=svc.old)
        return status_write.WRITTEN
    return await status_write.apply_status(
        deps.kube, svc.namespace, svc.name, svc.version, out, svc.old, logger
    )
