"""The EngineTuner kind's kopf handler functions (target mode) and its admission webhook's: thin.

:mod:`kvpilot.operator.main` registers them (every kopf registration is there). The reconciliation runs on
create, spec change and resume, and on a timer (``KVPILOT_TARGET_INTERVAL`` seconds, default 30) that runs
the closed loop on the target's pods (their crashes and metrics: :mod:`.target_loop`) and, in mode Auto,
evicts one that does not run the recommendation. The mutating webhook is registered only when
``KVPILOT_WEBHOOK_PORT`` is set (:mod:`kvpilot.operator.enginetuner.target_webhook`): kopf refuses admission
handlers without a server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator import fairness
from kvpilot.operator.enginetuner import target, target_deps, target_handlers, target_webhook
from kvpilot.operator.loop import loop_deps
from kvpilot.operator.pods import pod_cache

INTERVAL_ENV = "KVPILOT_TARGET_INTERVAL"
INTERVAL_S = float(os.environ.get(INTERVAL_ENV) or 30)
WEBHOOK_ID = "enginetuner-pods"
"""The handler id: kopf serves it at ``/<id>``, the path the MutatingWebhookConfiguration calls."""

_deps: target_deps.TargetDeps | None = None


def deps() -> target_deps.TargetDeps:
    """The EngineTuners' dependencies: the cluster, and the closed loop's Prometheus and pace (configured at
    start-up, before any handler runs), so both kinds read the same per-tick snapshot."""
    global _deps
    if _deps is None:
        from kvpilot.operator.clients.kube import get_kube

        loop = loop_deps.default_deps()
        prom = loop.prometheus if loop.prometheus is not None else loop.prom_url
        _deps = target_deps.TargetDeps(kube=get_kube(), prom=prom, pace=loop.pace)
    return _deps


def configure_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
    if target_webhook.enabled():
        settings.admission.server = target_webhook.build_server()
        settings.admission.managed = None  # the chart (or the e2e) owns the MutatingWebhookConfiguration


def _pick(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in ("body", "spec", "meta", "status", "patch", "logger")}


def _namespace(kwargs: dict[str, Any]) -> str:
    return str(kwargs["meta"].get("namespace") or "default")


async def engine_tuner_changed(retry: int, **kwargs: Any) -> None:
    async with fairness.gate().slot(_namespace(kwargs)):  # namespaces take turns (:mod:`.fairness`)
        await target_handlers.reconcile(deps=deps(), retry=retry, **_pick(kwargs))


async def engine_tuner_tick(**kwargs: Any) -> None:
    # a failure is in the status and an event already; the next tick tries again
    async with fairness.gate().slot(_namespace(kwargs)):
        with contextlib.suppress(kopf.TemporaryError, kopf.PermanentError):
            await target_handlers.reconcile(deps=deps(), **_pick(kwargs))


def engine_tuners(
    namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, **_: Any
) -> dict[tuple[str, str, str], target_webhook.Actuation] | None:
    return target_webhook.index_tuner(namespace, name, spec, status, meta)


def target_pod_event(
    namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any], **_: Any
) -> None:
    """A pod of a LeaderWorkerSet kvpilot did not make changed: its crash is filed for the EngineTuner that
    targets the set (:func:`kvpilot.operator.pods.pod_cache.file_target_crash`)."""
    pod_cache.file_target_crash(namespace, labels, body)


def pod_created(
    body: kopf.Body, patch: kopf.Patch, engine_tuners: kopf.Index[Any, Any], logger: kopf.Logger, **_: Any
) -> None:
    pod = dict(body)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    found = target_webhook.compute_pod_patch(pod, namespace, engine_tuners)
    if found is None:
        return
    containers, actuation = found
    patch.spec["containers"] = containers
    patch.metadata.setdefault("annotations", {})[target.TUNED_ANNOTATION] = target_webhook.describe(actuation)
    logger.info(f"webhook: {target_webhook.describe(actuation)}")
