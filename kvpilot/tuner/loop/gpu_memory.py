"""GPU memory telemetry in the closed loop: dcgm-exporter's framebuffer series as an early warning. Pure.

dcgm-exporter's ``DCGM_FI_DEV_FB_FREE``/``_USED`` show the memory outside vLLM's budget (allocator
fragmentation, NCCL, the sampler, the per-request buffers) that a CUDA OOM comes from. Two readings:

* **the floor** (:func:`compute_free_floor`): ``gpu_memory_free_min_gib``, or ``gpu_memory_free_min_fraction``
  of the device if larger. When the free framebuffer is below it, or below twice it and falling at a rate
  that crosses it within ``gpu_memory_horizon_seconds`` (growth that plateaus far from the floor is left
  alone), :func:`propose_for_gpu_memory` lowers the utilisation *before* the crash. Only samples at which
  the engine serves count (:func:`compute_serving_samples`): a pod's start-up fills its GPU, which is no
  trend. It is urgent (no metrics
  cooldown), but the current settings are not marked failed: they have not crashed.
* **memory that follows the batch** (:func:`fit_batch_growth`): when the free framebuffer falls in step with
  the running requests across the window (least squares of free against running, a clear negative slope
  over a spread of batch sizes), the memory at the sequence limit is predictable, and one step is not
  enough: the next pod, with a little more headroom, runs a little more and crashes again.
  :func:`compute_limit_cover` sizes the utilisation that keeps the floor free at ``max_num_seqs`` running
  (with VPA's 20 % margin on the shortfall), and :func:`compute_memory_safe_seqs` the sequence cap that
  keeps it at today's utilisation. The early warning and the CUDA OOM rule
  (:mod:`kvpilot.tuner.loop.crash_remedies`) both use them.

The detection is engine-neutral (:func:`detect_memory_warning`, :class:`MemoryWarning`: the floor, the fall
rate, the evidence text) and SGLang's and TGI's loops share it; the remedy is each engine's own: vLLM's
:func:`propose_for_gpu_memory` lowers ``gpu_memory_utilization`` (sized on the batch where memory follows
it), SGLang's a smaller ``--mem-fraction-static``
(:func:`kvpilot.tuner.loop.sglang_rules.propose_for_gpu_memory`), TGI's a smaller
``--cuda-memory-fraction`` (:func:`kvpilot.tuner.loop.tgi_rules.propose_for_gpu_memory`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.observations import MetricsSample
from kvpilot.tuner.loop.remedies import (
    Proposal,
    Situation,
    compute_room_seqs,
    effective_value,
    floor2,
    lower_gmu,
    predict_kv_tokens,
)
from kvpilot.tuner.types import EngineSettings

GPU_MEMORY_PRESSURE = "GpuMemoryPressure"

MIN_FIT_SAMPLES = 6
"""Samples with both the free framebuffer and the running batch that a batch-growth fit needs."""
MIN_FIT_SPREAD = 0.25
"""The running batch must span at least this share of its largest value in the window."""
MIN_FIT_R2 = 0.6
"""How much of the free framebuffer's variance the running batch must explain."""


def compute_free_floor(policy: PolicyConfig, total_gib: float) -> float:
    """The free framebuffer the loop keeps: ``gpu_memory_free_min_gib`` or the device's fraction."""
    return max(policy.gpu_memory_free_min_gib, policy.gpu_memory_free_min_fraction * total_gib)


def compute_device_total(samples: tuple[MetricsSample, ...]) -> float | None:
    """The device's memory as dcgm-exporter shows it (free + used, the largest sum), ``None`` without it."""
    totals = [
        x.gpu_memory_free_gib + x.gpu_memory_used_gib
        for x in samples
        if x.gpu_memory_free_gib is not None and x.gpu_memory_used_gib is not None
    ]
    return max(totals) if totals else None


def compute_serving_samples(samples: tuple[MetricsSample, ...]) -> tuple[MetricsSample, ...]:
    """The samples at which the engine itself reports (its KV usage is there). dcgm-exporter shows a pod's
    GPU from the container's start, the engine only once it serves: the framebuffer filling while the
    weights load and the KV cache is allocated is the start-up, not a trend towards a CUDA OOM."""
    return tuple(x for x in samples if x.kv_usage is not None)


def _slope(samples: tuple[MetricsSample, ...]) -> float:
    """GiB per second of the free framebuffer, least squares over the samples that have it."""
    points = [(x.time, x.gpu_memory_free_gib) for x in samples if x.gpu_memory_free_gib is not None]
    times = [t for t, _ in points]
    if len(points) < 2 or min(times) == max(times):
        return 0.0
    return statistics.linear_regression(times, [f for _, f in points]).slope


@dataclass(frozen=True, slots=True)
class BatchGrowth:
    """The free framebuffer as a line in the running batch: ``free = intercept - gib_per_seq x running``."""

    intercept_gib: float
    gib_per_seq: float
    """Positive: what each running request takes outside vLLM's budget."""

    def free_at(self, running: float) -> float:
        return self.intercept_gib - self.gib_per_seq * running


