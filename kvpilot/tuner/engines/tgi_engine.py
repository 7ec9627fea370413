"""TGI behind the engine seam, for reading legacy deployments: every answer delegates to
:mod:`kvpilot.tuner.tgi`.

The mapping of meanings: TGI exports no KV-usage ratio (``tgi_batch_current_max_tokens`` over the capacity
gauge ``tgi_batch_max_total_tokens`` is the nearest), so ``kv_usage`` is ``None``; the queue for waiting;
no preemption counter (TGI never evicts a running request); ``--max-total-tokens`` for the context,
``--max-concurrent-requests`` for sequences, ``--max-batch-prefill-tokens`` for batched tokens,
``--cuda-memory-fraction`` for the memory share. A warm-up that cannot hold the prefill asks to *lower*
the prefill tokens, not to change the share.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import tgi
from kvpilot.tuner.engines.seam import EngineFailure, EngineKind, Knobs, MetricSeries, Serving
from kvpilot.tuner.tgi import serving

_SERVING = Serving(
    container_name=serving.CONTAINER_NAME,
    command=serving.SERVE_COMMAND,
    port=serving.PORT,
    health_path=serving.HEALTH_PATH,
    metrics_path=serving.METRICS_PATH,
    metrics_args=(),
)
_METRICS = MetricSeries(
    kv_usage=None,
    kv_capacity_tokens=serving.BATCH_MAX_TOTAL_TOKENS,
    running=serving.BATCH_CURRENT_SIZE,
    queued=serving.QUEUE_SIZE,
    preemptions=None,
    ttft=serving.REQUEST_QUEUE_DURATION,
    itl=serving.TIME_PER_TOKEN,
)
_KNOBS = Knobs(
    context=tgi.FLAGS["max_total_tokens"],
    sequences=tgi.FLAGS["max_concurrent_requests"],
    batched_tokens=tgi.FLAGS["max_batch_prefill_tokens"],
    memory_share=tgi.FLAGS["cuda_memory_fraction"],
    kv_cache_dtype=tgi.KV_CACHE_DTYPE_FLAG,
    tensor_parallel=tgi.FLAGS["num_shard"],
)


@dataclass(frozen=True)
class TgiEngine:
    """TGI at its last release."""

    kind: EngineKind = "TGI"
    release: str = tgi.PINNED_TGI_VERSION
    serving: Serving = _SERVING
    metrics: MetricSeries = _METRICS
    knobs: Knobs = _KNOBS

    def classify_failure(self, log: str) -> EngineFailure | None:
        found = tgi.classify_log(log)
        if found is None:
            return None
        if found.kind == "overloaded":
            return EngineFailure("kv_pressure", 0, found.line)
        return EngineFailure("start_memory_short", 0, found.line)
