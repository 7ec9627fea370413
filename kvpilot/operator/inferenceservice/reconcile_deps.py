"""What an InferenceService's reconciliation and drift repair talk to: the cluster, events, clock, Hub.

:func:`default_deps` builds them once, on first use (the real cluster); tests build a :class:`Deps` of fakes,
so every path of :func:`kvpilot.operator.inferenceservice.handlers.reconcile` runs without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpilot.operator.clients.kube import Kube
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.planning.hub import download_hub_files
from kvpilot.operator.pods.ownership import VerifiedOwners
from kvpilot.operator.status import events, status_patch


def utc_now() -> str:
    return status_patch.format_time(time.time())


@dataclass
class Deps:
    """What a reconciliation talks to. ``kube=None`` only in unit tests that never get that far."""

    kube: Kube | None
    emit: events.Emitter = events.kopf_emitter
    now: Callable[[], str] = utc_now
    hub: resolve.HubDownload = download_hub_files
    plan_fn: modes.PlanFn | None = None
    record_metrics: bool = True
    owners: VerifiedOwners = field(default_factory=VerifiedOwners)
    """Objects already found to be this operator's (:mod:`kvpilot.operator.pods.ownership`): the closed
    loop's memory too (:func:`configure`)."""


_deps: Deps | None = None


def configure(owners: VerifiedOwners) -> Deps:
    """The process-wide dependencies: the real cluster and the operator's memory of its objects (shared with
    the closed loop). Called once by the operator's start-up handler."""
    global _deps
    from kvpilot.operator.clients.kube import get_kube

    _deps = Deps(kube=get_kube(), owners=owners)
    return _deps


def default_deps() -> Deps:
    """The dependencies :func:`configure` built at start-up (else, first use: a memory of their own)."""
    return _deps if _deps is not None else configure(VerifiedOwners())
