"""The EngineTuner's reconciliation (create, spec change, resume and a timer): thin.

Kubernetes objects in, tuner types through, status out::

    spec --parse--> api.EngineTunerSpec --read (thread)--> the target, its pods, their nodes, ConfigMaps
         --target.build_discovery--> what runs --target.build_plan_spec + modes--> the plan
    the pods that run the recommendation --prometheus.fetch_observations (the closed loop's shared
         per-tick snapshot)--> their metrics window
         --target_loop.compute_loop (the InferenceService's policy)--> the recommendation
    status <- discovered, gpu, budget, recommendation (Recommend, Initial, Auto), history, failedSettings,
              lastGoodSettings, rollout, conditions (MetricsAvailable, RolloutInProgress, ...)
    Auto   <- one eviction of a pod that does not run the recommendation (:func:`compute_eviction`), once
              the status already holds it (:func:`published`)

The target is never written. In Initial and Auto the admission webhook (:mod:`.target_webhook`) puts the
recommendation on the target's new pods; it reads it from ``status`` through a kopf index, so it keeps
working across operator restarts. Failures are ``Ready=False`` with the reason (and the failing condition
False), a Warning event, and kopf's back-off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic

from kvpilot.operator import api, conditions, errors
from kvpilot.operator.clients import metrics, prometheus
from kvpilot.operator.clients.kube import IO_POOL, TargetKube, build_label_selector
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.enginetuner import target, target_loop
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import capacity, tenant_guard, tenant_settings
from kvpilot.operator.pods.pod_status import parse_time
from kvpilot.operator.status import events, status_patch
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import HistoryAction, ObservationWindow, PolicyConfig
from kvpilot.tuner.types import EngineSettings, Plan

EVICTION_INTERVAL_S = 30.0
"""Auto: at least this long between two evictions of one target (and the replacement must be Ready)."""
SETTLE_S = 10.0
"""Auto: a pod younger than this is not judged (its replacement may still be starting)."""


@dataclass
class TargetDeps:
    kube: TargetKube | None
    emit: events.Emitter = events.kopf_emitter
    clock: Callable[[], float] = time.time
    hub: resolve.HubDownload = resolve.download_hub_config
    eviction_interval_s: float = EVICTION_INTERVAL_S
    prom: PrometheusSettings | str = ""
    """The InferenceService loop's Prometheus
    (:func:`kvpilot.operator.loop.loop_deps.configure`); ``""``:
    none configured (the metrics window says so and the policy's metric steps hold)."""
    pace: LoopPace = field(default_factory=LoopPace)
    """The closed loop's pace: the same window, step and snapshot age, so both kinds share one snapshot."""
    fetch_window: Callable[..., Awaitable[ObservationWindow]] = prometheus.fetch_observations


def parse_spec(spec: Mapping[str, Any]) -> api.EngineTunerSpec:
    try:
        parsed = api.EngineTunerSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        text = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise errors.InvalidSpec(text) from None
    m = parsed.model
    if m is not None and m.source == "ConfigMap" and m.config_map_ref is None:
        raise errors.InvalidSpec("spec.model: configMapRef is required when source is ConfigMap")
    violations = tenant_guard.compute_tuner_violations(parsed, tenant_settings.current())
    if violations:
        raise errors.PolicyViolation("; ".join(violations))
    return parsed


@dataclass(frozen=True, slots=True)
class Observed:
    workload: dict[str, Any]
    pods: list[dict[str, Any]]
    node_labels: list[dict[str, str]]
    config_maps: dict[str, dict[str, str]]


def _selector(workload: Mapping[str, Any]) -> str:
    sel = (workload.get("spec") or {}).get("selector") or {}
    return build_label_selector(dict(sel.get("matchLabels") or {}))


def read_observed(kube: TargetKube, namespace: str, spec: api.EngineTunerSpec) -> Observed:
    """The target, its pods, their nodes' labels and the ConfigMaps its pods mount (sync)."""
    ref = spec.target_ref
    workload = kube.read_workload(namespace, ref.kind, ref.name)
    if workload is None:
        raise target.TargetNotFound(
            f"{ref.kind} {namespace}/{ref.name} (spec.targetRef) does not exist; create it or fix the name"
        )
    pods = [
        p for p in kube.list_pods(namespace, _selector(workload)) if target.pod_belongs(p, ref.kind, ref.name)
    ]
    nodes = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in kube.list_nodes()}
    labels = [nodes[n] for p in pods if (n := (p.get("spec") or {}).get("nodeName")) in nodes]
    maps: dict[str, dict[str, str]] = {}
    for volume in target.pod_template(workload).get("volumes") or ():
        name = (volume.get("configMap") or {}).get("name")
        if name and name not in maps:
            data = kube.read_config_map_data(namespace, name)
            if data is not None:
                maps[name] = data
    return Observed(workload, pods, labels, maps)


