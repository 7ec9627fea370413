"""What the vLLM pods of a service say: which settings they run, readiness, and why they restarted.

The closed loop's view of the Deployment, from the pods themselves (not the
ReplicaSets): a pod's settings are parsed back from its container ``args``, so the
evidence is always attributed to the settings that produced it, also across an operator
restart. Restarts come from ``lastState.terminated`` (``message`` holds the log tail:
the Deployment sets ``terminationMessagePolicy: FallbackToLogsOnError``), classified by
:func:`kvpilot.tuner.loop.restarts.classify_termination`; when the message says nothing, the
previous container's log tail is read and classified instead; when that log cannot be read either,
the restart's detail says why (:func:`with_unread_log`,
:func:`kvpilot.operator.clients.pod_logs.compute_unread_log`: no permission, the pod or the log gone, the
node unreachable).

:func:`build_pod_view`, :func:`build_logged_view` and :func:`compute_pod_summary` are pure;
:func:`read_restart_logs` reads the previous logs a list of pods needs through a :class:`LogReader` with this
module's :class:`LogCache` (the InferenceService's :func:`read_pod_views` and the EngineTuner's reconcile
share it), and :class:`ClusterPods` does the two reads (list pods, read a previous log) with the
``kubernetes`` client.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpilot.operator.clients.kube import fetch_previous_log, raw_response
from kvpilot.operator.clients.pod_logs import UnreadLog
from kvpilot.operator.pods import group_crashes, leader_worker_set
from kvpilot.operator.pods.storage import INIT_CONTAINER
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import RestartEvent, RestartKind, classify_termination
from kvpilot.tuner.loop.scaling import ReplicaView
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import serving

CONTAINER = serving.CONTAINER_NAME
LOG_TAIL_LINES = 400
"""Lines of the previous container's log to read. The termination message is at most 2 KiB / 80 lines
(kubelet's ``FallbackToLogsOnError``), and after a start-up failure the API server's own traceback
("Engine core initialization failed. See root cause above.") usually fills that, pushing vLLM's
ValueError out; after a run-time CUDA OOM the shutdown lines do the same."""


PreviousLog = str | UnreadLog | None
"""A previous log's tail, why it could not be read, or ``None`` when there is none."""


class LogReader(Protocol):
    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        """The tail of the previous container's log, why it could not be read, or ``None`` when there is
        none."""
        ...


class PodReader(LogReader, Protocol):
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Raw pod objects (JSON dicts)."""
        ...


def parse_time(text: str | None) -> float | None:
    """RFC 3339 (``2026-11-30T10:00:00Z``) to epoch seconds."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    settings: EngineSettings | None
    """Parsed from the container args; ``None`` if they cannot be parsed."""
    ready: bool
    terminating: bool
    restart: RestartEvent | None
    """The last termination of the vLLM container, if it ever restarted."""
    needs_log: bool
    """The termination message did not explain the restart: worth reading the previous log (the exit
    code after a run-time engine death may be 0, so it is not consulted)."""
    waiting_reason: str | None = None
    """Why the vLLM container waits (``CrashLoopBackOff``, ``ImagePullBackOff``, ...), if it does."""
    unschedulable: bool = False
    """The scheduler found no node for it (``PodScheduled=False``, reason ``Unschedulable``)."""
    downloading: bool = False
    """The weight cache's init container (:data:`kvpilot.operator.pods.storage.INIT_CONTAINER`) still runs."""
    started_at: float | None = None
    """``status.startTime``: when the kubelet took the pod (``None`` while it is not scheduled)."""
    ready_at: float | None = None
    """The ``Ready`` condition's ``lastTransitionTime`` while it is True."""
    restart_count: int = 0
    node: str = ""
    """``spec.nodeName``: the node the pod is bound to (empty while it is not scheduled)."""
    group_worker: bool = False
    """A LeaderWorkerSet group's worker (:func:`kvpilot.operator.pods.leader_worker_set.is_worker`): its
    restarts count as the group's, but it is no replica (its leader serves the group's API)."""
    gone: bool = False
    """A group's pod LWS deleted after its crash (:mod:`kvpilot.operator.pods.group_crashes`): only its
    restart counts, against its settings; it is ``terminating`` for everything else."""
    node_lost: bool = False
    """Its node is lost, not its settings at fault (:func:`compute_node_lost`, :func:`with_lost_nodes`): the
    node is NotReady or unknown, or the pod was marked or evicted for the node's loss."""


NODE_LOST_REASONS = frozenset({"NodeLost", "NodeNotReady", "DeletionByTaintManager", "TerminationByKubelet"})
"""Reasons the node lifecycle controller, the taint manager and the kubelet give a pod (``status.reason``,
the ``Ready`` / ``DisruptionTarget`` conditions' ``reason``) when its node, not its container, failed."""


def compute_node_lost(pod: Mapping[str, Any]) -> bool:
    """Whether the pod itself says its node is lost: ``status.reason`` ``NodeLost``, a ``DisruptionTarget``
    condition (the taint manager's eviction of a NotReady/unreachable node's pods), or a ``Ready`` condition
    the node lifecycle controller set (``Unknown``, or reason ``NodeNotReady`` / ``NodeLost``)."""
    status = pod.get("status") or {}
    if status.get("reason") in NODE_LOST_REASONS:
        return True
    for c in status.get("conditions") or ():
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return True
        ready = c.get("type") == "Ready"
        if ready and (c.get("status") == "Unknown" or c.get("reason") in NODE_LOST_REASONS):
            return True
    return False


def compute_lost_nodes(nodes: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Names of the nodes whose ``Ready`` condition is False (NotReady) or Unknown (unreachable)."""
    lost = set()
    for node in nodes:
        conds = (node.get("status") or {}).get("conditions") or ()
        ready = next((c for c in conds if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") != "True":
            lost.add(str((node.get("metadata") or {}).get("name") or ""))
    return frozenset(lost)


def needs_node_check(pods: Sequence[PodView]) -> bool:
    """Whether a pod waits on a node (bound, not Ready, not already known lost): only then are nodes read."""
    return any(p.node and not p.ready and not p.node_lost and not p.terminating for p in pods)


def with_lost_nodes(pods: Sequence[PodView], nodes: Sequence[Mapping[str, Any]]) -> list[PodView]:
    """``pods`` with ``node_lost`` set on those not Ready whose node is NotReady, unknown, or gone from
    ``nodes`` (every node of the cluster)."""
    lost = compute_lost_nodes(nodes)
    known = {str((n.get("metadata") or {}).get("name") or "") for n in nodes}
    return [
        dataclasses.replace(p, node_lost=True)
        if p.node and not p.ready and (p.node in lost or p.node not in known)
        else p
        for p in pods
    ]


def find_container(pod: Mapping[str, Any], key: str, name: str) -> Mapping[str, Any]:
    """The engine's entry of the pod's ``spec.containers`` or ``status.containerStatuses`` (``key``): the one
    named ``name`` (the engine seam's ``serving.container_name``), else the first, else ``{}``. Also the
    SGLang loop's (:mod:`kvpilot.operator.pods.sglang_pods`)."""
    items: Mapping[str, Any] = (pod.get("spec") if key == "containers" else pod.get("status")) or {}
    found: Sequence[Mapping[str, Any]] = items.get(key) or ()
    return next((c for c in found if c.get("name") == name), found[0] if found else {})


def build_restart_event(
    pod: str, status_c: Mapping[str, Any], log_tail: str | None = None
) -> tuple[RestartEvent | None, bool]:
    """The last termination of a container (its ``containerStatuses`` entry), classified; and whether its
    previous log is worth reading (the termination message did not explain it). Also the EngineTuner's
    (:mod:`kvpilot.operator.enginetuner.target_loop`), whose vLLM container may have any name."""
    count = int(status_c.get("restartCount") or 0)
    terminated = (status_c.get("lastState") or {}).get("terminated") or {}
    if count <= 0 or not terminated:
        return None, False
    waiting = (status_c.get("state") or {}).get("waiting") or {}
    message, reason, code = terminated.get("message"), terminated.get("reason"), terminated.get("exitCode")
    cause = classify_termination(message, reason, code)
    if cause.kind == RestartKind.OTHER and log_tail:
        from_log = classify_termination(log_tail, reason, code)
        cause = from_log if from_log.kind != RestartKind.OTHER else cause
    needs_log = cause.kind == RestartKind.OTHER and reason != "OOMKilled" and not log_tail
    when = parse_time(terminated.get("finishedAt")) or parse_time(terminated.get("startedAt")) or 0.0
    restart = RestartEvent(
        time=when,
        cause=cause,
        pod=pod,
        restart_count=count,
        crash_looping=waiting.get("reason") == "CrashLoopBackOff",
        exit_code=code,
    )
    return restart, needs_log


def compute_unschedulable(pod: Mapping[str, Any]) -> bool:
    """The scheduler found no node for ``pod`` (``PodScheduled=False``, reason ``Unschedulable``)."""
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def compute_downloading(pod: Mapping[str, Any]) -> bool:
    """The weight cache's init container (:data:`~.storage.INIT_CONTAINER`) still runs."""
    return any(
        c.get("name") == INIT_CONTAINER and not (c.get("state") or {}).get("terminated")
        for c in (pod.get("status") or {}).get("initContainerStatuses") or ()
    )


def build_pod_view(pod: Mapping[str, Any], log_tail: str | None = None) -> PodView:
    """One pod as the closed loop sees it. ``log_tail`` overrides an empty termination message."""
    meta = pod.get("metadata") or {}
    spec_c = find_container(pod, "containers", CONTAINER)
    status_c = find_container(pod, "containerStatuses", CONTAINER)
    try:
        settings, _ = vllm.parse_vllm_args([str(a) for a in spec_c.get("args") or ()])
    except tuner_errors.TunerError:
        settings = None
    count = int(status_c.get("restartCount") or 0)
    waiting = (status_c.get("state") or {}).get("waiting") or {}
    restart, needs_log = build_restart_event(str(meta.get("name") or ""), status_c, log_tail)
    unschedulable, downloading = compute_unschedulable(pod), compute_downloading(pod)
    started_at, ready_at = read_start_times(pod)
    return PodView(
        started_at=started_at,
        ready_at=ready_at,
        restart_count=count,
        waiting_reason=waiting.get("reason") or None,
        unschedulable=unschedulable,
        downloading=downloading,
        name=str(meta.get("name") or ""),
        settings=settings,
        ready=bool(status_c.get("ready")),
        terminating=bool(meta.get("deletionTimestamp")) or group_crashes.is_gone(pod),
        restart=restart,
        needs_log=needs_log,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        node_lost=compute_node_lost(pod),
        group_worker=leader_worker_set.is_worker(pod),
        gone=group_crashes.is_gone(pod),
    )


@dataclass(frozen=True, slots=True)
class PodSummary:
    restarts: tuple[RestartEvent, ...]
    """Restarts of pods running the current settings."""
    ready: bool
    """At least ``replicas`` pods run the current settings and are Ready, and no other pods remain."""
    current_pods: int
    other_pods: int
    not_started: bool = False
    """A pod of the current settings cannot schedule, still downloads or lost its node, and none of them
    crashed."""


def compute_pod_summary(pods: Sequence[PodView], current: EngineSettings, replicas: int) -> PodSummary:
    """Split the pods into those running ``current`` and the rest (old ReplicaSets, being replaced). A pod
    whose node is lost (``node_lost``) is no evidence against its settings: its restarts do not count, and
    it makes the rollout wait (``not_started``) rather than fail."""
    mine = [p for p in pods if not p.terminating and p.settings == current]
    others = [p for p in pods if not p.terminating and p.settings != current]
    crashed = [*mine, *(p for p in pods if p.gone and p.settings == current)]  # a group's, gone since
    restarts = tuple(p.restart for p in crashed if p.restart is not None and not p.node_lost)
    ready = replicas > 0 and sum(1 for p in mine if p.ready and not p.group_worker) >= replicas and not others
    not_started = any(p.unschedulable or p.downloading or p.node_lost for p in mine) and not restarts
    return PodSummary(restarts, ready, len(mine), len(others), not_started)


class ReplicaPod(Protocol):
    """What :func:`compute_replica_view` reads of a pod: vLLM's :class:`PodView`, or an engine's
    :class:`kvpilot.operator.pods.engine_pods.EnginePod` (SGLang, TGI)."""

    @property
    def ready(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def group_worker(self) -> bool: ...
    @property
    def started_at(self) -> float | None: ...


def compute_replica_view(pods: Sequence[ReplicaPod], desired: int) -> ReplicaView:
    """The replica count as the pods show it (:func:`kvpilot.tuner.loop.scaling.compute_replica_change`),
    for every engine."""
    live = [p for p in pods if not p.terminating and not p.group_worker]
    starts = [p.started_at for p in live if p.started_at is not None]
    return ReplicaView(
        desired=desired,
        live=len(live),
        ready=sum(1 for p in live if p.ready),
        newest_start=max(starts) if starts else None,
    )


def compute_newest_start(pods: Sequence[PodView], settings: EngineSettings) -> float | None:
    """When the newest live pod running ``settings`` started (``status.startTime``), if any has: a rollout's
    deadline counts from it, not from the patch (a pod that waited for a GPU has not used any of it)."""
    starts = [p.started_at for p in pods if not p.terminating and p.settings == settings and p.started_at]
    return max(starts) if starts else None


class StartedPod(Protocol):
    """What :func:`compute_startup_seconds` reads of a pod: vLLM's :class:`PodView`, or an engine's
    :class:`kvpilot.operator.pods.engine_pods.EnginePod` (SGLang, TGI)."""

    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> object: ...
    @property
    def ready(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def restart_count(self) -> int: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def ready_at(self) -> float | None: ...


def read_start_times(pod: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """``status.startTime`` (when the kubelet took the pod) and the ``Ready`` condition's
    ``lastTransitionTime`` while it is True (``None`` otherwise)."""
    phase = pod.get("status") or {}
    conds: Sequence[Mapping[str, Any]] = phase.get("conditions") or ()
    ready_cond: Mapping[str, Any] = next((c for c in conds if c.get("type") == "Ready"), {})
    ready_at = (
        parse_time(ready_cond.get("lastTransitionTime")) if ready_cond.get("status") == "True" else None
    )
    return parse_time(phase.get("startTime")), ready_at


def compute_startup_seconds(pods: Sequence[StartedPod], settings: object) -> float | None:
    """Seconds from start (``status.startTime``) to Ready of the newest live pod running ``settings`` that
    became Ready without a restart: the service's measured restart cost (``status.startupSeconds``), for
    every engine (vLLM's :class:`PodView`, SGLang's and TGI's
    :class:`~kvpilot.operator.pods.engine_pods.EnginePod`)."""
    done = [
        p
        for p in pods
        if not p.terminating
        and p.settings == settings
        and p.ready
        and not p.restart_count
        and p.started_at is not None
        and p.ready_at is not None
    ]
    if not done:
        return None
    newest = max(done, key=lambda p: (p.started_at or 0.0, p.name))
    return max(0.0, (newest.ready_at or 0.0) - (newest.started_at or 0.0))


@dataclass(frozen=True, slots=True)
class Serving:
    """Whether a service serves, from its pods: ``status.replicas``, ``readyReplicas`` and the
    ``Available`` / ``Degraded`` conditions (and so ``Ready``)."""

    replicas: int
    """Pods of the Deployment that are not terminating (of a LeaderWorkerSet: its groups' leaders)."""
    ready_replicas: int
    """Of them, Ready and running the applied settings."""
    available: bool
    """At least one replica running the applied settings is Ready."""
    degraded_reason: str | None
    """CamelCase: ``CrashLoopBackOff``, ``StartupFailure``, ``ReplicaLost``, ``Unschedulable``,
    ``Downloading``, an image pull failure; ``None`` when nothing is wrong (``Starting`` is not degraded)."""
    message: str


_IMAGE_PULL = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
_STARTUP_KINDS = frozenset(
    {RestartKind.KV_CACHE_TOO_SMALL, RestartKind.NO_CACHE_BLOCKS, RestartKind.INSUFFICIENT_FREE_MEMORY}
)


def compute_serving(pods: Sequence[PodView], current: EngineSettings | None) -> Serving:
    """The service's serving state: available when a replica of ``current`` is Ready (``None``: a replica
    of any settings, as for an EngineTuner's target, whose owner rolls its pods); degraded with the most
    telling reason any pod gives (a crash loop, a start-up failure, no node, an image, a download)."""
    everyone = [p for p in pods if not p.terminating]
    live = [p for p in everyone if not p.group_worker]  # a group is one replica: its leader
    ready = [p for p in live if p.ready and (current is None or p.settings == current)]
    checks: list[tuple[str, str]] = []
    for p in everyone:
        if p.node_lost and not p.ready:
            checks.append(
                (
                    "ReplicaLost",
                    f"{p.name}: its node {p.node or '(unknown)'} is NotReady or "
                    "unreachable; the replica waits to be replaced (not a failure of its settings)",
                )
            )
            continue
        if p.restart is not None and p.restart.cause.kind in _STARTUP_KINDS:
            checks.append(("StartupFailure", f"{p.name}: {p.restart.cause.detail}"))
        if p.waiting_reason == "CrashLoopBackOff":
            detail = p.restart.cause.detail if p.restart is not None else "the vLLM container keeps exiting"
            checks.append(("CrashLoopBackOff", f"{p.name}: {detail}"))
        if p.waiting_reason in _IMAGE_PULL:
            checks.append((str(p.waiting_reason), f"{p.name}: the vLLM image cannot be pulled"))
        if p.unschedulable:
            checks.append(("Unschedulable", f"{p.name}: no node has a free GPU of the planned kind"))
        if p.downloading:
            checks.append(("Downloading", f"{p.name}: the weights are being downloaded into the cache"))
    order = (
        "StartupFailure",
        "CrashLoopBackOff",
        "ReplicaLost",
        *sorted(_IMAGE_PULL),
        "Unschedulable",
        "Downloading",
    )
    checks.sort(key=lambda c: order.index(c[0]))
    reason, detail = checks[0] if checks else (None, "")
    if ready:
        what = "serve the applied settings" if current is not None else "are Ready"
        message = f"{len(ready)} of {len(live)} replicas {what}"
    elif reason is not None:
        message = f"no replica serves: {detail}"
    else:
        message = f"no replica serves yet: {len(live)} starting"
    if ready and reason is not None:
        message += f"; degraded: {detail}"
    return Serving(len(live), len(ready), bool(ready), reason, message[:1000])


class LogCache:
    """Previous-log tails by (namespace, pod, restart count): a crash-looping pod's log is read once per
    restart, not once per tick. Only saves reads; losing it (an operator restart) loses nothing.
    Thread-safe: ticks read pods in worker threads."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._data: OrderedDict[tuple[str, str, int], PreviousLog] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, int]) -> tuple[bool, PreviousLog]:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return True, self._data[key]
            return False, None

    def put(self, key: tuple[str, str, int], value: PreviousLog) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


LOGS = LogCache()
"""The process's log cache (:func:`read_pod_views`)."""


def owned_by(pod: Mapping[str, Any], deployment: str) -> bool:
    """Whether the pod belongs to the Deployment ``deployment``: its controller is the ReplicaSet
    ``<deployment>-<pod-template-hash>`` (names are unique in a namespace, so no other app's pod, whatever
    its labels or name, passes); or to the LeaderWorkerSet of that name
    (:func:`kvpilot.operator.pods.leader_worker_set.is_group_pod`)."""
    meta = pod.get("metadata") or {}
    if leader_worker_set.is_group_pod(pod, deployment):
        return True
    template_hash = (meta.get("labels") or {}).get("pod-template-hash")
    if not template_hash:
        return False
    return any(
        ref.get("kind") == "ReplicaSet"
        and ref.get("controller")
        and ref.get("name") == f"{deployment}-{template_hash}"
        for ref in meta.get("ownerReferences") or ()
    )


EMPTY_LOG = "its previous log is empty"
"""The detail a restart gets when its previous log was read but held nothing."""


def with_unread_log(view: PodView, unread: UnreadLog | None = None) -> PodView:
    """``view`` after the previous log its restart needed could not be read: the restart keeps what the
    termination message said, and its detail adds why the log was not read (``unread``; ``None``: it was
    empty), so the reason stays clear (a real vLLM's start-up failure leaves only "Engine core initialization
    failed" in the message)."""
    if view.restart is None:
        return view
    why = unread.detail if unread is not None else EMPTY_LOG
    cause = dataclasses.replace(view.restart.cause, detail=f"{view.restart.cause.detail}; {why}")
    return dataclasses.replace(view, restart=dataclasses.replace(view.restart, cause=cause))


def build_logged_view(pod: Mapping[str, Any], log: PreviousLog) -> PodView:
    """The pod's view with its previous ``log`` read (:func:`read_restart_logs`): the restart classified from
    the log's tail, or its detail saying why there was none to classify."""
    if isinstance(log, str) and log:
        return build_pod_view(pod, log_tail=log)
    return with_unread_log(build_pod_view(pod), log if isinstance(log, UnreadLog) else None)


def read_restart_logs(
    reader: LogReader,
    namespace: str,
    pods: Sequence[Mapping[str, Any]],
    container: str = CONTAINER,
    logs: LogCache = LOGS,
) -> dict[str, PreviousLog]:
    """The previous logs of the ``pods`` whose restart the termination message does not explain, by pod
    name, each read once per restart (``logs``); blocking. ``container``: the vLLM container's name (the
    pods' views read it: an EngineTuner passes its pods with that container alone)."""
    out: dict[str, PreviousLog] = {}
    for pod in pods:
        view = build_pod_view(pod)
        if not view.needs_log or view.restart is None:
            continue
        key = (namespace, view.name, view.restart.restart_count)
        known, log = logs.get(key)
        if not known:
            log = reader.read_previous_log(namespace, view.name, container, LOG_TAIL_LINES)
            logs.put(key, log)
        out[view.name] = log
    return out


def read_pod_views(
    reader: PodReader, namespace: str, label_selector: str, owner: str, logs: LogCache = LOGS
) -> list[PodView]:
    """The pods of the Deployment ``owner`` as the closed loop sees them (blocking: run it in a worker
    thread). Only pods it owns count (:func:`owned_by`): a foreign pod with the same labels is no evidence.

    A restart the termination message does not explain is classified from the previous container's
    log tail (:func:`read_restart_logs`); a restart whose log cannot be read says why
    (:func:`build_logged_view`)."""
    pods = [pod for pod in reader.list_pods(namespace, label_selector) if owned_by(pod, owner)]
    read = read_restart_logs(reader, namespace, pods, CONTAINER, logs)
    return [
        build_logged_view(pod, read[name]) if (name := _name(pod)) in read else build_pod_view(pod)
        for pod in pods
    ]


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


class ClusterPods:
    """:class:`PodReader` over the ``kubernetes`` client (the operator's shared ApiClient)."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            from kvpilot.operator.clients.kube import get_kube

            api_client = get_kube().api_client
        self.core = client.CoreV1Api(api_client)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        response = raw_response(
            self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        )
        try:
            return list(json.loads(response.data).get("items") or [])
        finally:
            response.release_conn()

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        return fetch_previous_log(self.core, namespace, pod, container, tail_lines)
