"""GPU memory telemetry in the policy (kvpilot.tuner.loop.gpu_memory): dcgm-exporter's early warning, and
memory outside vLLM's budget that follows the running batch, sized for the sequence limit (bench scenarios
``oom-crash`` and ``no-spare-gpu-crash``: before, each remedy covered the batch that crashed, and the next
pod, one step further, ran a few more and crashed again)."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import BUDGET, NOW, context, entry, restart, state_and_evidence, window

from kvpilot.tuner.loop import gpu_memory, remedies
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow, RestartKind
from kvpilot.tuner.loop.policy import Action, Decision, compute_decision
from kvpilot.tuner.types import EngineSettings

TOTAL = BUDGET.gpu_total_gib
CHAT = EngineSettings(
    max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
)
WIDE = CHAT.replace(max_num_seqs=512)
"""A sequence limit far above what the memory outside vLLM's budget holds at 20 MiB a request."""
HEADROOM = (1.0 - 0.92) * TOTAL
FLOOR = gpu_memory.compute_free_floor(PolicyConfig(), TOTAL)


def decide(
    win: ObservationWindow, current: EngineSettings = CHAT, restarts: tuple = (), history: tuple = ()
) -> Decision:
    state, evidence = state_and_evidence(current, win, restarts, history=history)
    return compute_decision(state, evidence, context(TuningBounds(min_max_model_len=4096)), NOW)


def situation(win: ObservationWindow, current: EngineSettings = CHAT) -> remedies.Situation:
    ctx = context()
    return remedies.Situation(
        current=current,
        effective=remedies.compute_effective(current, ctx),
        budget=BUDGET,
        window=win,
        context=ctx,
        history=(),
        now=NOW,
        capacity_tokens=BUDGET.kv_cache_tokens,
    )


def with_memory(
    win: ObservationWindow, free: list[float], running: list[float] | None = None
) -> ObservationWindow:
    """``win``'s samples with these free framebuffers (and running batches), used = total - free."""
    samples = tuple(
        dataclasses.replace(
            s,
            gpu_memory_free_gib=f,
            gpu_memory_used_gib=TOTAL - f,
            running=running[i] if running is not None else s.running,
        )
        for i, (s, f) in enumerate(zip(win.samples, free, strict=True))
    )
    return dataclasses.replace(win, samples=samples)


def flood(running: float, free: float) -> ObservationWindow:
    """The first sample of a pod that just came up: the backlog of its start-up filled the batch at once,
    so there is no earlier sample and no spread of batch sizes to fit."""
    return with_memory(window(kv=1.0, running=running, waiting=3000, n=1, prompt=1000, output=300), [free])


def test_gpu_memory_running_out_lowers_utilisation_before_the_oom() -> None:
    base = window(kv=0.7, running=100)
    falling = with_memory(base, [3.0 - 0.25 * i for i in range(len(base.samples))])
    # a retune 2 minutes ago: the metrics cooldown would hold anything else
    recent = (entry(ago=120.0, after=CHAT),)
    d = decide(falling, history=recent)
    assert d.action == Action.RETUNE and d.trigger == gpu_memory.GPU_MEMORY_PRESSURE
    assert d.settings.gpu_memory_utilization is not None and d.settings.gpu_memory_utilization < 0.92
    assert d.failed is None  # nothing crashed: the current settings are not marked failed
    assert "falling" in d.reason and "dcgm-exporter" in d.reason
    assert "follows the batch" not in d.reason  # a steady batch: memory growing in time, one step


def test_steady_gpu_memory_with_room_is_left_alone() -> None:
    win = with_memory(window(kv=0.7, running=100), [6.0] * 10)
    assert gpu_memory.propose_for_gpu_memory(situation(win)) is None