def fit_batch_growth(samples: tuple[MetricsSample, ...], before: float | None = None) -> BatchGrowth | None:
    """The free framebuffer against the running batch (samples up to ``before``), or ``None`` when the
    window does not show memory following the batch: too few samples, too narrow a spread of batch sizes,
    a slope that is not negative, or a fit that explains less than ``MIN_FIT_R2`` of the variance."""
    points = [
        (x.running, x.gpu_memory_free_gib)
        for x in samples
        if x.running is not None
        and x.gpu_memory_free_gib is not None
        and (before is None or x.time <= before)
    ]
    if len(points) < MIN_FIT_SAMPLES:
        return None
    runs = [r for r, _ in points]
    if max(runs) <= 0 or max(runs) - min(runs) < MIN_FIT_SPREAD * max(runs):
        return None
    frees = [f for _, f in points]
    if min(frees) == max(frees):
        return None
    line = statistics.linear_regression(runs, frees)
    if line.slope >= 0 or statistics.correlation(runs, frees) ** 2 < MIN_FIT_R2:
        return None
    return BatchGrowth(intercept_gib=line.intercept, gib_per_seq=-line.slope)


def bound_growth_at(
    s: Situation, time: float, running: float | None, headroom_gib: float, free_gib: float
) -> BatchGrowth | None:
    """Memory growth bounded from one point, when the window has no spread of batch sizes to fit: under a
    rising batch of at least ``oom_growth_min_running`` requests (no sample ``oom_growth_lookback_seconds``
    before ``time``, or none within ``seqs_step_down`` fewer running) below the sequence limit, all the
    memory used outside vLLM's budget (``headroom - free``) is counted as per-request memory -- an upper
    bound, so the limit it covers is covered. A steady batch (another process filling the GPU) gets
    ``None``."""
    p = s.policy
    seqs = s.effective.max_num_seqs or 1
    if running is None or running < p.oom_growth_min_running or running >= seqs:
        return None
    used = headroom_gib - free_gib
    if used <= 0:
        return None
    earlier = [
        x.running
        for x in s.window.samples
        if x.running is not None and x.time <= time - p.oom_growth_lookback_seconds
    ]
    if earlier and running < (1.0 + p.seqs_step_down) * max(earlier):
        return None
    return BatchGrowth(intercept_gib=headroom_gib, gib_per_seq=used / running)


def compute_limit_cover(
    eff: EngineSettings, growth: BatchGrowth, total_gib: float, policy: PolicyConfig
) -> float | None:
    """The utilisation at which ``max_num_seqs`` running still leave the floor free, each request's memory
    counted with ``oom_headroom_ratio``'s margin, or ``None`` when the limit already fits."""
    if total_gib <= 0:
        return None
    floor = compute_free_floor(policy, total_gib)
    need = growth.gib_per_seq * policy.oom_headroom_ratio * float(eff.max_num_seqs or 1)
    shortfall = floor + need - growth.intercept_gib
    if shortfall <= 0:
        return None
    return floor2(effective_value(eff.gpu_memory_utilization) - shortfall / total_gib)


def compute_memory_safe_seqs(
    eff: EngineSettings, growth: BatchGrowth, total_gib: float, policy: PolicyConfig, gmu: float | None = None
) -> int:
    """The most running requests that leave the floor free at utilisation ``gmu`` (today's by default),
    each request's memory counted with the margin; at least 1."""
    floor = compute_free_floor(policy, total_gib)
    freed = (effective_value(eff.gpu_memory_utilization) - gmu) * total_gib if gmu is not None else 0.0
    room = growth.intercept_gib + freed - floor
    return max(1, math.floor(room / (growth.gib_per_seq * policy.oom_headroom_ratio)))


def compute_limit_settings(
    s: Situation, growth: BatchGrowth, total_gib: float, highest: float
) -> EngineSettings | None:
    """Utilisation and sequence limit together, when memory follows the batch: every utilisation from
    ``highest`` down to the one that covers ``max_num_seqs`` (:func:`compute_limit_cover`, not below the
    bounds), the sequences each allows -- the fewer of what the memory outside vLLM's budget leaves room
    for and what its KV cache holds at ``target_kv_usage`` by the observed lengths and usage -- and the
    utilisation that allows the most (the higher one on a tie). ``None`` when the limit already fits.
    Without observed lengths the cover of the limit itself: every sequence kept."""
    p, eff = s.policy, s.effective
    seqs = eff.max_num_seqs or 1
    cover = compute_limit_cover(eff, growth, total_gib, p)
    if cover is None:
        return None
    lowest = max(cover, s.bounds.min_gpu_memory_utilization)
    best: tuple[int, float] | None = None
    gmu = floor2(min(highest, effective_value(eff.gpu_memory_utilization)))
    while gmu >= lowest - 1e-9:
        allowed = min(seqs, compute_memory_safe_seqs(eff, growth, total_gib, p, gmu))
        tokens = predict_kv_tokens(s, s.effective_of(eff.replace(gpu_memory_utilization=gmu)))
        if tokens is not None and s.capacity_tokens:
            room = compute_room_seqs(s, tokens / s.capacity_tokens)
            if room is not None:
                allowed = min(allowed, room)
        if best is None or allowed > best[0]:
            best = (allowed, gmu)
        gmu = round(gmu - 0.01, 2)
    if best is None:
        return None
    allowed, gmu = best
    return eff.replace(
        gpu_memory_utilization=gmu, max_num_seqs=allowed if allowed < seqs else eff.max_num_seqs
    )


