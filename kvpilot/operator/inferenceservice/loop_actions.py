"""What one closed-loop tick of an InferenceService does to the cluster: the Deployment it rolls out, how,
whether it could ever schedule, and what the fleet learns.

The acting half of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once`:
:func:`build_loop_deployment` (the Deployment of given settings, no re-plan), :func:`fetch_rollout`
(the strategy a change rolls out with and what it costs), :func:`fetch_schedulable` (the ``Schedulable``
condition), :func:`apply_settings` (the Deployment patched, a ``RetuneFailed`` event otherwise) and
:func:`apply_learning` (the tick's facts to the matching TuningProfiles).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpilot.operator import api, conditions, errors
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop import loop_state
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import modes, profile_scope, profiles, resolve
from kvpilot.operator.pods import capacity, pod_status, rollout_strategy, workloads
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import events, status_patch
from kvpilot.tuner.loop import Action, Decision, RestartKind
from kvpilot.tuner.types import EngineSettings, MemoryBudget

Cluster = tuple[list[capacity.NodeView], list[dict[str, Any]]]
"""The nodes and the unfinished pods (:func:`kvpilot.operator.pods.workloads.fetch_capacity`)."""


def build_loop_deployment(
    meta: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs, settings: EngineSettings,
    choice: RolloutChoice | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The Deployment running ``settings`` exactly (no re-plan: a rollback must not wait on the planner),
    with the user's extra args and the resolved GPU products, as the reconciler renders it, rolled out
    with ``choice``'s strategy (``None``: the one the spec declares)."""
    user = modes.compute_user_args(spec)
    return workloads.build_deployment(
        meta, spec, settings, user.extra, inputs.gpu.products,
        checkpoint_bytes=resolve.compute_checkpoint_bytes(inputs.model), rollout=choice,
    )  # fmt: skip


async def fetch_rollout(
    deps: LoopDeps, svc: Service, inputs: resolve.Inputs, views: list[pod_status.PodView],
    serving: pod_status.Serving, decision: Decision, redecide: Callable[[float, str | None], Decision],
) -> tuple[Decision, RolloutChoice, Cluster | None]:  # fmt: skip
    """The strategy ``decision``'s change would roll out with, and the decision again with what that
    costs (``Evidence.rollout_lost_fraction``) or why it cannot roll out (``rollout_blocked``), with the
    cluster read for it. A rollback is never held: the previous settings' pods are still there or serve
    nothing."""
    assert deps.kube is not None
    cluster = await workloads.fetch_capacity(deps.kube)
    deployment = build_loop_deployment(svc.meta, svc.spec, inputs, decision.settings)
    ready = any(v.ready and not v.terminating for v in views)
    choice = await workloads.fetch_rollout_choice(
        deps.kube, svc.spec, deployment, serving=ready, not_serving_why=serving.degraded_reason or "",
        cluster=cluster,
    )  # fmt: skip
    if decision.action == Action.ROLLBACK:
        if choice.held:
            choice = RolloutChoice("Surge", "rolling back: the previous settings' pods still serve")
        return decision, choice, cluster
    lost = rollout_strategy.compute_lost_fraction(choice, svc.spec.replicas, serving=ready)
    blocked = choice.reason if choice.held else None
    if lost or blocked:
        decision = redecide(lost, blocked)
    return decision, choice, cluster


async def fetch_schedulable(
    deps: LoopDeps, svc: Service, inputs: resolve.Inputs | None, views: list[pod_status.PodView],
    cluster: Cluster | None,
) -> list[status_patch.Update]:  # fmt: skip
    """The ``Schedulable`` condition: checked against the nodes while a pod cannot schedule or it is False
    (so it follows the nodes as they change); True without a read once every pod is on a node. ``inputs``
    ``None`` (mode Off resolves nothing): resolved here, when needed."""
    old = svc.old
    was_false = (conditions.find_condition(old.get("conditions"), conditions.SCHEDULABLE) or {}).get(
        "status"
    ) == conditions.FALSE
    pending = any(v.unschedulable for v in views)
    if not pending and not was_false:
        if views and all(v.started_at is not None for v in views if not v.terminating):
            return [(conditions.SCHEDULABLE, conditions.TRUE, "Scheduled", "every pod is on a node")]
        return []
    if deps.kube is None:
        return []
    if inputs is None:
        try:
            inputs = await resolve.fetch_inputs(svc.spec, svc.namespace, deps.kube, deps.hub)
        except Exception:  # noqa: BLE001 -- the reconciler reports resolution failures
            return []
    if cluster is not None:
        nodes = cluster[0]
    else:  # the nodes alone: what could ever fit does not depend on the pods
        try:
            nodes = [capacity.build_node_view(n) for n in await deps.nodes.fetch(deps.kube, deps.clock())]
        except errors.OperatorError:
            return []
    settings = loop_state.build_loop_state(old).current
    shape = capacity.build_pod_shape(build_loop_deployment(svc.meta, svc.spec, inputs, settings))
    verdict = capacity.compute_schedulable(shape, nodes)
    status = conditions.TRUE if verdict.schedulable else conditions.FALSE
    return [(conditions.SCHEDULABLE, status, verdict.reason, verdict.message)]


async def apply_settings(
    deps: LoopDeps, svc: Service, inputs: resolve.Inputs | None, settings: EngineSettings, what: str,
    logger: Any, choice: RolloutChoice | None = None,
) -> bool:  # fmt: skip
    """Roll ``settings`` out to the Deployment; False (and a ``RetuneFailed`` event) if that failed."""
    try:
        if inputs is None or deps.kube is None:
            raise errors.ApplyFailed("model/GPU not resolved or no Kubernetes client")
        deployment = build_loop_deployment(svc.meta, svc.spec, inputs, settings, choice)
        await workloads.apply_workloads([deployment], deps.kube)
    except Exception as exc:  # noqa: BLE001 -- report and retry on the next tick
        logger.warning(f"closed loop: applying {what} failed: {exc}")
        reason = errors.NameConflict.reason if isinstance(exc, errors.NameConflict) else "RetuneFailed"
        deps.emit(svc.body, events.WARNING, reason, f"could not apply {what}: {exc}")
        return False
    return True


async def apply_learning(
    deps: LoopDeps, svc: Service, inputs: resolve.Inputs, decision: Decision, budget: MemoryBudget,
    new_status: Mapping[str, Any], startup: float | None, logger: Any,
) -> None:  # fmt: skip
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
        deps.kube, keys, svc.spec.model.id, f"{svc.namespace}/{svc.name}", budget=budget,
        observed_kv_tokens=int(tokens) if tokens else None,
        oom=(decision.effective or state.current) if oom else None, healthy=healthy,
        startup_seconds=new_startup, now=status_patch.format_time(deps.clock()), logger=logger,
    )  # fmt: skip
