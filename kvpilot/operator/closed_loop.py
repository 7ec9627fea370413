"""The closed loop: a kopf timer per InferenceService that watches vLLM and retunes it.

Every ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds (default 30; the pace: :class:`LoopPace`) for each
service in mode ``Auto`` or ``Recommend`` that the reconciler has applied (``status.applied`` set)::

    pods (args, readiness, lastState.terminated) --pod_status--> restarts of the current settings, ready?
    Prometheus (vLLM metrics)              --prometheus--> ObservationWindow
    model + GPU (resolve, cached)          --memory------> MemoryBudget of the current settings
    status (applied, lastGood, failed, rollout, history, calibration) --loop_state--> LoopState
        --tuner.policy.compute_decision--> Decision
        --Auto: workloads.apply (the Deployment with the new args); Recommend: status.recommendation
        --loop_state.build_status_patch--> patch.status + events (Retuned, RolledBack, OOMDetected, Held, ...)

One rollout at a time: while ``status.rollout`` is set, the policy only waits, puts the
settings on probation (Ready), succeeds (probation passed) or rolls back (a crash before
Ready or on probation, or the deadline). All state is in the status, so an operator
restarted mid-rollout picks up where it left off. The loop never raises to kopf: a
failing Prometheus becomes ``MetricsAvailable=False`` and a hold; a failing apply is
logged and retried on the next tick.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from kvpilot.operator import api, errors, events, metrics, pod_status, prometheus, render, resolve, workloads
from kvpilot.operator import loop_state as state_mod
from kvpilot.operator.kube import Kube
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import gpus, memory, plan, vllm
from kvpilot.tuner.loop import (
    Decision,
    Evidence,
    ObservationWindow,
    PolicyConfig,
    TuningBounds,
    TuningContext,
    compute_decision,
)
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget

INTERVAL_ENV = "KVPILOT_CLOSED_LOOP_INTERVAL"
DEFAULT_INTERVAL_S = 30.0
STEP_ENV = "KVPILOT_METRICS_STEP_SECONDS"
DEFAULT_STEP_S = 30.0
MIN_CHANGE_INTERVAL_ENV = "KVPILOT_MIN_CHANGE_INTERVAL"
WINDOW_ENV = "KVPILOT_METRICS_WINDOW_SECONDS"
MIN_SAMPLES_ENV = "KVPILOT_MIN_SAMPLES"
PROBATION_ENV = "KVPILOT_PROBATION_SECONDS"
_POLICY_DEFAULTS = PolicyConfig()


class LoopConfigError(ValueError):
    """An operator environment variable of the closed loop has an invalid value (raised at start-up)."""


def _number_from_env(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float,
    strict: bool,
    integer: bool = False,
) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    what = "an integer" if integer else "a number of seconds"
    bound = f">= {minimum:g}" if not strict else f"> {minimum:g}"
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        raise LoopConfigError(f"{name}={raw!r}: expected {what} {bound}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise LoopConfigError(f"{name}={raw!r}: expected {what} {bound}")
    return value


@dataclass(frozen=True, slots=True)
class LoopPace:
    """The closed loop's pace, from the operator's environment (tests and demos speed it up).

    Read once at start-up by :func:`pace_from_env`; an invalid value stops the operator there
    with :class:`LoopConfigError`, never in the middle of the loop.
    """

    interval_seconds: float = DEFAULT_INTERVAL_S
    step_seconds: float = DEFAULT_STEP_S
    min_change_interval_seconds: float = _POLICY_DEFAULTS.min_change_interval_seconds
    window_seconds: float | None = None
    """``None``: 10 steps."""
    min_samples: int = _POLICY_DEFAULTS.min_samples
    probation_seconds: float = _POLICY_DEFAULTS.probation_seconds


def pace_from_env(environ: Mapping[str, str] | None = None) -> LoopPace:
    """:class:`LoopPace` from ``$KVPILOT_CLOSED_LOOP_INTERVAL``, ``$KVPILOT_METRICS_STEP_SECONDS``,
    ``$KVPILOT_MIN_CHANGE_INTERVAL``, ``$KVPILOT_METRICS_WINDOW_SECONDS``, ``$KVPILOT_MIN_SAMPLES``
    and ``$KVPILOT_PROBATION_SECONDS``; unset or empty = the default. Raises :class:`LoopConfigError`."""
    env = environ if environ is not None else os.environ
    base = LoopPace()
    step = _number_from_env(env, STEP_ENV, base.step_seconds, minimum=0, strict=True)
    window = _number_from_env(env, WINDOW_ENV, 0.0, minimum=0, strict=False) or None
    if window is not None and window < step:
        raise LoopConfigError(f"{WINDOW_ENV}={window:g}: shorter than one sample step ({STEP_ENV}={step:g})")
    return LoopPace(
        interval_seconds=_number_from_env(env, INTERVAL_ENV, base.interval_seconds, minimum=0, strict=True),
        step_seconds=step,
        min_change_interval_seconds=_number_from_env(
            env, MIN_CHANGE_INTERVAL_ENV, base.min_change_interval_seconds, minimum=0, strict=False
        ),
        window_seconds=window,
        min_samples=int(
            _number_from_env(env, MIN_SAMPLES_ENV, base.min_samples, minimum=1, strict=False, integer=True)
        ),
        probation_seconds=_number_from_env(
            env, PROBATION_ENV, base.probation_seconds, minimum=0, strict=False
        ),
    )


PACE = pace_from_env()
"""The process's pace, read at import (= operator start-up: ``kopf run -m kvpilot.operator.main``)."""


def interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The timer interval: ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds, default 30 (tests use 1-2)."""
    return pace_from_env(environ).interval_seconds


def step_from_env(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between metric samples: ``$KVPILOT_METRICS_STEP_SECONDS``, default 30.

    The window is 10 steps and metrics older than 4 steps (at least 60 s) are stale, so a fast
    e2e setup (scraping every few seconds) can use a step of 5 s and act within a minute.
    """
    return pace_from_env(environ).step_seconds


WindowFetch = Callable[..., Awaitable[ObservationWindow]]


@dataclass
class LoopDeps:
    """What one tick talks to; tests replace any of them."""

    kube: Kube | None
    pods: pod_status.PodReader | None
    prom_url: str
    clock: Callable[[], float] = time.time
    emit: events.Emitter = events.kopf_emitter
    fetch_window: WindowFetch = prometheus.fetch_observations
    hub: resolve.HubDownload = resolve.download_hub_config
    record_metrics: bool = True
    step_seconds: float = DEFAULT_STEP_S
    """Seconds between metric samples (:func:`step_from_env`)."""
    pace: LoopPace | None = None
    """The rest of the pace (:func:`pace_from_env`); ``None``: the policy's defaults."""


_deps: LoopDeps | None = None


def default_deps() -> LoopDeps:
    """The process-wide dependencies: the real cluster and ``$KVPILOT_PROMETHEUS_URL``."""
    global _deps
    if _deps is None:
        from kvpilot.operator.kube import get_kube

        kube = get_kube()
        _deps = LoopDeps(
            kube=kube,
            pods=pod_status.ClusterPods(kube.api_client),
            prom_url=os.environ.get(prometheus.PROMETHEUS_URL_ENV, ""),
            step_seconds=PACE.step_seconds,
            pace=PACE,
        )
    return _deps


@kopf.timer(
    group=api.GROUP,
    version=api.VERSION,
    plural=api.PLURAL,
    interval=PACE.interval_seconds,
    initial_delay=PACE.interval_seconds,
)
async def closed_loop_tick(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch,
    logger: kopf.Logger, **_: Any,
) -> None:  # fmt: skip
    try:
        await run_once(
            body=body, spec=spec, meta=meta, status=status, patch=patch, logger=logger, deps=default_deps()
        )
    except Exception:  # noqa: BLE001 -- a bug must not stop the loop for every other service
        logger.exception("closed loop: tick failed")


# --- one tick ---------------------------------------------------------------------------------------


