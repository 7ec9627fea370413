"""The EngineTuner's reconciliation (create, spec change, resume and a timer), as a chain of named steps.

Kubernetes objects in, tuner types through, status out::

    spec --parse--> api.EngineTunerSpec --read (thread)--> the target, its pods, their nodes, ConfigMaps
         --target.build_discovery--> what runs --target.build_plan_spec + modes--> the plan
                                                                     (target_reading.fetch_target)
    the pods that run the recommendation --prometheus.fetch_observations (the closed loop's shared
         per-tick snapshot)--> their metrics window                  (fetch_window)
    + the previous logs of their unexplained restarts (target_logs.fetch_logs, as an InferenceService's)
         --target_loop.compute_loop (the InferenceService's policy)--> the recommendation
                                                                     (fetch_recommendation)
    Auto <- one eviction of a pod that does not run the recommendation, once the status already holds it
                                                                     (target_eviction.apply_eviction)
    status <- tuner_status.build_tuner_status: discovered, gpu, budget, recommendation (Recommend, Initial,
              Auto), history, failedSettings, lastGoodSettings, rollout, conditions    (apply_tuner_status)

A target whose container runs SGLang or TGI (:class:`~.target_engine_reading.EngineTarget`) takes the same
steps in that engine's terms (:func:`.target_engine_reconcile.reconcile_engine`): the closed loop is the
shared engine loop's, with the engine's own rules and metrics (:mod:`.target_engine_tick`,
:mod:`.target_engine_loop`), its memory in the status's engine-args fields; Auto evicts one pod that does
not run the recommendation. The status and its events are written by :mod:`.target_status_write`.

The target is never written. In Initial and Auto the admission webhook (:mod:`.target_webhook`) puts the
recommendation on the target's new pods; it reads it from ``status`` through a kopf index, so it keeps
working across operator restarts. Failures are ``Ready=False`` with the reason (and the failing condition
False), a Warning event, and kopf's back-off (:func:`apply_failure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator.enginetuner import (
    target_engine_reconcile,
    target_eviction,
    target_logs,
    target_loop,
    target_reading,
)
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_reading import Target
from kvpilot.operator.enginetuner.target_status_write import apply_failure, apply_tuner_status
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.status import tuner_status
from kvpilot.operator.status.tuner_status import TunerLoop
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import ObservationWindow, PolicyConfig


async def reconcile(
    *,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
    logger: Any,
    deps: TargetDeps,
    retry: int = 0,
) -> None:
    """Read and plan the target, judge the recommendation on its pods, evict one in Auto, record it all."""
    now = deps.clock()
    old = dict(status or {})
    try:
        read = await target_reading.fetch_target(deps.kube, spec, meta, deps.hub)
    except Exception as exc:
        apply_failure(deps, body, meta, old, patch, exc, now, logger, retry)  # raises kopf's retry verdict
    if isinstance(read, EngineTarget):
        await target_engine_reconcile.reconcile_engine(deps, read, body, old, patch, now, logger)
        return
    loop = await fetch_recommendation(deps, read, old, now)
    budget = target_loop.compute_budget(read.loop_inputs, loop.settings)
    published = tuner_status.is_published(old, read.generation, loop.settings)
    eviction = await target_eviction.apply_eviction(deps, read, old, loop.settings, now, body, published)
    found = target_reading.build_found(read, loop.settings, budget, now)
    apply_tuner_status(deps, body, patch, tuner_status.build_tuner_status(old, found, loop, eviction))
    pods = f"{found.discovered.pods_tuned}/{found.discovered.pods} pods run the recommendation"
    planned = vllm.describe_settings(loop.settings)
    logger.info(f"EngineTuner {read.mode}: recommends {planned}; {pods}{eviction.message}")


async def fetch_recommendation(
    deps: TargetDeps, read: Target, old: Mapping[str, Any], now: float
) -> TunerLoop:
    """The recommendation to stand by: the plan's in mode Off, else the closed loop's on the pods that run
    it (:func:`.target_loop.compute_loop`)."""
    if read.mode == "Off":
        return TunerLoop(read.plan.settings)
    policy = loop_settings.build_policy(read.loop_inputs.plan_spec, deps.pace)
    window = await fetch_window(deps, read, old, policy, now)
    live, container = read.observed.pods, read.found.container
    pods = [*live, *target_logs.recall_gone(read.namespace, read.spec.target_ref, live)]  # a group's crashes
    logs = await target_logs.fetch_logs(deps.kube, read.namespace, live, container)
    replicas = int((read.observed.workload.get("spec") or {}).get("replicas") or 1)
    return target_loop.compute_loop(
        read.loop_inputs,
        old,
        read.found.settings,
        pods,
        container,
        window=window,
        policy=policy,
        replicas=replicas,
        now=now,
        logs=logs,
    )


async def fetch_window(
    deps: TargetDeps, read: Target, old: Mapping[str, Any], policy: PolicyConfig, now: float
) -> ObservationWindow:
    """The metrics of the target's pods that run the recommendation, from the closed loop's per-tick snapshot
    (the same queries, window and age as the InferenceServices': no query per target)."""
    pods = target_loop.compute_metric_pods(read.plan, old, read.observed.pods, read.found.container)
    if not pods:
        return ObservationWindow.unavailable(tuner_status.NOT_RUNNING, now)
    return await deps.fetch_window(
        deps.prom,
        read.namespace,
        read.spec.target_ref.name,
        now,
        pods=pods,
        window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds,
        max_age_seconds=deps.pace.interval_seconds,
    )
