"""What TGI's closed loop is given and answers: the shared state of an engine's own loop
(:mod:`.engine_state`) in TGI's flags (:class:`~kvpilot.tuner.tgi.TgiSettings`), and the context it tunes
within. Pure data.

:func:`kvpilot.tuner.loop.tgi_policy.compute_tgi_decision` takes these.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import tgi
from kvpilot.tuner.engines import TgiEngine
from kvpilot.tuner.loop import engine_state
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.engine_state import EngineRestart
from kvpilot.tuner.loop.tgi_fit import TgiMemory

__all__ = [
    "TgiChange",
    "TgiContext",
    "TgiDecision",
    "TgiEvidence",
    "TgiLoopState",
    "TgiRestart",
    "TgiRollout",
    "classify_tgi_restart",
]

TgiRestart = EngineRestart
TgiChange = engine_state.EngineChange[tgi.TgiSettings]
TgiRollout = engine_state.EngineRollout[tgi.TgiSettings]
TgiLoopState = engine_state.EngineLoopState[tgi.TgiSettings]
TgiEvidence = engine_state.EngineEvidence
TgiDecision = engine_state.EngineDecision[tgi.TgiSettings]


def classify_tgi_restart(time: float, log: str, pod: str = "") -> TgiRestart:
    """A termination and its log, classified by the seam (:meth:`TgiEngine.classify_failure`)."""
    return engine_state.classify_restart(TgiEngine(), time, log, pod)


@dataclass(frozen=True, slots=True)
class TgiContext:
    """What one TGI service is tuned on and within."""

    memory: TgiMemory
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    itl_p95_seconds: float | None = None
    """``spec.serving.slo.interTokenLatencyP95Seconds`` (``None``: none). TGI's TTFT objective is not kept:
    its only series for it is the router's queue time
    (:data:`kvpilot.tuner.tgi.serving.REQUEST_QUEUE_DURATION`), a lower bound of TTFT that leaves the prefill
    out."""
