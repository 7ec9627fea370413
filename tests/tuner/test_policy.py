"""Table tests of the closed-loop policy, one group per step of the chain."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import BUDGET, CURRENT, NOW, context, entry, restart, state_and_evidence, window

from kvpilot.tuner import vllm
from kvpilot.tuner.gpus import list_gpus, lookup_gpu
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import remedies
from kvpilot.tuner.loop.history import HistoryAction, HistoryEntry
from kvpilot.tuner.loop.observations import ObservationWindow, RestartKind
from kvpilot.tuner.loop.policy import (
    Action,
    Decision,
    PolicyConfig,
    RolloutState,
    Trigger,
    TuningBounds,
    compute_cooldown,
    compute_decision,
    compute_metrics_status,
)
from kvpilot.tuner.loop.remedies import Situation
from kvpilot.tuner.loop.restarts import classify_termination
from kvpilot.tuner.types import EngineSettings, GpuSpec

POLICY = PolicyConfig()
BOUNDS = TuningBounds(min_max_model_len=4096)
DOWN = ObservationWindow.unavailable("Prometheus unreachable", NOW)


def decide(
    current: EngineSettings = CURRENT,
    win: ObservationWindow | None = None,
    restarts: tuple = (),
    bounds: TuningBounds = BOUNDS,
    policy: PolicyConfig = POLICY,
    history: tuple[HistoryEntry, ...] = (),
    failed: tuple[EngineSettings, ...] = (),
    **kw: object,
) -> Decision:
    state, evidence = state_and_evidence(
        current,
        win if win is not None else window(),
        restarts,
        history,
        failed,
        **kw,  # type: ignore[arg-type]
    )
    return compute_decision(state, evidence, context(bounds, policy), NOW)


# --- single moves --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gmu", "step"),
    [(0.92, 0.02), (0.90, 0.02), (0.85, 0.03), (0.80, 0.04), (0.70, 0.05), (0.50, 0.05)],
)
def test_oom_step_is_vpa_bump_on_headroom(gmu: float, step: float) -> None:
    assert remedies.compute_oom_step(gmu, POLICY) == pytest.approx(step)


@pytest.mark.parametrize(("steps", "gmu"), [(1, 0.90), (2, 0.88), (3, 0.85)])
def test_lower_gmu_compounds(steps: int, gmu: float) -> None:
    assert remedies.lower_gmu(CURRENT, steps, POLICY).gpu_memory_utilization == gmu


@pytest.mark.parametrize(
    ("tokens", "length"), [(86240, 84480), (41984, 40960), (3000, 2816), (1024, 992), (100, 96)]
)
def test_fit_context_leaves_margin_and_rounds(tokens: float, length: int) -> None:
    assert remedies.fit_context(tokens, POLICY) == length


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.name)
def test_effective_settings_are_what_vllm_runs_on_every_catalogue_gpu(gpu: GpuSpec) -> None:
    """The loop steps from vLLM's own defaults for the GPU, never from a copy (an A100-80GB has 80 GiB
    but vLLM gives it the small-GPU batch; >= 160 GiB gets 16384 tokens)."""
    eff = remedies.compute_effective(EngineSettings(max_model_len=8192), context(gpu=gpu))
    defaults = vllm.default_batch_limits(vllm.PINNED_VERSION, gpu)
    assert eff.max_num_seqs == defaults.max_num_seqs
    assert eff.max_num_batched_tokens == defaults.max_num_batched_tokens
    assert eff.gpu_memory_utilization == vllm.default_gpu_memory_utilization(vllm.PINNED_VERSION)
    assert eff.kv_cache_dtype == "auto"


def test_a100_80gb_runs_the_small_gpu_batch() -> None:
    """The drifted copy said 1024 / 8192 for every GPU of >= 70 GiB; vLLM excepts the A100."""
    eff = remedies.compute_effective(EngineSettings(max_model_len=8192), context(gpu=lookup_gpu("A100-80GB")))
    assert (eff.max_num_seqs, eff.max_num_batched_tokens) == (256, 2048)


def test_repeated_oom_on_an_a100_halves_what_vllm_runs() -> None:
    """Defect: a repeated CUDA OOM "halve" set 4096 batched tokens on an A100-80GB, double vLLM's 2048."""
    current = EngineSettings(max_model_len=8192, max_num_seqs=128, gpu_memory_utilization=0.92)
    state, evidence = state_and_evidence(current, window(), (restart(RestartKind.CUDA_OOM, count=2),))
    d = compute_decision(state, evidence, context(BOUNDS, POLICY, gpu=lookup_gpu("A100-80GB")), NOW)
    assert d.action == Action.RETUNE, d
    assert d.settings.max_num_batched_tokens in (None, 2048)  # never above what vLLM ran
    assert (d.settings.max_num_batched_tokens or 2048) <= 2048


def test_recommend_sees_a_queue_at_vllms_real_sequence_limit_on_an_a100() -> None:
    """Defect: with max_num_seqs unset, a queue at the A100's real 256-sequence limit read as Steady."""
    current = EngineSettings(max_model_len=8192, gpu_memory_utilization=0.92)
    win = window(kv=0.3, running=256, waiting=40, prompt=200, output=100)
    state, evidence = state_and_evidence(current, win, ready=True)
    d = compute_decision(state, evidence, context(BOUNDS, POLICY, gpu=lookup_gpu("A100-80GB")), NOW)
    assert d.trigger == Trigger.IDLE_CAPACITY, d
    assert d.settings.max_num_seqs is not None and d.settings.max_num_seqs > 256


def test_describe_change_uses_the_flag_names() -> None:
    new = CURRENT.replace(gpu_memory_utilization=0.9, max_num_batched_tokens=4096)
    assert vllm.describe_change(CURRENT, new) == (
        "gpu-memory-utilization 0.92 -> 0.9, max-num-batched-tokens default -> 4096"
    )


# --- calibration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "gmu", "dtype", "observed", "expected"),
    [
        (400_000, 0.92, "auto", None, 400_000),  # vLLM's report for these settings wins
        (400_000, 0.85, "auto", None, BUDGET.kv_cache_tokens),  # report is for other settings
        (400_000, 0.92, "fp8", None, BUDGET.kv_cache_tokens),
        (None, None, None, 410_000, 410_000),  # kept from an earlier window
        (None, None, None, None, BUDGET.kv_cache_tokens),  # the plan
    ],
)
def test_capacity_prefers_vllms_report(
    capacity: int | None, gmu: float | None, dtype: str | None, observed: int | None, expected: int
) -> None:
    win = dataclasses.replace(
        window(capacity=capacity), reported_gpu_memory_utilization=gmu, reported_kv_cache_dtype=dtype
    )
    eff = remedies.compute_effective(CURRENT, context(policy=POLICY))
    assert remedies.compute_capacity_tokens(eff, BUDGET, win, observed) == expected


def _situation(capacity: int | None) -> Situation:
    ctx = context(BOUNDS, POLICY)
    eff = remedies.compute_effective(CURRENT, ctx)
    return Situation(CURRENT, eff, BUDGET, window(), ctx, (), NOW, capacity)


