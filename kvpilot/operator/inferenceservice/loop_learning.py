"""Fleet learning from the closed loop: what one tick of an InferenceService teaches its TuningProfiles.

After a tick's status is recorded, its new facts go to the profiles the service teaches
(:mod:`kvpilot.operator.planning.profile_scope`: its namespace's, a shared one when listed), where the
planner of the next service of the same model and GPU reads them (:mod:`kvpilot.operator.planning.profiles`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import profile_scope, profiles, resolve
from kvpilot.operator.status import status_patch
from kvpilot.tuner.loop import Action, Decision, RestartKind
from kvpilot.tuner.types import MemoryBudget


async def apply_learning(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs,
    decision: Decision,
    budget: MemoryBudget,
    new_status: Mapping[str, Any],
    startup: float | None,
    logger: Any,
) -> None:
    """The tick's new facts for :mod:`.profiles`: a new KV report against the budget of the same settings, the
    settings a CUDA OOM struck (as vLLM ran them), settings that passed probation, a new start-up time; to
    the profiles this service teaches (:mod:`.profile_scope`: its namespace's, a shared one when listed)."""
    state, old = svc.state, svc.old
    calibration = new_status.get("calibration")
    tokens = calibration.get("observedKvCacheTokens") if isinstance(calibration, Mapping) else None
    oom = decision.trigger == RestartKind.CUDA_OOM and decision.action in (Action.RETUNE, Action.ROLLBACK)
    healthy = decision.good if decision.good is not None and decision.good != state.last_good else None
    new_startup = startup if startup is not None and startup != old.get("startupSeconds") else None
    if not tokens and not oom and healthy is None and new_startup is None:
        return
    model, gpu = inputs.model.config_key, inputs.gpu.gpu.name
    keys = profile_scope.compute_keys(model, gpu, svc.spec, state.current, svc.namespace)
    await profiles.record_observations(
        deps.kube,
        keys,
        svc.spec.model.id,
        f"{svc.namespace}/{svc.name}",
        budget=budget,
        observed_kv_tokens=int(tokens) if tokens else None,
        oom=(decision.effective or state.current) if oom else None,
        healthy=healthy,
        startup_seconds=new_startup,
        now=status_patch.format_time(deps.clock()),
        logger=logger,
    )
