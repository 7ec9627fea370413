"""The pods of a service whose engine has a closed loop of its own (SGLang, TGI), as that loop reads them: the
flags each runs, its last restart and why.

The counterpart of :func:`kvpilot.operator.pods.pod_status.read_pod_views` (whose restarts vLLM's texts
classify), for any engine behind the tuner's seam: each container's arguments parsed back into the engine's
settings (:class:`Codec`: :func:`kvpilot.tuner.sglang.parse_sglang_args`,
:func:`kvpilot.tuner.tgi.parse_tgi_args`), its last termination classified by the engine seam
(:meth:`kvpilot.tuner.engines.Engine.classify_failure`), from the termination message, else from the previous
log's tail (read once per restart: :data:`kvpilot.operator.pods.pod_status.LOGS`). Only pods the Deployment
owns count (:func:`~kvpilot.operator.pods.pod_status.owned_by`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvpilot.operator.pods import group_crashes, leader_worker_set, pod_status, workloads
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.engines import Engine, SglangEngine, TgiEngine
from kvpilot.tuner.loop.engine_state import EngineRestart

S = TypeVar("S")


@dataclass(frozen=True)
class Codec(Generic[S]):
    """An engine's flags as the operator reads and writes them: its seam, and its own parser and renderer."""

    engine: Engine
    parse: Callable[[Sequence[str]], S]
    """A container's arguments -> the settings (``TunerError`` when a value does not parse)."""
    build: Callable[[S], list[str]]
    """The settings -> their flags (unset: left to the engine)."""

    @property
    def name(self) -> str:
        return self.engine.kind


SGLANG: Codec[sglang.SglangSettings] = Codec(
    SglangEngine(), sglang.parse_sglang_args, sglang.build_sglang_args
)
TGI: Codec[tgi.TgiSettings] = Codec(TgiEngine(), tgi.parse_tgi_args, tgi.build_tgi_args)


@dataclass(frozen=True)
class EnginePod(Generic[S]):
    """One pod of the service as the engine's loop sees it."""

    name: str
    settings: S | None
    """The flags its container runs (``None``: they do not parse)."""
    terminating: bool
    restart: EngineRestart | None
    """Its container's last termination, classified by the seam (``failure`` ``None``: unexplained)."""
    restart_count: int = 0
    needs_log: bool = False
    """The termination message did not explain the restart, or the engine says its whole log may say more
    (:attr:`~kvpilot.tuner.engines.EngineFailure.more_in_log`): the previous log is worth reading."""
    ready: bool = False
    """Its engine container is Ready."""
    not_started: bool = False
    """It has not started: no node for it (unschedulable), or its weights still download."""
    group_worker: bool = False
    """A LeaderWorkerSet group's rank >= 1: it serves no API, so it is no replica of its own."""
    crash_looping: bool = False
    """Its engine container waits in ``CrashLoopBackOff``."""
    started_at: float | None = None
    """``status.startTime``: when the kubelet took the pod (``None`` while it is not scheduled)."""
    ready_at: float | None = None
    """The ``Ready`` condition's ``lastTransitionTime`` while it is True: with :attr:`started_at`, the
    measured start (:func:`~kvpilot.operator.pods.pod_status.compute_startup_seconds`)."""


def build_engine_pod(codec: Codec[S], pod: Mapping[str, Any], log: str | None = None) -> EnginePod[S]:
    """One pod of a service: the flags its engine container's ``args`` carry, and its last termination
    classified from the message (and ``log``, when read)."""
    container = codec.engine.serving.container_name
    try:
        settings: S | None = codec.parse(
            [str(a) for a in pod_status.find_container(pod, "containers", container).get("args") or ()]
        )
    except tuner_errors.TunerError:
        settings = None
    return build_pod_of(codec, pod, container, settings, log)