@pytest.mark.parametrize(
    ("change", "capacity", "expected"),
    [
        ({}, 446128, 446128),
        ({"gpu_memory_utilization": 0.90}, 446128, 446128 - 0.02 * 79.19 * (1 << 30) / 131072),
        ({"kv_cache_dtype": "fp8"}, 446128, 2 * 446128),
        ({"max_num_seqs": 64}, 300000, 300000),
        ({"gpu_memory_utilization": 0.90}, None, None),
    ],
)
def test_predict_kv_tokens(change: dict, capacity: int | None, expected: float | None) -> None:
    got = remedies.predict_kv_tokens(_situation(capacity), CURRENT.replace(**change))
    assert got == (pytest.approx(expected, rel=1e-3) if expected is not None else None)


def test_predicted_tokens_scale_with_calibration() -> None:
    """If vLLM reports 10 % fewer tokens than planned, a utilisation step costs 10 % fewer tokens too."""
    lost_planned = 446128 - remedies.predict_kv_tokens(
        _situation(446128), CURRENT.replace(gpu_memory_utilization=0.9)
    )
    lost_observed = 401515 - remedies.predict_kv_tokens(
        _situation(401515), CURRENT.replace(gpu_memory_utilization=0.9)
    )
    assert lost_observed == pytest.approx(0.9 * lost_planned, rel=1e-3)


# --- metrics gate -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("win", "available", "reason"),
    [
        (DOWN, False, "MetricsUnavailable"),
        (ObservationWindow(NOW - 300, NOW), False, "MetricsUnavailable"),
        (window(end=NOW - 121), False, "MetricsStale"),
        (window(end=NOW - 119), True, "MetricsFresh"),
        (window(), True, "MetricsFresh"),
    ],
)
def test_metrics_status(win: ObservationWindow, available: bool, reason: str) -> None:
    status = compute_metrics_status(win, POLICY, NOW)
    assert (status.available, status.reason) == (available, reason)


@pytest.mark.parametrize(
    "win", [DOWN, window(end=NOW - 600, kv=0.99, preempt=5.0), ObservationWindow(NOW, NOW)]
)
def test_missing_or_stale_metrics_hold(win: ObservationWindow) -> None:
    d = decide(win=win)
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, Trigger.METRICS_UNAVAILABLE, CURRENT)


def test_too_few_samples_since_the_last_change_hold() -> None:
    d = decide(win=window(kv=0.99, preempt=1.0), history=(entry(ago=100, trigger="CudaOOM"),))
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.INSUFFICIENT_DATA)
    assert "4 samples" in d.reason  # 30 s apart: samples at -90..0 are after the change


# --- rollout ---------------------------------------------------------------------------------------------

GOOD = CURRENT.replace(max_num_seqs=320)
ROLLOUT = RolloutState(CURRENT, started_at=NOW - 300, deadline=NOW + 600)


def test_rollout_ready_starts_probation() -> None:
    d = decide(rollout=ROLLOUT, last_good=GOOD, ready=True)
    assert (d.action, d.trigger, d.good, d.failed) == (Action.HOLD, Trigger.ROLLOUT_PROBATION, None, None)
    assert d.probation_until == NOW + POLICY.probation_seconds


def test_rollout_ready_is_good_at_once_without_probation() -> None:
    d = decide(rollout=ROLLOUT, last_good=GOOD, ready=True, policy=PolicyConfig(probation_seconds=0))
    assert (d.action, d.trigger, d.good) == (Action.HOLD, Trigger.ROLLOUT_SUCCEEDED, CURRENT)


# Ready 100 s ago: on probation for 200 s more
PROBATION = dataclasses.replace(ROLLOUT, probation_until=NOW + 200)
PASSED = dataclasses.replace(ROLLOUT, probation_until=NOW - 1)
OVERDUE = dataclasses.replace(ROLLOUT, deadline=NOW - 10)
"""Ready just before the deadline: the probation runs past it."""


@pytest.mark.parametrize(
    ("case", "rollout", "restarts", "ready", "expected"),
    [
        # on probation, crash-free: wait (whatever the metrics say), Ready or not
        ("waits", PROBATION, (), True, (Action.HOLD, Trigger.ROLLOUT_PROBATION, CURRENT, None, None)),
        ("unready", PROBATION, (), False, (Action.HOLD, Trigger.ROLLOUT_PROBATION, CURRENT, None, None)),
        (
            "past the deadline",
            dataclasses.replace(OVERDUE, probation_until=NOW + 200),
            (),
            False,
            (Action.HOLD, Trigger.ROLLOUT_PROBATION, CURRENT, None, None),
        ),
        # a crash of the new settings on probation: the same rollback as before Ready
        (
            "OOM",
            PROBATION,
            (restart(RestartKind.CUDA_OOM, ago=10),),
            True,
            (Action.ROLLBACK, Trigger.ROLLOUT_FAILED, GOOD, CURRENT, None),
        ),
        (
            "any crash",
            PROBATION,
            (restart(RestartKind.OTHER, ago=10),),
            False,
            (Action.ROLLBACK, Trigger.ROLLOUT_FAILED, GOOD, CURRENT, None),
        ),
        (
            "host OOM",
            PROBATION,
            (restart(RestartKind.HOST_OOM_KILLED, ago=10),),
            True,
            (Action.ROLLBACK, Trigger.ROLLOUT_FAILED, GOOD, CURRENT, None),
        ),
        # probation passed crash-free and Ready: the settings are good
        ("passed", PASSED, (), True, (Action.HOLD, Trigger.ROLLOUT_SUCCEEDED, CURRENT, None, CURRENT)),
        # passed, but not Ready: wait for Ready until the deadline ...
        ("passed, unready", PASSED, (), False, (Action.HOLD, Trigger.ROLLOUT_PROBATION, CURRENT, None, None)),
        # ... and not Ready past it: failed
        (
            "passed, unready, overdue",
            dataclasses.replace(OVERDUE, probation_until=NOW - 1),
            (),
            False,
            (Action.ROLLBACK, Trigger.ROLLOUT_FAILED, GOOD, CURRENT, None),
        ),
    ],
)
def test_probation(case: str, rollout: RolloutState, restarts: tuple, ready: bool, expected: tuple) -> None:
    d = decide(
        win=window(kv=0.99, preempt=2.0), restarts=restarts, rollout=rollout, last_good=GOOD, ready=ready
    )
    assert (d.action, d.trigger, d.settings, d.failed, d.good) == expected, case


def test_crash_on_probation_rolls_back_the_bug_from_the_fleet() -> None:
    """max_num_seqs 4 -> 5 passed readiness, then CUDA OOM: back to 4, 5 failed (not a utilisation walk)."""
    good = CURRENT.replace(max_num_seqs=4, gpu_memory_utilization=0.95)
    raised = good.replace(max_num_seqs=5)
    rollout = RolloutState(raised, started_at=NOW - 40, deadline=NOW + 860, probation_until=NOW + 280)
    oom = (restart(RestartKind.CUDA_OOM, ago=5),)
    history = (entry(40, "IdleCapacity", before=good, after=raised),)
    d = decide(current=raised, restarts=oom, rollout=rollout, last_good=good, ready=False, history=history)
    assert (d.action, d.settings, d.failed, d.trigger) == (
        Action.ROLLBACK,
        good,
        raised,
        Trigger.ROLLOUT_FAILED,
    )
    assert "CudaOOM" in d.reason and "probation" in d.reason


