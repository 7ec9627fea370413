"""What one closed-loop tick of an InferenceService does to its Deployment: what it rolls out, and how.

The acting half of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once`:
:func:`build_loop_deployment` (the Deployment of given settings, no re-plan), :func:`fetch_rollout`
(the strategy a change rolls out with and what it costs) and :func:`apply_settings` (the Deployment
patched, a ``RetuneFailed`` event otherwise). What the fleet learns: :mod:`.loop_learning`; whether the
pods could ever schedule: :mod:`.loop_schedulable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice.loop_observing import Cluster, Observed
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import rollout_strategy, workloads
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import events
from kvpilot.tuner.loop import Action, Decision
from kvpilot.tuner.types import EngineSettings


def build_loop_deployment(
    meta: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    settings: EngineSettings,
    choice: RolloutChoice | None = None,
) -> dict[str, Any]:
    """The Deployment (or a replica over several nodes' LeaderWorkerSet) running ``settings`` exactly (no
    re-plan: a rollback must not wait on the planner), with the user's extra args and the resolved GPU
    products, as the reconciler renders it, rolled out with ``choice``'s strategy (``None``: the one the
    spec declares)."""
    user = modes.compute_user_args(spec)
    deployment = workloads.build_deployment(
        meta,
        spec,
        settings,
        user.extra,
        inputs.gpu.products,
        checkpoint_bytes=resolve.compute_checkpoint_bytes(inputs.model),
        rollout=choice,
        layout=modes.compute_group_layout(spec, inputs, user),
    )
    return workloads.build_workload(deployment, spec)


async def fetch_rollout(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs,
    observed: Observed,
    decision: Decision,
    redecide: Callable[[float, str | None], Decision],
) -> tuple[Decision, RolloutChoice, Cluster | None]:
    """The strategy ``decision``'s change would roll out with, and the decision again with what that
    costs (``Evidence.rollout_lost_fraction``) or why it cannot roll out (``rollout_blocked``), with the
    cluster read for it. A rollback is never held: the previous settings' pods are still there or serve
    nothing."""
    assert deps.kube is not None
    cluster = await workloads.fetch_capacity(deps.kube)
    deployment = build_loop_deployment(svc.meta, svc.spec, inputs, decision.settings)
    choice = await workloads.fetch_rollout_choice(
        deps.kube,
        svc.spec,
        deployment,
        serving=observed.ready,
        not_serving_why=observed.serving.degraded_reason or "",
        cluster=cluster,
    )
    if decision.action == Action.ROLLBACK:
        if choice.held:
            choice = RolloutChoice("Surge", "rolling back: the previous settings' pods still serve")
        return decision, choice, cluster
    lost, blocked = rollout_strategy.compute_costs(choice, svc.spec.replicas, serving=observed.ready)
    if lost or blocked:
        decision = redecide(lost, blocked)
    return decision, choice, cluster


async def apply_settings(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs | None,
    settings: EngineSettings,
    what: str,
    logger: Any,
    choice: RolloutChoice | None = None,
) -> bool:
    """Roll ``settings`` out to the Deployment; False (and a ``RetuneFailed`` event) if that failed."""
    try:
        if inputs is None or deps.kube is None:
            raise errors.ApplyFailed("model/GPU not resolved or no Kubernetes client")
        deployment = build_loop_deployment(svc.meta, svc.spec, inputs, settings, choice)
        await workloads.apply_workloads([deployment], deps.kube, deps.owners)
    except Exception as exc:  # noqa: BLE001 -- report and retry on the next tick
        logger.warning(f"closed loop: applying {what} failed: {exc!r}")
        reason = errors.NameConflict.reason if isinstance(exc, errors.NameConflict) else "RetuneFailed"
        deps.emit(svc.body, events.WARNING, reason, f"could not apply {what}: {errors.classify(exc).message}")
        return False
    return True
