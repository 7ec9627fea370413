"""TGI behind the engine seam: every answer delegates to :mod:`kvpilot.tuner.tgi`.

The mapping of meanings: TGI exports no KV-usage ratio, so ``kv_usage`` is ``None`` and the loop reads
``tgi_batch_current_max_tokens`` (``kv_used_tokens``: the tokens the running batch may reach) over the
capacity gauge ``tgi_batch_max_total_tokens``; the queue for waiting; no preemption counter (TGI never
evicts a running request); the requests its router refuses at ``--max-concurrent-requests`` (429s) for
``rejected``; ``--max-total-tokens`` for the context, ``--max-concurrent-requests`` for
sequences, ``--max-batch-prefill-tokens`` for batched tokens, ``--cuda-memory-fraction`` for the memory
share. The failures (:func:`kvpilot.tuner.tgi.classify_log`): a warm-up that cannot hold its prefill is a
start-up OOM whose remedy is fewer prefill tokens, not the share (direction 0); a ``--max-total-tokens``
the inferred KV cache cannot hold is a start-up short of memory (more share helps while it is below 1); a
CUDA OOM while serving asks for a smaller share; "Model is overloaded" (a 429) is pressure, not a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import tgi
from kvpilot.tuner.engines.seam import EngineFailure, EngineKind, FailureKind, Knobs, MetricSeries, Serving
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
    ttft=serving.REQUEST_QUEUE_DURATION,  # the queue time: a lower bound of TTFT (no prefill in it)
    itl=serving.TIME_PER_TOKEN,  # per request, its mean time per output token
    kv_used_tokens=serving.BATCH_CURRENT_MAX_TOKENS,
    prompt_tokens=serving.INPUT_LENGTH,
    rejected=serving.REQUEST_OVERLOADED,  # the 429s beyond --max-concurrent-requests
)
_KNOBS = Knobs(
    context=tgi.FLAGS["max_total_tokens"],
    sequences=tgi.FLAGS["max_concurrent_requests"],
    batched_tokens=tgi.FLAGS["max_batch_prefill_tokens"],
    memory_share=tgi.FLAGS["cuda_memory_fraction"],
    kv_cache_dtype=tgi.KV_CACHE_DTYPE_FLAG,
    tensor_parallel=tgi.FLAGS["num_shard"],
)

_SEAM_KIND: dict[str, tuple[FailureKind, int]] = {
    "prefill_too_large": ("start_oom", 0),
    "total_tokens_too_large": ("start_memory_short", 1),
    "cuda_oom": ("runtime_oom", -1),
    "overloaded": ("kv_pressure", 0),
}
"""TGI's own failure kinds (:data:`kvpilot.tuner.tgi.messages.FailureKind`) in the seam's terms, with the way
the memory share would move."""


@dataclass(frozen=True)
class TgiEngine:
    """TGI at its last release (3.3.7)."""

    kind: EngineKind = "TGI"
    release: str = tgi.PINNED_TGI_VERSION
    serving: Serving = _SERVING
    metrics: MetricSeries = _METRICS
    knobs: Knobs = _KNOBS

    def classify_failure(self, log: str) -> EngineFailure | None:
        found = tgi.classify_log(log)
        if found is None:
            return None
        kind, direction = _SEAM_KIND[found.kind]
        size = found.batch_size
        return EngineFailure(
            kind, direction, found.line, running=size, more_in_log=found.kind == "cuda_oom" and size is None
        )