def test_probation_never_blocks_a_rollback() -> None:
    """Seconds after the change, over the hourly limit, in the cooldown: a crash on probation rolls back."""
    history = (*(entry(ago=600 + 60 * i) for i in range(6)), entry(ago=5))
    rollout = dataclasses.replace(PROBATION, started_at=NOW - 5)
    d = decide(
        restarts=(restart(RestartKind.CUDA_OOM, ago=1),), rollout=rollout, last_good=GOOD, history=history
    )
    assert (d.action, d.settings) == (Action.ROLLBACK, GOOD)


def test_crash_after_probation_gets_the_normal_remedy() -> None:
    """Probation passed (the rollout ended, the settings are good): a later crash is a new problem."""
    history = (entry(ago=900, before=GOOD, after=CURRENT),)
    d = decide(restarts=(restart(RestartKind.CUDA_OOM, ago=10),), last_good=CURRENT, history=history)
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "CudaOOM", CURRENT)
    assert d.settings.gpu_memory_utilization == 0.90


def test_crash_on_probation_with_nothing_to_return_to_is_cured() -> None:
    d = decide(restarts=(restart(RestartKind.CUDA_OOM, ago=10),), rollout=PROBATION, last_good=None)
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "CudaOOM", CURRENT)


def test_settings_outside_a_rollout_are_good_only_after_probation() -> None:
    """The first plan (no rollout): Ready is not enough until probation_seconds after the change."""
    planned = (entry(ago=100, action=HistoryAction.PLANNED),)
    assert decide(ready=True, history=planned).good is None
    later = (entry(ago=POLICY.probation_seconds + 1, action=HistoryAction.PLANNED),)
    assert decide(ready=True, history=later).good == CURRENT


def test_rollout_waits_until_ready_or_deadline() -> None:
    d = decide(win=window(kv=0.99, preempt=2.0), rollout=ROLLOUT, last_good=GOOD, ready=False)
    assert (d.action, d.trigger, d.good) == (Action.HOLD, Trigger.ROLLOUT_IN_PROGRESS, None)


@pytest.mark.parametrize(
    ("restarts", "deadline"),
    [
        ((restart(RestartKind.CUDA_OOM, ago=60),), NOW + 600),
        ((restart(RestartKind.OTHER, ago=60),), NOW + 600),
        ((), NOW - 1),
    ],
)
def test_failed_rollout_rolls_back_and_marks_failed(restarts: tuple, deadline: float) -> None:
    rollout = dataclasses.replace(ROLLOUT, deadline=deadline)
    d = decide(restarts=restarts, rollout=rollout, last_good=GOOD)
    assert (d.action, d.settings, d.failed, d.trigger) == (
        Action.ROLLBACK,
        GOOD,
        CURRENT,
        Trigger.ROLLOUT_FAILED,
    )


def test_restart_before_the_rollout_is_not_its_failure() -> None:
    d = decide(restarts=(restart(RestartKind.CUDA_OOM, ago=400),), rollout=PASSED, last_good=GOOD, ready=True)
    assert d.trigger == Trigger.ROLLOUT_SUCCEEDED


def test_rollback_skips_failed_last_good_and_cures_instead() -> None:
    d = decide(
        restarts=(restart(RestartKind.CUDA_OOM, ago=60),), rollout=ROLLOUT, last_good=GOOD, failed=(GOOD,)
    )
    assert (d.action, d.trigger, d.settings.gpu_memory_utilization) == (Action.RETUNE, "CudaOOM", 0.90)


def test_failed_rollout_without_anything_to_return_to_holds() -> None:
    d = decide(rollout=dataclasses.replace(ROLLOUT, deadline=NOW - 1), last_good=None)
    assert (d.action, d.trigger, d.failed) == (Action.HOLD, Trigger.ROLLOUT_FAILED, CURRENT)


def test_rollback_ignores_the_rate_limit() -> None:
    history = tuple(entry(ago=100 + 60 * i) for i in range(6))
    d = decide(
        restarts=(restart(RestartKind.CUDA_OOM, ago=30),), rollout=ROLLOUT, last_good=GOOD, history=history
    )
    assert d.action == Action.ROLLBACK


# --- crash remedies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "history", "expected"),
    [
        # first OOM: the headroom grows by 20 % (at least 0.02)
        (restart(RestartKind.CUDA_OOM), (), {"gpu_memory_utilization": 0.90}),
        # the same settings OOMed twice: also halve the batch
        (
            restart(RestartKind.CUDA_OOM, count=2),
            (),
            {"gpu_memory_utilization": 0.90, "max_num_batched_tokens": 4096},
        ),
        # OOM again right after an OOM remedy: escalate
        (
            restart(RestartKind.CUDA_OOM),
            (entry(ago=900, trigger="CudaOOM"),),
            {"gpu_memory_utilization": 0.90, "max_num_batched_tokens": 4096},
        ),
        (restart(RestartKind.CUDA_OOM, ago=5, pod="b"), (), {"gpu_memory_utilization": 0.90}),
    ],
)
def test_cuda_oom(event: object, history: tuple, expected: dict) -> None:
    d = decide(win=DOWN, restarts=(event,), history=history)
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "CudaOOM", CURRENT)
    assert d.settings == CURRENT.replace(**expected)


def test_cuda_oom_at_the_utilisation_floor_cuts_the_batch() -> None:
    current = CURRENT.replace(gpu_memory_utilization=0.5)
    d = decide(current=current, win=DOWN, restarts=(restart(RestartKind.CUDA_OOM),))
    assert d.settings == current.replace(max_num_batched_tokens=4096)


def test_cuda_oom_never_repeats_failed_settings() -> None:
    failed = (CURRENT.replace(gpu_memory_utilization=0.90), CURRENT.replace(gpu_memory_utilization=0.88))
    d = decide(win=DOWN, restarts=(restart(RestartKind.CUDA_OOM),), failed=failed)
    assert d.settings.gpu_memory_utilization == 0.85


def test_cuda_oom_does_not_lower_utilisation_below_what_the_context_needs() -> None:
    """KV holds just over one max-model-len request: less utilisation would not start, so cut the batch."""
    current = CURRENT.replace(max_model_len=440_000)
    d = decide(current=current, win=DOWN, restarts=(restart(RestartKind.CUDA_OOM),))
    assert d.settings == current.replace(max_num_batched_tokens=4096)


def _oom(tried: float, free: float, ago: float = 20.0, count: int = 1) -> object:
    figures = {"tried_gib": tried, "free_gib": free, "total_gib": 79.19}
    return restart(RestartKind.CUDA_OOM, ago=ago, count=count, **figures)


