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

from kvpilot.operator.inferenceservice.engine_loop import run_engine_tick
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.engine_profiles import TGI_PROFILE, build_tgi_context, decide_tgi
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.tuner.loop import TgiDecision

__all__ = ["PROFILE", "build_tgi_context", "decide_tgi", "run_tgi_tick"]

PROFILE = TGI_PROFILE
"""TGI's profile (:mod:`kvpilot.operator.loop.engine_profiles`, shared with the EngineTuner)."""


async def run_tgi_tick(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> TgiDecision | None:
    """One tick (:func:`run_engine_tick` with TGI's :data:`PROFILE`)."""
    return await run_engine_tick(PROFILE, deps, svc, patch, logger)
