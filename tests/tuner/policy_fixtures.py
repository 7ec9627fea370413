"""Builders shared by the policy tests: a budget, windows and restarts with readable defaults."""

from __future__ import annotations

from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import Evidence, LoopState, PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.history import HistoryAction, HistoryEntry
from kvpilot.tuner.loop.observations import (
    LengthSummary,
    MetricsSample,
    ObservationWindow,
    RestartCause,
    RestartEvent,
    RestartKind,
)
from kvpilot.tuner.types import EngineSettings, MemoryBudget

NOW = 1_800_000_000.0
"""A fixed "now" (epoch seconds); every test passes time in."""

BUDGET = MemoryBudget(
    gpu_total_gib=79.19,
    requested_gib=72.85,
    weights_gib=14.99,
    activation_gib=2.5,
    non_torch_gib=0.4,
    cuda_graph_gib=0.5,
    available_kv_cache_gib=54.46,
    kv_bytes_per_token=131072,  # Llama-3.1-8B, bf16: 32 layers x 8 kv heads x 128 x 2 x 2 bytes
    num_gpu_blocks=27883,
    kv_cache_tokens=446128,
    max_concurrency=13.6,
    starts=True,
)
"""An 8B model on an H100: about 446k KV tokens at gpu_memory_utilization 0.92."""

H100 = lookup_gpu("H100-SXM")
"""The GPU of :data:`BUDGET` (79.19 GiB to CUDA; vLLM 0.33's defaults there: 1024 sequences, 8192 tokens)."""
MODEL_MAX_LEN = 131072
"""Llama-3.1-8B's own maximum context."""


def context(
    bounds: TuningBounds | None = None, policy: PolicyConfig | None = None, gpu: object = None
) -> TuningContext:
    """The service's tuning context: an 8B model on :data:`H100` unless told otherwise."""
    return TuningContext(
        gpu=gpu or H100,  # type: ignore[arg-type]
        default_max_model_len=MODEL_MAX_LEN,
        bounds=bounds or TuningBounds(),
        policy=policy or PolicyConfig(),
    )


def state_and_evidence(
    current: EngineSettings,
    window: ObservationWindow,
    restarts: tuple[RestartEvent, ...] = (),
    history: tuple[HistoryEntry, ...] = (),
    failed: tuple[EngineSettings, ...] = (),
    *,
    budget: MemoryBudget | None = None,
    rollout: object = None,
    last_good: EngineSettings | None = None,
    ready: bool = False,
    observed_kv_tokens: int | None = None,
    restart_seconds: float | None = None,
) -> tuple[LoopState, Evidence]:
    """:class:`LoopState` and :class:`Evidence` from the pieces a test varies."""
    state = LoopState(
        current=current,
        history=history,
        failed=failed,
        rollout=rollout,  # type: ignore[arg-type]
        last_good=last_good,
        observed_kv_tokens=observed_kv_tokens,
    )
    evidence = Evidence(
        budget=budget or BUDGET,
        window=window,
        restarts=restarts,
        ready=ready,
        restart_seconds=restart_seconds,
    )
    return state, evidence


CURRENT = EngineSettings(
    max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, kv_cache_dtype="auto"
)


def window(
    kv: float = 0.7,
    preempt: float = 0.0,
    running: float = 100.0,
    waiting: float = 0.0,
    n: int = 10,
    end: float = NOW,
    prompt: float | None = 1500.0,
    output: float | None = 500.0,
    capacity: int | None = None,
    step: float = 30.0,
) -> ObservationWindow:
    """``n`` identical samples ending at ``end``, ``step`` seconds apart."""
    samples = tuple(
        MetricsSample(
            end - (n - 1 - i) * step, kv_usage=kv, preemption_rate=preempt, running=running, waiting=waiting
        )
        for i in range(n)
    )
    return ObservationWindow(
        start=end - n * step,
        end=end,
        samples=samples,
        prompt_tokens=LengthSummary(prompt) if prompt is not None else None,
        generation_tokens=LengthSummary(output) if output is not None else None,
        kv_capacity_tokens=capacity,
        pods=1,
    )


def restart(
    kind: RestartKind,
    ago: float = 20.0,
    count: int = 1,
    pod: str = "svc-7d9f-abcde",
    **figures: object,
) -> RestartEvent:
    return RestartEvent(
        NOW - ago, RestartCause(kind, detail=f"{kind} text", **figures), pod=pod, restart_count=count
    )


def entry(
    ago: float,
    trigger: str = "KvPressure",
    action: HistoryAction = HistoryAction.RETUNED,
    before: EngineSettings = CURRENT,
    after: EngineSettings | None = None,
) -> HistoryEntry:
    after = after if after is not None else before.replace(max_num_seqs=(before.max_num_seqs or 256) + 1)
    return HistoryEntry(NOW - ago, action, trigger, "test", before, after)