def test_batch_shaped_oom_at_start_up_cuts_sequences_in_proportion() -> None:
    """Weakness 4: a start-up OOM trying 20 GiB with 5.3 GiB free (headroom 6.3 GiB at 0.92) walked the
    utilisation down 2 % a crash. It is sized by the batch, and covering 14.7 GiB would cost 32 % of the
    KV cache (more than the 20 % sizing leaves, lengths unknown): cut max_num_seqs in proportion to the
    room it found, 256 x 5.3 / (20 x 1.2) = 56 -- the whole cut at start-up, where the allocation is
    sized by max_num_seqs itself (halving to 128 would try 10 GiB in 5.3 and OOM again)."""
    d = decide(win=DOWN, restarts=(_oom(20.0, 5.3),))
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "CudaOOM", CURRENT)
    assert d.settings == CURRENT.replace(max_num_seqs=56)
    assert "at start-up" in d.reason and "batch-shaped" in d.reason


def test_batch_shaped_oom_at_start_up_without_lengths_trades_within_the_sizing_margin() -> None:
    """12.8 GiB tried, 5.3 free: 0.80 covers it and keeps 83 % of the KV cache (>= 80 %): keep 256."""
    d = decide(win=DOWN, restarts=(_oom(12.8, 5.3),))
    assert d.settings == CURRENT.replace(gpu_memory_utilization=0.80)


def test_batch_shaped_oom_at_start_up_with_kv_room_trades_the_measured_shortfall() -> None:
    """Short requests: 7.5 GiB short (x 1.2 = 9 GiB, 0.114) -> 0.80, where the KV cache still holds 256 x
    250 tokens at 0.80 many times over: keep every sequence, even past the 0.05 step a guess may take."""
    win = window(kv=0.0, running=0, waiting=50, prompt=200, output=100)
    d = decide(win=win, restarts=(_oom(12.8, 5.3),))
    assert d.settings == CURRENT.replace(gpu_memory_utilization=0.80)
    assert "at start-up" in d.reason and "traded" in d.reason


def test_batch_shaped_oom_with_kv_room_trades_utilisation_for_the_sequences() -> None:
    """Under a full batch of short requests, a 3.5 GiB allocation with 2.5 GiB free: 1.2 GiB more headroom
    (0.92 -> 0.90) covers it, and the KV cache at 0.90 still holds 256 x 400 tokens at 0.80: keep them."""
    win = window(kv=0.25, running=256, waiting=5, prompt=300, output=200)
    d = decide(win=win, restarts=(_oom(3.5, 2.5),))
    assert d.settings == CURRENT.replace(gpu_memory_utilization=0.90)
    assert "traded for the sequences" in d.reason


def test_batch_shaped_oom_under_a_full_batch_without_kv_room_cuts_sequences() -> None:
    """Long requests fill the KV cache: less utilisation would cost sequences anyway, so cut what sized
    the allocation, once, in proportion to the room it found: 256 x 2.5 / (3.5 x 1.2) = 152 (the old rule
    tried 0.90, then 0.88, ...)."""
    win = window(kv=0.85, running=256, waiting=5, prompt=3000, output=1000)
    d = decide(win=win, restarts=(_oom(3.5, 2.5),))
    assert d.settings == CURRENT.replace(max_num_seqs=152)


def test_batch_shaped_oom_under_a_small_batch_halves_the_batched_tokens() -> None:
    win = window(kv=0.85, running=40, waiting=0, prompt=3000, output=1000)
    d = decide(win=win, restarts=(_oom(3.5, 2.5),))
    assert d.settings == CURRENT.replace(max_num_batched_tokens=4096)


def test_small_oom_lowers_utilisation_enough_for_the_shortfall() -> None:
    """A 3 GiB allocation with 0.2 GiB free, headroom 6.3 GiB (under half of it: the headroom filled up):
    2.8 x 1.2 = 3.4 GiB more headroom, 0.043 -> 0.87 (VPA's 0.02 would OOM again)."""
    d = decide(win=window(kv=0.5, running=100), restarts=(_oom(3.0, 0.2),))
    assert d.settings == CURRENT.replace(gpu_memory_utilization=0.87)


def test_repeated_batch_shaped_oom_escalates() -> None:
    """The same settings OOMed twice: cut what sized it *and* lower the utilisation (one capped step)."""
    d = decide(win=DOWN, restarts=(_oom(20.0, 5.3, count=2),))
    assert d.settings == CURRENT.replace(max_num_seqs=56, gpu_memory_utilization=0.87)


def test_cuda_oom_exhausted_is_infeasible() -> None:
    current = CURRENT.replace(gpu_memory_utilization=0.5, max_num_seqs=1, max_num_batched_tokens=2048)
    d = decide(current=current, win=DOWN, restarts=(restart(RestartKind.CUDA_OOM),))
    assert (d.action, d.failed) == (Action.INFEASIBLE, current)


LONG = CURRENT.replace(max_model_len=131072)


@pytest.mark.parametrize(
    ("bounds", "estimate", "expected_action", "expected"),
    [
        (BOUNDS, 86240, Action.RETUNE, {"max_model_len": 84480}),
        (BOUNDS, None, Action.RETUNE, {"max_model_len": 64000}),  # no estimate, plan was wrong: halve
        (
            TuningBounds(min_max_model_len=100_000, allow_fp8_kv=True),
            86240,
            Action.RETUNE,
            {"kv_cache_dtype": "fp8"},
        ),
        (
            TuningBounds(min_max_model_len=100_000, allow_fp8_kv=True),
            60000,
            Action.RETUNE,
            {"kv_cache_dtype": "fp8", "max_model_len": 117504},
        ),
        (TuningBounds(min_max_model_len=100_000), 86240, Action.INFEASIBLE, {}),
        (TuningBounds(min_max_model_len=100_000, allow_fp8_kv=True), 40000, Action.INFEASIBLE, {}),
    ],
)
def test_kv_cache_too_small(
    bounds: TuningBounds, estimate: int | None, expected_action: Action, expected: dict
) -> None:
    event = restart(RestartKind.KV_CACHE_TOO_SMALL, max_model_len=131072, estimated_max_model_len=estimate)
    d = decide(current=LONG, win=DOWN, restarts=(event,), bounds=bounds)
    assert (d.action, d.trigger, d.failed) == (expected_action, "KvCacheTooSmall", LONG)
    assert d.settings == LONG.replace(**expected)


def test_kv_cache_too_small_infeasible_says_what_would_fit() -> None:
    event = restart(RestartKind.KV_CACHE_TOO_SMALL, max_model_len=131072, estimated_max_model_len=86240)
    d = decide(current=LONG, win=DOWN, restarts=(event,), bounds=TuningBounds(min_max_model_len=100_000))
    assert "max-model-len <= 84480" in d.reason
    assert "allowFp8KvCache" in d.reason
    assert "minimum context 100000" in d.reason


