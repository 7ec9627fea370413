"""The EngineTuner's reconcile of a target whose container runs SGLang or TGI, after its reading.

:func:`reconcile_engine`: the plan's flags (the InferenceService planner's for that engine:
:mod:`.target_engine_reading`) are the recommendation; in mode Auto one pod that does not run them is evicted
once the status holds them (:func:`.target_eviction.apply_eviction`; the admission webhook puts them on the
replacement); the status is :func:`kvpilot.operator.status.engine_tuner_status.build_engine_tuner_status`'s.
There is no closed loop for these engines in an EngineTuner yet: the recommendation is the plan's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator.enginetuner import target_engine_reading, target_eviction
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
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
    """An SGLang or TGI target: the plan's flags are the recommendation; evict one pod in Auto; record."""
    recommended = read.recommended
    published = engine_tuner_status.is_engine_published(old, read.generation, recommended.args)
    eviction = await target_eviction.apply_eviction(deps, read, old, recommended, now, body, published)
    found = target_engine_reading.build_engine_found(read, now)
    apply_tuner_status(deps, body, patch, engine_tuner_status.build_engine_tuner_status(old, found, eviction))
    pods = f"{found.discovered.pods_tuned}/{found.discovered.pods} pods run the recommendation"
    planned = engine_tuner_status.describe_args(recommended.args, recommended.kind)
    logger.info(
        f"EngineTuner {read.mode} ({recommended.kind}): recommends {planned}; {pods}{eviction.message}"
    )
