"""The vLLM pods of a service read from the cluster, with the previous logs their restarts need.

:func:`read_pod_views` lists the pods of a workload through a :class:`PodReader`, keeps those it owns
(:func:`~.pod_view.owned_by`) and builds their views; a restart the termination message does not explain is
classified from the previous container's log tail (:func:`read_restart_logs`, read once per restart:
:class:`LogCache`; :func:`~.pod_view.build_logged_view`). The InferenceService's loop
(:func:`read_service_views`) and the EngineTuner's reconcile share the log reading; :class:`ClusterPods`
does the two reads (list pods, read a previous log) with the ``kubernetes`` client. Blocking: run in a
worker thread.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kvpilot.operator.clients.kube import fetch_previous_log, raw_response
from kvpilot.operator.pods import workloads
from kvpilot.operator.pods.pod_view import (
    CONTAINER,
    PodView,
    PreviousLog,
    build_logged_view,
    build_pod_view,
    owned_by,
)

LOG_TAIL_LINES = 400
"""Lines of the previous container's log to read. The termination message is at most 2 KiB / 80 lines
(kubelet's ``FallbackToLogsOnError``), and after a start-up failure the API server's own traceback
("Engine core initialization failed. See root cause above.") usually fills that, pushing vLLM's
ValueError out; after a run-time CUDA OOM the shutdown lines do the same."""


class LogReader(Protocol):
    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        """The tail of the previous container's log, why it could not be read, or ``None`` when there is
        none."""
        ...


class PodReader(LogReader, Protocol):
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Raw pod objects (JSON dicts)."""
        ...


class LogCache:
    """Previous-log tails by (namespace, pod, restart count): a crash-looping pod's log is read once per
    restart, not once per tick. Only saves reads; losing it (an operator restart) loses nothing.
    Thread-safe: ticks read pods in worker threads."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._data: OrderedDict[tuple[str, str, int], PreviousLog] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, int]) -> tuple[bool, PreviousLog]:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return True, self._data[key]
            return False, None

    def put(self, key: tuple[str, str, int], value: PreviousLog) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


LOGS = LogCache()
"""The process's log cache (:func:`read_pod_views`)."""


def read_restart_logs(
    reader: LogReader,
    namespace: str,
    pods: Sequence[Mapping[str, Any]],
    container: str = CONTAINER,
    logs: LogCache = LOGS,
) -> dict[str, PreviousLog]:
    """The previous logs of the ``pods`` whose restart the termination message does not explain, by pod
    name, each read once per restart (``logs``); blocking. ``container``: the vLLM container's name (the
    pods' views read it: an EngineTuner passes its pods with that container alone)."""
    out: dict[str, PreviousLog] = {}
    for pod in pods:
        view = build_pod_view(pod)
        if not view.needs_log or view.restart is None:
            continue
        key = (namespace, view.name, view.restart.restart_count)
        known, log = logs.get(key)
        if not known:
            log = reader.read_previous_log(namespace, view.name, container, LOG_TAIL_LINES)
            logs.put(key, log)
        out[view.name] = log
    return out


def read_pod_views(
    reader: PodReader, namespace: str, label_selector: str, owner: str, logs: LogCache = LOGS
) -> list[PodView]:
    """The pods of the Deployment ``owner`` as the closed loop sees them (blocking: run it in a worker
    thread). Only pods it owns count (:func:`owned_by`): a foreign pod with the same labels is no evidence.

    A restart the termination message does not explain is classified from the previous container's
    log tail (:func:`read_restart_logs`); a restart whose log cannot be read says why
    (:func:`build_logged_view`)."""
    pods = [pod for pod in reader.list_pods(namespace, label_selector) if owned_by(pod, owner)]
    read = read_restart_logs(reader, namespace, pods, CONTAINER, logs)
    return [
        build_logged_view(pod, read[name]) if (name := _name(pod)) in read else build_pod_view(pod)
        for pod in pods
    ]


def read_service_views(reader: PodReader, namespace: str, name: str, logs: LogCache = LOGS) -> list[PodView]:
    """The pods of the InferenceService ``name`` (its workload's labels:
    :func:`~.workloads.build_label_selector`), as :func:`read_pod_views` reads them."""
    return read_pod_views(reader, namespace, workloads.build_label_selector(name), name, logs)


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


class ClusterPods:
    """:class:`PodReader` over the ``kubernetes`` client (the operator's shared ApiClient)."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            from kvpilot.operator.clients.kube import get_kube

            api_client = get_kube().api_client
        self.core = client.CoreV1Api(api_client)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        response = raw_response(
            self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        )
        try:
            return list(json.loads(response.data).get("items") or [])
        finally:
            response.release_conn()

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        return fetch_previous_log(self.core, namespace, pod, container, tail_lines)