# "KV cache too small" at the minimum context: vLLM's text for 2015 tokens (0.246 GiB) at max-model-len 4096
EDGE = CURRENT.replace(max_model_len=4096, gpu_memory_utilization=0.90)
EDGE_BOUNDS = TuningBounds(min_max_model_len=4096)


def _too_small_at_the_minimum() -> object:
    return restart(
        RestartKind.KV_CACHE_TOO_SMALL,
        max_model_len=4096,
        estimated_max_model_len=2015,
        needed_kv_gib=0.5,
        available_kv_gib=2015 * 131072 / 2**30,
    )


def test_kv_too_small_at_the_minimum_context_cuts_the_batched_tokens() -> None:
    """Weakness 1: declared Infeasible although fewer batched tokens fit. Halving vLLM's 8192 frees a
    quarter of the 2.5 GiB activation peak (0.625 GiB = 5120 tokens): 7135 >= 4096."""
    d = decide(current=EDGE, win=DOWN, restarts=(_too_small_at_the_minimum(),), bounds=EDGE_BOUNDS)
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "KvCacheTooSmall", EDGE)
    assert d.settings == EDGE.replace(max_num_batched_tokens=4096)


def test_kv_too_small_at_the_minimum_context_raises_utilisation_just_enough() -> None:
    """At the batched-token floor: 4096 x 1.02 - 2015 = 2163 tokens more = 0.26 GiB = +0.0034 -> 0.91."""
    current = EDGE.replace(max_num_batched_tokens=2048)
    d = decide(current=current, win=DOWN, restarts=(_too_small_at_the_minimum(),), bounds=EDGE_BOUNDS)
    assert (d.action, d.settings) == (Action.RETUNE, current.replace(gpu_memory_utilization=0.91))


def test_kv_too_small_with_nothing_left_to_free_is_infeasible() -> None:
    current = EDGE.replace(max_num_batched_tokens=2048, gpu_memory_utilization=0.95)
    bounds = TuningBounds(min_max_model_len=4096, max_gpu_memory_utilization=0.95)
    d = decide(current=current, win=DOWN, restarts=(_too_small_at_the_minimum(),), bounds=bounds)
    assert (d.action, d.failed) == (Action.INFEASIBLE, current)
    assert "gpuMemoryUtilization bound" in d.reason


def test_kv_too_small_skips_what_is_predicted_not_to_fit() -> None:
    """Far too small (116 tokens for 4096): 2560 -> 2048 batched tokens frees 2048 tokens, not enough;
    4062 tokens more (0.50 GiB) of utilisation does: 0.91."""
    event = restart(
        RestartKind.KV_CACHE_TOO_SMALL,
        max_model_len=4096,
        estimated_max_model_len=116,
        available_kv_gib=116 * 131072 / 2**30,
    )
    current = EDGE.replace(max_num_batched_tokens=2560)
    d = decide(current=current, win=DOWN, restarts=(event,), bounds=EDGE_BOUNDS)
    assert d.settings == current.replace(gpu_memory_utilization=0.91)


def test_no_cache_blocks_raises_utilisation_within_bounds() -> None:
    current = CURRENT.replace(gpu_memory_utilization=0.85)
    d = decide(current=current, win=DOWN, restarts=(restart(RestartKind.NO_CACHE_BLOCKS),))
    assert d.settings == current.replace(gpu_memory_utilization=0.90)
    d = decide(win=DOWN, restarts=(restart(RestartKind.NO_CACHE_BLOCKS),))  # 0.92 + 0.05 capped at 0.95
    assert d.settings == CURRENT.replace(gpu_memory_utilization=0.95)


def test_insufficient_free_memory_goes_under_the_free_share() -> None:
    event = restart(RestartKind.INSUFFICIENT_FREE_MEMORY, free_gib=60.0, total_gib=79.19)
    d = decide(win=DOWN, restarts=(event,))
    assert d.settings.gpu_memory_utilization == 0.74


@pytest.mark.parametrize(
    "kind", [RestartKind.HOST_OOM_KILLED, RestartKind.INVALID_ENGINE_ARGS, RestartKind.OTHER]
)
def test_crashes_args_cannot_fix_hold(kind: RestartKind) -> None:
    d = decide(win=window(kv=0.99, preempt=2.0), restarts=(restart(kind),))
    assert (d.action, d.trigger, d.failed) == (Action.HOLD, kind, None)


def test_a_workers_nccl_timeout_holds_naming_the_group() -> None:
    d = decide(win=window(kv=0.99, preempt=2.0), restarts=(restart(RestartKind.DISTRIBUTED_TIMEOUT),))
    assert (d.action, d.trigger, d.failed) == (Action.HOLD, RestartKind.DISTRIBUTED_TIMEOUT, None)
    assert "not the KV cache" in d.reason


def test_a_kv_crash_outranks_a_peers_timeout() -> None:
    events = (restart(RestartKind.DISTRIBUTED_TIMEOUT, ago=5, pod="w"), restart(RestartKind.CUDA_OOM, ago=50))
    assert decide(win=DOWN, restarts=events).trigger == RestartKind.CUDA_OOM


def test_start_up_failure_outranks_runtime_oom() -> None:
    events = (
        restart(RestartKind.CUDA_OOM, ago=5, pod="a"),
        restart(
            RestartKind.KV_CACHE_TOO_SMALL,
            ago=50,
            pod="b",
            max_model_len=131072,
            estimated_max_model_len=86240,
        ),
    )
    assert decide(current=LONG, win=DOWN, restarts=events).trigger == "KvCacheTooSmall"


def test_crash_before_the_last_change_is_old_news() -> None:
    d = decide(restarts=(restart(RestartKind.CUDA_OOM, ago=700),), history=(entry(ago=650),))
    assert d.trigger == Trigger.STEADY


# --- metrics rules --------------------------------------------------------------------------------


def test_preemption_storm_cuts_sequences_towards_capacity() -> None:
    d = decide(win=window(kv=0.97, preempt=0.5, running=256, prompt=3000, output=1000))
    # fit = 446128 * 0.8 / 3500 = 101, but one step cuts at most 25 %: 256 -> 192
    assert (d.action, d.trigger, d.settings) == (
        Action.RETUNE,
        Trigger.KV_PRESSURE,
        CURRENT.replace(max_num_seqs=192),
    )


def test_preemption_storm_cut_starts_from_what_actually_runs() -> None:
    d = decide(win=window(kv=0.97, preempt=0.5, running=120, prompt=3000, output=1000))
    assert d.settings.max_num_seqs == 112  # 446128 * 0.88 / (3000 + 1000 / 2), at most -25 % of 120


def test_preemption_storm_without_lengths_takes_one_step() -> None:
    d = decide(win=window(kv=0.97, preempt=0.5, running=256, prompt=None, output=None))
    assert d.settings.max_num_seqs == 192


def test_preemption_storm_prefers_fp8_when_allowed() -> None:
    d = decide(win=window(kv=0.97, preempt=0.5, running=256), bounds=TuningBounds(allow_fp8_kv=True))
    assert d.settings == CURRENT.replace(kv_cache_dtype="fp8")


