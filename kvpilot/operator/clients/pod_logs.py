"""Why a pod's previous container log (``pods/log?previous=true``) could not be read, when it could not.

kubelet keeps the last 80 lines / 2 KiB of a crash as the termination message; after a real vLLM start-up
failure the ValueError sits further up, so the closed loop reads the previous log
(:func:`kvpilot.operator.pods.pod_reading.read_restart_logs`, for InferenceServices and EngineTuners alike,
through :func:`kvpilot.operator.clients.kube.fetch_previous_log`). When that read fails, the restart's
reason must say which failure it was and what to do about it (:func:`compute_unread_log`):

* **Forbidden** (HTTP 403): the operator's ServiceAccount lacks ``get`` on ``pods/log`` in the namespace;
* **PodGone** (404 on the pod): the pod was deleted, its logs with it;
* **LogGone** (400 "previous terminated container ... not found", or no log file on the node): kubelet
  removed the previous container or its log was rotated away;
* **NodeUnreachable** (5xx, the API server's "dial tcp ...:10250" and the like): the API server could not
  reach the kubelet of the pod's node;
* **ApiUnreachable**: the operator could not talk to the API server.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

FORBIDDEN, POD_GONE, LOG_GONE, NODE_UNREACHABLE, API_UNREACHABLE, UNREADABLE = (
    "Forbidden",
    "PodGone",
    "LogGone",
    "NodeUnreachable",
    "ApiUnreachable",
    "Unreadable",
)


@dataclass(frozen=True, slots=True)
class UnreadLog:
    """A previous log that could not be read: ``reason`` (one of this module's names) and ``detail``, the
    sentence a restart's reason carries (which failure, and what to do)."""

    reason: str
    detail: str


_NODE_TEXTS = ("dial tcp", "10250", "no agent available", "i/o timeout", "connection refused", "no route")
_GONE_TEXTS = ("previous terminated container", "no such file", "unable to retrieve container logs")


def _message(body: str) -> str:
    """The ``Status`` object's ``message``, else the body itself (cut)."""
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    return str(status.get("message") or body)[:300] if isinstance(status, dict) else body.strip()[:300]


def compute_unread_log(status: int | None, body: str, namespace: str) -> UnreadLog:
    """Why ``pods/log?previous=true`` failed, from the API server's HTTP ``status`` (``None``: no answer)
    and response ``body``, said so that the reader knows what to do. The detail reaches tenant-visible
    status, so it never quotes the API server's message (node addresses, upstream text): that goes to the
    operator's log only."""
    message = _message(body)
    low = message.lower()
    if message:
        logger.warning("previous log in namespace %s unreadable (HTTP %s): %s", namespace, status, message)
    if status is None:
        return UnreadLog(
            API_UNREACHABLE,
            "its previous log could not be read: the API server did not answer the operator; the next tick "
            "tries again (the operator's log has the error)",
        )
    if status == 403:
        return UnreadLog(
            FORBIDDEN,
            f"its previous log could not be read: the operator may not get pods/log in namespace {namespace} "
            "(HTTP 403, RBAC); grant its ServiceAccount get on pods/log there (the chart's workloads Role "
            "has it for the namespaces it serves)",
        )
    if status == 404:
        return UnreadLog(
            POD_GONE,
            "its previous log could not be read: the pod is gone and its logs with it (HTTP 404)",
        )
    if status >= 500 or any(t in low for t in _NODE_TEXTS):
        return UnreadLog(
            NODE_UNREACHABLE,
            "its previous log could not be read: the API server could not reach the kubelet of the pod's "
            f"node (HTTP {status}; the operator's log has the API server's words); check that the node is "
            "Ready and its port 10250 reachable from the API server",
        )
    if status == 400 and any(t in low for t in _GONE_TEXTS):
        return UnreadLog(
            LOG_GONE,
            "its previous log could not be read: the node no longer has it (HTTP 400: the previous container "
            "was removed or its log rotated away); the next restart's log is read, or read it sooner with "
            "kubectl logs --previous",
        )
    return UnreadLog(
        UNREADABLE,
        f"its previous log could not be read (HTTP {status}; the operator's log has the API server's words)",
    )