def build_policy(
    spec: api.InferenceServiceSpec, step_seconds: float = DEFAULT_STEP_S, pace: LoopPace | None = None
) -> PolicyConfig:
    """kvpilot's policy defaults, with ``spec.tuning``'s knobs, the window scaled to the sample step
    and the operator's pace (:class:`LoopPace`) when given."""
    t, pace = spec.tuning, pace or LoopPace()
    return PolicyConfig(
        cooldown_seconds=float(t.cooldown_seconds),
        max_changes_per_hour=t.max_changes_per_hour,
        rollout_deadline_seconds=float(t.rollout_deadline_seconds),
        window_seconds=pace.window_seconds or 10 * step_seconds,
        staleness_seconds=max(4 * step_seconds, 60.0),
        min_change_interval_seconds=pace.min_change_interval_seconds,
        min_samples=pace.min_samples,
        probation_seconds=pace.probation_seconds,
    )


def build_bounds(spec: api.InferenceServiceSpec, fp8_supported: bool) -> TuningBounds:
    """``spec.tuning.bounds`` + ``spec.serving`` context limits; fp8 only if allowed *and* supported."""
    b, serving = spec.tuning.bounds, spec.serving
    base = TuningBounds.from_serving(spec.to_bounds(), fp8_supported=fp8_supported)
    mml = b.max_model_len or api.IntRange()
    lows = [v for v in (mml.min, serving.min_context_length) if v]
    highs = [v for v in (mml.max, serving.max_context_length) if v]
    seqs = b.max_num_seqs or api.IntRange()
    return TuningBounds(
        min_max_num_seqs=seqs.min or 1,
        max_max_num_seqs=seqs.max,
        min_gpu_memory_utilization=base.min_gpu_memory_utilization,
        max_gpu_memory_utilization=base.max_gpu_memory_utilization,
        min_max_model_len=max(lows) if lows else None,
        max_max_model_len=min(highs) if highs else None,
        allow_fp8_kv=base.allow_fp8_kv,
    )


_LOGS = pod_status.LogCache()


async def _fetch_pods(deps: LoopDeps, namespace: str, name: str) -> list[pod_status.PodView]:
    if deps.pods is None:
        return []
    reader = deps.pods
    selector = ",".join(f"{k}={v}" for k, v in sorted(workloads.build_selector(name).items()))

    def _read() -> list[pod_status.PodView]:
        views = []
        for pod in reader.list_pods(namespace, selector):
            view = pod_status.build_pod_view(pod)
            if view.needs_log and view.restart is not None:
                key = (namespace, view.name, view.restart.restart_count)
                known, tail = _LOGS.get(key)
                if not known:
                    tail = reader.read_previous_log(
                        namespace, view.name, pod_status.CONTAINER, pod_status.LOG_TAIL_LINES
                    )
                    _LOGS.put(key, tail)
                view = pod_status.build_pod_view(pod, log_tail=tail) if tail else view
            views.append(view)
        return views

    return await asyncio.to_thread(_read)


def _budget_for(
    inputs: resolve.Inputs, spec: api.InferenceServiceSpec, settings: EngineSettings
) -> MemoryBudget:
    """The budget of ``settings`` in the topology the Deployment renders: an unset TP size
    is vLLM's 1, the remaining GPUs are pipeline stages (:func:`kvpilot.tuner.plan.compute_pipeline_parallel`)
    """
    tp = settings.tensor_parallel_size or 1
    return memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        settings.replace(tensor_parallel_size=tp),
        pipeline_parallel_size=plan.compute_pipeline_parallel(spec.gpu.count, tp),
        vllm_version=api.VLLM_VERSION,
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )


