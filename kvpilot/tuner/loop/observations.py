"""What the closed loop sees of a running vLLM deployment: metrics windows and restarts.

Frozen value objects, built by the operator's edge (``kvpilot.operator.clients.prometheus`` for
metrics, ``kvpilot.operator.inferenceservice.closed_loop`` for pod restarts) and read by
:mod:`kvpilot.tuner.loop.policy`. Nothing here queries anything: a window is a finished
record of samples with the times they were taken, and "now" is always an argument.

Aggregation across replicas happens before a sample is built: every per-pod figure is
the *worst* pod (``max``), because ``--max-num-seqs`` and the KV cache are per pod and
the pod that preempts is the one that matters.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class RestartKind(enum.StrEnum):
    """Why a vLLM container stopped, as :func:`kvpilot.tuner.loop.restarts.classify_termination` reads it."""

    CUDA_OOM = "CudaOOM"
    """``torch.OutOfMemoryError: CUDA out of memory`` and the raw CUDA/cuBLAS/NCCL variants."""
    HOST_OOM_KILLED = "HostOOMKilled"
    """The kernel's cgroup OOM killer (``reason: OOMKilled``): host memory, not GPU memory."""
    KV_CACHE_TOO_SMALL = "KvCacheTooSmall"
    """Start-up: one request of ``max_model_len`` tokens does not fit in the KV cache."""
    NO_CACHE_BLOCKS = "NoCacheBlocks"
    """Start-up: nothing at all is left for the KV cache (``No available memory for the cache blocks``)."""
    INSUFFICIENT_FREE_MEMORY = "InsufficientFreeMemory"
    """Start-up: the GPU has less free memory than ``gpu_memory_utilization`` asks for."""
    INVALID_ENGINE_ARGS = "InvalidEngineArgs"
    """Start-up: vLLM refused its arguments before the engine started (argparse, a config's validation,
    ``max_model_len`` beyond the model's): the rendered command is wrong, not the memory; no rule cures it."""
    MAMBA_CACHE_BLOCKS = "MambaCacheBlocks"
    """Start-up (CUDA-graph capture) of a hybrid model: ``max_num_seqs`` exceeds the Mamba cache blocks."""
    DISTRIBUTED_TIMEOUT = "DistributedTimeout"
    """A rank of a group over several nodes timed out waiting for a peer (NCCL's watchdog, vLLM's RPC or
    barrier) or saw a worker process die: the peer or the network failed, not this rank's memory."""
    OTHER = "Other"
    """Anything else (image, config, probe kills, ...): not the tuner's to fix."""


CRASH_KINDS_FIXABLE_BY_ARGS = frozenset(
    {
        RestartKind.CUDA_OOM,
        RestartKind.KV_CACHE_TOO_SMALL,
        RestartKind.NO_CACHE_BLOCKS,
        RestartKind.INSUFFICIENT_FREE_MEMORY,
        RestartKind.MAMBA_CACHE_BLOCKS,
    }
)
"""Restart kinds that a change of engine arguments can cure."""


@dataclass(frozen=True, slots=True)
class RestartCause:
    """A classified termination, with the figures vLLM printed when it printed any."""

    kind: RestartKind
    detail: str = ""
    """A short human-readable summary (the matched line, trimmed)."""
    max_model_len: int | None = None
    """``max seq len (L)`` from the KV-too-small text."""
    estimated_max_model_len: int | None = None
    """``estimated maximum model length is E`` (V1), or the KV token count ``(N)`` of the V0 text."""
    needed_kv_gib: float | None = None
    available_kv_gib: float | None = None
    free_gib: float | None = None
    """``Free memory on device (F/T GiB)``: F; for a CUDA OOM, PyTorch's "of which F is free"."""
    total_gib: float | None = None
    """``Free memory on device (F/T GiB)``: T; for a CUDA OOM, PyTorch's "total capacity of T"."""
    tried_gib: float | None = None
    """CUDA OOM: the allocation that failed, PyTorch's "Tried to allocate X"."""
    cache_blocks: int | None = None
    """``exceeds available Mamba cache blocks (M)``: M, the most sequences the state pool holds."""


@dataclass(frozen=True, slots=True)
class RestartEvent:
    """One observed container termination of a pod running the settings in question."""

    time: float
    """When the container terminated (``lastState.terminated.finishedAt``), epoch seconds."""
    cause: RestartCause
    pod: str = ""
    restart_count: int = 1
    """The container's ``restartCount``: how many times it has restarted with these settings."""
    crash_looping: bool = False
    """The container now waits in ``CrashLoopBackOff``."""
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """The worst replica's figures at one instant. ``None`` = the series was absent."""

    time: float
    kv_usage: float | None = None
    """``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before the rename)."""
    preemption_rate: float | None = None
    """Preemptions per second, ``rate(vllm:num_preemptions_total[...])``."""
    running: float | None = None
    """``vllm:num_requests_running``."""
    waiting: float | None = None
    """``vllm:num_requests_waiting``."""
    ttft_p95: float | None = None
    """Seconds: the 95th percentile of ``vllm:time_to_first_token_seconds`` over the step."""
    itl_p95: float | None = None
    """Seconds: the 95th percentile of ``vllm:inter_token_latency_seconds`` over the step."""
    gpu_memory_used_gib: float | None = None
    """dcgm-exporter's ``DCGM_FI_DEV_FB_USED`` of the pod's fullest GPU (MiB there, GiB here)."""
    gpu_memory_free_gib: float | None = None
    """dcgm-exporter's ``DCGM_FI_DEV_FB_FREE`` of the same GPU."""
    rejected_rate: float | None = None
    """Requests refused at the engine's admission limit per second, the seam's ``MetricSeries.rejected``:
    TGI's 429s beyond ``--max-concurrent-requests``. vLLM and SGLang export none: ``None``."""


