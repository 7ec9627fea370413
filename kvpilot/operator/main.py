"""Every kopf registration of the kvpilot operator, and its settings: nothing else.

Run it::

    kopf run --standalone -m kvpilot.operator.main --all-namespaces      # or --namespace NS

The InferenceService's handlers are in :mod:`kvpilot.operator.inferenceservice.handlers`, its closed
loop's tick in :mod:`kvpilot.operator.inferenceservice.closed_loop` (the pace read here at start-up) with
the pod index it reads (:mod:`kvpilot.operator.pods.pod_cache`); the EngineTuner's in
:mod:`kvpilot.operator.enginetuner.target_main`. All of them are registered below, nowhere else. kopf
keeps its handler progress and its diff base in ``status.kopf`` (handlers never return values), and puts
no finalizer on an InferenceService (:mod:`kvpilot.operator.timers`). There is no delete handler: the
Deployment and Service carry owner references and the garbage collector removes them. Event handlers on
those Deployments and Services (by kvpilot's labels) put back a deleted one or a hand-edited field
(:mod:`.drift`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator import api, kopf_internals, timers
from kvpilot.operator.clients import metrics, prometheus_settings
from kvpilot.operator.enginetuner import target_main, target_webhook
from kvpilot.operator.inferenceservice import closed_loop, drift, handlers
from kvpilot.operator.loop import loop_deps, loop_settings
from kvpilot.operator.planning import profile_scope
from kvpilot.operator.pods import pod_cache, tenant_settings, workloads

DIFF_BASE_FIELD = "status.kopf.lastHandledConfiguration"
"""Where kopf keeps the spec it last handled (``status.kopf`` in the CRD)."""
PROGRESS_FIELD = "status.kopf.progress"
"""Where kopf keeps the progress of a handler being retried."""
TOUCH_FIELD = "status.kopf.dummy"
"""What kopf patches to wake a handler for its retry: in the CRD's schema, or the API server prunes it and the
retry never comes."""
PEERING_LIFETIME_ENV = "KVPILOT_PEERING_LIFETIME_SECONDS"
"""How long a replica's kopf peering record stays alive without a keep-alive (kopf's default: 60 s). A
replica that dies without leaving the peering (SIGKILL, a lost node) blocks the others this long: it
bounds the failover time (docs/operator.md, "High availability"). kopf renews it every lifetime minus
5-10 s."""
PEERING_LIFETIME_MIN_S = 10


def peering_lifetime_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``$KVPILOT_PEERING_LIFETIME_SECONDS`` as an integer >= 10, or None (unset: kopf's default)."""
    raw = (os.environ if environ is None else environ).get(PEERING_LIFETIME_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < PEERING_LIFETIME_MIN_S:
        raise loop_settings.LoopConfigError(
            f"{PEERING_LIFETIME_ENV}={raw!r}: expected an integer number of seconds "
            f">= {PEERING_LIFETIME_MIN_S}"
        )
    return value


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler progress in status too, so that kopf's bookkeeping rides in the same PATCH as our status (no
    # PATCH of the object's annotations): one write per reconcile (docs/operator.md, "Scale").
    settings.persistence.progress_storage = kopf.StatusProgressStorage(
        field=PROGRESS_FIELD, touch_field=TOUCH_FIELD
    )
    # The diff base lives in status, not in an annotation: a spec within the CRD's limits can exceed the
    # 256 KiB an object's annotations may hold, after which every patch fails and the finalizer is never
    # released (the namespace hangs in Terminating).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field=DIFF_BASE_FIELD)
    # No handler needs a finalizer (kvpilot.operator.timers): kopf removes this one, left by older releases.
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf's would double them
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    try:
        pace = loop_settings.pace_from_env()
        prom = prometheus_settings.settings_from_env()
        lifetime = peering_lifetime_from_env()
        shared = profile_scope.sharing_from_env()  # which namespaces' TuningProfiles teach each other
        tenants = tenant_settings.settings_from_env()  # the tenant guard when no admission policy runs
    except (
        loop_settings.LoopConfigError,
        prometheus_settings.PrometheusConfigError,
        profile_scope.SharingConfigError,
        tenant_settings.TenantConfigError,
    ) as exc:
        raise kopf.PermanentError(str(exc)) from exc  # a bad setting stops the operator here, not mid-loop
    if lifetime is not None:
        settings.peering.lifetime = lifetime
    profile_scope.configure_sharing(shared)
    tenant_settings.configure(tenants)
    logging.getLogger(__name__).info(f"tenant guard: operatorEnforcement={tenants.mode}")
    metrics.start_metrics_server()
    handlers.default_deps()
    loop_deps.configure(pace, prom)


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


@kopf.on.event(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)
def inference_service_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    timers.observe(event, body)  # a DELETED object's closed-loop timer stops (no finalizer)
    if event.get("type") == "DELETED":  # its per-service metric series go too
        metrics.forget_service(body.meta.get("namespace") or "default", body.meta.get("name") or "")


@kopf.on.event("apps", "v1", "deployments", labels=drift.OWNED_LABELS)
async def deployment_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Deployment", event, body, logger)


@kopf.on.event("", "v1", "services", labels=drift.OWNED_LABELS)
async def service_event(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    await _repair("Service", event, body, logger)


async def _repair(kind: str, event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger) -> None:
    """Drift repair (:mod:`kvpilot.operator.inferenceservice.drift`); a failure is logged, the next event
    retries."""
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


# --- the closed loop: a timer per InferenceService, and the pod index it reads -----------------------------

kopf.index("v1", "pods", labels={workloads.INSTANCE_LABEL: kopf.PRESENT})(pod_cache.vllm_pods)

# kopf takes a timer's interval when it registers it, at import, before any start-up handler has run:
# this one value of the pace is read here; the rest is read at start-up (loop_settings.pace_from_env).
LOOP_INTERVAL_S = loop_settings.interval_from_env()
kopf.timer(
    group=api.GROUP, version=api.VERSION, plural=api.PLURAL, interval=LOOP_INTERVAL_S,
    initial_delay=LOOP_INTERVAL_S,
    when=timers.is_live,  # stopped on the watch's DELETED event, not by a finalizer (kvpilot.operator.timers)
)(closed_loop.closed_loop_tick)  # fmt: skip
if not kopf_internals.drop_finalizer_requirement(closed_loop.closed_loop_tick):
    raise RuntimeError("kopf's registry has no timer for closed_loop_tick to drop the finalizer of")


# --- the EngineTuner kind and its admission webhook --------------------------------------------------------

ENGINE_TUNERS = (api.GROUP, api.VERSION, api.ENGINE_TUNER_PLURAL)
kopf.on.startup()(target_main.configure_webhook)
kopf.on.create(*ENGINE_TUNERS)(target_main.engine_tuner_changed)
kopf.on.update(*ENGINE_TUNERS, field="spec")(target_main.engine_tuner_changed)
kopf.on.resume(*ENGINE_TUNERS)(target_main.engine_tuner_changed)
kopf.timer(*ENGINE_TUNERS, interval=target_main.INTERVAL_S, initial_delay=target_main.INTERVAL_S)(
    target_main.engine_tuner_tick
)
kopf.index(*ENGINE_TUNERS)(target_main.engine_tuners)
if target_webhook.enabled():
    # kopf's WebhookFn protocol spells out every kwarg; the handler takes the ones it needs and **_.
    kopf.on.mutate("", "v1", "pods", id=target_main.WEBHOOK_ID, operation="CREATE", ignore_failures=True)(
        target_main.pod_created  # type: ignore[arg-type]
    )
