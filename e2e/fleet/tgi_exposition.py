"""TGI 3.3.7's Prometheus exposition for one simulated pod (the router's ``/metrics``).

Names and types of TGI's own metrics at ``v3.3.7`` (``docs/source/reference/metrics.md``; the Rust
``metrics`` crate through ``metrics-exporter-prometheus``, no labels on these): the batcher's gauges
``tgi_queue_size``, ``tgi_batch_current_size``, ``tgi_batch_current_max_tokens`` (the tokens the running batch
may reach: its requests' prompt + max new tokens) and ``tgi_batch_max_total_tokens`` (the KV tokens the
warm-up inferred, set once: ``backends/v3/src/lib.rs`` line 138), the counters ``tgi_request_count`` and
``tgi_request_success``, the histograms ``tgi_request_queue_duration``, ``tgi_request_duration`` and
``tgi_request_mean_time_per_token_duration`` (seconds). dcgm-exporter's framebuffer gauges are added as for a
vLLM pod (:func:`e2e.fleet.exposition.build_framebuffer_gauges`). Each pod has its own registry: a restarted
container starts from zero.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from e2e.fleet import tgi_truth
from e2e.fleet.engine import Deltas
from e2e.fleet.exposition import build_framebuffer_gauges, render_without_created
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import GroundTruth

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""The exporter's buckets for TGI's duration histograms (the fleet's choice: TGI sets none per series)."""


class TgiMetrics:
    """The metric families of one TGI router, in their own registry."""

    def __init__(self, truth: GroundTruth, args: TgiArgs) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue = Gauge("tgi_queue_size", "Requests waiting in the queue", registry=r)
        self.batch = Gauge("tgi_batch_current_size", "Requests in the running batch", registry=r)
        self.batch_tokens = Gauge(
            "tgi_batch_current_max_tokens", "Maximum tokens the running batch may reach", registry=r
        )
        self.tokens = tgi_truth.kv_tokens(truth, args)
        Gauge("tgi_batch_max_total_tokens", "Maximum tokens of a batch (the KV cache)", registry=r).set(
            self.tokens
        )
        self.requests = Counter("tgi_request_count", "Requests received", registry=r)
        self.success = Counter("tgi_request_success", "Requests answered", registry=r)
        self.queue_duration = Histogram(
            "tgi_request_queue_duration", "Time spent in the queue", buckets=DURATION_BUCKETS, registry=r
        )
        self.duration = Histogram(
            "tgi_request_duration", "End-to-end request time", buckets=DURATION_BUCKETS, registry=r
        )
        self.per_token = Histogram(
            "tgi_request_mean_time_per_token_duration",
            "Mean time per generated token",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.fb_total_gib = truth.gpu_memory_gib
        self.fb_used, self.fb_free = build_framebuffer_gauges(r, 0)
        self.record_framebuffer(tgi_truth.framebuffer_used_gib(truth, args))

    def record_framebuffer(self, used_gib: float) -> None:
        self.fb_used.set(used_gib * 1024)
        self.fb_free.set(max(0.0, self.fb_total_gib - used_gib) * 1024)

    def record(
        self, *, running: int, waiting: int, kv_usage: float, deltas: Deltas, fb_used_gib: float | None = None
    ) -> None:
        """One batcher report: the gauges now, the counters and histograms by what finished since."""
        if fb_used_gib is not None:
            self.record_framebuffer(fb_used_gib)
        self.queue.set(waiting)
        self.batch.set(running)
        self.batch_tokens.set(int(kv_usage * self.tokens))
        for f in deltas.finished:
            self.requests.inc()
            self.success.inc()
            self.queue_duration.observe(f.queue_s)
            self.duration.observe(f.e2e_s)
            if f.generation_tokens > 1:
                self.per_token.observe(f.itl_s)

    def render(self) -> bytes:
        """The exposition, without prometheus_client's ``_created`` samples (TGI's exporter has none)."""
        return render_without_created(self.registry)
