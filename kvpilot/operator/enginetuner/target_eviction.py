"""Mode Auto: kvpilot rolls the recommendation onto the target's pods by evicting them, one at a time.

The target is never written: the admission webhook (:mod:`.target_webhook`) puts the recommendation on the
replacement pods, reading it from the status through a kopf index. So a pod is evicted only once the status
already read holds the recommendation (:func:`~kvpilot.operator.status.tuner_status.is_published`), one at a
time (:func:`compute_eviction`), only if some node could take the replacement, and never when the webhook's
rewrite cannot put the recommendation on the pod template's container
(:func:`~.target_webhook.compute_refusal`: a shell script that does not pass ``"$@"``), whose replacement
would run the same settings again: the status says so (``Rewritable=False``) instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator.clients.kube import IO_POOL
from kvpilot.operator.enginetuner import target, target_webhook
from kvpilot.operator.enginetuner.target import Recommended
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_reading import Target
from kvpilot.operator.pods import capacity
from kvpilot.operator.pods.pod_view import parse_time
from kvpilot.operator.status import events
from kvpilot.operator.status.tuner_status import Eviction

SETTLE_S = 10.0
"""Auto: a pod younger than this is not judged (its replacement may still be starting)."""


async def apply_eviction(
    deps: TargetDeps,
    read: Target | EngineTarget,
    old: Mapping[str, Any],
    recommended: Recommended,
    now: float,
    body: Mapping[str, Any],
    published: bool,
) -> Eviction:
    """Mode Auto with pods: evict one that does not run ``recommended`` (vLLM's settings, or another
    engine's flags) when :func:`compute_eviction` says so (an ``Evicted`` event); what was done, for
    ``Ready``'s message; never when the webhook's rewrite cannot put ``recommended`` on the pod template's
    container (:func:`~.target_webhook.compute_refusal`, checked in every mode but Off: the status's
    ``Rewritable``). ``published``: whether the status already read holds
    ``recommended`` for this generation (:func:`~kvpilot.operator.status.tuner_status.is_published`,
    :func:`~kvpilot.operator.status.engine_tuner_status.is_engine_published`)."""
    if read.mode == "Off":
        return Eviction()
    refused = target_webhook.compute_refusal(read.observed.workload, read.found.container, recommended)
    pods = read.observed.pods
    if read.mode != "Auto" or not pods:
        return Eviction(checked=True, refused=refused)
    if refused is not None:
        # the replacement would run the same settings: evicting would only repeat, pod after pod
        return Eviction(
            "; not evicting: the webhook cannot rewrite the target's pods (Rewritable)",
            refused=refused,
            checked=True,
        )
    if not published:
        # the webhook reads the recommendation from the status (a kopf index): a pod evicted before this
        # tick's status lands would be replaced with the owner's settings
        return Eviction(
            "; the recommendation is not in the status yet: evicting from the next tick", checked=True
        )
    kube = deps.kube
    assert kube is not None  # fetch_target refused a reconcile without one
    io = asyncio.get_running_loop()
    nodes = await io.run_in_executor(IO_POOL, kube.list_nodes)
    shape = target.pod_shape(read.observed.workload)
    schedulable = capacity.compute_schedulable(
        shape, [capacity.build_node_view(n) for n in nodes]
    ).schedulable
    victim, why = compute_eviction(
        pods,
        read.found.container,
        recommended,
        now=now,
        last_eviction=parse_time(old.get("lastEvictionTime")),
        interval_s=deps.eviction_interval_s,
        schedulable=schedulable,
    )
    if victim is None:
        return Eviction(f"; {why}", checked=True)
    if not await io.run_in_executor(IO_POOL, kube.evict_pod, read.namespace, victim):
        return Eviction(f"; a PodDisruptionBudget refused evicting {victim}, retrying later", checked=True)
    deps.emit(body, events.NORMAL, "Evicted", f"evicted pod {victim}: {why}")
    return Eviction(f"; evicted {victim}", evicted=True, checked=True)


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def _crashing(pod: Mapping[str, Any]) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff" or (cs.get("state") or {}).get("terminated"):
            return True
    return False


def _age_s(pod: Mapping[str, Any], now: float) -> float:
    started = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return now - started if started is not None else 0.0


def compute_eviction(
    pods: Sequence[Mapping[str, Any]],
    container: str,
    recommended: Recommended,
    *,
    now: float,
    last_eviction: float | None,
    interval_s: float,
    schedulable: bool,
) -> tuple[str | None, str]:
    """The pod to evict now in mode Auto, or ``None``, and why.

    One at a time (of a LeaderWorkerSet, one group at a time: :func:`~.target.compute_stale_pods`): a
    crash-looping pod that does not run the recommendation first (it serves nothing),
    else one of the others, only when every other pod of the target is Ready (the last replacement has
    started), the last eviction is ``interval_s`` old, and some node could take the replacement."""
    stale = target.compute_stale_pods(pods, container, recommended)
    if not stale:
        return None, "every pod runs the recommendation"
    if not schedulable:
        return None, "no node could take a replacement pod (GPUs); holding"
    crashed_groups = {target.group_key(p) for p in pods if _crashing(p)} - {None}
    crashing = [p for p in stale if _crashing(p) or target.group_key(p) in crashed_groups]
    if crashing:
        return str(
            crashing[0]["metadata"]["name"]
        ), "it crash-loops with settings that are not the recommendation"
    if last_eviction is not None and now - last_eviction < interval_s:
        return None, f"the last eviction was {now - last_eviction:.0f}s ago; waiting {interval_s:.0f}s"
    if any(not _ready(p) or _age_s(p, now) < SETTLE_S for p in pods):
        return None, "a pod of the target is not Ready yet; waiting before the next eviction"
    return str(stale[0]["metadata"]["name"]), "it does not run the recommendation"