def compute_plan(
    spec: api.EngineTunerSpec, found: target.Discovery, namespace: str, kube: Any, hub: resolve.HubDownload
) -> tuple[Plan, resolve.ResolvedModel, target_loop.LoopInputs]:
    """The InferenceService planner's answer for the target (sync: the model may come from a ConfigMap or
    the Hub), and what the closed loop needs of it. A catalogue miss for an id read from the arguments is
    looked up on the Hub."""
    plan_spec = target.build_plan_spec(spec, found)
    try:
        model = resolve.read_model(plan_spec.model, namespace, kube, hub)
    except tuner_errors.UnknownModel:
        if spec.model is not None:
            raise
        hub_ref = plan_spec.model.model_copy(update={"source": "Hub"})
        plan_spec = plan_spec.model_copy(update={"model": hub_ref})
        model = resolve.read_model(hub_ref, namespace, kube, hub)
    gpu = target.compute_gpu(found)
    user = modes.compute_user_args(plan_spec)
    release = vllm.resolve_image_version(plan_spec.engine.image, None)
    runner_v2 = vllm.parse_v2_runner_env(found.vllm_env.get(vllm.V2_RUNNER_ENV))
    flags = vllm.build_engine_flags(found.command.flags, runner_v2)  # the target's own flags
    plan = modes.compute_feasible_plan(
        plan_spec, model.spec, gpu, user,
        image=release, engine=flags, weights_total_bytes=model.checkpoint_bytes,
    )  # fmt: skip
    loop = target_loop.LoopInputs(
        plan_spec, plan, model.spec, gpu, release.version, model.checkpoint_bytes, engine=flags
    )
    return plan, model, loop


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())  # fmt: skip


def _crashing(pod: Mapping[str, Any]) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff" or (cs.get("state") or {}).get("terminated"):
            return True
    return False


def _age_s(pod: Mapping[str, Any], now: float) -> float:
    started = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return now - started if started is not None else 0.0


def compute_eviction(
    pods: Sequence[Mapping[str, Any]], container: str, recommended: EngineSettings, *, now: float,
    last_eviction: float | None, interval_s: float, schedulable: bool,
) -> tuple[str | None, str]:  # fmt: skip
    """The pod to evict now in mode Auto, or ``None``, and why.

    One at a time: a crash-looping pod that does not run the recommendation first (it serves nothing),
    else one of the others, only when every other pod of the target is Ready (the last replacement has
    started), the last eviction is ``interval_s`` old, and some node could take the replacement."""
    stale = [p for p in pods if not target.pod_carries(p, container, recommended)
             and not (p.get("metadata") or {}).get("deletionTimestamp")]  # fmt: skip
    if not stale:
        return None, "every pod runs the recommendation"
    if not schedulable:
        return None, "no node could take a replacement pod (GPUs); holding"
    crashing = [p for p in stale if _crashing(p)]
    if crashing:
        return str(
            crashing[0]["metadata"]["name"]
        ), "it crash-loops with settings that are not the recommendation"
    if last_eviction is not None and now - last_eviction < interval_s:
        return None, f"the last eviction was {now - last_eviction:.0f}s ago; waiting {interval_s:.0f}s"
    if any(not _ready(p) or _age_s(p, now) < SETTLE_S for p in pods):
        return None, "a pod of the target is not Ready yet; waiting before the next eviction"
    return str(stale[0]["metadata"]["name"]), "it does not run the recommendation"


def published(old: Mapping[str, Any], generation: Any, recommended: EngineSettings) -> bool:
    """Whether the status already read holds ``recommended`` for this generation with ``Ready=True``: what
    the webhook's index needs (:func:`~kvpilot.operator.enginetuner.target_webhook.index_tuner`) before an
    eviction."""
    ready = conditions.find_condition(old.get("conditions"), conditions.READY) or {}
    rec = (old.get("recommendation") or {}).get("settings")
    return (
        old.get("observedGeneration") == generation and ready.get("status") == conditions.TRUE
        and status_patch.compact(rec) == status_patch.compact(_settings_wire(recommended))
    )  # fmt: skip