@pytest.mark.parametrize(
    "win",
    [
        window(kv=0.97, preempt=0.0),  # full but not preempting: vLLM is using what it has
        window(kv=0.80, preempt=1.0),  # preempting below the band: noise, not sustained pressure
        window(kv=0.70, waiting=10, running=256),  # inside the band with a queue
        window(kv=0.30, waiting=0.2, running=256),  # idle, no queue
        window(kv=0.30, waiting=10, running=100),  # queue, but not at the sequence limit
    ],
)
def test_inside_the_bands_holds(win: ObservationWindow) -> None:
    """Inside the band, without room at 0.80 for more sequences of the observed length, nothing changes."""
    d = decide(win=win)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.STEADY)


def test_pressure_at_the_lower_bound_holds() -> None:
    bounds = TuningBounds(min_max_num_seqs=256)
    d = decide(win=window(kv=0.97, preempt=0.5, running=256), bounds=bounds)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.KV_PRESSURE)
    assert "lower bound" in d.reason


def test_queue_at_the_limit_inside_the_band_raises_to_the_room() -> None:
    """Weakness 2: KV 0.60 with a queue at the limit was never acted on. 256 running at 0.60 leaves room
    for 375 at 0.88 (and the lengths for 981): the whole room in one rollout, not +25 % now and the rest a
    cooldown later (bench edge-of-fit: 8 -> 10 -> 13 with a queue of 1, now 8 -> 13)."""
    d = decide(win=window(kv=0.6, waiting=12, running=256, prompt=300, output=200))
    assert (d.action, d.trigger, d.settings) == (
        Action.RETUNE,
        Trigger.IDLE_CAPACITY,
        CURRENT.replace(max_num_seqs=375),
    )
    assert "room for 375 sequences" in d.reason


def test_a_queue_of_one_inside_the_band_takes_the_whole_room() -> None:
    """A queue measured at the limit understates what more sequences admit: 8 running at KV 0.55 with one
    request waiting has room for 12 at 0.88, and the raise goes there, not to the 9 the queue names."""
    current = CURRENT.replace(max_num_seqs=8)
    d = decide(current=current, win=window(kv=0.55, waiting=1.0, running=8, prompt=1000, output=200))
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY)
    assert d.settings.max_num_seqs == 12  # 0.88 x 8 / 0.55


def test_idle_with_low_usage_still_steps() -> None:
    """Below the band (usage <= 0.50 sustained) the raise keeps its step: the room there is an
    extrapolation far from what ran."""
    d = decide(win=window(kv=0.3, waiting=12, running=256, prompt=300, output=200))
    assert d.settings.max_num_seqs == 320


def test_queue_inside_the_band_is_capped_by_the_room() -> None:
    d = decide(win=window(kv=0.7, waiting=300, running=256, prompt=300, output=200))
    assert d.settings.max_num_seqs == 321  # 0.88 x 256 / 0.7; the deep queue alone would double


def test_queue_inside_the_band_without_room_holds() -> None:
    d = decide(win=window(kv=0.85, waiting=12, running=256, prompt=300, output=200))
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.STEADY)  # room for 265: under +5 %


def test_sizing_counts_what_a_sequence_holds_on_average() -> None:
    """Weakness 6 of the findings (5 of the brief): a sequence holds its prompt and, on average over its
    life, half its output: 446128 x 0.88 / (1000 + 300 / 2) = 341, not / 1300 = 301."""
    s = _situation_of(window(kv=0.3, running=256, prompt=1000, output=300))
    assert remedies.compute_room_seqs(s) == 341
    policy = dataclasses.replace(POLICY, output_occupancy=1.0)
    s = _situation_of(window(kv=0.3, running=256, prompt=1000, output=300), policy)
    assert remedies.compute_room_seqs(s) == 301


def _situation_of(win: ObservationWindow, policy: PolicyConfig = POLICY) -> Situation:
    ctx = context(BOUNDS, policy)
    return Situation(
        current=CURRENT,
        effective=remedies.compute_effective(CURRENT, ctx),
        budget=BUDGET,
        window=win,
        context=ctx,
        history=(),
        now=NOW,
        capacity_tokens=BUDGET.kv_cache_tokens,
    )


def test_idle_capacity_with_a_queue_raises_sequences() -> None:
    d = decide(win=window(kv=0.3, waiting=12, running=256, prompt=300, output=200))
    assert (d.action, d.trigger, d.settings) == (
        Action.RETUNE,
        Trigger.IDLE_CAPACITY,
        CURRENT.replace(max_num_seqs=320),
    )


@pytest.mark.parametrize(("waiting", "seqs"), [(12, 320), (128, 384), (256, 512), (2000, 1126)])
def test_idle_raise_grows_with_the_queue(waiting: float, seqs: int) -> None:
    """+25 % up to x2 by the queue per running sequence; a queue deeper than that goes on to the room the
    window measured (0.88 / (0.2 / 256) = 1,126 sequences), not to x2 and then again a cooldown later."""
    d = decide(win=window(kv=0.2, waiting=waiting, running=256, prompt=100, output=100))
    assert d.settings.max_num_seqs == seqs


def test_idle_raise_is_capped_by_kv_capacity() -> None:
    d = decide(win=window(kv=0.3, waiting=12, running=256, prompt=1200, output=300))
    assert d.settings.max_num_seqs == 290  # 446128 * 0.88 / (1200 + 300 / 2), under the +25 % step


def test_idle_raise_is_capped_by_the_bound() -> None:
    d = decide(
        win=window(kv=0.3, waiting=12, running=256, prompt=300, output=200),
        bounds=TuningBounds(max_max_num_seqs=300),
    )
    assert d.settings.max_num_seqs == 300


def test_idle_raise_stays_under_where_pressure_forced_a_cut() -> None:
    """Without usage per sequence (KV reads 0) nothing shows room at 300: the ceiling holds for an hour, and
    the 299 under it is a raise under +25 % after the cut, not worth a restart."""
    cut = entry(ago=1800, before=CURRENT.replace(max_num_seqs=300), after=CURRENT)
    d = decide(win=window(kv=0.0, waiting=12, running=256, prompt=300, output=200), history=(cut,))
    assert (d.action, d.settings.max_num_seqs) == (Action.HOLD, 256)
    assert "below 300" in d.reason or "under 25%" in d.reason
    old_cut = entry(ago=4000, before=CURRENT.replace(max_num_seqs=300), after=CURRENT)
    d = decide(win=window(kv=0.0, waiting=12, running=256, prompt=300, output=200), history=(old_cut,))
    assert d.settings.max_num_seqs == 320


def test_a_cut_is_lifted_once_the_lower_setting_shows_room() -> None:
    """Weakness 3: a cut on a noisy peak was permanent. At 256 the window shows KV 0.30, i.e. 0.35 at
    300: the cut from 300 was a transient, and the raise may pass it (up to what fits at 0.80)."""
    cut = entry(ago=1800, before=CURRENT.replace(max_num_seqs=300), after=CURRENT)
    d = decide(win=window(kv=0.3, waiting=12, running=256, prompt=300, output=200), history=(cut,))
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 320)
    assert "lifted" in d.reason