def test_free_memory_that_falls_with_the_batch_is_fitted() -> None:
    running = [100.0 + 20 * i for i in range(10)]
    win = with_memory(window(), [6.0 - 0.02 * r for r in running], running)
    growth = gpu_memory.fit_batch_growth(win.samples)
    assert growth is not None
    assert growth.gib_per_seq == pytest.approx(0.02) and growth.intercept_gib == pytest.approx(6.0)
    # only the samples up to a time count: the first four are too few to fit
    assert gpu_memory.fit_batch_growth(win.samples, before=win.samples[4].time) is None


@pytest.mark.parametrize(
    ("free", "running"),
    [
        ([3.0 - 0.2 * i for i in range(10)], [100.0] * 10),  # a steady batch: memory growing in time
        ([6.0 - 0.02 * (100 + i) for i in range(10)], [100.0 + i for i in range(10)]),  # no spread of batches
        ([2.0 + 0.01 * (100 + 20 * i) for i in range(10)], [100.0 + 20 * i for i in range(10)]),  # rises
        ([5.0, 1.0, 4.8, 1.2, 4.9, 1.1, 5.0, 1.0, 4.7, 1.3], [100.0 + 20 * i for i in range(10)]),  # noise
    ],
)
def test_no_fit_without_memory_following_the_batch(free: list[float], running: list[float]) -> None:
    assert gpu_memory.fit_batch_growth(with_memory(window(), free, running).samples) is None


def test_a_rising_batch_bounds_the_memory_per_request_from_one_point() -> None:
    s = situation(flood(200, 1.32), WIDE)
    growth = gpu_memory.bound_growth_at(s, NOW, 200, HEADROOM, 1.32)
    assert growth is not None and growth.gib_per_seq == pytest.approx((HEADROOM - 1.32) / 200)
    # a batch that ran as large for minutes: another process filled the GPU, not the batch
    steady = situation(with_memory(window(running=190), [1.32] * 10), WIDE)
    assert gpu_memory.bound_growth_at(steady, NOW, 200, HEADROOM, 1.32) is None
    # at the sequence limit the limit itself crashed: the crash rules' batch cut, not a projection
    assert gpu_memory.bound_growth_at(situation(flood(256, 1.32)), NOW, 256, HEADROOM, 1.32) is None


def _leaves_the_floor(settings: EngineSettings, gib_per_seq: float) -> bool:
    """The free framebuffer at ``max_num_seqs`` running, each request's memory with VPA's 20 % margin."""
    assert settings.gpu_memory_utilization is not None and settings.max_num_seqs is not None
    headroom = (1.0 - settings.gpu_memory_utilization) * TOTAL
    return headroom - gib_per_seq * 1.2 * settings.max_num_seqs >= FLOOR - 1e-9


def test_the_early_warning_under_a_flood_covers_the_sequence_limit() -> None:
    """1.32 GiB free under 200 running requests at 0.92: one step (0.90) would leave 512 running with
    far less than the floor; the warning sizes utilisation and the limit together instead."""
    d = decide(flood(200, 1.32), WIDE)
    assert d.action == Action.RETUNE and d.trigger == gpu_memory.GPU_MEMORY_PRESSURE
    per_request = (HEADROOM - 1.32) / 200
    assert not _leaves_the_floor(WIDE.replace(gpu_memory_utilization=0.90), per_request)
    assert _leaves_the_floor(d.settings, per_request)
    assert "follows the batch" in d.reason


def _oom_event(ago: float = 5.0) -> object:
    return restart(RestartKind.CUDA_OOM, ago=ago, tried_gib=0.77, free_gib=0.1, total_gib=TOTAL)


