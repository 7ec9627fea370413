"""What one closed-loop tick talks to, for both kinds: the cluster, the pods, Prometheus, the Hub, the clock.

:func:`configure` builds them once, at the operator's start-up (:func:`kvpilot.operator.main.configure`), from
the pace and the Prometheus settings read there; the InferenceService tick
(:mod:`kvpilot.operator.inferenceservice.closed_loop`) and the EngineTuner's
(:mod:`kvpilot.operator.enginetuner.target_main`) read them with :func:`default_deps`, so both kinds share one
per-tick Prometheus snapshot. Tests build a :class:`LoopDeps` of fakes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients.kube import Kube, NodeList
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.planning import resolve
from kvpilot.operator.planning.hub import download_hub_files
from kvpilot.operator.pods import pod_reading
from kvpilot.operator.pods.ownership import VerifiedOwners
from kvpilot.operator.status import events, status_write
from kvpilot.tuner.loop import ObservationWindow

WindowFetch = Callable[..., Awaitable[ObservationWindow]]


@dataclass
class LoopDeps:
    """What one tick talks to; tests replace any of them."""

    kube: Kube | None
    pods: pod_reading.PodReader | None
    prom_url: str
    clock: Callable[[], float] = time.time
    emit: events.Emitter = events.kopf_emitter
    fetch_window: WindowFetch = prometheus.fetch_observations
    hub: resolve.HubDownload = download_hub_files
    record_metrics: bool = True
    pace: LoopPace = field(default_factory=LoopPace)
    """The operator's pace (:func:`kvpilot.operator.loop.loop_settings.pace_from_env`, read at start-up)."""
    prometheus: PrometheusSettings | None = None
    """How to reach Prometheus (auth, TLS, headers, label names: :mod:`.prometheus_settings`); ``None``:
    ``prom_url`` without auth."""
    nodes: NodeList = field(default_factory=lambda: NodeList(resolve.NODE_CACHE_TTL_S))
    """Every node, for the "could it ever fit" check (cached:
    :class:`kvpilot.operator.clients.kube.NodeList`)."""
    pending: status_write.PendingApplies = field(default_factory=status_write.PendingApplies)
    """Recorded changes whose apply failed: applied again by the next tick (:mod:`.status_write`)."""
    owners: VerifiedOwners = field(default_factory=VerifiedOwners)
    """Objects already found to be this operator's (:mod:`kvpilot.operator.pods.ownership`): the reconciler's
    memory too (:func:`configure`)."""


_deps: LoopDeps | None = None


def configure(
    pace: LoopPace, prom: PrometheusSettings | None = None, owners: VerifiedOwners | None = None
) -> LoopDeps:
    """The process-wide dependencies: the real cluster, Prometheus (``prom``, else
    ``$KVPILOT_PROMETHEUS_URL``), ``pace`` and the operator's memory of its objects (``owners``, shared
    with the reconciler; ``None``: a memory of its own).

    Called once by the operator's start-up handler (:func:`kvpilot.operator.main.configure`)."""
    global _deps
    from kvpilot.operator.clients.kube import get_kube

    kube = get_kube()
    _deps = LoopDeps(
        kube=kube,
        pods=pod_reading.ClusterPods(kube.api_client),
        prom_url=prom.url if prom is not None else os.environ.get(prometheus.PROMETHEUS_URL_ENV, ""),
        pace=pace,
        prometheus=prom,
        owners=owners if owners is not None else VerifiedOwners(),
    )
    return _deps


def default_deps() -> LoopDeps:
    """The dependencies :func:`configure` built at start-up (kopf runs timers only after it)."""
    if _deps is None:
        raise RuntimeError("the closed loop is not configured: kvpilot.operator.main.configure runs first")
    return _deps
