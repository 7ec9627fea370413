"""The InferenceService kind's kopf handler functions: the reconciler's triggers and drift repair.

:mod:`kvpilot.operator.main` registers them (every kopf registration is there), with the closed loop's timer
(:func:`kvpilot.operator.inferenceservice.closed_loop.closed_loop_tick`). Create, spec change and resume run
:func:`~.handlers.reconcile`; the watch's events stop a deleted object's timer
(:mod:`kvpilot.operator.timers`); events on kvpilot's Deployments and Services put back a deleted one or a
hand-edited field (:mod:`.drift`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import kopf

from kvpilot.operator import fairness, timers
from kvpilot.operator.clients import metrics
from kvpilot.operator.inferenceservice import drift, handlers, reconcile_deps
from kvpilot.operator.inferenceservice.reconcile_deps import default_deps
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.pods.ownership import VerifiedOwners

LOOP_INTERVAL_S = loop_settings.interval_from_env()
"""The closed loop's timer interval (``$KVPILOT_CLOSED_LOOP_INTERVAL``): kopf takes it when the timer is
registered, at import, before any start-up handler has run (the rest of the pace: at start-up,
:func:`kvpilot.operator.loop.loop_settings.pace_from_env`)."""

MULTI_NODE_ENV = "KVPILOT_MULTI_NODE"
WATCH_LEADER_WORKER_SETS = os.environ.get(MULTI_NODE_ENV, "true").strip().lower() != "false"
"""Whether drift repair watches LeaderWorkerSets (``$KVPILOT_MULTI_NODE``, unset: yes). The chart sets it from
``multiNode.enabled``: without the rights to list and watch the kind, kopf's watch would fail on every retry.
Read at import, as kopf registers its watches then."""


def configure(owners: VerifiedOwners) -> None:
    """At start-up: the reconciler's dependencies (the real cluster, the operator's memory of its objects),
    before any handler runs."""
    reconcile_deps.configure(owners)


async def created(**kwargs: Any) -> None:
    async with _turn(kwargs):
        await handlers.reconcile(trigger=handlers.CREATED, deps=default_deps(), **_pick(kwargs))


async def spec_changed(diff: kopf.Diff, **kwargs: Any) -> None:
    async with _turn(kwargs):
        await handlers.reconcile(
            trigger=handlers.SPEC_CHANGED, deps=default_deps(), diff=diff, **_pick(kwargs)
        )


async def resumed(**kwargs: Any) -> None:
    async with _turn(kwargs):
        await handlers.reconcile(trigger=handlers.RESUMED, deps=default_deps(), **_pick(kwargs))


def _turn(kwargs: Mapping[str, Any]) -> AbstractAsyncContextManager[None]:
    """The namespace's turn at the operator's work (:mod:`kvpilot.operator.fairness`): a burst elsewhere
    waits its own."""
    return fairness.gate().slot(str(kwargs["meta"].get("namespace") or "default"))


def inference_service_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    timers.observe(event, body)  # a DELETED object's closed-loop timer stops (no finalizer)
    if event.get("type") == "DELETED":  # its per-service metric series go too
        meta = body.get("metadata") or {}
        metrics.forget_service(meta.get("namespace") or "default", meta.get("name") or "")


async def deployment_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Deployment", event, body, logger)


async def leader_worker_set_event(
    event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any
) -> None:
    await _repair("LeaderWorkerSet", event, body, logger)


async def service_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Service", event, body, logger)


async def _repair(kind: str, event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger) -> None:
    """Drift repair (:mod:`kvpilot.operator.inferenceservice.drift`); a failure is logged, the next event
    retries."""
    deps = default_deps()
    if deps.kube is None:
        return
    try:
        await drift.apply_repair(
            kind,
            event.get("type"),
            body,
            kube=deps.kube,
            hub=deps.hub,
            emit=deps.emit,
            logger=logger,
            read_owner=deps.kube.read_inference_service,
            plan_fn=deps.plan_fn,
            owners=deps.owners,
        )
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports what is wrong with the spec
        logger.warning(f"drift: repairing {kind} {body.get('metadata', {}).get('name')} failed: {exc}")


def _pick(kwargs: dict[str, Any]) -> dict[str, Any]:
    keys = ("body", "spec", "meta", "status", "patch", "retry", "logger")
    return {k: kwargs[k] for k in keys}
