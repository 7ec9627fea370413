"""The closed loop: a kopf timer per InferenceService that watches vLLM and retunes it.

Every ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds (default 30; the pace: :mod:`.loop_settings`) for each
service in mode ``Auto`` or ``Recommend`` that the reconciler has applied (``status.applied`` set)::

    pods (args, readiness, lastState.terminated) --pod_status--> restarts of the current settings, ready?
    Prometheus (vLLM metrics)              --prometheus--> ObservationWindow
    model + GPU (resolve, cached)          --memory------> MemoryBudget of the current settings
    status (applied, lastGood, failed, rollout, history, calibration) --loop_state--> LoopState
        --tuner.loop.compute_decision--> Decision
        --a change in Auto: nodes + unfinished pods (workloads.fetch_capacity) --rollout_strategy--> Surge,
          Replace, Recreate or held; decided again with what that costs (Evidence.rollout_lost_fraction,
          rollout_blocked)
        --status_patch.build_loop_patch--> one conditional status PATCH (status_write; refused: the tick ends)
        --> events (Retuned, RolledBack, OOMDetected, Held, ...)
        --Auto, a change: workloads.build_deployment with the settings and strategy, applied after the record

This module only orders that I/O; the pieces are pure elsewhere. One rollout at a time: while
``status.rollout`` is set, the policy only waits, puts the settings on probation (Ready),
succeeds (probation passed) or rolls back (a crash before Ready or on probation, or the
deadline). All state is in the status, so an operator restarted mid-rollout picks up where it
left off. The loop never raises to kopf: a failing Prometheus becomes ``MetricsAvailable=False``
and a hold; a failing apply is logged and retried on the next tick.
"""


from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from kvpilot.operator import api, conditions, errors
from kvpilot.operator.clients import metrics
from kvpilot.operator.clients.kube import Kube
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.loop import loop_settings, loop_state, tick
from kvpilot.operator.loop.loop_deps import LoopDeps, default_deps
from kvpilot.operator.planning import modes, profile_scope, profiles, release, resolve
from kvpilot.operator.pods import capacity, pod_cache, pod_status, rollout_strategy, workloads
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import events, status_patch, status_write
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import gpus, plan
from kvpilot.tuner.loop import (
    Action,
    Decision,
    LoopState,
    RestartKind,
    TuningContext,
    compute_decision,
)
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget


async def closed_loop_tick(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
    logger: kopf.Logger, vllm_pods: kopf.Index[pod_cache.PodKey, Any] | None = None, **_: Any,
) -> None:  # fmt: skip
    """The kopf timer's handler (registered in :mod:`kvpilot.operator.main`): one tick, never raising."""
    deps = default_deps()
    if vllm_pods is not None and deps.pods is not None:  # pods from kopf's index, not a LIST (pod_cache)
        deps = dataclasses.replace(deps, pods=pod_cache.IndexedPods(vllm_pods, deps.pods))
    try:
        await run_once(body=body, spec=spec, meta=meta, status=status, patch=patch, logger=logger, deps=deps)
    except Exception:  # noqa: BLE001 -- a bug must not stop the loop for every other service
        logger.exception("closed loop: tick failed")



# --- one tick ---------------------------------------------------------------------------------------


async def _fetch_pods(deps: LoopDeps, namespace: str, name: str) -> list[pod_status.PodView]:
    if deps.pods is None:
        return []
    selector = workloads.build_label_selector(name)
    views = await asyncio.to_thread(pod_status.read_pod_views, deps.pods, namespace, selector, name)
    if deps.kube is not None and pod_status.needs_node_check(views):  # a pod waits on a node: is it lost?
        try:
            nodes = await deps.nodes.fetch(deps.kube, deps.clock())
        except errors.OperatorError:
            return views  # nodes unreadable (RBAC, a hiccup): the pods' own signs still count
        views = pod_status.with_lost_nodes(views, nodes)
    return views


def _budget_for(
    inputs: resolve.Inputs, spec: api.InferenceServiceSpec, settings: EngineSettings
) -> MemoryBudget:
    """The budget of ``settings`` in the topology the Deployment renders
    (:func:`kvpilot.tuner.plan.compute_topology_budget`)."""
    engine = release.resolve_release(spec)
    return plan.compute_topology_budget(
        inputs.model.spec, inputs.gpu.gpu, spec.gpu.count, settings, engine.version,
        inputs.model.checkpoint_bytes, engine.flags,
    )  # fmt: skip


