"""TGI 3.3.7's Prometheus exposition for one simulated pod (the router's ``GET /metrics``).

The router records through the ``metrics`` crate and renders with ``metrics-exporter-prometheus`` 0.15.3
(``Cargo.lock`` at ``v3.3.7``), so the text is that exporter's, not prometheus_client's: no ``_total`` on a
counter, no ``_created`` samples, a series appears once it is first recorded (a histogram after its first
request, the failure counter after the first failure), and every histogram whose name ends in ``duration``
has the router's buckets, 35 of ``0.0001 x 1.5^k`` (``router/src/server.rs`` lines 1938-1947). The series
names are kvpilot's (:mod:`kvpilot.tuner.tgi.serving`, their one home); what each holds:

* ``BATCH_MAX_TOTAL_TOKENS``: the KV capacity the warm-up inferred (``backends/v3/src/lib.rs`` line 138);
* ``QUEUE_SIZE``, ``BATCH_CURRENT_SIZE``: the engine model's waiting and running requests
  (``backends/v3/src/queue.rs`` line 158, ``backend.rs`` line 170);
* ``BATCH_CURRENT_MAX_TOKENS``: the KV tokens the running batch holds (TGI's is what the batch reserved,
  each request's prompt plus its ``max_new_tokens``; the engine model allocates as requests grow);
* ``REQUEST_DURATION``, ``REQUEST_QUEUE_DURATION``, ``TIME_PER_TOKEN``: per finished request, its end to
  end, queued and inference time over its generated tokens (``router/src/server.rs`` lines 363-367, 417-421);
* ``REQUEST_OVERLOADED`` (``REQUEST_FAILURE`` with its ``err`` label): requests refused beyond
  ``--max-concurrent-requests`` (``router/src/infer/mod.rs`` line 117), a counter the router never describes
  (no ``# HELP``), written as ``metrics-exporter-prometheus`` 0.15.3 writes one (``src/recorder.rs`` line
  124: the name as recorded, no suffix).

dcgm-exporter's framebuffer gauges are added as for a vLLM pod
(:func:`e2e.fleet.exposition.build_framebuffer_gauges`). A restarted container starts from zero.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from e2e.fleet import tgi_truth
from e2e.fleet.engine import Deltas
from e2e.fleet.exposition import build_framebuffer_gauges
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import GroundTruth
from kvpilot.tuner.tgi import serving


def _duration_buckets() -> tuple[float, ...]:
    """``router/src/server.rs`` lines 1938-1947, computed as the router computes them."""
    out, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


DURATION_BUCKETS = _duration_buckets()
HELP = {
    serving.QUEUE_SIZE: "Current queue size",
    serving.BATCH_CURRENT_SIZE: "Current batch size",
    serving.BATCH_CURRENT_MAX_TOKENS: "Maximum tokens for the current batch",
    serving.REQUEST_DURATION: "Total time spent processing the request",
    serving.REQUEST_QUEUE_DURATION: "Time spent in the queue per request",
    serving.TIME_PER_TOKEN: "Mean time per token per request",
}
"""``metrics::describe_*`` in ``router/src/server.rs`` (the last description of a name)."""


def _num(value: float) -> str:
    """A value as Rust's ``f64`` ``Display`` writes it (``3``, ``0.5``)."""
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, le in enumerate(self.buckets):
            if value <= le:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [
            f'{name}_bucket{{le="{_num(le)}"}} {c}' for le, c in zip(self.buckets, self.counts, strict=True)
        ]
        return [*out, f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {_num(self.sum)}",
                f"{name}_count {self.count}"]  # fmt: skip


class TgiMetrics:
    """The router's series of one TGI pod, fed by the engine model."""

    def __init__(self, truth: GroundTruth, args: TgiArgs, *, gpu: int = 0) -> None:
        self.capacity = tgi_truth.warmup(truth, args).max_batch_total_tokens
        self.gauges: dict[str, float] = {serving.BATCH_MAX_TOTAL_TOKENS: float(self.capacity)}
        self.histograms: dict[str, _Histogram] = {}
        self.overloaded = 0
        self.fb_total_gib = truth.gpu_memory_gib
        self.registry = CollectorRegistry(auto_describe=True)
        self.fb_used, self.fb_free = build_framebuffer_gauges(self.registry, gpu)
        self.record_framebuffer(tgi_truth.framebuffer_used_gib(truth, args))

    def record_framebuffer(self, used_gib: float) -> None:
        self.fb_used.set(used_gib * 1024)
        self.fb_free.set(max(0.0, self.fb_total_gib - used_gib) * 1024)

    def _observe(self, name: str, value: float) -> None:
        self.histograms.setdefault(name, _Histogram(DURATION_BUCKETS)).observe(value)

    def record(
        self, *, running: int, waiting: int, kv_usage: float, deltas: Deltas, fb_used_gib: float | None = None
    ) -> None:
        """The gauges now; the histograms and the failure counter by what happened since the last call."""
        if fb_used_gib is not None:
            self.record_framebuffer(fb_used_gib)
        self.gauges[serving.QUEUE_SIZE] = float(waiting)
        self.gauges[serving.BATCH_CURRENT_SIZE] = float(running)
        self.gauges[serving.BATCH_CURRENT_MAX_TOKENS] = float(int(kv_usage * self.capacity))
        self.overloaded += deltas.refused
        for f in deltas.finished:
            self._observe(serving.REQUEST_DURATION, f.e2e_s)
            self._observe(serving.REQUEST_QUEUE_DURATION, f.queue_s)
            self._observe(serving.TIME_PER_TOKEN, f.inference_s / max(1, f.generation_tokens))

    def render(self) -> bytes:
        out: list[str] = []
        for name, value in sorted(self.gauges.items()):
            if name in HELP:
                out.append(f"# HELP {name} {HELP[name]}")
            out += [f"# TYPE {name} gauge", f"{name} {_num(value)}", ""]
        if self.overloaded:  # not described by the router (no HELP line); the selector is the sample's name
            name = serving.REQUEST_FAILURE
            out += [f"# TYPE {name} counter", f"{serving.REQUEST_OVERLOADED} {self.overloaded}", ""]
        for name, hist in sorted(self.histograms.items()):
            out += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} histogram", *hist.lines(name), ""]
        return ("\n".join(out) + "\n").encode() + generate_latest(self.registry)
