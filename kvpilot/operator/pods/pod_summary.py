"""What a service's pods say together: the pods of the current settings and their restarts
(:func:`compute_pod_summary`), the replica count (:func:`compute_replica_view`), when the newest pod of some
settings started (:func:`compute_newest_start`), how long a start took (:func:`compute_startup_seconds`) and
whether the service serves (:func:`compute_serving`: ``Available`` and ``Degraded``). Pure; the replica view
and the start-up time serve every engine (vLLM's :class:`~.pod_view.PodView`, SGLang's and TGI's
:class:`~kvpilot.operator.pods.engine_pods.EnginePod`), the serving state both kinds (an InferenceService and
an EngineTuner's target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpilot.operator.pods.pod_view import PodView
from kvpilot.tuner.loop import RestartEvent, RestartKind
from kvpilot.tuner.loop.scaling import ReplicaView
from kvpilot.tuner.types import EngineSettings


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
