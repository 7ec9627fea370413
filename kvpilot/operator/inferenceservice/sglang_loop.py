"""The closed loop for an SGLang service: :mod:`.engine_loop` with SGLang's flags and rules.

One tick of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once` for ``spec.engine.kind`` SGLang:
the pods read into :class:`~kvpilot.tuner.sglang.SglangSettings`, Prometheus in the seam's series (token
usage, retractions, queued, TTFT/ITL), the model and GPU as :class:`~kvpilot.tuner.loop.SglangMemory`, and
:func:`kvpilot.tuner.loop.compute_sglang_decision` asked (``docs/engines/sglang.md``).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator.inferenceservice.engine_loop import run_engine_tick
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.inferenceservice.sglang_reading import (
    build_sglang_context,
    build_state_and_evidence,
    compute_current,
)
from kvpilot.operator.loop.engine_profiles import SGLANG_PROFILE, decide_sglang
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.pods.sglang_pods import SglangPod, read_sglang_pods
from kvpilot.tuner.loop import SglangDecision

__all__ = [
    "PROFILE",
    "SglangPod",
    "build_sglang_context",
    "build_state_and_evidence",
    "compute_current",
    "decide_sglang",
    "read_sglang_pods",
    "run_sglang_tick",
]

PROFILE = SGLANG_PROFILE
"""SGLang's profile (:mod:`kvpilot.operator.loop.engine_profiles`, shared with the EngineTuner)."""


async def run_sglang_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> SglangDecision | None:
    """One tick (:func:`run_engine_tick` with SGLang's :data:`PROFILE`)."""
    return await run_engine_tick(PROFILE, deps, svc, patch, logger)
