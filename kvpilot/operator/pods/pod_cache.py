"""The closed loop's pod reads from a watch-fed cache, not one LIST per service per tick.

Each tick of the closed loop reads the pods of its service. As a LIST request that is one read per
service per tick: at 1000 services and a 30 s tick, 33 pod LISTs a second against the API server for
pods that change rarely (docs/operator.md, "Scale"). Instead kopf keeps an index of kvpilot's vLLM pods
from one watch (:func:`vllm_pods`, a ``kopf.index``; kopf passes it to every handler as the keyword
argument of that name): :func:`index_pod` files each pod under ``(namespace, InferenceService name)``,
and the tick reads its pods from the index through :class:`IndexedPods`, a
:class:`~kvpilot.operator.pods.pod_reading.PodReader`. kopf fills every index from its initial listing before
it
runs any other handler or timer, so a tick never sees a half-filled cache; the watch keeps it current (a
deleted pod leaves the index with its ``DELETED`` event).

A LeaderWorkerSet group's crashed pods are gone before a tick sees them (LWS recreates the group at once):
the index files their terminations in :mod:`.group_crashes`, and :class:`IndexedPods` reads them back.

Previous-container logs are not cached: they are read from the API, once per restart
(:func:`kvpilot.operator.pods.pod_reading.read_pod_views`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from kvpilot.operator.pods import group_crashes, leader_worker_set, pod_reading, pod_view, workloads

PodKey = tuple[str, str]
"""``(namespace, InferenceService name)``."""
INDEX_LABELS: dict[str, Any] = {workloads.INSTANCE_LABEL: kopf.PRESENT}
"""The pods the index watches (registered in :mod:`kvpilot.operator.main`): those of an InferenceService."""


def index_pod(namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any]) -> dict[PodKey, Any]:
    """The index entry of one pod: under its service, the pod :func:`slim`; no entry for a pod without
    kvpilot's selector labels."""
    instance = labels.get(workloads.INSTANCE_LABEL)
    if not instance or any(labels.get(k) != v for k, v in workloads.build_selector(instance).items()):
        return {}
    key, pod = (namespace or "", instance), slim(body)
    group_crashes.CRASHES.record(key, pod)  # a group's crash is gone with its pods in milliseconds
    return {key: pod}


TARGET_GROUP_LABELS: dict[str, Any] = {
    leader_worker_set.NAME_LABEL: kopf.PRESENT,
    workloads.INSTANCE_LABEL: kopf.ABSENT,
}
"""The pods :func:`file_target_crash` sees (registered in :mod:`kvpilot.operator.main`): a LeaderWorkerSet's
that kvpilot did not make."""


def file_target_crash(namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any]) -> None:
    """File a crash of a pod of a LeaderWorkerSet kvpilot did not make (an EngineTuner may target it): LWS
    deletes its group the moment it restarts (:mod:`.group_crashes`)."""
    name = labels.get(leader_worker_set.NAME_LABEL)
    if name:
        group_crashes.TARGET_CRASHES.record((namespace or "", name), slim(body))


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the caches keep it: without ``managedFields`` (the largest part of a pod, and nothing the
    closed loop reads)."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {**body, "metadata": meta}


def parse_selector(label_selector: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (the equality selectors the closed loop builds) as a dict."""
    out = {}
    for part in filter(None, (p.strip() for p in label_selector.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.endswith("!"):
            raise ValueError(f"not an equality selector: {part!r}")
        out[key.strip()] = value.lstrip("=").strip()
    return out


class IndexedPods:
    """:class:`~kvpilot.operator.pods.pod_reading.PodReader` over the pod index; logs from ``logs``."""

    def __init__(
        self, index: Mapping[PodKey, Iterable[Mapping[str, Any]]], logs: pod_reading.PodReader
    ) -> None:
        self.index, self.logs = index, logs

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        wanted = parse_selector(label_selector)
        instance = wanted.get(workloads.INSTANCE_LABEL)
        if instance is None:
            raise ValueError(f"the pod cache is keyed by {workloads.INSTANCE_LABEL}: {label_selector!r}")
        live = list(self.index.get((namespace, instance)) or ())
        # a group's crashed pods, as index_pod filed them
        pods = [*live, *group_crashes.CRASHES.recall((namespace, instance), live)]
        return [
            dict(pod)
            for pod in pods
            if all(((pod.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]

    def read_previous_log(
        self, namespace: str, pod: str, container: str, tail_lines: int
    ) -> pod_view.PreviousLog:
        return self.logs.read_previous_log(namespace, pod, container, tail_lines)


def vllm_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[PodKey, Any]:
    """The pod index's handler (registered in :mod:`kvpilot.operator.main` on pods carrying
    :data:`~kvpilot.operator.pods.workloads.INSTANCE_LABEL`; kopf passes the index by this name)."""
    return index_pod(namespace, labels, body)
