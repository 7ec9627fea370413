"""The closed loop's PromQL against a real Prometheus scraping vLLM-format ``/metrics``.

Debian's ``prometheus`` (started by ``e2e.prometheus``, scrape interval 1 s) scrapes two
fake vLLM pods of one service (the e2e fleet's exposition: 0.33 names, and a pod with
the pre-rename names) plus a pod of *another* service that must not be selected.
Checks that every query parses, the selector picks the right pods, the fallbacks work
and the window has what the policy needs. Skipped where the binary is not installed
(``make test`` installs it).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvpilot.operator import prometheus


def test_the_prometheus_binary_is_installed() -> None:
    assert shutil.which("prometheus"), "prometheus is missing: `make e2e-tools` installs Debian's package"


def _serve(render: Any) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[str, dict[str, Any]]]:
    prom_mod = pytest.importorskip("e2e.prometheus")
    truth_mod = pytest.importorskip("e2e.fleet.truth")
    expo = pytest.importorskip("e2e.fleet.exposition")
    engine = pytest.importorskip("e2e.fleet.engine")

    truth = truth_mod.GroundTruth()
    pods: dict[str, Any] = {}
    servers = []
    for name, naming, gmu in (("llm-5d8f7c-aaaaa", "current", 0.9), ("llm-5d8f7c-bbbbb", "legacy", 0.9),
                              ("other-7b9c6d-ccccc", "current", 0.5)):  # fmt: skip
        args = truth_mod.EngineArgs(
            model="m", max_model_len=8192, max_num_seqs=64, gpu_memory_utilization=gmu
        )
        metrics = expo.VllmMetrics(truth, args, naming=naming)
        usage = 0.97 if name.startswith("llm-5d8f7c-aaaaa") else (0.5 if name.startswith("llm") else 0.99)
        metrics.record(running=40, waiting=7, kv_usage=usage, deltas=engine.Deltas(preemptions=0))
        pods[name] = (metrics, truth.kv_tokens(args))
        servers.append((name, _serve(metrics.render)))

    def bump() -> None:  # a preemption storm on pod aaaaa: 5 per second
        while not stop.is_set():
            pods["llm-5d8f7c-aaaaa"][0].record(
                running=40, waiting=7, kv_usage=0.97, deltas=engine.Deltas(preemptions=1)
            )
            time.sleep(0.2)

    stop = threading.Event()
    threading.Thread(target=bump, daemon=True).start()
    with prom_mod.PrometheusServer(scrape_interval="1s") as prom:
        prom.write_targets([
            {"targets": [f"127.0.0.1:{srv.server_address[1]}"],
             "labels": {"__meta_kubernetes_namespace": "ns1", "__meta_kubernetes_pod_name": name}}
            for name, srv in servers
        ])  # fmt: skip
        prom.wait_for(
            'count(up{namespace="ns1"} == 1)', lambda r: bool(r) and r[0]["value"][1] == "3", timeout=60
        )
        time.sleep(6)  # a few scrapes for rate()
        try:
            yield prom.url, pods
        finally:
            stop.set()
            for _, srv in servers:
                srv.shutdown()


async def test_real_prometheus_window(fleet: tuple[str, dict[str, Any]]) -> None:
    url, pods = fleet
    now = time.time()
    w = await prometheus.fetch_observations(
        url,
        "ns1",
        "llm",
        now,
        pods=("llm-5d8f7c-aaaaa", "llm-5d8f7c-bbbbb"),
        window_seconds=10,
        step_seconds=1,
    )
    assert w.available, w.unavailable_reason
    assert w.pods == 2  # the other service's pod is not selected
    # a foreign pod named like the service's (llm-<hash>-<suffix>) is not the service's pod: not selected
    only_one = await prometheus.fetch_observations(
        url, "ns1", "llm", now, pods=("llm-5d8f7c-bbbbb",), window_seconds=10, step_seconds=1
    )
    assert only_one.pods == 1 and only_one.samples[-1].kv_usage == pytest.approx(0.5)
    last = w.samples[-1]
    assert last.kv_usage == pytest.approx(0.97)  # the worst pod, across the current and legacy names
    assert (last.running, last.waiting) == (40, 7)
    assert last.preemption_rate is not None and last.preemption_rate > 0.05  # the policy's storm threshold
    assert now - (w.last_sample_time or 0) < 5
    # the current-naming pod reports kv_cache_size_tokens, the legacy one blocks x block size: same figure
    assert w.kv_capacity_tokens == pods["llm-5d8f7c-aaaaa"][1]
    assert w.reported_gpu_memory_utilization == 0.9 and w.reported_kv_cache_dtype == "auto"


async def test_real_prometheus_other_service_and_missing_service(fleet: tuple[str, dict[str, Any]]) -> None:
    url, _ = fleet
    other = await prometheus.fetch_observations(
        url, "ns1", "other", time.time(), pods=("other-7b9c6d-ccccc",), window_seconds=10, step_seconds=1
    )
    assert other.available and other.samples[-1].kv_usage == pytest.approx(0.99)
    assert other.reported_gpu_memory_utilization == 0.5
    none = await prometheus.fetch_observations(
        url, "ns2", "llm", time.time(), pods=("llm-5d8f7c-aaaaa",), window_seconds=10, step_seconds=1
    )
    assert not none.available and "no vllm:kv_cache_usage_perc series" in (none.unavailable_reason or "")
