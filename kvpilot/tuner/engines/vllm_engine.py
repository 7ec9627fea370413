"""vLLM behind the engine seam: every answer delegates to :mod:`kvpilot.tuner.vllm`.

Nothing here is a vLLM fact of its own; the values are read from :mod:`kvpilot.tuner.vllm.serving`,
:mod:`kvpilot.tuner.vllm.args` and :mod:`kvpilot.tuner.vllm.messages` at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner.engines.seam import EngineFailure, EngineKind, Knobs, MetricSeries, Serving
from kvpilot.tuner.vllm import args, messages, serving
from kvpilot.tuner.vllm.versions import PINNED_VLLM_VERSION

_SERVING = Serving(
    container_name=serving.CONTAINER_NAME,
    command=serving.SERVE_COMMAND,
    port=serving.PORT,
    health_path=serving.HEALTH_PATH,
    metrics_path=serving.METRICS_PATH,
    metrics_args=(),
)
_METRICS = MetricSeries(
    kv_usage=serving.KV_USAGE,
    kv_capacity_tokens=None,
    running=serving.RUNNING,
    queued=serving.WAITING,
    preemptions=serving.PREEMPTIONS,
    ttft=serving.TTFT,
    itl=serving.ITL,
    rejected=None,  # no admission-limit refusals exported: what does not run waits in the queue
)
_KNOBS = Knobs(
    context=args.FLAGS["max_model_len"],
    sequences=args.FLAGS["max_num_seqs"],
    batched_tokens=args.FLAGS["max_num_batched_tokens"],
    memory_share=args.FLAGS["gpu_memory_utilization"],
    kv_cache_dtype=args.FLAGS["kv_cache_dtype"],
    tensor_parallel=args.FLAGS["tensor_parallel_size"],
)


def _line(log: str, start: int) -> str:
    begin = log.rfind("\n", 0, start) + 1
    end = log.find("\n", start)
    return log[begin : end if end >= 0 else len(log)].strip()


@dataclass(frozen=True)
class VllmEngine:
    """vLLM at its pinned release."""

    kind: EngineKind = "vLLM"
    release: str = PINNED_VLLM_VERSION
    serving: Serving = _SERVING
    metrics: MetricSeries = _METRICS
    knobs: Knobs = _KNOBS

    def classify_failure(self, log: str) -> EngineFailure | None:
        """Start-up: no room for KV blocks (raise the utilisation); a CUDA OOM (lower it). vLLM logs no
        per-preemption line: its pressure is read from the counter."""
        if found := messages.NO_BLOCKS.search(log):
            return EngineFailure("start_memory_short", 1, _line(log, found.start()))
        if found := messages.CUDA_OOM.search(log):
            return EngineFailure("runtime_oom", -1, _line(log, found.start()))
        return None
