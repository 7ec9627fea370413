"""The previous logs of an EngineTuner target's restarts, read as an InferenceService's are.

kubelet's termination message holds the last 80 lines / 2 KiB of a crash; after a real vLLM start-up failure
the ValueError that says why sits further up, under the API server's traceback. So, as for an
InferenceService's pods, a restart of the target's vLLM container that its termination message does not
explain is classified from the previous container's log, read once per restart through the one shared
reader (:func:`kvpilot.operator.pods.pod_reading.read_restart_logs`), or says why that log could not be read
(:mod:`kvpilot.operator.clients.pod_logs`). :func:`kvpilot.operator.enginetuner.target_loop.build_views`
takes what this module read.

A LeaderWorkerSet target's restart has no log left to read: LWS deletes the group the moment a pod restarts.
Its pod, as the operator's watch filed it on the way (:mod:`kvpilot.operator.pods.group_crashes`), is what
:func:`recall_gone` gives back: the restart it says, and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.clients.kube import IO_POOL, TargetKube
from kvpilot.operator.enginetuner import target, target_loop
from kvpilot.operator.pods import group_crashes, pod_reading, pod_view


def read_logs(
    kube: TargetKube, namespace: str, pods: Sequence[Mapping[str, Any]], container: str
) -> dict[str, pod_view.PreviousLog]:
    """The previous logs of the pods' vLLM ``container`` whose restarts need them, by pod (blocking)."""
    only = [target_loop.with_container(pod, container) for pod in pods]
    return pod_reading.read_restart_logs(kube, namespace, only, container)


async def fetch_logs(
    kube: TargetKube | None, namespace: str, pods: Sequence[Mapping[str, Any]], container: str
) -> dict[str, pod_view.PreviousLog]:
    """:func:`read_logs` in the operator's I/O threads; nothing without a client."""
    if kube is None:
        return {}
    return await asyncio.get_running_loop().run_in_executor(
        IO_POOL, read_logs, kube, namespace, pods, container
    )


def recall_gone(
    namespace: str, ref: api.TargetRef, live: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A LeaderWorkerSet target's pods deleted with their group after a crash (``group_crashes``'s
    ``TARGET_CRASHES``), only those the set's owner chain claims, as for the live pods; none for other
    kinds."""
    if not target.is_group_kind(ref.kind):
        return []
    filed = group_crashes.TARGET_CRASHES.recall((namespace, ref.name), live)
    return [p for p in filed if target.pod_belongs(p, ref.kind, ref.name)]
