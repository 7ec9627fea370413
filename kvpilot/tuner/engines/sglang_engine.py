"""SGLang behind the engine seam: every answer delegates to :mod:`kvpilot.tuner.sglang`.

The mapping of meanings (``docs/engines/sglang.md``): token usage for KV usage, queued requests for
waiting, retractions for preemptions, the prompt-length histogram for the prompts' mean,
``--context-length`` for the context, ``--max-running-requests`` for sequences, ``--chunked-prefill-size``
for batched tokens, ``--mem-fraction-static`` for the memory share -- whose start-up failure asks to raise
it and whose run-time OOM asks to lower it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import sglang
from kvpilot.tuner.engines.seam import EngineFailure, EngineKind, FailureKind, Knobs, MetricSeries, Serving
from kvpilot.tuner.sglang import serving

_SERVING = Serving(
    container_name=serving.CONTAINER_NAME,
    command=serving.SERVE_COMMAND,
    port=serving.PORT,
    health_path=serving.HEALTH_PATH,
    metrics_path=serving.METRICS_PATH,
    metrics_args=(sglang.ENABLE_METRICS_FLAG,),
)
_METRICS = MetricSeries(
    kv_usage=serving.TOKEN_USAGE,
    kv_capacity_tokens=serving.MAX_TOTAL_NUM_TOKENS,
    running=serving.NUM_RUNNING,
    queued=serving.NUM_QUEUED,
    preemptions=serving.RETRACTIONS,
    ttft=serving.TTFT,
    itl=serving.ITL,
    prompt_tokens=serving.PROMPT_TOKENS_HISTOGRAM,  # every finished request's prompt, read as its mean
    rejected=None,  # no admission-limit refusals exported: what does not run waits in the queue
)
_KNOBS = Knobs(
    context=sglang.FLAGS["context_length"],
    sequences=sglang.FLAGS["max_running_requests"],
    batched_tokens=sglang.FLAGS["chunked_prefill_size"],
    memory_share=sglang.FLAGS["mem_fraction_static"],
    kv_cache_dtype=sglang.FLAGS["kv_cache_dtype"],
    tensor_parallel=sglang.FLAGS["tp_size"],
)

_SEAM_KIND: dict[str, FailureKind] = {
    "no_kv_pool": "start_memory_short",
    "weights_exceed_static": "start_memory_short",
    "graph_capture_oom": "start_oom",
    "cuda_oom": "runtime_oom",
    "kv_pool_full": "kv_pressure",
}
"""SGLang's own failure kinds (:data:`kvpilot.tuner.sglang.messages.FailureKind`) in the seam's terms."""


@dataclass(frozen=True)
class SglangEngine:
    """SGLang at its pinned release."""

    kind: EngineKind = "SGLang"
    release: str = sglang.PINNED_SGLANG_VERSION
    serving: Serving = _SERVING
    metrics: MetricSeries = _METRICS
    knobs: Knobs = _KNOBS

    def classify_failure(self, log: str) -> EngineFailure | None:
        found = sglang.classify_log(log)
        if found is None:
            return None
        running = found.running_requests
        return EngineFailure(
            _SEAM_KIND[found.kind],
            found.fraction_direction,
            found.line,
            running=running,
            more_in_log=found.kind == "cuda_oom" and running is None,
        )