def test_a_cut_holds_while_the_lower_setting_shows_no_room_for_it() -> None:
    """Hysteresis: after a cut 300 -> 256, KV 0.80 at 256 extrapolates to 0.94 at 300 (> 0.88): the raise
    stops below the ceiling, at what fits at 0.88 (281), and that +10 % after a cut holds; at KV 0.60 the
    room (375) lifts the cut."""
    cut = entry(ago=1800, before=CURRENT.replace(max_num_seqs=300), after=CURRENT)
    d = decide(win=window(kv=0.80, waiting=12, running=256, prompt=300, output=200), history=(cut,))
    assert (d.action, d.settings.max_num_seqs) == (Action.HOLD, 256)
    assert "lifted" not in d.reason
    d = decide(win=window(kv=0.60, waiting=12, running=256, prompt=300, output=200), history=(cut,))
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 375)
    assert "lifted" in d.reason


@pytest.mark.parametrize(("seqs", "kv"), [(14, 0.70), (109, 0.78)])
def test_a_small_raise_after_a_pressure_cut_is_not_worth_a_restart(seqs: int, kv: float) -> None:
    """After KV pressure cut the sequences, a raise under +25 % holds: the cut showed the load at times
    needs fewer, and a raise back towards them buys its few per cent only until that load returns (bench
    oom-and-context: 15 -> 14, then 14 -> 15 on room for 15 = the ceiling lifted, and again an hour later
    with a larger cache; long-output-bursts: 146 -> 109, then 109 -> 122 and cut again at the next burst).
    The cut is remembered until a raise follows it, not only for the flap guard's hour."""
    current = CURRENT.replace(max_num_seqs=seqs)
    win = window(kv=kv, waiting=2, running=seqs, prompt=300, output=200)
    for ago in (1200, 4000):
        cut = entry(ago=ago, before=CURRENT.replace(max_num_seqs=seqs + 1), after=current)
        d = decide(current=current, win=win, history=(cut,))
        assert d.action == Action.HOLD
        assert f"under 25% after KV pressure cut from {seqs + 1}" in d.reason
    # once a raise has followed the cut, the usual 5 % applies again
    lower = CURRENT.replace(max_num_seqs=seqs - 8)
    cut = entry(ago=5000, before=CURRENT.replace(max_num_seqs=seqs + 1), after=lower)
    raised = entry(ago=4000, trigger="IdleCapacity", before=lower, after=current)
    d = decide(current=current, win=win, history=(cut, raised))
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY)


def test_pressure_that_came_back_caps_raises_at_its_last_cut() -> None:
    """Bursts: pressure grew the cache (139 sequences kept) and, 56 minutes later, came back and cut
    146 -> 109. Between bursts a calm window shows room for 145 (KV 0.66 at 109); a single cut would be
    lifted towards it, a recurring one holds at 109 for ``peak_memory_seconds`` (bench long-output-bursts:
    raised between bursts, cut again at each)."""
    current = CURRENT.replace(max_num_seqs=109)
    win = window(kv=0.66, waiting=900, running=109, prompt=300, output=200)
    cut = entry(ago=840, before=CURRENT.replace(max_num_seqs=146), after=current)
    d = decide(current=current, win=win, history=(cut,))
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 145)
    grew = entry(
        ago=840 + 3360,
        before=CURRENT.replace(max_num_seqs=139),
        after=CURRENT.replace(max_num_seqs=139, gpu_memory_utilization=0.94),
    )
    d = decide(current=current, win=win, history=(grew, cut))
    assert (d.action, d.settings) == (Action.HOLD, current)
    assert "KV pressure that came back" in d.reason
    # two hours after the last cut the memory is gone
    old = (dataclasses.replace(grew, time=grew.time - 7200), dataclasses.replace(cut, time=cut.time - 7200))
    d = decide(current=current, win=win, history=old)
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 145)


def test_recovery_after_a_cut_on_a_noisy_peak() -> None:
    """A storm cuts 256 -> 192; the load then eases: KV 0.55 at 192 with a queue at the limit. Before, the
    band (and the ceiling) held for good; now the next change raises again, and a constant storm at the
    cut setting would not (tests/tuner/test_policy_properties.py, no flapping)."""
    cut = entry(ago=700, before=CURRENT, after=CURRENT.replace(max_num_seqs=192))
    current = CURRENT.replace(max_num_seqs=192)
    d = decide(
        current=current, win=window(kv=0.55, waiting=20, running=192, prompt=300, output=200), history=(cut,)
    )
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY)
    assert d.settings.max_num_seqs == 307  # the room at 0.88 (0.88 x 192 / 0.55), in one rollout


def test_idle_raise_stays_under_sequences_that_failed() -> None:
    failed = (
        CURRENT.replace(max_num_seqs=300),
        CURRENT.replace(max_num_seqs=280, gpu_memory_utilization=0.8),
        CURRENT.replace(max_num_seqs=320, gpu_memory_utilization=0.9),  # the trade failed too
    )
    idle = window(kv=0.3, waiting=12, running=256, prompt=300, output=200)
    d = decide(win=idle, failed=failed)
    assert d.settings.max_num_seqs == 278  # halfway from 256 to 300, rather than creeping up
    d = decide(
        win=idle,
        failed=(
            CURRENT.replace(max_num_seqs=265),
            CURRENT.replace(max_num_seqs=320, gpu_memory_utilization=0.9),
        ),
    )
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.IDLE_CAPACITY)  # +4 %: not worth a rollout
    d = decide(win=idle, failed=())
    assert d.settings.max_num_seqs == 320


def test_idle_raise_trades_utilisation_for_sequences_that_failed() -> None:
    """Weakness 4, the reverse trade: 300 sequences failed at 0.92. With KV room to spare, 320 at one OOM
    step less (0.90) is tried before bisecting to 278 at 0.92; never where that utilisation failed."""
    idle = window(kv=0.3, waiting=12, running=256, prompt=300, output=200)
    d = decide(win=idle, failed=(CURRENT.replace(max_num_seqs=300),))
    assert d.settings == CURRENT.replace(max_num_seqs=320, gpu_memory_utilization=0.90)
    assert "headroom traded" in d.reason
    traded = CURRENT.replace(max_num_seqs=310, gpu_memory_utilization=0.9)
    failed = (CURRENT.replace(max_num_seqs=300), traded)
    assert decide(win=idle, failed=failed).settings == CURRENT.replace(max_num_seqs=278)
    long = window(kv=0.3, waiting=12, running=256, prompt=1200, output=300)  # 0.90 holds 282 < 290 at 0.88
    assert decide(win=long, failed=(CURRENT.replace(max_num_seqs=300),)).settings.max_num_seqs == 278


def test_idle_raise_keeps_batched_tokens_at_least_sequences() -> None:
    current = CURRENT.replace(max_num_batched_tokens=256)
    d = decide(current=current, win=window(kv=0.3, waiting=12, running=256, prompt=300, output=200))
    assert (d.settings.max_num_seqs, d.settings.max_num_batched_tokens) == (320, 320)


