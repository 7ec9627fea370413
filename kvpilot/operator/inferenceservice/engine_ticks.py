"""Which loop ticks a service whose engine has rules of its own: one entry per engine of
:data:`kvpilot.operator.planning.engines.RECOMMENDING_KINDS` (SGLang's :func:`.sglang_loop.run_sglang_tick`,
TGI's :func:`.tgi_loop.run_tgi_tick`), each :func:`.engine_loop.run_engine_tick` with the engine's profile.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kvpilot.operator.inferenceservice import sglang_loop, tgi_loop
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.loop_deps import LoopDeps

Tick = Callable[[LoopDeps, Service, Any, Any], Awaitable[Any]]

TICKS: Mapping[str, Tick] = {"SGLang": sglang_loop.run_sglang_tick, "TGI": tgi_loop.run_tgi_tick}
"""``spec.engine.kind`` -> its loop's tick."""


async def run_engine_rules(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> None:
    """One tick of the loop of ``svc``'s engine (none for an engine without rules of its own)."""
    tick = TICKS.get(svc.spec.engine.kind)
    if tick is not None:
        await tick(deps, svc, patch, logger)