@dataclass(frozen=True, slots=True)
class LengthSummary:
    """A token-length distribution from an engine's histogram over the window (vLLM's, or the seam's
    ``MetricSeries.prompt_tokens``: SGLang's, TGI's). The operator reads only its mean (the histogram's
    ``_sum`` over its ``_count``)."""

    mean: float
    p90: float | None = None


@dataclass(frozen=True, slots=True)
class ObservationWindow:
    """Samples over ``[start, end]`` plus the slower-moving facts vLLM reports.

    A window with ``unavailable_reason`` set carries no usable data (Prometheus down,
    no series for the pods, ...); the policy holds on it.
    """

    start: float
    end: float
    samples: tuple[MetricsSample, ...] = ()
    prompt_tokens: LengthSummary | None = None
    """``vllm:request_prompt_tokens`` histogram (another engine's: ``MetricSeries.prompt_tokens``)."""
    generation_tokens: LengthSummary | None = None
    """``vllm:request_generation_tokens`` histogram."""
    kv_capacity_tokens: int | None = None
    """KV tokens vLLM reports (``vllm:cache_config_info``: ``kv_cache_size_tokens`` or blocks x size)."""
    reported_gpu_memory_utilization: float | None = None
    """``gpu_memory_utilization`` label of ``vllm:cache_config_info``: which settings the capacity is for."""
    reported_kv_cache_dtype: str | None = None
    """``cache_dtype`` label of ``vllm:cache_config_info``."""
    pods: int = 0
    """How many pods reported metrics."""
    unavailable_reason: str | None = None
    unavailable_code: str | None = None
    """A CamelCase cause for the ``MetricsAvailable`` condition's reason (``PrometheusTLSError``,
    ``PrometheusUnauthorized``, ...); ``None``: the generic ``MetricsUnavailable``."""

    @classmethod
    def unavailable(cls, reason: str, now: float, code: str | None = None) -> ObservationWindow:
        """A window that says why there is nothing to look at (``code``: the condition's reason)."""
        return cls(start=now, end=now, unavailable_reason=reason, unavailable_code=code)

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None and any(s.kv_usage is not None for s in self.samples)

    @property
    def last_sample_time(self) -> float | None:
        times = [s.time for s in self.samples if s.kv_usage is not None]
        return max(times) if times else None

    def since(self, time: float) -> ObservationWindow:
        """The same window restricted to samples taken at or after ``time``."""
        kept = tuple(s for s in self.samples if s.time >= time)
        return ObservationWindow(
            start=max(self.start, time),
            end=self.end,
            samples=kept,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            kv_capacity_tokens=self.kv_capacity_tokens,
            reported_gpu_memory_utilization=self.reported_gpu_memory_utilization,
            reported_kv_cache_dtype=self.reported_kv_cache_dtype,
            pods=self.pods,
            unavailable_reason=self.unavailable_reason,
        )

    @property
    def mean_sequence_tokens(self) -> float | None:
        """Tokens one finished request holds in KV at its end (prompt + output), on average."""
        return self.compute_occupied_tokens(1.0)

    def compute_occupied_tokens(self, output_share: float) -> float | None:
        """Tokens one running request holds in KV on average: prompt + ``output_share`` x output
        (0.5 over a sequence's life: its output grows from nothing to the full length)."""
        if self.prompt_tokens is None or self.generation_tokens is None:
            return None
        total = self.prompt_tokens.mean + output_share * self.generation_tokens.mean
        return total if total > 0 else None


Field = Callable[[MetricsSample], float | None]


def values_of(samples: tuple[MetricsSample, ...], field: Field) -> tuple[float, ...]:
    """The non-missing values of one field, in sample order."""
    return tuple(v for v in (field(s) for s in samples) if v is not None)


def compute_fraction(
    samples: tuple[MetricsSample, ...], field: Field, test: Callable[[float], bool]
) -> float:
    """Share of the samples (with the field present) for which ``test`` holds; 0.0 when none."""
    values = values_of(samples, field)
    if not values:
        return 0.0
    return sum(1 for v in values if test(v)) / len(values)


def compute_mean(samples: tuple[MetricsSample, ...], field: Field) -> float | None:
    values = values_of(samples, field)
    return sum(values) / len(values) if values else None


def compute_max(samples: tuple[MetricsSample, ...], field: Field) -> float | None:
    values = values_of(samples, field)
    return max(values) if values else None


def compute_latest(samples: tuple[MetricsSample, ...], field: Field) -> float | None:
    """The newest non-missing value of one field: what the window says holds *now* (its mean and peak say
    what held at some time in it)."""
    values = values_of(samples, field)
    return values[-1] if values else None


def kv_usage(s: MetricsSample) -> float | None:
    return s.kv_usage


def preemption_rate(s: MetricsSample) -> float | None:
    return s.preemption_rate


def running(s: MetricsSample) -> float | None:
    return s.running


def waiting(s: MetricsSample) -> float | None:
    return s.waiting


def rejected_rate(s: MetricsSample) -> float | None:
    return s.rejected_rate


def ttft_p95(s: MetricsSample) -> float | None:
    return s.ttft_p95


def itl_p95(s: MetricsSample) -> float | None:
    return s.itl_p95


def gpu_memory_free_gib(s: MetricsSample) -> float | None:
    return s.gpu_memory_free_gib
