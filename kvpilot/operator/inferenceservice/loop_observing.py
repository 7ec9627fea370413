"""What one closed-loop tick of an InferenceService sees of it running: its pods and their metrics.

:func:`fetch_pods` (the pods, a waiting one checked against the nodes), then :func:`fetch_observed` (the
metrics window from the fleet's per-tick Prometheus snapshot, the start-up time, what the pods say, and the
shared tick's :class:`~kvpilot.operator.loop.tick.TickReading` of them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice.loop_reading import Resolved, Service, compute_checkpoint_gib
from kvpilot.operator.loop import loop_state, tick
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.pods import capacity, pod_reading, pod_summary, pod_view, storage
from kvpilot.tuner.engines import MetricSeries
from kvpilot.tuner.loop import ObservationWindow, PolicyConfig

Cluster = tuple[list[capacity.NodeView], list[dict[str, Any]]]
"""The nodes and the unfinished pods (:func:`kvpilot.operator.pods.workloads.fetch_capacity`), read when a
change may roll out."""


@dataclass(frozen=True)
class Observed:
    """What the tick saw of the running service: its pods, what they say, its metrics and start-up time."""

    views: list[pod_view.PodView]
    serving: pod_summary.Serving
    reading: tick.TickReading
    startup: float | None

    @property
    def ready(self) -> bool:
        """Whether a live pod is Ready (the service serves while a rollout replaces pods)."""
        return any(v.ready and not v.terminating for v in self.views)


async def fetch_observed(
    deps: LoopDeps, svc: Service, resolved: Resolved, views: list[pod_view.PodView]
) -> Observed:
    """The metrics of ``views`` (the pods :func:`fetch_pods` read), the start-up time and serving view."""
    window = await fetch_window(deps, svc, views, resolved.policy)
    startup = pod_summary.compute_startup_seconds(views, svc.state.current)
    serving = pod_summary.compute_serving(views, svc.state.current)
    return Observed(views, serving, build_reading(svc, resolved, views, window, startup), startup)


def compute_serving(svc: Service, views: list[pod_view.PodView]) -> pod_summary.Serving:
    """What the pods say (mode Off, where nothing else is observed)."""
    return pod_summary.compute_serving(views, svc.state.current)


async def fetch_pods(deps: LoopDeps, namespace: str, name: str) -> list[pod_view.PodView]:
    """The service's pods; a pod waiting on a node is checked against the nodes (is the node lost?)."""
    if deps.pods is None:
        return []
    views = await asyncio.to_thread(pod_reading.read_service_views, deps.pods, namespace, name)
    if deps.kube is not None and pod_view.needs_node_check(views):
        try:
            nodes = await deps.nodes.fetch(deps.kube, deps.clock())
        except errors.OperatorError:
            return views  # nodes unreadable (RBAC, a hiccup): the pods' own signs still count
        views = pod_view.with_lost_nodes(views, nodes)
    return views


async def fetch_window(
    deps: LoopDeps, svc: Service, views: list[pod_view.PodView], policy: PolicyConfig
) -> ObservationWindow:
    """The live pods' metrics from the fleet's per-tick Prometheus snapshot."""
    return await fetch_service_window(deps, svc, [v.name for v in views if not v.terminating], policy)


async def fetch_service_window(
    deps: LoopDeps,
    svc: Service,
    pods: Sequence[str],
    policy: PolicyConfig,
    series: MetricSeries | None = None,
) -> ObservationWindow:
    """The metrics of the live pods ``pods`` from the fleet's per-tick Prometheus snapshot, in the engine's
    own series (``series``; ``None``: vLLM's)."""
    return await deps.fetch_window(
        deps.prometheus or deps.prom_url,
        svc.namespace,
        svc.name,
        svc.now,
        pods=tuple(pods),
        window_seconds=policy.window_seconds,
        step_seconds=deps.pace.step_seconds,
        max_age_seconds=deps.pace.interval_seconds,  # one snapshot of every pod per tick, shared
        series=series,
    )


def build_reading(
    svc: Service,
    resolved: Resolved,
    views: list[pod_view.PodView],
    window: ObservationWindow,
    startup: float | None,
) -> tick.TickReading:
    """The shared tick's reading of the service's pods (``startup``: measured on them, else the status's)."""
    current, replicas = svc.state.current, svc.spec.replicas
    return tick.TickReading(
        budget=resolved.budget,
        window=window,
        pods=views,
        summary=pod_summary.compute_pod_summary(views, current, replicas),
        replica_view=pod_summary.compute_replica_view(views, replicas),
        replicas=replicas,
        restart_seconds=startup if startup is not None else loop_state.read_startup_seconds(svc.old),
        compile_cache_persistent=storage.keeps_compile_cache(svc.spec.model.storage),
        checkpoint_gib=compute_checkpoint_gib(resolved),
        weights_cached=storage.keeps_weights(svc.spec.model.storage),
    )
