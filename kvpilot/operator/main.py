"""Every kopf registration of the kvpilot operator, and its settings: nothing else.

Run it::

    kopf run --standalone -m kvpilot.operator.main --all-namespaces      # or --namespace NS

The InferenceService's handler functions are in :mod:`kvpilot.operator.inferenceservice.service_main`, its
closed loop's tick in :mod:`kvpilot.operator.inferenceservice.closed_loop` (the pace read at start-up:
:mod:`kvpilot.operator.loop.startup`) with the pod index it reads (:mod:`kvpilot.operator.pods.pod_cache`);
the EngineTuner's in :mod:`kvpilot.operator.enginetuner.target_main`. All of them are registered below,
nowhere else. kopf keeps its handler progress and its diff base in ``status.kopf`` (handlers never return
values), and puts no finalizer on an InferenceService (:mod:`kvpilot.operator.timers`). There is no delete
handler: the Deployment and Service carry owner references and the garbage collector removes them. Event
handlers on those Deployments, LeaderWorkerSets and Services (by kvpilot's labels) put back a deleted one or a
hand-edited field (:mod:`kvpilot.operator.inferenceservice.drift`).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot.operator import api, kopf_internals, timers
from kvpilot.operator.enginetuner import target_main, target_webhook
from kvpilot.operator.inferenceservice import closed_loop, drift, service_main
from kvpilot.operator.loop import startup
from kvpilot.operator.pods import pod_cache

DIFF_BASE_FIELD = "status.kopf.lastHandledConfiguration"
"""Where kopf keeps the spec it last handled (``status.kopf`` in the CRD)."""
PROGRESS_FIELD = "status.kopf.progress"
"""Where kopf keeps the progress of a handler being retried."""
TOUCH_FIELD = "status.kopf.dummy"
"""What kopf patches to wake a handler for its retry: in the CRD's schema, or the API server prunes it and the
retry never comes."""


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
    config = startup.read_config()  # a bad setting stops the operator here, not mid-loop
    if config.lifetime is not None:
        settings.peering.lifetime = config.lifetime
    owners = startup.apply_config(config)  # the objects found to be kvpilot's: one memory for every writer
    service_main.configure(owners)


# --- the InferenceService kind: the reconciler and drift repair (inferenceservice.service_main) -----------

# by keyword: kopf reads a third positional argument as a name, not a plural
kopf.on.create(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)(service_main.created)
kopf.on.update(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, field="spec")(
    service_main.spec_changed
)
kopf.on.resume(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)(service_main.resumed)
kopf.on.event(group=api.GROUP, version=api.VERSION, plural=api.PLURAL)(
    service_main.inference_service_event  # a DELETED object's closed-loop timer stops (no finalizer)
)
kopf.on.event("apps", "v1", "deployments", labels=drift.OWNED_LABELS)(service_main.deployment_event)
kopf.on.event("", "v1", "services", labels=drift.OWNED_LABELS)(service_main.service_event)
if (
    service_main.WATCH_LEADER_WORKER_SETS
):  # a replica over several nodes (kvpilot.operator.pods.leader_worker_set)
    kopf.on.event(*drift.LEADER_WORKER_SETS, labels=drift.OWNED_LABELS)(service_main.leader_worker_set_event)


# --- the closed loop: a timer per InferenceService, and the pod index it reads -----------------------------

kopf.index("v1", "pods", labels=pod_cache.INDEX_LABELS)(pod_cache.vllm_pods)

# kopf takes a timer's interval when it registers it, at import, before any start-up handler has run:
# this one value of the pace is read at import (service_main.LOOP_INTERVAL_S); the rest at start-up.
kopf.timer(
    group=api.GROUP,
    version=api.VERSION,
    plural=api.PLURAL,
    interval=service_main.LOOP_INTERVAL_S,
    initial_delay=service_main.LOOP_INTERVAL_S,
    when=timers.is_live,  # stopped on the watch's DELETED event, not by a finalizer (kvpilot.operator.timers)
)(closed_loop.closed_loop_tick)
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
# a target LeaderWorkerSet's group is deleted the moment a pod restarts: its crashes are filed as they pass
kopf.on.event("v1", "pods", labels=pod_cache.TARGET_GROUP_LABELS)(target_main.target_pod_event)
if target_webhook.enabled():
    # kopf's WebhookFn protocol spells out every kwarg; the handler takes the ones it needs and **_.
    kopf.on.mutate("", "v1", "pods", id=target_main.WEBHOOK_ID, operation="CREATE", ignore_failures=True)(
        target_main.pod_created  # type: ignore[arg-type]
    )
