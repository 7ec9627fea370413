"""The closed loop for an SGLang service: :mod:`.engine_loop` with SGLang's flags and rules.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for ``spec.engine.kind`` SGLang:
the pods read into :class:`~kvpilot.tuner.sglang.SglangSettings`, Prometheus in the seam's series (token
usage, retractions, queued, TTFT/ITL), the model and GPU as :class:`~kvpilot.tuner.loop.SglangMemory`, and
:func:`kvpilot.tuner.loop.compute_sglang_decision` asked (``docs/engines/sglang.md``).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator import api
from kvpilot.operator.inferenceservice.engine_loop import run_engine_tick
from kvpilot.operator.inferenceservice.engine_reading import Profile
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.inferenceservice.sglang_reading import (
    build_sglang_context,
    build_state_and_evidence,
    compute_current,
)
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.engine_pods import SGLANG
from kvpilot.operator.pods.sglang_pods import SglangPod, read_sglang_pods
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import (
    PolicyConfig,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    compute_sglang_decision,
)

__all__ = [
    "PROFILE",
    "SglangPod",
    "build_sglang_context",
    "build_state_and_evidence",
    "compute_current",
    "read_sglang_pods",
    "run_sglang_tick",
]


def decide_sglang(
    state: SglangLoopState,
    evidence: SglangEvidence,
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    policy: PolicyConfig,
    now: float,
) -> SglangDecision:
    """SGLang's policy in the service's context (:func:`build_sglang_context`)."""
    return compute_sglang_decision(state, evidence, build_sglang_context(spec, inputs, policy), now)


PROFILE = Profile(SGLANG, sglang.SglangSettings, decide_sglang)


async def run_sglang_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> SglangDecision | None:
    """One tick (:func:`run_engine_tick` with SGLang's :data:`PROFILE`)."""
    return await run_engine_tick(PROFILE, deps, svc, patch, logger)