@dataclass(frozen=True, slots=True)
class MemoryWarning:
    """The engine-neutral early warning: the free framebuffer below the floor, or falling towards it
    within the horizon (:func:`detect_memory_warning`). Each engine's rule answers it in its own flags
    (vLLM's :func:`propose_for_gpu_memory`; SGLang's and TGI's in :mod:`.sglang_rules`, :mod:`.tgi_rules`)."""

    free_gib: float
    """The latest serving sample's free framebuffer."""
    total_gib: float
    """The device's memory (free + used)."""
    floor_gib: float
    slope_gib_per_second: float
    """Least squares over the serving samples (negative: falling)."""
    horizon_seconds: float
    latest: MetricsSample
    """The latest serving sample with the free framebuffer."""
    samples: tuple[MetricsSample, ...]
    """The serving samples (:func:`compute_serving_samples`)."""

    @property
    def below_now(self) -> bool:
        return self.free_gib < self.floor_gib

    def describe(self) -> str:
        """``GPU memory free F GiB of T GiB (dcgm-exporter)[, falling R GiB/min]: below X GiB now|within
        Hs, ahead of a CUDA OOM``: the evidence every engine's rule starts with."""
        slope = self.slope_gib_per_second
        trend = f", falling {-slope * 60:.2f} GiB/min" if slope < 0 else ""
        when = "now" if self.below_now else f"within {self.horizon_seconds:.0f}s"
        return (
            f"GPU memory free {self.free_gib:.2f} GiB of {self.total_gib:.1f} GiB (dcgm-exporter){trend}: "
            f"below {self.floor_gib:.2f} GiB {when}, ahead of a CUDA OOM"
        )


def detect_memory_warning(samples: tuple[MetricsSample, ...], policy: PolicyConfig) -> MemoryWarning | None:
    """The early warning from dcgm-exporter's framebuffer in ``samples`` (the serving ones only): free
    memory below the floor, or below twice it and falling at a rate that crosses it within
    ``gpu_memory_horizon_seconds``; ``None`` without the telemetry or with room."""
    p = policy
    serving = compute_serving_samples(samples)
    latest = next((x for x in reversed(serving) if x.gpu_memory_free_gib is not None), None)
    if latest is None or latest.gpu_memory_free_gib is None:
        return None
    free = latest.gpu_memory_free_gib
    total = compute_device_total(serving) or free + (latest.gpu_memory_used_gib or 0.0)
    floor = compute_free_floor(p, total)
    slope = _slope(serving)
    projected = free + slope * p.gpu_memory_horizon_seconds
    if free >= floor and (projected >= floor or free >= 2 * floor):
        return None  # room, or a trend still far from the floor (fragmentation plateaus)
    return MemoryWarning(free, total, floor, slope, p.gpu_memory_horizon_seconds, latest, serving)


def propose_for_gpu_memory(s: Situation) -> Proposal | None:
    """The early warning: free GPU memory low, or falling towards the floor within the horizon. With memory
    that follows the batch, the utilisation that holds the floor at the sequence limit (or, below the
    bounds, the sequence cap that holds it at today's utilisation); otherwise one OOM step."""
    p, eff = s.policy, s.effective
    warning = detect_memory_warning(s.window.samples, p)
    if warning is None:
        return None
    samples, latest, free, total = warning.samples, warning.latest, warning.free_gib, warning.total_gib
    step = lower_gmu(eff, 1, p)
    candidates: tuple[EngineSettings, ...] = (step,)
    headroom = (1.0 - effective_value(eff.gpu_memory_utilization)) * total
    growth = fit_batch_growth(samples) or bound_growth_at(s, latest.time, latest.running, headroom, free)
    sized = ""
    if growth is not None:
        sized_settings = compute_limit_settings(
            s, growth, total, effective_value(step.gpu_memory_utilization)
        )
        if sized_settings is not None:
            seqs = eff.max_num_seqs or 1
            capped = eff.replace(max_num_seqs=compute_memory_safe_seqs(eff, growth, total, p))
            candidates = (sized_settings, capped, step)
            sized = (
                f"; it follows the batch ({growth.gib_per_seq * 1024:.0f} MiB per running request): "
                f"{seqs} running would leave {growth.free_at(float(seqs)):.2f} GiB"
            )
    return Proposal(
        trigger=GPU_MEMORY_PRESSURE,
        evidence=f"{warning.describe()}{sized}",
        candidates=candidates,
        exhausted="already at the lower bound of gpuMemoryUtilization",
        urgent=True,
    )
