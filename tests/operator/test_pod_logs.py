"""Why a pod's previous log could not be read, said in the restart's reason with what to do
(:mod:`kvpilot.operator.clients.pod_logs`): the API server's own answers for RBAC, a deleted pod, a removed
or rotated log, an unreachable node, and no answer at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from closed_loop_fakes import FakePods, pod
from kubernetes.client.exceptions import ApiException

from e2e.pods import termination_message
from kvpilot.operator.clients import pod_logs
from kvpilot.operator.clients.kube import fetch_previous_log
from kvpilot.operator.pods.pod_reading import LogCache, read_pod_views
from kvpilot.operator.pods.pod_summary import compute_serving
from kvpilot.operator.pods.pod_view import PreviousLog
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.vllm import parse_vllm_args


def status_body(code: int, reason: str, message: str) -> str:
    """A ``metav1.Status`` as the API server writes it."""
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


FORBIDDEN = status_body(
    403,
    "Forbidden",
    'pods "svc-1" is forbidden: User "system:serviceaccount:kvpilot:kvpilot" cannot get resource "pods/log" '
    'in API group "" in the namespace "demo"',
)
POD_GONE = status_body(404, "NotFound", 'pods "svc-1" not found')
LOG_GONE = status_body(400, "BadRequest", 'previous terminated container "vllm" in pod "svc-1" not found')
NODE_DOWN = status_body(
    500,
    "InternalError",
    'Get "https://10.0.0.7:10250/containerLogs/demo/svc-1/vllm?previous=true&tailLines=400": dial tcp '
    "10.0.0.7:10250: connect: no route to host",
)

CASES = [
    (403, FORBIDDEN, pod_logs.FORBIDDEN, ("may not get pods/log in namespace demo", "HTTP 403", "grant")),
    (404, POD_GONE, pod_logs.POD_GONE, ("the pod is gone", "HTTP 404")),
    (400, LOG_GONE, pod_logs.LOG_GONE, ("no longer has it", "rotated", "kubectl logs --previous")),
    (500, NODE_DOWN, pod_logs.NODE_UNREACHABLE, ("could not reach the kubelet", "HTTP 500", "Ready")),
    (None, "ConnectionError", pod_logs.API_UNREACHABLE, ("the API server did not answer", "next tick")),
    (418, "{}", pod_logs.UNREADABLE, ("HTTP 418",)),
]


@pytest.mark.parametrize(("status", "body", "reason", "says"), CASES, ids=[c[2] for c in CASES])
def test_each_failure_is_named_with_what_to_do(
    status: int | None, body: str, reason: str, says: tuple[str, ...]
) -> None:
    unread = pod_logs.compute_unread_log(status, body, "demo")
    assert unread.reason == reason
    assert unread.detail.startswith("its previous log could not be read")
    for text in says:
        assert text in unread.detail, (text, unread.detail)
    for upstream in ("10.0.0.7", "no route to host", "ConnectionError", "forbidden: User"):
        assert upstream not in unread.detail, (upstream, unread.detail)  # tenant-visible: no upstream words


def test_a_kubelet_error_behind_a_502_is_the_node() -> None:
    body = status_body(502, "InternalError", "error trying to reach service: No agent available")
    assert pod_logs.compute_unread_log(502, body, "demo").reason == pod_logs.NODE_UNREACHABLE


class Core:
    """``CoreV1Api.read_namespaced_pod_log`` answering with an exception."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls: list[dict[str, Any]] = []

    def read_namespaced_pod_log(self, pod: str, namespace: str, **kwargs: Any) -> Any:
        self.calls.append({"pod": pod, "namespace": namespace, **kwargs})
        raise self.exc


def api_exception(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = body
    return exc


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (api_exception(403, FORBIDDEN), pod_logs.FORBIDDEN),
        (api_exception(400, LOG_GONE), pod_logs.LOG_GONE),
        (api_exception(500, NODE_DOWN), pod_logs.NODE_UNREACHABLE),
        (ConnectionRefusedError(111, "refused"), pod_logs.API_UNREACHABLE),
    ],
)
def test_the_client_read_returns_why(exc: Exception, reason: str) -> None:
    core = Core(exc)
    got = fetch_previous_log(core, "demo", "svc-1", "vllm", 400)
    assert isinstance(got, pod_logs.UnreadLog) and got.reason == reason
    assert core.calls == [
        {
            "pod": "svc-1",
            "namespace": "demo",
            "container": "vllm",
            "previous": True,
            "tail_lines": 400,
            "_preload_content": False,
        }
    ]


ARGS = ["tiny-llama", "--max-model-len", "4096"]
ENGINE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)


class Unreadable(FakePods):
    def __init__(self, log: PreviousLog) -> None:
        super().__init__()
        self.log = log

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        self.log_reads += 1
        return self.log


@pytest.mark.parametrize(("status", "body", "reason", "says"), CASES, ids=[c[2] for c in CASES])
def test_the_restart_and_the_degraded_condition_say_why(
    status: int | None, body: str, reason: str, says: tuple[str, ...]
) -> None:
    reader = Unreadable(pod_logs.compute_unread_log(status, body, "demo"))
    message = termination_message(ENGINE_FAILED + "\n")
    reader.pods = [pod("svc-1", ARGS, ready=False, restarts=1, message=message, crash_loop=True)]
    cache = LogCache()
    [view] = read_pod_views(reader, "demo", "app=svc", "svc", logs=cache)
    read_pod_views(reader, "demo", "app=svc", "svc", logs=cache)
    assert reader.log_reads == 1  # once per restart, the failure too
    assert view.restart is not None and view.restart.cause.kind == RestartKind.OTHER
    serving = compute_serving([view], parse_vllm_args(ARGS)[0])
    assert serving.degraded_reason == "CrashLoopBackOff"
    for text in says:
        assert text in view.restart.cause.detail and text in serving.message


def test_an_empty_previous_log_is_said_empty() -> None:
    reader = Unreadable(None)
    reader.pods = [pod("svc-1", ARGS, ready=False, restarts=1, message=ENGINE_FAILED, crash_loop=True)]
    [view] = read_pod_views(reader, "demo", "app=svc", "svc", logs=LogCache())
    assert view.restart is not None and "its previous log is empty" in view.restart.cause.detail
