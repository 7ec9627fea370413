"""One vLLM pod as the closed loop sees it (:class:`PodView`): the settings it runs, readiness, its node,
and why its container last restarted.

A pod's settings are parsed back from its container ``args``, so the evidence is always attributed to the
settings that produced it, also across an operator restart. Restarts come from ``lastState.terminated``
(``message`` holds the log tail: the Deployment sets ``terminationMessagePolicy: FallbackToLogsOnError``),
classified by :func:`kvpilot.tuner.loop.restarts.classify_termination`; when the message says nothing, the
view says its previous log is worth reading, and :func:`build_logged_view` classifies the restart from that
log's tail once it is read (:mod:`.pod_reading`), or says why it could not be read (:func:`with_unread_log`,
:func:`kvpilot.operator.clients.pod_logs.compute_unread_log`: no permission, the pod or the log gone, the
node unreachable). A pod whose node is lost is no evidence against its settings (:func:`compute_node_lost`,
:func:`with_lost_nodes`); only the pods a workload owns count (:func:`owned_by`). Pure.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator.clients.pod_logs import UnreadLog
from kvpilot.operator.pods import group_crashes, leader_worker_set
from kvpilot.operator.pods.storage import INIT_CONTAINER
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm
from kvpilot.tuner.loop import RestartEvent, RestartKind, classify_termination
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import serving

CONTAINER = serving.CONTAINER_NAME

PreviousLog = str | UnreadLog | None
"""A previous log's tail, why it could not be read, or ``None`` when there is none."""


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
    """The pod's view with its previous ``log`` read (:func:`~.pod_reading.read_restart_logs`): the restart
    classified from the log's tail, or its detail saying why there was none to classify."""
    if isinstance(log, str) and log:
        return build_pod_view(pod, log_tail=log)
    return with_unread_log(build_pod_view(pod), log if isinstance(log, UnreadLog) else None)