def _settings_wire(settings: EngineSettings) -> dict[str, Any]:
    return api.Settings.from_engine(settings).wire()


async def fetch_window(
    deps: TargetDeps, plan: Plan, old: Mapping[str, Any], observed: Observed, container: str, namespace: str,
    spec: api.EngineTunerSpec, policy: PolicyConfig, now: float,
) -> ObservationWindow:  # fmt: skip
    """The metrics of the target's pods that run the recommendation, from the closed loop's per-tick snapshot
    (the same queries, window and age as the InferenceServices': no query per target)."""
    pods = target_loop.compute_metric_pods(plan, old, observed.pods, container)
    if not pods:
        return ObservationWindow.unavailable(target_loop.NOT_RUNNING, now)
    return await deps.fetch_window(
        deps.prom, namespace, spec.target_ref.name, now, pods=pods, window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds, max_age_seconds=deps.pace.interval_seconds,
    )  # fmt: skip


async def reconcile(
    *, body: Mapping[str, Any], spec: Mapping[str, Any], meta: Mapping[str, Any], status: Mapping[str, Any],
    patch: kopf.Patch, logger: Any, deps: TargetDeps, retry: int = 0,
) -> None:  # fmt: skip
    now_s = deps.clock()
    now = status_patch.format_time(now_s)
    generation, namespace = meta.get("generation"), meta.get("namespace") or "default"
    old = dict(status or {})
    try:
        parsed = parse_spec(spec)
        if deps.kube is None:
            raise errors.ApplyFailed("no Kubernetes client configured")
        kube = deps.kube
        observed = await asyncio.get_running_loop().run_in_executor(
            IO_POOL, read_observed, kube, namespace, parsed
        )
        found = target.build_discovery(parsed, observed.workload, observed.node_labels, observed.config_maps)
        plan, model, loop_inputs = await asyncio.get_running_loop().run_in_executor(
            IO_POOL, compute_plan, parsed, found, namespace, kube, deps.hub
        )
    except Exception as exc:
        failure = errors.classify(exc)
        if failure.reason == "InternalError":
            logger.exception("EngineTuner reconciliation failed unexpectedly")
        failed = [(conditions.READY, conditions.FALSE, failure.reason, failure.message)]
        if failure.condition != conditions.READY:
            failed.append((failure.condition, conditions.FALSE, failure.reason, failure.message))
        lists = status_patch.ListPatch(generation, now, updates=failed)
        status_patch.StatusPatch(status={"observedGeneration": generation}, lists=lists).add_to(patch)
        ready = conditions.find_condition(old.get("conditions"), conditions.READY) or {}
        if (ready.get("reason"), ready.get("message")) != (failure.reason, status_patch.cap(failure.message)):
            deps.emit(body, events.WARNING, failure.reason, failure.message)
        raise errors.to_kopf(failure, retry) from None

    mode = parsed.update_mode
    loop = target_loop.LoopOutcome(plan.settings, status_patch.StatusPatch())
    if mode != "Off":
        policy = loop_settings.build_policy(loop_inputs.plan_spec, deps.pace)
        window = await fetch_window(
            deps, plan, old, observed, found.container, namespace, parsed, policy, now_s
        )
        replicas = int((observed.workload.get("spec") or {}).get("replicas") or 1)
        loop = target_loop.compute_loop(
            loop_inputs, old, found.settings, observed.pods, found.container, window=window, policy=policy,
            replicas=replicas, now=now_s, time=now,
        )  # fmt: skip
    recommended, b = loop.settings, target_loop.compute_budget(loop_inputs, loop.settings)
    tuned = sum(1 for p in observed.pods if target.pod_carries(p, found.container, recommended))
    planned_text = vllm.describe_settings(recommended)
    current_text = vllm.describe_settings(found.settings)
    discovered = api.Discovered(
        container=found.container, model=found.model.id, model_origin=model.origin,
        args_origin=found.args_origin, gpu_product=found.gpu_product, gpu_count=found.gpu_count,
        settings=api.Settings.from_engine(found.settings), vllm_env=dict(list(found.vllm_env.items())[:32]),
        pods=len(observed.pods), pods_tuned=tuned,
    )  # fmt: skip
    new: dict[str, Any] = {
        "observedGeneration": generation,
        "discovered": discovered.wire(),
        "gpu": {"product": found.gpu_product, "catalogueName": plan.gpu, "count": plan.gpu_count},
        "budget": api.Budget.from_budget(b).wire(),
        "warnings": list(plan.warnings)[: status_patch.WARNINGS_LIMIT],
        "recommendation": None,
        **loop.patch.status,  # failedSettings, lastGoodSettings, rollout
    }
    old_rec = (old.get("recommendation") or {}).get("settings")
    changed = status_patch.compact(old_rec) != status_patch.compact(_settings_wire(recommended))
    if mode != "Off":
        reason = f"planned for {plan.gpu_count}x {plan.gpu}: {planned_text} (the target runs {current_text})"
        trigger = "Discovered"
        if loop.decision is not None and loop.decision.changes:  # the closed loop lowered it just now
            reason, trigger = loop.decision.reason, loop.decision.trigger
        kept = {} if changed else dict(old.get("recommendation") or {})
        new["recommendation"] = status_patch.build_recommendation(
            recommended, str(kept.get("reason") or reason), str(kept.get("trigger") or trigger),
            str(kept.get("time") or now),
        )  # fmt: skip
    updates: list[status_patch.Update] = [
        (target.TARGET_FOUND, conditions.TRUE, "Found", f"{parsed.target_ref.kind} {parsed.target_ref.name}"),
        (target.DISCOVERED, conditions.TRUE, "Discovered",
         f"container {found.container} ({found.command.form}, flags in {found.args_origin}) runs "
         f"{current_text}; model {found.model.id} from {found.model_origin}; {found.gpu_count}x "
         f"{found.gpu_product or plan.gpu}"),
        (conditions.PLANNED, conditions.TRUE, "Planned",
         f"{planned_text}; KV cache {b.available_kv_cache_gib:.2f} GiB = {b.kv_cache_tokens} tokens"),
    ]  # fmt: skip
    action = ""
    if mode == "Auto" and observed.pods and not published(old, generation, recommended):
        # the webhook reads the recommendation from the status (a kopf index): a pod evicted before this
        # tick's status lands would be replaced with the owner's settings
        action = "; the recommendation is not in the status yet: evicting from the next tick"
    elif mode == "Auto" and observed.pods:
        nodes = await asyncio.get_running_loop().run_in_executor(IO_POOL, kube.list_nodes)
        shape = target.pod_shape(observed.workload)
        schedulable = capacity.compute_schedulable(
            shape, [capacity.build_node_view(n) for n in nodes]
        ).schedulable
        last = parse_time(old.get("lastEvictionTime"))
        victim, why = compute_eviction(
            observed.pods, found.container, recommended, now=now_s, last_eviction=last,
            interval_s=deps.eviction_interval_s, schedulable=schedulable,
        )  # fmt: skip
        if victim is not None:
            evicted = await asyncio.get_running_loop().run_in_executor(
                IO_POOL, kube.evict_pod, namespace, victim
            )
            if evicted:
                new["lastEvictionTime"] = now
                new["evictions"] = int(old.get("evictions") or 0) + 1
                deps.emit(body, events.NORMAL, "Evicted", f"evicted pod {victim}: {why}")
                action = f"; evicted {victim}"
            else:
                action = f"; a PodDisruptionBudget refused evicting {victim}, retrying later"
        else:
            action = f"; {why}"
    ready_reason = {"Off": "Reporting", "Recommend": "Recommending", "Initial": "Tuning", "Auto": "Tuning"}[
        mode
    ]
    pods_text = f"{tuned}/{len(observed.pods)} pods run the recommendation"
    updates.append((conditions.READY, conditions.TRUE, ready_reason, f"{mode}: {pods_text}{action}"))
    looped = loop.patch.lists or status_patch.ListPatch(generation, now)
    lists = status_patch.ListPatch(
        generation, now, updates=[*looped.updates, *updates], history=looped.history,
        keep=HistoryAction.PLANNED,  # the plan's entry: where the loop starts from (target_loop)
    )  # fmt: skip
    status_patch.StatusPatch(status=new, lists=lists).add_to(patch)
    for type_, reason, message in loop.patch.events:
        deps.emit(body, type_, reason, message)
    for kind in loop.patch.decisions:
        metrics.record_decision(kind)
    if mode != "Off" and changed:
        deps.emit(body, events.NORMAL, "Recommended", f"{planned_text} (the target runs {current_text})")
    logger.info(f"EngineTuner {mode}: recommends {planned_text}; {pods_text}{action}")
