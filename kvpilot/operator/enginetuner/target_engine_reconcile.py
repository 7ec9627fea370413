"""The EngineTuner's reconcile of a target whose container runs SGLang or TGI, after its reading.

:func:`reconcile_engine`: the closed loop (:func:`.target_engine_tick.fetch_engine_loop`: the plan's flags,
the InferenceService planner's for that engine, as the engine's own rules changed them since on the pods
that run them) gives the recommendation; in mode Auto one pod that does not run it is evicted once the
status holds it (:func:`.target_eviction.apply_eviction`; the admission webhook puts it on the
replacement); the status is
:func:`kvpilot.operator.status.engine_tuner_status.build_engine_tuner_status`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator.enginetuner import target_engine_reading, target_engine_tick, target_eviction
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.enginetuner.target_status_write import apply_tuner_status
from kvpilot.operator.status import engine_tuner_status


async def reconcile_engine(
    deps: TargetDeps,
    read: EngineTarget,
    body: Mapping[str, Any],
    old: Mapping[str, Any],
    patch: kopf.Patch,
    now: float,
    logger: Any,
) -> None:
    """An SGLang or TGI target: the closed loop's recommendation; evict one pod in Auto; record."""
    loop = await target_engine_tick.fetch_engine_loop(deps, read, old, now)
    recommended = EngineArgs(read.found.kind, loop.recommended)
    published = engine_tuner_status.is_engine_published(old, read.generation, recommended.args)
    eviction = await target_eviction.apply_eviction(deps, read, old, recommended, now, body, published)
    found = target_engine_reading.build_engine_found(read, recommended, now)
    out = engine_tuner_status.build_engine_tuner_status(old, found, loop, eviction)
    apply_tuner_status(deps, body, patch, out)
    pods = f"{found.discovered.pods_tuned}/{found.discovered.pods} pods run the recommendation"
    planned = engine_tuner_status.describe_args(recommended.args, recommended.kind)
    logger.info(
        f"EngineTuner {read.mode} ({recommended.kind}): recommends {planned}; {pods}{eviction.message}"
    )
