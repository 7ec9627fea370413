"""What an InferenceService's reconciliation and drift repair talk to: the cluster, events, clock, Hub.

:func:`default_deps` builds them once, on first use (the real cluster); tests build a :class:`Deps` of fakes,
so every path of :func:`kvpilot.operator.inferenceservice.handlers.reconcile` runs without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvpilot.operator.clients.kube import Kube
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.status import events, status_patch


def utc_now() -> str:
    return status_patch.format_time(time.time())


@dataclass
class Deps:
    """What a reconciliation talks to. ``kube=None`` only in unit tests that never get that far."""

    kube: Kube | None
    emit: events.Emitter = events.kopf_emitter
    now: Callable[[], str] = utc_now
    hub: resolve.HubDownload = resolve.download_hub_config
    plan_fn: modes.PlanFn | None = None
    record_metrics: bool = True


_deps: Deps | None = None


def default_deps() -> Deps:
    """The process-wide dependencies (the real cluster), created on first use."""
    global _deps
    if _deps is None:
        from kvpilot.operator.clients.kube import get_kube

        _deps = Deps(kube=get_kube())
    return _deps