def _gpu_and_default_len(
    inputs: resolve.Inputs | None, status: Mapping[str, Any], current: EngineSettings,
    engine: release.EngineRelease,
) -> tuple[GpuSpec | None, int]:  # fmt: skip
    """The GPU and the model's maximum context the loop tunes for: resolved, else what the reconciler
    recorded (``status.gpu.catalogueName``, the applied ``max_model_len``), so a Hub outage does not
    stop crash remedies."""
    if inputs is not None:
        return inputs.gpu.gpu, inputs.model.spec.default_max_model_len(engine.parsed)
    name = (status.get("gpu") or {}).get("catalogueName")
    try:
        gpu = gpus.lookup_gpu(str(name)) if name else None
    except tuner_errors.TunerError:
        gpu = None
    return gpu, current.max_model_len or 0


async def run_once(
    *, body: Mapping[str, Any], spec: Mapping[str, Any], meta: Mapping[str, Any], status: Mapping[str, Any],
    patch: Any, logger: Any, deps: LoopDeps,
) -> Decision | None:  # fmt: skip
    """One observation-decision-action cycle for one InferenceService. Never raises.

    Its status goes out as one conditional PATCH, and a change is recorded before it is applied
    (:mod:`kvpilot.operator.status.status_write`); ``patch`` (kopf's) is used only without a Kubernetes
    client."""
    old = dict(status or {})
    version = meta.get("resourceVersion")  # what ``old`` was read at: kopf's body is live, read it now
    if not old.get("applied"):
        return None  # the reconciler has not applied anything yet
    try:
        parsed = desired.parse_spec(spec)
        pinned = modes.compute_user_args(parsed).pinned  # the user's values: never the loop's to change
    except (errors.OperatorError, tuner_errors.TunerError):
        return None  # the reconciler reports invalid specs
    mode = parsed.tuning.mode
    if parsed.replicas == 0:
        return None
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
    now = deps.clock()
    state = loop_state.build_loop_state(old)
    if mode == "Off":  # nothing to decide; the pods still say whether the service serves
        try:
            off_views = await _fetch_pods(deps, namespace, name)
        except Exception as exc:  # noqa: BLE001 -- API hiccup: the next tick retries
            logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
            return None
        serving = pod_status.compute_serving(off_views, state.current)
        generation = meta.get("generation")
        off = status_patch.build_serving_patch(old, serving, generation=generation, now=now)
        sched = await _schedulable(deps, old, meta, parsed, None, off_views, None, namespace)
        if off.lists is not None:
            off.lists.updates.extend(sched)
        await _write(deps, patch, namespace, name, version, off, old, logger)
        return None
    policy = loop_settings.build_policy(parsed, deps.pace)

    resolve_failure: errors.Failure | None = None
    try:
        inputs: resolve.Inputs | None = await resolve.fetch_inputs(parsed, namespace, deps.kube, deps.hub)
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports resolution failures; vanished refs: below
        logger.warning(f"closed loop: cannot resolve model/GPU ({exc}); using status.budget")
        inputs, resolve_failure = None, errors.classify(exc)
    engine = release.resolve_release(parsed)
    budget = loop_state.read_budget(old, engine.version)
    if inputs is not None:
        try:
            budget = _budget_for(inputs, parsed, state.current)
        except tuner_errors.TunerError as exc:
            logger.warning(f"closed loop: memory model failed for the current settings ({exc})")
    if budget is None:
        logger.info("closed loop: no memory budget yet; waiting for the reconciler")
        return None
    gpu, default_len = _gpu_and_default_len(inputs, old, state.current, engine)
    if gpu is None or not default_len:
        logger.info("closed loop: model or GPU not resolved and not in status; waiting for the reconciler")
        return None

    try:
        views = await _fetch_pods(deps, namespace, name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: skip this tick, the next one retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return None
    retry = deps.pending.take(namespace, name, state.current)  # recorded by an earlier tick, not yet applied
    if retry is not None and mode == "Auto" and not await _apply(
        deps, meta, parsed, inputs, retry[0], "the recorded change", logger, body, retry[1]
    ):
        deps.pending.add(namespace, name, retry)
    window = await deps.fetch_window(
        deps.prometheus or deps.prom_url,
        namespace,
        name,
        now,
        pods=tuple(v.name for v in views if not v.terminating),
        window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds,
        max_age_seconds=deps.pace.interval_seconds,  # one snapshot of every pod per tick, shared
    )

    context = TuningContext(
        gpu=gpu,
        default_max_model_len=default_len,
        mm_prefix_item_tokens=inputs.model.spec.mm_prefix_item_tokens if inputs is not None else 0,
        # Auto: the loop never changes a pinned value; Recommend: pinned is what the user deploys, and the
        # recommendation is advice on it
        bounds=loop_settings.build_bounds(parsed, gpu.fp8_kv, pinned if mode == "Auto" else None),
        policy=policy,
        vllm_version=engine.version,
        slo=loop_settings.build_slo(parsed),
    )
    startup = pod_status.compute_startup_seconds(views, state.current)
    restart_seconds = startup if startup is not None else loop_state.read_startup_seconds(old)
    reading = tick.TickReading(
        budget=budget, window=window, pods=views,
        summary=pod_status.compute_pod_summary(views, state.current, parsed.replicas),
        replica_view=pod_status.compute_replica_view(views, parsed.replicas), replicas=parsed.replicas,
        restart_seconds=restart_seconds,
    )  # fmt: skip
    judged = tick.compute_tick(state, reading, context, now)
    loop, evidence, decision = judged.loop, judged.evidence, judged.decision
    serving = pod_status.compute_serving(views, state.current)
    cluster = None
    choice: RolloutChoice | None = None
    if decision.changes and mode == "Auto" and inputs is not None and deps.kube is not None:
        cluster = await workloads.fetch_capacity(deps.kube)

        def redecide(lost: float, blocked: str | None) -> Decision:
            costs = dataclasses.replace(evidence, rollout_lost_fraction=lost, rollout_blocked=blocked)
            return compute_decision(loop, costs, context, now)

        decision, choice = await _choose_rollout(
            deps.kube, meta, parsed, inputs, views, serving, cluster, decision, redecide
        )

    change = bool(decision.changes) and mode == "Auto"
    if change and (inputs is None or deps.kube is None):  # cannot be applied: say so, record nothing
        what = str(decision.action)
        change = await _apply(deps, meta, parsed, inputs, decision.settings, what, logger, body)
    schedulable = await _schedulable(deps, old, meta, parsed, inputs, views, cluster, namespace)
    out = status_patch.build_loop_patch(
        old, state, decision, mode=mode, now=now, generation=meta.get("generation"), applied=change,
        rollout_deadline_seconds=policy.rollout_deadline_seconds, serving=serving, rollout_choice=choice,
        extra_conditions=schedulable,
    )  # fmt: skip
    out.status.update(tick.build_rollout_fields(old, state, judged.rollout, out.status))
    if startup is not None and startup != old.get("startupSeconds"):
        out.status["startupSeconds"] = round(startup, 1)
    resolved, resolve_events = status_patch.build_resolution_updates(old, resolve_failure)
    if out.lists is not None:
        out.lists.updates.extend(resolved)
    out.events.extend(resolve_events)
    written = await _write(deps, patch, namespace, name, version, out, old, logger)
    if written not in (status_write.WRITTEN, status_write.UNCHANGED):
        if change and written == status_write.UNKNOWN:  # applied next tick if status.applied says it landed
            deps.pending.add(namespace, name, (decision.settings, choice))
        return decision  # nothing recorded: nothing applied, no event; the next tick decides again
    for type_, reason, message in out.events:
        deps.emit(body, type_, reason, message)
    if change and inputs is not None:  # recorded: now the Deployment follows
        what = str(decision.action)
        if not await _apply(deps, meta, parsed, inputs, decision.settings, what, logger, body, choice):
            deps.pending.add(namespace, name, (decision.settings, choice))
    if inputs is not None:  # fleet learning: what this tick saw goes to the matching TuningProfile
        await _learn(deps, meta, parsed, inputs, state, decision, budget, out.status, startup, old, logger)
    if deps.record_metrics:
        for kind in out.decisions:
            metrics.record_decision(kind, namespace, name)
        running = decision.settings if change else state.current
        held = decision.action == Action.HOLD and not status_patch.is_quiet_hold(decision, old)
        metrics.record_service(namespace, name, running, policy, context.slo, held=held)
    if out.events:
        logger.info(f"closed loop: {decision.action} ({decision.trigger}): {decision.reason}")
    return decision


async def _learn(
    deps: LoopDeps, meta: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs,
    state: LoopState, decision: Decision, budget: MemoryBudget, new_status: Mapping[str, Any],
    startup: float | None, old: Mapping[str, Any], logger: Any,
) -> None:  # fmt: skip
    """The tick's new facts for :mod:`.profiles`: a new KV report against the budget of the same settings, the
    settings a CUDA OOM struck (as vLLM ran them), settings that passed probation, a new start-up time; to
    the profiles this service teaches (:mod:`.profile_scope`: its namespace's, a shared one when listed)."""
    calibration = new_status.get("calibration")
    tokens = calibration.get("observedKvCacheTokens") if isinstance(calibration, Mapping) else None
    oom = decision.trigger == RestartKind.CUDA_OOM and decision.action in (Action.RETUNE, Action.ROLLBACK)
    healthy = decision.good if decision.good is not None and decision.good != state.last_good else None
    new_startup = startup if startup is not None and startup != old.get("startupSeconds") else None
    namespace = meta.get("namespace") or "default"
    if not tokens and not oom and healthy is None and new_startup is None:
        return
    model, gpu = inputs.model.config_key, inputs.gpu.gpu.name
    keys = profile_scope.compute_keys(model, gpu, spec, state.current, namespace)
    await profiles.record_observations(
        deps.kube, keys, spec.model.id, f"{namespace}/{meta['name']}", budget=budget,
        observed_kv_tokens=int(tokens) if tokens else None,
        oom=(decision.effective or state.current) if oom else None, healthy=healthy,
        startup_seconds=new_startup, now=status_patch.format_time(deps.clock()), logger=logger,
    )  # fmt: skip


Cluster = tuple[list[capacity.NodeView], list[dict[str, Any]]]


async def _choose_rollout(
    kube: Kube, meta: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs,
    views: list[pod_status.PodView], serving: pod_status.Serving, cluster: Cluster | None, decision: Decision,
    redecide: Callable[[float, str | None], Decision],
) -> tuple[Decision, RolloutChoice]:  # fmt: skip
    """The strategy ``decision``'s change would roll out with, and the decision again with what that
    costs (``Evidence.rollout_lost_fraction``) or why it cannot roll out (``rollout_blocked``). A rollback
    is never held: the previous settings' pods are still there or serve nothing."""
    deployment = build_loop_deployment(meta, spec, inputs, decision.settings)
    ready = any(v.ready and not v.terminating for v in views)
    choice = await workloads.fetch_rollout_choice(
        kube, spec, deployment, serving=ready, not_serving_why=serving.degraded_reason or "", cluster=cluster
    )
    if decision.action == Action.ROLLBACK:
        if choice.held:
            choice = RolloutChoice("Surge", "rolling back: the previous settings' pods still serve")
        return decision, choice
    lost = rollout_strategy.compute_lost_fraction(choice, spec.replicas, serving=ready)
    blocked = choice.reason if choice.held else None
    if lost or blocked:
        decision = redecide(lost, blocked)
    return decision, choice


async def _schedulable(
    deps: LoopDeps, old: Mapping[str, Any], meta: Mapping[str, Any], spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs | None, views: list[pod_status.PodView], cluster: Cluster | None,
    namespace: str = "default",
) -> list[status_patch.Update]:  # fmt: skip
    """The ``Schedulable`` condition: checked against the nodes while a pod cannot schedule or it is False
    (so it follows the nodes as they change); True without a read once every pod is on a node. ``inputs``
    ``None`` (mode Off resolves nothing): resolved here, when needed."""
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
            inputs = await resolve.fetch_inputs(spec, namespace, deps.kube, deps.hub)
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
    shape = capacity.build_pod_shape(build_loop_deployment(meta, spec, inputs, settings))
    verdict = capacity.compute_schedulable(shape, nodes)
    status = conditions.TRUE if verdict.schedulable else conditions.FALSE
    return [(conditions.SCHEDULABLE, status, verdict.reason, verdict.message)]


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


async def _write(
    deps: LoopDeps, patch: Any, namespace: str, name: str, version: str | None,
    out: status_patch.StatusPatch, old: Mapping[str, Any], logger: Any,
) -> str:  # fmt: skip
    """The tick's status as one conditional PATCH (:func:`status_write.apply_status`): what became of it.
    Without a Kubernetes client, kopf's ``patch`` carries it."""
    if deps.kube is None:
        out.add_to(patch, old=old)
        return status_write.WRITTEN
    return await status_write.apply_status(deps.kube, namespace, name, version, out, old, logger)


async def _apply(
    deps: LoopDeps, meta: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs | None,
    settings: EngineSettings, what: str, logger: Any, body: Mapping[str, Any],
    choice: RolloutChoice | None = None,
) -> bool:  # fmt: skip
    """Roll ``settings`` out to the Deployment; False (and a ``RetuneFailed`` event) if that failed."""
    try:
        if inputs is None or deps.kube is None:
            raise errors.ApplyFailed("model/GPU not resolved or no Kubernetes client")
        deployment = build_loop_deployment(meta, spec, inputs, settings, choice)
        await workloads.apply_workloads([deployment], deps.kube)
    except Exception as exc:  # noqa: BLE001 -- report and retry on the next tick
        logger.warning(f"closed loop: applying {what} failed: {exc}")
        reason = errors.NameConflict.reason if isinstance(exc, errors.NameConflict) else "RetuneFailed"
        deps.emit(body, events.WARNING, reason, f"could not apply {what}: {exc}")
        return False
    return True