def test_unset_fields_stay_unset() -> None:
    current = EngineSettings(max_model_len=32768)
    d = decide(current=current, win=window(kv=0.97, preempt=0.5, running=2000, prompt=None, output=None))
    assert d.settings == EngineSettings(max_model_len=32768, max_num_seqs=768)  # 1024 (vLLM default) - 25 %


# --- stability gates ------------------------------------------------------------------------------

STORM = window(kv=0.97, preempt=0.5, running=256)


def test_cooldown_blocks_metric_changes() -> None:
    """The cooldown is a restart (180 s assumed) plus one window (300 s) after the last retune."""
    d = decide(win=STORM, history=(entry(ago=400),))
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.KV_PRESSURE)
    assert "cooldown for 80s" in d.reason
    assert decide(win=STORM, history=(entry(ago=481),)).action == Action.RETUNE


def test_cooldown_grows_with_the_measured_restart() -> None:
    """The hook for the measured start-to-Ready seconds: a 10-minute start-up means 15 minutes' cooldown."""
    assert decide(win=STORM, history=(entry(ago=800),), restart_seconds=600.0).action == Action.HOLD
    assert decide(win=STORM, history=(entry(ago=901),), restart_seconds=600.0).action == Action.RETUNE
    assert compute_cooldown(POLICY, 600.0) == 900.0
    assert compute_cooldown(POLICY) == 480.0
    assert compute_cooldown(dataclasses.replace(POLICY, cooldown_seconds=1200.0), 60.0) == 1200.0


def test_first_metrics_change_after_the_plan_waits_only_for_fresh_samples() -> None:
    """Weakness 6: the plan started a 10-minute cooldown. It judged nothing: as soon as the planned pods
    have min_samples fresh samples, the first metrics-driven change may go."""
    planned = entry(ago=200, trigger="Planned", action=HistoryAction.PLANNED)
    d = decide(win=STORM, history=(planned,))
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.KV_PRESSURE)
    d = decide(win=STORM, history=(entry(ago=100, trigger="Planned", action=HistoryAction.PLANNED),))
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.INSUFFICIENT_DATA)  # 4 samples since the plan


def test_crash_remedies_skip_the_cooldown_but_not_the_minimum_interval() -> None:
    oom = (restart(RestartKind.CUDA_OOM, ago=10),)
    assert decide(win=DOWN, restarts=oom, history=(entry(ago=120),)).action == Action.RETUNE
    d = decide(win=DOWN, restarts=oom, history=(entry(ago=30),))
    assert (d.action, d.failed) == (Action.HOLD, CURRENT)
    assert "minimum 60s" in d.reason


def test_changes_per_hour_limit() -> None:
    history = tuple(
        entry(ago=3500 - 700 * i) for i in range(4)
    )  # 4 changes in the last hour, last 1400 s ago
    d = decide(win=STORM, history=history)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.KV_PRESSURE)
    assert "4 changes in the last hour" in d.reason
    assert decide(win=STORM, history=history[1:]).action == Action.RETUNE


def test_holds_on_unchanged_evidence_are_idempotent() -> None:
    assert decide(win=STORM) == decide(win=STORM)


# --- good settings --------------------------------------------------------------------------------


def test_ready_and_crash_free_marks_current_good() -> None:
    assert decide(ready=True).good == CURRENT
    assert decide(ready=True, last_good=CURRENT).good is None
    assert decide(ready=False).good is None
    assert decide(ready=True, restarts=(restart(RestartKind.OTHER),)).good is None


# --- history helpers ------------------------------------------------------------------------------


def test_history_is_bounded_newest_last() -> None:
    history: tuple[HistoryEntry, ...] = ()
    for i in range(25):
        history = history_mod.build_history(history, entry(ago=1000 - i))
    assert len(history) == history_mod.HISTORY_LIMIT
    assert history[-1].time == NOW - 976


def test_history_queries() -> None:
    history = (
        entry(ago=5000, action=HistoryAction.PLANNED),
        entry(ago=3000, trigger="CudaOOM"),
        entry(ago=2000, trigger="CudaOOM"),
        entry(ago=1000, action=HistoryAction.HELD, after=CURRENT),
    )
    assert history_mod.compute_last_change_time(history) == NOW - 2000
    assert history_mod.compute_changes_since(history, NOW - 3600) == 2
    assert history_mod.compute_recent_streak(history, "CudaOOM", NOW - 3600) == 2
    assert history_mod.compute_recent_streak(history, "KvPressure", NOW - 3600) == 0


# --- the CUDA OOM's figures -----------------------------------------------------------------------


def test_cuda_oom_text_gives_the_allocation_and_what_was_free() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total "
        "capacity of 79.19 GiB of which 140.75 MiB is free. Including non-PyTorch memory, this process has "
        "79.04 GiB memory in use."
    )
    cause = classify_termination(text, "Error", 1)
    assert cause.kind == RestartKind.CUDA_OOM
    assert cause.tried_gib == pytest.approx(786 / 1024)
    assert cause.free_gib == pytest.approx(140.75 / 1024)
    assert cause.total_gib == pytest.approx(79.19)
    bare = classify_termination("RuntimeError: CUDA error: out of memory", "Error", 1)
    assert (bare.kind, bare.tried_gib, bare.free_gib) == (RestartKind.CUDA_OOM, None, None)


def test_mamba_cache_blocks_sets_max_num_seqs_to_what_the_state_pool_holds() -> None:
    event = restart(RestartKind.MAMBA_CACHE_BLOCKS, cache_blocks=200)
    d = decide(win=DOWN, restarts=(event,))
    assert (d.action, d.trigger) == (Action.RETUNE, RestartKind.MAMBA_CACHE_BLOCKS)
    assert d.settings.max_num_seqs == 200  # vLLM: "lower max_num_seqs to at most 200"


def test_a_pinned_value_is_never_the_loops_to_change() -> None:
    """Defect: the closed loop moved a pinned gpuMemoryUtilization (0.95 -> 0.93) on a CUDA OOM."""
    current = EngineSettings(max_model_len=8192, max_num_seqs=128, gpu_memory_utilization=0.95)
    oom = (restart(RestartKind.CUDA_OOM, count=1),)
    state, evidence = state_and_evidence(current, window(), oom)
    free = compute_decision(state, evidence, context(BOUNDS, POLICY), NOW)
    assert free.action == Action.RETUNE and free.settings.gpu_memory_utilization < 0.95
    pinned = dataclasses.replace(BOUNDS, pinned=EngineSettings(gpu_memory_utilization=0.95))
    d = compute_decision(state, evidence, context(pinned, POLICY), NOW)
    assert d.settings.gpu_memory_utilization == 0.95  # another remedy, or none
    if d.action == Action.RETUNE:
        assert d.settings != current
    fp8 = dataclasses.replace(BOUNDS, allow_fp8_kv=True, pinned=EngineSettings(kv_cache_dtype="auto"))
    assert fp8.clamp(current.replace(kv_cache_dtype="fp8")).kv_cache_dtype == "auto"