def _gpu_and_default_len(
    inputs: resolve.Inputs | None, status: Mapping[str, Any], current: EngineSettings
) -> tuple[GpuSpec | None, int]:
    """The GPU and the model's maximum context the loop tunes for: resolved, else what the reconciler
    recorded (``status.gpu.catalogueName``, the applied ``max_model_len``), so a Hub outage does not
    stop crash remedies."""
    if inputs is not None:
        return inputs.gpu.gpu, inputs.model.spec.default_max_model_len(vllm.parse_version(api.VLLM_VERSION))
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
    """One observation-decision-action cycle for one InferenceService. Never raises."""
    old = dict(status or {})
    if not old.get("applied"):
        return None  # the reconciler has not applied anything yet
    try:
        parsed = render.parse_spec(spec)
    except errors.OperatorError:
        return None  # the reconciler reports invalid specs
    mode = parsed.tuning.mode
    if mode == "Off" or parsed.replicas == 0:
        return None
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
    now = deps.clock()
    state = state_mod.build_loop_state(old)
    rollout = state.rollout if state.rollout is not None and state.rollout.settings == state.current else None
    policy = build_policy(parsed, deps.step_seconds, deps.pace)

    try:
        inputs: resolve.Inputs | None = await resolve.fetch_inputs(parsed, namespace, deps.kube, deps.hub)
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports resolution failures
        logger.warning(f"closed loop: cannot resolve model/GPU ({exc}); using status.budget")
        inputs = None
    budget = state_mod.read_budget(old)
    if inputs is not None:
        try:
            budget = _budget_for(inputs, parsed, state.current)
        except tuner_errors.TunerError as exc:
            logger.warning(f"closed loop: memory model failed for the current settings ({exc})")
    if budget is None:
        logger.info("closed loop: no memory budget yet; waiting for the reconciler")
        return None
    gpu, default_len = _gpu_and_default_len(inputs, old, state.current)
    if gpu is None or not default_len:
        logger.info("closed loop: model or GPU not resolved and not in status; waiting for the reconciler")
        return None

    try:
        views = await _fetch_pods(deps, namespace, name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: skip this tick, the next one retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return None
    summary = pod_status.compute_pod_summary(views, state.current, parsed.replicas)
    window = await deps.fetch_window(
        deps.prom_url,
        namespace,
        name,
        now,
        window_seconds=policy.window_seconds,
        step_seconds=deps.step_seconds,
    )

    context = TuningContext(
        gpu=gpu,
        default_max_model_len=default_len,
        bounds=build_bounds(parsed, gpu.fp8_kv),
        policy=policy,
        vllm_version=api.VLLM_VERSION,
    )
    loop_state = dataclasses.replace(state, rollout=rollout)
    evidence = Evidence(budget=budget, window=window, restarts=summary.restarts, ready=summary.ready)
    decision = compute_decision(loop_state, evidence, context, now)

    applied = False
    if decision.changes and mode == "Auto":
        applied = await _apply(deps, meta, parsed, inputs, decision, logger, body)
    out = state_mod.build_status_patch(
        old, state, decision, mode=mode, now=now, generation=meta.get("generation"), applied=applied,
        rollout_deadline_seconds=policy.rollout_deadline_seconds,
    )  # fmt: skip
    if state.rollout is not None and rollout is None and "rollout" not in out.status:
        out.status["rollout"] = None  # a spec change replaced the settings being rolled out
    patch.status.update(out.status)
    for type_, reason, message in out.events:
        deps.emit(body, type_, reason, message)
    if deps.record_metrics:
        for kind in out.decisions:
            metrics.record_decision(kind)
    if out.events:
        logger.info(f"closed loop: {decision.action} ({decision.trigger}): {decision.reason}")
    return decision


async def _apply(
    deps: LoopDeps, meta: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs | None,
    decision: Decision, logger: Any, body: Mapping[str, Any],
) -> bool:  # fmt: skip
    """Roll ``decision.settings`` out to the Deployment; False (and a warning event) if that failed."""
    try:
        if inputs is None or deps.kube is None:
            raise errors.ApplyFailed("model/GPU not resolved or no Kubernetes client")
        desired = render.build_desired(
            meta, spec, inputs, deploy_override=api.Settings.from_engine(decision.settings)
        )
        await workloads.apply_workloads(desired.manifests, deps.kube)
    except Exception as exc:  # noqa: BLE001 -- report and retry on the next tick
        logger.warning(f"closed loop: applying {decision.action} failed: {exc}")
        deps.emit(body, events.WARNING, "RetuneFailed", f"could not apply {decision.action}: {exc}")
        return False
    return True
