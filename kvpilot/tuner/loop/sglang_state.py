"""What SGLang's closed loop is given and answers: the shared state of an engine's own loop
(:mod:`.engine_state`) in SGLang's flags, and the context it tunes within. Pure data.

:func:`kvpilot.tuner.loop.sglang_policy.compute_sglang_decision` takes these; :mod:`.engine_rollout` judges a
rollout in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import sglang
from kvpilot.tuner.engines import SglangEngine
from kvpilot.tuner.loop import engine_state
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.engine_state import CRASH_ORDER, UNCLASSIFIED, EngineRestart, kind_of
from kvpilot.tuner.loop.sglang_fit import SglangMemory

__all__ = [
    "CRASH_ORDER",
    "UNCLASSIFIED",
    "SglangChange",
    "SglangContext",
    "SglangDecision",
    "SglangEvidence",
    "SglangLoopState",
    "SglangRestart",
    "SglangRollout",
    "classify_restart",
    "kind_of",
]

SglangRestart = EngineRestart
SglangChange = engine_state.EngineChange[sglang.SglangSettings]
SglangRollout = engine_state.EngineRollout[sglang.SglangSettings]
SglangLoopState = engine_state.EngineLoopState[sglang.SglangSettings]
SglangEvidence = engine_state.EngineEvidence
SglangDecision = engine_state.EngineDecision[sglang.SglangSettings]


def classify_restart(time: float, log: str, pod: str = "") -> SglangRestart:
    """A termination and its log, classified by the seam (:meth:`SglangEngine.classify_failure`)."""
    return engine_state.classify_restart(SglangEngine(), time, log, pod)


@dataclass(frozen=True, slots=True)
class SglangContext:
    """What one SGLang service is tuned on and within."""

    memory: SglangMemory
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    ttft_p95_seconds: float | None = None
    itl_p95_seconds: float | None = None
    """``spec.serving.slo``'s objectives (``None``: none)."""
