"""What the closed-loop tick of an engine with rules of its own (SGLang, TGI) writes: its status (one
conditional PATCH) and, for a change in mode Auto, the Deployment with the new flags.

The acting half of :func:`kvpilot.operator.inferenceservice.engine_loop.run_engine_tick`, as
:mod:`.loop_actions` is vLLM's: what a change's rollout would lose or why it cannot roll out
(:func:`fetch_rollout_costs`, as vLLM's :func:`.loop_actions.fetch_rollout`), the status first
(:func:`apply_engine_status`), then the flags (:func:`apply_flags`: the reconciler's rendering with the
flags kept, the rollout strategy the cluster allows now).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import engine_desired
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import engines, resolve
from kvpilot.operator.pods import workloads
from kvpilot.operator.status import events, status_write
from kvpilot.operator.status.status_patch import StatusPatch


async def apply_flags(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs,
    flags: engines.EngineFlags,
    logger: Any,
    costs: workloads.RolloutCosts | None = None,
) -> bool:
    """The Deployment (a replica over several nodes: the LeaderWorkerSet) with ``flags`` (the reconciler's
    rendering, the flags kept), rolled out with the strategy the change was weighed on (``costs``, as vLLM's
    :func:`.loop_actions.apply_settings` takes its choice), else the one the cluster allows now; False and a
    ``RetuneFailed`` event when it cannot be applied (the reconciler and drift repair render
    ``status.appliedEngineArgs`` next)."""
    try:
        if deps.kube is None:
            raise errors.ApplyFailed("no Kubernetes client")
        _, manifests = engine_desired.build_engine_manifests(svc.meta, svc.spec, inputs, flags)
        workload = [m for m in manifests if m["kind"] in workloads.WORKLOAD_KINDS]
        if costs is not None:
            workload = [workloads.build_rollout_strategy(m, costs.choice) for m in workload]
        else:
            workload = await workloads.fetch_rollout_strategy(deps.kube, svc.spec, workload)
        await workloads.apply_workloads(workload, deps.kube, deps.owners)
    except Exception as exc:  # noqa: BLE001 -- report; the reconciler or drift repair applies it later
        logger.warning(f"closed loop ({svc.spec.engine.kind}): applying the new flags failed: {exc!r}")
        reason = errors.NameConflict.reason if isinstance(exc, errors.NameConflict) else "RetuneFailed"
        message = f"could not apply the new {svc.spec.engine.kind} flags: {errors.classify(exc).message}"
        deps.emit(svc.body, events.WARNING, reason, message)
        return False
    return True


async def fetch_rollout_costs(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs,
    flags: engines.EngineFlags,
    *,
    serving: bool,
    not_serving_why: str = "",
) -> workloads.RolloutCosts | None:
    """What a rollout of ``flags`` costs under the strategy the cluster allows now
    (:func:`workloads.fetch_rollout_costs`, the strategy :func:`apply_flags` renders): the share of the
    service's capacity it loses while a pod restarts (Surge 0, Replace ``k/N``, Recreate 1, 0 while nothing
    serves) and why it cannot roll out (one replica, no spare GPU, no ``allowDowntime``:
    :data:`~kvpilot.operator.pods.rollout_strategy.HELD_MESSAGE`), as vLLM's
    :func:`.loop_actions.fetch_rollout`, with the choice :func:`apply_flags` then renders. ``None`` when it
    cannot be read (no client, the flags cannot be rendered, an API hiccup: :func:`apply_flags` meets it and
    says so)."""
    if deps.kube is None:
        return None
    try:
        _, manifests = engine_desired.build_engine_manifests(svc.meta, svc.spec, inputs, flags)
        workload = next(m for m in manifests if m["kind"] in workloads.WORKLOAD_KINDS)
        return await workloads.fetch_rollout_costs(
            deps.kube, svc.spec, workload, serving=serving, not_serving_why=not_serving_why
        )
    except Exception:  # noqa: BLE001 -- apply_flags reports what cannot be rendered or read
        return None


async def apply_engine_status(
    deps: LoopDeps, patch: Any, svc: Service, out: StatusPatch, logger: Any
) -> bool:
    """One conditional PATCH (:func:`status_write.apply_status`; kopf's ``patch`` without a client): whether
    it was written (refused or unknown: nothing is rolled out, the next tick decides again)."""
    if deps.kube is None:
        out.add_to(patch, old=svc.old)
        return True
    written = await status_write.apply_status(
        deps.kube, svc.namespace, svc.name, svc.version, out, svc.old, logger
    )
    return written == status_write.WRITTEN