def test_an_oom_under_a_rising_batch_is_sized_for_the_limit_not_one_step() -> None:
    """An OOM 20 s after the pod came up under 284 running of 512: the whole headroom over the batch
    bounds each request's memory, and the remedy leaves the floor free at the new limit."""
    win = flood(284, 0.5)
    win = dataclasses.replace(win, samples=tuple(dataclasses.replace(x, time=NOW - 25) for x in win.samples))
    d = decide(win, WIDE, restarts=(_oom_event(),))
    assert (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")
    assert _leaves_the_floor(d.settings, HEADROOM / 284)
    assert "for the sequence limit" in d.reason


def test_an_oom_under_a_steady_batch_takes_the_usual_step() -> None:
    """Forty requests for ten minutes, then an OOM (another process on the GPU): the memory did not follow
    the batch, so the VPA-style step, not a projection to 512 (bench scenario ``two-faults``)."""
    win = with_memory(window(kv=0.3, running=40, n=20, prompt=1000, output=300), [4.0] * 20)
    d = decide(win, WIDE, restarts=(_oom_event(),))
    assert (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")
    assert d.settings.gpu_memory_utilization == 0.90 and d.settings.max_num_seqs in (None, 512)
    assert "for the sequence limit" not in d.reason


def test_memory_safe_sequences_and_the_limit_cover_agree() -> None:
    growth = gpu_memory.BatchGrowth(intercept_gib=HEADROOM, gib_per_seq=0.02)
    cover = gpu_memory.compute_limit_cover(WIDE, growth, TOTAL, PolicyConfig())
    assert cover is not None and cover < 0.90
    assert gpu_memory.compute_memory_safe_seqs(WIDE, growth, TOTAL, PolicyConfig(), cover) >= 512
    assert gpu_memory.compute_memory_safe_seqs(WIDE, growth, TOTAL, PolicyConfig(), cover + 0.02) < 512
    # a limit the headroom already holds needs no cover
    assert (
        gpu_memory.compute_limit_cover(CHAT.replace(max_num_seqs=64), growth, TOTAL, PolicyConfig()) is None
    )


def test_metrics_sample_fields_used() -> None:
    """The fit reads the two series it needs and nothing else: a sample without memory is skipped."""
    running = [100.0 + 20 * i for i in range(10)]
    win = with_memory(window(), [6.0 - 0.02 * r for r in running], running)
    gaps = (*win.samples, MetricsSample(NOW + 1, running=500.0))
    assert gpu_memory.fit_batch_growth(gaps) == gpu_memory.fit_batch_growth(win.samples)


def test_a_pods_start_up_is_no_falling_trend() -> None:
    """dcgm-exporter shows the GPU from the container's start: all of it free, then filling as the weights
    load, before the engine serves. Those samples (no KV usage yet) are no trend; the steady free memory
    after them, below twice the floor but far from it, is left alone. The same ramp while the engine
    reports is a trend, and warns."""
    base = window(kv=0.7, running=100)
    steady = 1.7 * FLOOR
    free = [TOTAL, TOTAL / 2] + [steady] * (len(base.samples) - 2)
    ramp = with_memory(base, free)
    starting = dataclasses.replace(
        ramp,
        samples=tuple(
            dataclasses.replace(x, kv_usage=None) if i < 2 else x for i, x in enumerate(ramp.samples)
        ),
    )
    assert gpu_memory.propose_for_gpu_memory(situation(starting)) is None
    warned = gpu_memory.propose_for_gpu_memory(situation(ramp))
    assert warned is not None and "falling" in warned.evidence


def test_a_kv_usage_too_small_to_divide_by_says_nothing_of_the_room() -> None:
    """Found by test_policy_properties: a window of one sample, KV usage 2.2e-313 (a denormal float) with
    16 running, made the usage room 16 / 2.2e-313 = inf and the CUDA OOM remedy raise OverflowError; the
    room by usage is unknown there, and the room by fit still answers."""
    sample = MetricsSample(time=NOW, kv_usage=2.2250738585e-313, running=16.0)
    win = ObservationWindow(start=NOW - 300, end=NOW, samples=(sample,), pods=1)
    room = remedies.compute_room_seqs(situation(win))
    assert room is None or room >= 1
    state, evidence = state_and_evidence(CHAT, win, (restart(RestartKind.CUDA_OOM),))
    decision = compute_decision(state, evidence, context(), NOW)
    assert isinstance(decision, Decision)  # a decision, not an OverflowError
