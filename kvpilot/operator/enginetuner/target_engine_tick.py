"""What the EngineTuner's closed loop reads for a target whose container runs SGLang or TGI, and the tick it
makes of it (:func:`fetch_engine_loop`).

In every mode but Off: the standing recommendation from the status's history
(:func:`.target_engine_loop.compute_current`; none: a new plan, recorded as such), the target's pods read as
the engine's loop reads an InferenceService's, the previous log of a restart the termination message does
not explain read once per restart (:func:`kvpilot.operator.pods.engine_pods.read_logged_pods`, in the
operator's I/O threads), a LeaderWorkerSet group's crashed pods the operator's watch filed before LWS
deleted them (:func:`.target_logs.recall_gone`: the restart they say, and nothing else), and the metrics of
the pods that run the recommendation in the engine's own series
(:attr:`kvpilot.tuner.engines.Engine.metrics`: :mod:`kvpilot.tuner.sglang.serving`,
:mod:`kvpilot.tuner.tgi.serving`) from the closed loop's per-tick Prometheus snapshot, as vLLM targets' and
InferenceServices' are; then :func:`.target_engine_loop.compute_engine_loop`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

from kvpilot.operator.clients.kube import IO_POOL
from kvpilot.operator.enginetuner import target_engine_loop, target_logs
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.engine_profiles import PROFILES
from kvpilot.operator.pods import engine_pods
from kvpilot.operator.status.engine_tuner_status import EngineTunerLoop


async def fetch_engine_loop(
    deps: TargetDeps, read: EngineTarget, old: Mapping[str, Any], now: float
) -> EngineTunerLoop:
    """The recommendation to stand by and what to record: the plan's in mode Off (nothing recorded), a new
    plan's ``Planned`` entry, a recommendation no live pod runs (nothing judges it), or a judged tick."""
    planned = read.planned
    if read.mode == "Off":
        return EngineTunerLoop(planned.args)
    profile = PROFILES[read.found.kind]
    codec = profile.codec
    current = target_engine_loop.compute_current(codec, old.get("history") or (), planned)
    if current is None:  # a new plan: the loop starts again from it
        return EngineTunerLoop(planned.args, planned_from=read.found.args)
    recommended = EngineArgs(read.found.kind, current[1])
    build = functools.partial(
        target_engine_loop.build_target_pod, codec, read.found.container, current[0], recommended
    )
    kube, live = deps.kube, read.observed.pods
    assert kube is not None  # fetch_target refused a reconcile without one
    pods = await asyncio.get_running_loop().run_in_executor(
        IO_POOL, engine_pods.read_logged_pods, kube, read.namespace, live, read.found.container, build
    )
    # a LeaderWorkerSet group's crashed pods, gone with their group (no log left to read): their restart
    pods += [build(p, None) for p in target_logs.recall_gone(read.namespace, read.spec.target_ref, live)]
    running = target_engine_loop.running(pods)
    if not running:  # nothing judges it: a rollout waits, its deadline counts from the first such pod's start
        return EngineTunerLoop(recommended.args, not_running=True)
    policy = loop_settings.build_policy(read.plan_spec, deps.pace)
    window = await deps.fetch_window(
        deps.prom,
        read.namespace,
        read.spec.target_ref.name,
        now,
        pods=running,
        window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds,
        max_age_seconds=deps.pace.interval_seconds,
        series=codec.engine.metrics,
    )
    replicas = int((read.observed.workload.get("spec") or {}).get("replicas") or 1)
    return target_engine_loop.compute_engine_loop(
        profile,
        read,
        old,
        current,
        pods,
        window=window,
        policy=policy,
        replicas=replicas,
        newest_start=target_engine_loop.compute_newest_start(live, read.found.container, recommended),
        now=now,
    )
