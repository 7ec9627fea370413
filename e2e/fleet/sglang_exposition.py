"""SGLang 0.5.23's Prometheus exposition for one simulated pod (``--enable-metrics``).

Names, types, label names and buckets of ``sglang/srt/observability/metrics_collector.py`` in the pinned
wheel (``e2e/test_fleet_sglang.py`` checks them against the installed source):

* the scheduler's series (``SchedulerMetricsCollector``, labels ``model_name``, ``engine_type``,
  ``tp_rank``, ``pp_rank``, ``moe_ep_rank``: lines 1376-1388): ``sglang:num_running_reqs`` (line 364),
  ``sglang:num_queue_reqs`` (370), ``sglang:token_usage`` (404), ``sglang:num_used_tokens`` (432),
  ``sglang:num_retracted_reqs`` (552), ``sglang:num_retracted_requests_total`` (557, a counter declared with
  its ``_total``), ``sglang:queue_time_seconds`` (837), ``sglang:max_total_num_tokens`` (1289, set once at
  start-up), ``sglang:context_len`` (1337), ``sglang:page_size`` (1325);
* the tokenizer's (``TokenizerMetricsCollector``, labels ``model_name`` and ``engine_type``:
  ``tokenizer_metric_labels``, lines 1805-1819; ``is_streaming`` on some): ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:num_requests_total`` (lines 1855-1944),
  ``sglang:prompt_tokens_histogram`` (line 1909, buckets ``default_bucket_prompt_tokens`` 1871-1907: every
  finished request's prompt, observed with no flag but ``--enable-metrics``, line 2146),
  ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
  ``sglang:e2e_request_latency_seconds`` (lines 2032-2066, buckets 1965-2030).

``engine_type`` is ``unified`` (``disaggregation/utils.py`` ``to_engine_type``, no disaggregation). SGLang
serves ``/metrics`` through prometheus_client's ``MultiProcessCollector`` (``utils/common.py`` line 2848),
which exports no ``_created`` samples (neither does the fleet) and labels a gauge declared without a
``multiprocess_mode`` (``sglang:num_retracted_reqs``) with its writer's ``pid``. dcgm-exporter's
framebuffer gauges are added as for a vLLM pod (:func:`e2e.fleet.exposition.build_framebuffer_gauges`). Each
pod has its own registry: a restarted container starts from zero.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from e2e.fleet import sglang_truth
from e2e.fleet.engine import Deltas
from e2e.fleet.exposition import build_framebuffer_gauges
from e2e.fleet.sglang_truth import SglangArgs
from e2e.fleet.truth import GroundTruth

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
SCHEDULER_PID = 121
"""The scheduler process's pid, on gauges SGLang declares without a ``multiprocess_mode`` (prometheus_client's
default ``all`` keeps one sample per writing process, labelled ``pid``)."""
TOKENIZER_LABELS = ("model_name", "engine_type")

QUEUE_TIME_BUCKETS = (
    0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80,
    90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
E2E_REQUEST_LATENCY_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
PROMPT_TOKENS_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
    17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
    600000, 800000, 1000000, 1100000,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
    0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


class SglangMetrics:
    """The metric families of one SGLang server (TP rank 0 reports), in their own registry."""

    def __init__(self, truth: GroundTruth, args: SglangArgs, *, tp_rank: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        model = args.model_name or "model"
        sched = {"model_name": model, "engine_type": "unified", "tp_rank": str(tp_rank), "pp_rank": "0"}
        sched["moe_ep_rank"] = "0"
        tok = {"model_name": model, "engine_type": "unified"}
        streaming = {**tok, "is_streaming": "false"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, SCHEDULER_LABELS, registry=r).labels(**sched)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        # declared without a multiprocess_mode ("all"): MultiProcessCollector keeps the writer's pid label
        self.retracted = Gauge(
            "sglang:num_retracted_reqs", "The number of retracted requests.", (*SCHEDULER_LABELS, "pid"),
            registry=r,
        ).labels(**sched, pid=str(SCHEDULER_PID))  # fmt: skip
        self.retracted_total = Counter(
            "sglang:num_retracted_requests_total", "Total number of retracted requests.", SCHEDULER_LABELS,
            registry=r,
        ).labels(**sched)  # fmt: skip
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", SCHEDULER_LABELS,
            buckets=QUEUE_TIME_BUCKETS, registry=r,
        ).labels(**sched)  # fmt: skip
        self.tokens = sglang_truth.max_total_num_tokens(truth, args)
        gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.").set(
            self.tokens
        )
        gauge("sglang:page_size", "KV cache page size in tokens.").set(sglang_truth.page(args))
        gauge("sglang:context_len", "Maximum context length.").set(sglang_truth.context_len(truth, args))
        with_stream = (*TOKENIZER_LABELS, "is_streaming")
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", with_stream, registry=r
        ).labels(**streaming)
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", with_stream,
            registry=r,
        ).labels(**streaming)  # fmt: skip
        self.requests = Counter(
            "sglang:num_requests_total", "Number of requests processed.", with_stream, registry=r
        ).labels(**streaming)
        self.prompt_lengths = Histogram(
            "sglang:prompt_tokens_histogram", "Histogram of prompt token length.", TOKENIZER_LABELS,
            buckets=PROMPT_TOKENS_BUCKETS, registry=r,
        ).labels(**tok)  # fmt: skip
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", with_stream,
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS, registry=r,
        ).labels(**streaming)  # fmt: skip
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            TOKENIZER_LABELS, buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=r,
        ).labels(**tok)  # fmt: skip
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            with_stream, buckets=E2E_REQUEST_LATENCY_BUCKETS, registry=r,
        ).labels(**streaming)  # fmt: skip
        self.fb_total_gib = truth.gpu_memory_gib
        self.fb_used, self.fb_free = build_framebuffer_gauges(r, tp_rank)
        self.record_framebuffer(sglang_truth.framebuffer_used_gib(truth, args))

    def record_framebuffer(self, used_gib: float) -> None:
        self.fb_used.set(used_gib * 1024)
        self.fb_free.set(max(0.0, self.fb_total_gib - used_gib) * 1024)

    def record(
        self, *, running: int, waiting: int, kv_usage: float, deltas: Deltas, fb_used_gib: float | None = None
    ) -> None:
        """One scheduler report: the gauges now, the counters and histograms by what happened since."""
        if fb_used_gib is not None:
            self.record_framebuffer(fb_used_gib)
        self.running.set(running)
        self.queued.set(waiting)
        self.token_usage.set(round(kv_usage, 2))  # pool_stats_observer.py line 155 rounds it to 2 places
        self.used_tokens.set(int(kv_usage * self.tokens))
        self.retracted.set(deltas.preemptions)
        self.retracted_total.inc(deltas.preemptions)
        for f in deltas.finished:
            self.queue_time.observe(f.queue_s)
            self.prompt_tokens.inc(f.prompt_tokens)
            self.prompt_lengths.observe(f.prompt_tokens)
            self.generation_tokens.inc(f.generation_tokens)
            self.requests.inc()
            self.ttft.observe(f.ttft_s)
            self.e2e.observe(f.e2e_s)
            if f.generation_tokens > 1:
                self.itl.observe(f.itl_s)

    def render(self) -> bytes:
        """The exposition, without ``_created`` samples (SGLang's ``MultiProcessCollector`` has none)."""
        text = generate_latest(self.registry).decode()
        lines = [
            line
            for line in text.splitlines()
            if not (line.split("{", 1)[0].split(" ", 1)[0].endswith("_created"))
            and not (line.startswith("# ") and line.split(" ")[2].endswith("_created"))
        ]
        return ("\n".join(lines) + "\n").encode()
