"""A LeaderWorkerSet group's crashes outlive its pods.

kvpilot renders groups with LWS's ``RecreateGroupOnPodRestart`` (vLLM's ranks cannot rejoin a running
group): the moment any container of a group restarts, LWS deletes the group's leader and with it the
group's pods, and makes a new group (``pkg/controllers/pod_controller.go``, ``handleRestartPolicy``; the
LWS object gets a ``RecreateGroup`` event). The crash's status (``lastState.terminated``, vLLM's message)
lives only between kubelet's report and that delete, milliseconds. A tick, every 30 s, never sees it, and
every new group starts at ``restartCount`` 0: a crash the settings cause (a CUDA OOM) would recreate the
group forever and the closed loop would never remedy it.

The pod index's handler sees every status on its way (the watch: :mod:`.pod_cache`), so it files here each
group pod's termination (:meth:`GroupCrashes.record`), and the tick's pod reads add the pods that are gone
since, marked :data:`GONE_ANNOTATION` (:meth:`GroupCrashes.recall`): their restart is evidence against
their settings (:func:`kvpilot.operator.pods.pod_summary.compute_pod_summary`) and nothing else. Kept for
an hour, at most :data:`PER_SERVICE` a service; in the operator's memory, so a restarted operator forgets
them (the crash that comes next is filed again). A LeaderWorkerSet another stack made (an EngineTuner's
target) recreates its groups the same way: its pods' crashes are filed in :data:`TARGET_CRASHES`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.pods import leader_worker_set

GONE_ANNOTATION = f"{api.GROUP}/gone"
"""Marks a pod :meth:`GroupCrashes.recall` gives back after it was deleted: evidence only."""
KEEP_SECONDS = 3600.0
PER_SERVICE = 8

PodKey = tuple[str, str]
"""``(namespace, InferenceService name)``, as the pod index files pods."""


def _restarted(body: Mapping[str, Any]) -> bool:
    """Whether a container of the pod has restarted and says how it ended (``lastState.terminated``)."""
    statuses = (body.get("status") or {}).get("containerStatuses") or ()
    return any(
        int(s.get("restartCount") or 0) > 0 and ((s.get("lastState") or {}).get("terminated") is not None)
        for s in statuses
    )


@dataclass
class GroupCrashes:
    """What the pod index saw of group pods' terminations, per service."""

    keep_seconds: float = KEEP_SECONDS
    per_service: int = PER_SERVICE
    clock: Callable[[], float] = time.time
    _seen: dict[PodKey, dict[str, tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: PodKey, body: Mapping[str, Any]) -> None:
        """File ``body`` (a pod as the watch delivers it) when it is a group's and a container restarted."""
        if not leader_worker_set.is_group_member(body) or not _restarted(body):
            return
        uid = str((body.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        now = self.clock()
        with self._lock:
            pods = self._seen.setdefault(key, {})
            pods[uid] = (now, dict(body))
            for old in sorted(pods, key=lambda u: pods[u][0])[: max(0, len(pods) - self.per_service)]:
                del pods[old]

    def recall(self, key: PodKey, live: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The filed pods of ``key`` that are gone (not among ``live``), seen within ``keep_seconds``, each
        marked :data:`GONE_ANNOTATION`."""
        live_uids = {str((p.get("metadata") or {}).get("uid") or "") for p in live}
        horizon = self.clock() - self.keep_seconds
        with self._lock:
            pods = self._seen.get(key, {})
            for uid in [u for u, (seen, _) in pods.items() if seen < horizon]:
                del pods[uid]
            kept = [body for uid, (_, body) in pods.items() if uid not in live_uids]
        return [_mark_gone(body) for body in kept]


def _mark_gone(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), GONE_ANNOTATION: "true"}
    return {**body, "metadata": meta}


def is_gone(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is one :meth:`GroupCrashes.recall` gave back: deleted, its restart evidence only."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(GONE_ANNOTATION) == "true"


CRASHES = GroupCrashes()
"""The operator's one memory, filled by the pod index (:func:`kvpilot.operator.pods.pod_cache.index_pod`)."""
TARGET_CRASHES = GroupCrashes()
"""The same for groups kvpilot did not make (an EngineTuner's LeaderWorkerSet target), keyed ``(namespace,
LeaderWorkerSet name)``: filled by :func:`kvpilot.operator.pods.pod_cache.file_target_crash`."""
