"""What an EngineTuner's reconcile talks to: the cluster, the clock, the Hub, the closed loop's Prometheus.

Built once by :func:`kvpilot.operator.enginetuner.target_main.deps` from the closed loop's dependencies
(:mod:`kvpilot.operator.loop.loop_deps`), so both kinds read the same per-tick snapshot; tests build a
:class:`TargetDeps` of fakes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients.kube import TargetKube
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.planning import resolve
from kvpilot.operator.planning.hub import download_hub_files
from kvpilot.operator.status import events
from kvpilot.tuner.loop import ObservationWindow

EVICTION_INTERVAL_S = 30.0
"""Auto: at least this long between two evictions of one target (and the replacement must be Ready)."""


@dataclass
class TargetDeps:
    kube: TargetKube | None
    emit: events.Emitter = events.kopf_emitter
    clock: Callable[[], float] = time.time
    hub: resolve.HubDownload = download_hub_files
    eviction_interval_s: float = EVICTION_INTERVAL_S
    prom: PrometheusSettings | str = ""
    """The InferenceService loop's Prometheus
    (:func:`kvpilot.operator.loop.loop_deps.configure`); ``""``:
    none configured (the metrics window says so and the policy's metric steps hold)."""
    pace: LoopPace = field(default_factory=LoopPace)
    """The closed loop's pace: the same window, step and snapshot age, so both kinds share one snapshot."""
    fetch_window: Callable[..., Awaitable[ObservationWindow]] = prometheus.fetch_observations