def build_pod_of(
    codec: Codec[S], pod: Mapping[str, Any], container: str, settings: S | None, log: str | None = None
) -> EnginePod[S]:
    """One pod whose engine runs in ``container`` with ``settings`` (as its reader found them): its
    readiness, start, and last termination classified by the engine's seam from the message (and ``log``,
    when read). An EngineTuner's target names its own container and reads its flags by the engine's command
    reader (:mod:`kvpilot.operator.enginetuner.target_engine_loop`)."""
    meta = pod.get("metadata") or {}
    state = pod_status.find_container(pod, "containerStatuses", container)
    count = int(state.get("restartCount") or 0)
    terminated = (state.get("lastState") or {}).get("terminated") or {}
    name = str(meta.get("name") or "")
    restart, needs_log = None, False
    if count > 0 and terminated:
        # the log first: the message is its tail, and what led up to the failure precedes it
        text = "\n".join(t for t in (log or "", str(terminated.get("message") or "")) if t)
        failure = codec.engine.classify_failure(text)
        when = pod_status.parse_time(terminated.get("finishedAt")) or 0.0
        unread = failure is None or failure.more_in_log
        restart, needs_log = EngineRestart(when, failure, name), unread and log is None
    # a group's crashed pod the pod index filed (LWS deleted it with its group): its restart is evidence,
    # it is no live replica (:mod:`kvpilot.operator.pods.group_crashes`)
    terminating = bool(meta.get("deletionTimestamp")) or group_crashes.is_gone(pod)
    not_started = pod_status.compute_unschedulable(pod) or pod_status.compute_downloading(pod)
    ready = bool(state.get("ready"))
    worker = leader_worker_set.is_worker(pod)
    looping = ((state.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
    started_at, ready_at = pod_status.read_start_times(pod)
    return EnginePod(
        name,
        settings,
        terminating,
        restart,
        count,
        needs_log,
        ready,
        not_started,
        worker,
        looping,
        started_at,
        ready_at,
    )


def read_engine_pods(
    codec: Codec[S],
    reader: pod_status.PodReader,
    namespace: str,
    owner: str,
    logs: pod_status.LogCache = pod_status.LOGS,
) -> list[EnginePod[S]]:
    """The pods of the Deployment ``owner`` (blocking: run it in a worker thread); a restart the termination
    message does not explain (or after which the engine says its whole log says more) is classified from the
    previous log's tail, read once per restart."""
    selector = workloads.build_label_selector(owner)
    pods = [p for p in reader.list_pods(namespace, selector) if pod_status.owned_by(p, owner)]
    container = codec.engine.serving.container_name
    return read_logged_pods(
        reader, namespace, pods, container, lambda pod, log: build_engine_pod(codec, pod, log), logs
    )


def read_logged_pods(
    reader: pod_status.LogReader,
    namespace: str,
    pods: Sequence[Mapping[str, Any]],
    container: str,
    build: Callable[[Mapping[str, Any], str | None], EnginePod[S]],
    logs: pod_status.LogCache = pod_status.LOGS,
) -> list[EnginePod[S]]:
    """Each pod as ``build`` sees it, a restart the termination message does not explain (by the engine's
    own texts), or after which the engine says its whole log says more (the batch before an OOM), classified
    from the previous log of ``container``, read once per restart (blocking)."""
    out = []
    for pod in pods:
        view = build(pod, None)
        if view.needs_log:
            key = (namespace, view.name, view.restart_count)
            known, log = logs.get(key)
            if not known:
                log = reader.read_previous_log(namespace, view.name, container, pod_status.LOG_TAIL_LINES)
                logs.put(key, log)
            if isinstance(log, str) and log:
                view = build(pod, log)
        out.append(view)
    return out


def compute_engine_serving(
    codec: Codec[S], pods: Sequence[EnginePod[S]], current: S | None
) -> pod_status.Serving:
    """The service's serving state from its pods, as vLLM's (:func:`pod_status.compute_serving`):
    ``replicas`` the live pods that serve an API (a group's leader), ``readyReplicas`` those Ready with the
    ``current`` flags (``None``: any), available when one is; degraded by a start-up failure the engine's
    texts explain, or a crash loop."""
    live = [p for p in pods if not p.terminating and not p.group_worker]
    ready = [p for p in live if p.ready and (current is None or p.settings == current)]
    checks: list[tuple[str, str]] = []
    for p in pods:
        if p.terminating:
            continue
        failure = p.restart.failure if p.restart is not None else None
        if failure is not None and failure.kind in ("start_memory_short", "start_oom"):
            checks.append(("StartupFailure", f"{p.name}: {failure.text}"))
        elif p.crash_looping:
            why = failure.text if failure is not None else f"the {codec.name} container keeps exiting"
            checks.append(("CrashLoopBackOff", f"{p.name}: {why}"))
    reason, detail = checks[0] if checks else (None, "")
    if ready:
        message = f"{len(ready)} of {len(live)} replicas serve the applied flags"
        message += f"; degraded: {detail}" if reason else ""
    elif reason is not None:
        message = f"no replica serves: {detail}"
    else:
        message = f"no replica serves yet: {len(live)} starting"
    return pod_status.Serving(len(live), len(ready), bool(ready), reason, message)
