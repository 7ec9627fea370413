"""The closed loop for a TGI service: :mod:`.engine_loop` with TGI's flags and rules.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for ``spec.engine.kind`` TGI: the
pods read into :class:`~kvpilot.tuner.tgi.TgiSettings` (:func:`kvpilot.tuner.tgi.parse_tgi_args`; a restart
classified from ``lastState.terminated.message``, else the previous log), Prometheus in the seam's series
(``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens``, ``tgi_batch_current_size``,
``tgi_queue_size``: :mod:`kvpilot.tuner.tgi.serving`), the model and GPU as
:class:`~kvpilot.tuner.loop.TgiMemory`, ``spec.tuning.bounds`` and ``serving.minContextLength`` as the bounds,
and :func:`kvpilot.tuner.loop.compute_tgi_decision` asked (``docs/engines/tgi.md``).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator import api
from kvpilot.operator.inferenceservice.engine_loop import run_engine_tick
from kvpilot.operator.inferenceservice.engine_reading import Profile
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.engine_pods import TGI
from kvpilot.tuner import tgi
from kvpilot.tuner.loop import (
    PolicyConfig,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    compute_tgi_decision,
)

__all__ = ["PROFILE", "build_tgi_context", "run_tgi_tick"]


def build_tgi_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> TgiContext:
    """What the policy tunes within: the GPU and the model, and ``spec.tuning.bounds`` merged with
    ``spec.serving`` (the concurrency bounds bound ``--max-concurrent-requests``, ``minContextLength`` and
    ``maxContextLength`` bound ``--max-total-tokens``, the memory-share floor bounds
    ``--cuda-memory-fraction``), and ``spec.serving.slo``'s inter-token latency objective (its TTFT objective
    is not kept for TGI: :class:`~kvpilot.tuner.loop.TgiContext`)."""
    memory = TgiMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, False, None)
    return TgiContext(memory, bounds, policy, slo.itl_p95_seconds if slo is not None else None)


def decide_tgi(
    state: TgiLoopState,
    evidence: TgiEvidence,
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    policy: PolicyConfig,
    now: float,
) -> TgiDecision:
    """TGI's policy in the service's context (:func:`build_tgi_context`)."""
    return compute_tgi_decision(state, evidence, build_tgi_context(spec, inputs, policy), now)


PROFILE = Profile(TGI, tgi.TgiSettings, decide_tgi)


async def run_tgi_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> TgiDecision | None:
    """One tick (:func:`run_engine_tick` with TGI's :data:`PROFILE`)."""
    return await run_engine_tick(PROFILE, deps, svc, patch, logger)
