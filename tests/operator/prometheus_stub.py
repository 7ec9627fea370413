"""A stub Prometheus HTTP API for the closed loop's unit tests.

Answers ``/api/v1/query`` and ``/api/v1/query_range`` like Prometheus does
(``{"status": "success", "data": {"resultType": ..., "result": [...]}}``), choosing the
answer by the metric names in the PromQL, with one series per pod (two of service ``llm``, one of
another service, one in another namespace), and records every query and its headers.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOW = 1_800_000_000.0


class Stub:
    def __init__(self) -> None:
        self.queries: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.legacy = False
        self.kv: list[float] | None = [0.5, 0.6, 0.95, 0.97, 0.99]
        self.last_scrape = NOW - 5
        self.status = 200
        self.running: float | None = None
        """Override the last running-requests value (an impossible one, say)."""
        self.waiting: float | None = None
        self.pod_label, self.namespace_label = "pod", "namespace"
        self.require: dict[str, str] = {}
        """Headers a request must carry, else 401."""

    def labels(self, pod: str, namespace: str = "ns1") -> dict[str, str]:
        return {self.namespace_label: namespace, self.pod_label: pod}

    def answer(
        self, path: str, params: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        q = params.get("query", "")
        self.queries.append(q)
        self.headers.append(headers)
        if any(headers.get(k) != v for k, v in self.require.items()):
            return 401, {"status": "error", "errorType": "unauthorized", "error": "no"}
        if self.status != 200:
            return self.status, {"status": "error", "errorType": "internal", "error": "boom"}
        if path.endswith("query_range"):
            start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
            times = [start + i * step for i in range(int((end - start) // step) + 1)]
            values: list[float] | None = None
            if q.startswith("max by") and "kv_cache_usage_perc" in q:
                values = None if self.kv is None else self.kv
            elif "num_preemptions_total" in q:
                values = [0.0, 0.0, 0.2, 0.4, 0.5]
            elif "num_requests_running" in q:
                values = [10, 20, 60, 64, 64 if self.running is None else self.running]
            elif "num_requests_waiting" in q:
                values = [0, 0, 3, 9, 12 if self.waiting is None else self.waiting]
            if values is None:
                return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}
            points = [[t, str(v)] for t, v in zip(times[-len(values) :], values, strict=False)]
            lower = [[t, str(float(v) / 2)] for t, v in points]
            higher = [[t, str(float(v) * 1.01)] for t, v in points]  # another service's pod: never selected
            return 200, {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [
                        {"metric": self.labels(PODS[0]), "values": points},
                        {"metric": self.labels(PODS[1]), "values": lower},
                        {"metric": self.labels("other-7b9c6d-ccccc"), "values": higher},
                        {"metric": self.labels(PODS[0], "ns2"), "values": higher},
                    ],
                },
            }
        t = float(params.get("time", NOW))
        a, b, other = self.labels(PODS[0]), self.labels(PODS[1]), self.labels("other-7b9c6d-ccccc")

        def vector(*pairs: tuple[dict[str, str], Any]) -> list[dict[str, Any]]:
            return [{"metric": m, "value": [t, str(v)]} for m, v in pairs]

        if q.startswith("max by") and "timestamp(" in q:
            result = vector((a, self.last_scrape), (b, self.last_scrape - 1), (other, NOW))
        elif "request_prompt_tokens_sum" in q:
            result = vector((a, 1800.5 * 3), (b, 1800.5), (other, 1e6))
        elif "request_prompt_tokens_count" in q:
            result = vector((a, 3), (b, 1), (other, 1))
        elif "request_generation_tokens" in q:
            result = vector((a, 0), (b, 0))  # no request finished in the window: 0 / 0
        elif q.startswith("vllm:cache_config_info"):
            labels = {
                "__name__": "vllm:cache_config_info",
                "engine": "0",
                "block_size": "16",
                "gpu_memory_utilization": "0.9",
                "cache_dtype": "auto",
                "num_gpu_blocks": "27000",
            }
            ca = dict(labels, **a)
            cb = dict(labels, **b, num_gpu_blocks="26000")
            co = dict(labels, **other, num_gpu_blocks="100")
            if not self.legacy:
                ca["kv_cache_size_tokens"], cb["kv_cache_size_tokens"] = "432000", "416000"
            result = [
                {"metric": ca, "value": [t, "1"]},
                {"metric": cb, "value": [t, "1"]},
                {"metric": co, "value": [t, "1"]},
            ]
        else:
            result = []
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


def serve_stub(state: Stub | None = None) -> Iterator[tuple[Stub, str]]:
    """Serve ``state`` (a fresh :class:`Stub` by default) on a free port; yields it and its URL."""
    state = state or Stub()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, params: dict[str, str]) -> None:
            path = urllib.parse.urlparse(self.path).path
            code, payload = state.answer(path, params, dict(self.headers.items()))
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            query = urllib.parse.urlparse(self.path).query
            self._reply({k: v[-1] for k, v in urllib.parse.parse_qs(query).items()})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PODS = ("llm-5d8f7c-aaaaa", "llm-5d8f7c-bbbbb")
"""The pods the service's Deployment owns (the closed loop lists them by owner)."""
