"""kopf registrations of the kvpilot operator: nothing but decorators and settings.

Run it::

    kopf run --standalone -m kvpilot.operator.main --all-namespaces      # or --namespace NS

Handlers are in :mod:`kvpilot.operator.handlers`; the closed loop's timer is registered by
:mod:`kvpilot.operator.closed_loop`, and its pace is read here at start-up. kopf keeps its handler
progress in annotations under ``kvpilot.io/`` and its diff base in ``status.kopf`` (handlers never
return values). There is no delete handler: the Deployment and Service
carry owner references and the garbage collector removes them. Event handlers on those Deployments and
Services (by kvpilot's labels) put back a deleted one or a hand-edited field (:mod:`.drift`).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot.operator import (
    api,
    closed_loop,  # registers the closed loop's timer (kopf.timer) on import
    drift,
    handlers,
    loop_settings,
    metrics,
    target_main,  # noqa: F401  (registers the EngineTuner kind and its webhook on import)
)

DIFF_BASE_FIELD = "status.kopf.lastHandledConfiguration"
"""Where kopf keeps the spec it last handled (``status.kopf`` in the CRD)."""


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    # The diff base lives in status, not in an annotation: a spec within the CRD's limits can exceed the
    # 256 KiB an object's annotations may hold, after which every patch fails and the finalizer is never
    # released (the namespace hangs in Terminating).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field=DIFF_BASE_FIELD)
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's would double them
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    try:
        pace = loop_settings.pace_from_env()
    except loop_settings.LoopConfigError as exc:  # a bad setting stops the operator here, not mid-loop
        raise kopf.PermanentError(str(exc)) from exc
    metrics.start_metrics_server()
    handlers.default_deps()
    closed_loop.configure(pace)


@kopf.on.create(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)
async def created(**kwargs: Any) -> None:
    await handlers.reconcile(trigger=handlers.CREATED, deps=handlers.default_deps(), **_pick(kwargs))


@kopf.on.update(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, field="spec")
async def spec_changed(diff: kopf.Diff, **kwargs: Any) -> None:
    await handlers.reconcile(
        trigger=handlers.SPEC_CHANGED, deps=handlers.default_deps(), diff=diff, **_pick(kwargs)
    )


@kopf.on.resume(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)
async def resumed(**kwargs: Any) -> None:
    await handlers.reconcile(trigger=handlers.RESUMED, deps=handlers.default_deps(), **_pick(kwargs))


@kopf.on.event("apps", "v1", "deployments", labels=drift.OWNED_LABELS)
async def deployment_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Deployment", event, body, logger)


@kopf.on.event("", "v1", "services", labels=drift.OWNED_LABELS)
async def service_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Service", event, body, logger)


async def _repair(kind: str, event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger) -> None:
    """Drift repair (:mod:`kvpilot.operator.drift`); a failure is logged, the next event retries."""
    deps = handlers.default_deps()
    if deps.kube is None:
        return
    try:
        await drift.apply_repair(
            kind, event.get("type"), body, kube=deps.kube, hub=deps.hub, emit=deps.emit, logger=logger,
            read_owner=deps.kube.read_inference_service, plan_fn=deps.plan_fn,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports what is wrong with the spec
        logger.warning(f"drift: repairing {kind} {body.get('metadata', {}).get('name')} failed: {exc}")


def _pick(kwargs: dict[str, Any]) -> dict[str, Any]:
    keys = ("body", "spec", "meta", "status", "patch", "retry", "logger")
    return {k: kwargs[k] for k in keys}
