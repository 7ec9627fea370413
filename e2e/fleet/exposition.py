"""vLLM 0.33's Prometheus exposition for one simulated pod.

Names, types, label names and histogram buckets are those of
``vllm/v1/metrics/loggers.py::PrometheusStatLogger`` and
``vllm/v1/metrics/buckets.py`` in the pinned wheel (``e2e/test_fleet.py``
checks them against the installed source): label set ``model_name`` and
``engine`` ("0"); counters declared without ``_total`` (prometheus_client
exposes ``<name>_total`` and ``<name>_created``); ``vllm:cache_config_info`` is
a gauge set to 1 whose labels are every ``CacheConfig`` field plus ``engine``
(no ``model_name``).

Naming switch (``Scenario.naming``):

* ``current`` -- 0.33: ``vllm:kv_cache_usage_perc`` only.
* ``both``    -- 0.9.2 to 0.10.x: ``vllm:kv_cache_usage_perc`` and the deprecated
  ``vllm:gpu_cache_usage_perc``.
* ``legacy``  -- 0.8.x V1: ``vllm:gpu_cache_usage_perc`` only, and ``vllm:cache_config_info`` without
  the 0.33-only ``kv_cache_size_tokens`` / ``kv_cache_max_concurrency`` labels.

Each pod gets its own ``CollectorRegistry``: a restarted container starts from
zero, as a new vLLM process does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from e2e.fleet.engine import Deltas
from e2e.fleet.truth import EngineArgs, GroundTruth

NAMINGS = ("current", "both", "legacy")

# vllm/v1/metrics/buckets.py (0.33)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

#: ``CacheConfig().metrics_info()`` of vLLM 0.33 (defaults; the fleet fills in what start-up resolves).
CACHE_CONFIG_DEFAULTS: dict[str, str] = {
    "block_size": "16",
    "user_specified_block_size": "False",
    "kv_cache_layout": "None",
    "prefix_match_unit": "None",
    "gpu_memory_utilization": "0.92",
    "cache_dtype": "auto",
    "is_attention_free": "False",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "enable_prefix_caching": "True",
    "prefix_caching_hash_algo": "sha256",
    "prefix_cache_retention_interval": "0",
    "kv_cache_dtype_skip_layers": "[]",
    "mamba_page_size_padded": "None",
    "skip_page_size_padded": "None",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "replayssm_buffer_len": "16",
    "use_replayssm": "False",
    "use_kda_recoverssm": "False",
    "num_gpu_blocks": "None",
    "num_cpu_blocks": "None",
    "simple_cpu_offload_num_blocks": "None",
    "effective_attention_block_size": "None",
    "kv_cache_size_tokens": "None",
    "kv_cache_max_concurrency": "None",
    "hash_block_size": "None",
    "cache_hit_alignment_tokens": "None",
    "kv_sharing_fast_prefill": "False",
    "swa_bounded_replay": "True",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_size": "None",
    "kv_offloading_backend": "native",
    "_block_size_resolved": "True",
}
LABELS_ADDED_IN_033 = ("kv_cache_size_tokens", "kv_cache_max_concurrency")
CACHE_HIT_SOURCES = ("device", "host", "disk", "p2p", "external_unspecified")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """``vllm.v1.metrics.buckets.build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... <= max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


def cache_config_labels(
    truth: GroundTruth, args: EngineArgs, naming: str = "current", engine: int = 0
) -> dict[str, str]:
    info = dict(CACHE_CONFIG_DEFAULTS)
    info.update(
        block_size=str(truth.block(args)),
        user_specified_block_size=str(args.block_size is not None),
        gpu_memory_utilization=str(truth.utilization(args)),
        cache_dtype=args.kv_cache_dtype,
        num_gpu_blocks=str(truth.num_gpu_blocks(args)),
        num_cpu_blocks="0",
        kv_cache_size_tokens=str(truth.kv_tokens(args)),
        kv_cache_max_concurrency=str(round(truth.max_concurrency(args), 2)),
    )
    if naming == "legacy":
        for k in LABELS_ADDED_IN_033:
            info.pop(k, None)
    info["engine"] = str(engine)
    return info


class VllmMetrics:
    """The metric families of one vLLM API server process, in their own registry."""

    def __init__(
        self, truth: GroundTruth, args: EngineArgs, *, naming: str = "current", engine: int = 0
    ) -> None:
        """``engine``: the engine's index, as vLLM labels each data-parallel engine's series (``engine``) and
        as the engine's own GPU (dcgm-exporter's ``gpu``) when several engines share one API server."""
        if naming not in NAMINGS:
            raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
        self.naming = naming
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ln = ["model_name", "engine"]
        lv = {"model_name": args.model_name or "model", "engine": str(engine)}
        mml = truth.max_model_len(args)
        tok_buckets = build_1_2_5_buckets(mml)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ln, registry=r).labels(**lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ln, registry=r).labels(**lv)

        def hist(name: str, doc: str, buckets: list[float] | tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ln, buckets=buckets, registry=r).labels(**lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        wbr = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*ln, "reason"],
            registry=r,
        )
        self.waiting_capacity = wbr.labels(**lv, reason="capacity")
        self.waiting_deferred = wbr.labels(**lv, reason="deferred")
        self.waiting_deferred.set(0)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; "
            "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            [*ln, "sleep_state"],
            registry=r,
        )
        sleep.labels(**lv, sleep_state="awake").set(1)
        sleep.labels(**lv, sleep_state="weights_offloaded").set(0)
        sleep.labels(**lv, sleep_state="discard_all").set(0)
        self.kv_usage: list[Gauge] = []
        if naming in ("current", "both"):
            self.kv_usage.append(
                gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
            )
        if naming in ("legacy", "both"):
            self.kv_usage.append(
                gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
            )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*ln, "source"], registry=r
        )
        self.prompt_tokens_computed = by_source.labels(**lv, source="local_compute")
        for source in ("local_cache_hit", "external_kv_transfer"):
            by_source.labels(**lv, source=source)
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            [*ln, "source"],
            registry=r,
        )
        for source in CACHE_HIT_SOURCES:
            cached_by_source.labels(**lv, source=source)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*ln, "finished_reason"],
            registry=r,
        )
        self.success = {reason: success.labels(**lv, finished_reason=reason) for reason in FINISH_REASONS}
        self.h_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets)
        self.h_generation = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets
        )
        self.h_iteration = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.h_max_gen = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tok_buckets,
        )
        self.h_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", REQUEST_PARAMS_N_BUCKETS
        )
        self.h_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok_buckets
        )
        self.h_ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.h_itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.h_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.h_e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        )
        # dcgm-exporter's framebuffer gauges (MiB), as its Kubernetes mode exports them for the GPU this pod
        # holds; the scrape adds namespace and pod (the fleet's one target per pod stands in for the node's
        # exporter, whose own labels would name the pod)
        self.fb_total_gib = truth.gpu_memory_gib
        self.fb_used, self.fb_free = build_framebuffer_gauges(r, engine)
        # the engine serves once it has allocated its budget: the framebuffer is already full of it (a GPU's
        # start-up ramp, all free to full, is before vLLM serves its first scrape)
        self.record_framebuffer(truth.framebuffer_used_gib(args, 0, 0.0))
        info = cache_config_labels(truth, args, naming, engine)
        Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=r
        ).labels(**info).set(1)

    def record_framebuffer(self, used_gib: float) -> None:
        self.fb_used.set(used_gib * 1024)
        self.fb_free.set(max(0.0, self.fb_total_gib - used_gib) * 1024)

    def record(
        self, *, running: int, waiting: int, kv_usage: float, deltas: Deltas, fb_used_gib: float | None = None
    ) -> None:
        if fb_used_gib is not None:
            self.record_framebuffer(fb_used_gib)
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        for g in self.kv_usage:
            g.set(kv_usage)
        self.prefix_queries.inc(deltas.prompt_tokens)
        self.preemptions.inc(deltas.preemptions)
        self.prompt_tokens.inc(deltas.prompt_tokens)
        self.prompt_tokens_computed.inc(deltas.prompt_tokens)
        self.generation_tokens.inc(deltas.generation_tokens)
        for t in deltas.iteration_tokens:
            self.h_iteration.observe(t)
        for f in deltas.finished:
            self.success[f.finished_reason].inc()
            self.h_prompt.observe(f.prompt_tokens)
            self.h_generation.observe(f.generation_tokens)
            self.h_max_gen.observe(f.max_tokens)
            self.h_max_tokens.observe(f.max_tokens)
            self.h_n.observe(1)
            self.h_ttft.observe(f.ttft_s)
            self.h_e2e.observe(f.e2e_s)
            self.h_queue.observe(f.queue_s)
            self.h_inference.observe(f.inference_s)
            prefill = max(0.0, f.ttft_s - f.queue_s)
            self.h_prefill.observe(prefill)
            self.h_decode.observe(max(0.0, f.inference_s - prefill))
            tpot = (f.inference_s - prefill) / max(1, f.generation_tokens - 1)
            self.h_tpot.observe(tpot)
            self.h_itl.observe(tpot)
            self.h_preemptions.observe(f.preemptions)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def build_framebuffer_gauges(registry: CollectorRegistry, gpu: int) -> tuple[Gauge, Gauge]:
    """dcgm-exporter's ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB) for GPU ``gpu``, as its
    Kubernetes mode exports them for the GPU a pod holds."""
    dcgm = ["gpu", "UUID", "modelName", "Hostname"]
    values = {
        "gpu": str(gpu),
        "UUID": f"GPU-00000000-0000-0000-0000-{gpu:012d}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "kwok-node",
    }
    used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", dcgm, registry=registry)
    free = Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", dcgm, registry=registry)
    return used.labels(**values), free.labels(**values)


def render_engines(engines: Sequence[VllmMetrics]) -> bytes:
    """One API server's exposition over several data-parallel engines (``--data-parallel-size``): vLLM's
    ``PrometheusStatLogger`` keeps one family per metric with a child per engine index, so each family here
    holds every engine's samples (build the engines with ``engine=0, 1, ...``)."""
    families: dict[str, Metric] = {}
    for metrics in engines:
        for family in metrics.registry.collect():
            if family.name in families:
                families[family.name].samples.extend(family.samples)
            else:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                merged.samples = list(family.samples)
                families[family.name] = merged
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
