"""SGLang's ``KvBound`` rule and its idle growth (:mod:`kvpilot.tuner.loop.sglang_bound`), through the
loop's own decision (:func:`~kvpilot.tuner.loop.sglang_policy.compute_sglang_decision`).

The expected figures are asked of SGLang's memory model (:mod:`kvpilot.tuner.loop.sglang_fit`) and of
SGLang's running-request limit (:func:`kvpilot.tuner.sglang.default_max_running_requests`, held to SGLang's
own ``resolve_max_num_reqs`` in ``tests/contract/test_contract_sglang.py``), never restated.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvpilot.tuner import sglang
from kvpilot.tuner.loop import Action, PolicyConfig, engine_room, sglang_bound, sglang_idle
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from tests.tuner.test_sglang_policy import BOUNDS, H100, NOW, decide, effective, fraction, window

PLAN = sglang.SglangSettings(context_length=32768)
"""SGLang's defaults on an H100 with a 32K context: the fraction at its ceiling, the limit from the pool."""


def limit_of(settings: sglang.SglangSettings) -> int:
    got = fit.compute_running_limit(effective(settings), H100)
    assert got is not None
    return got


def pool_of(settings: sglang.SglangSettings) -> int:
    got = fit.predict_pool_tokens(effective(settings), H100)
    assert got is not None
    return got


def test_a_queue_behind_a_full_pool_grows_the_pool_though_nothing_retracts() -> None:
    """SGLang's admission reserves the running requests' outputs, so a full pool keeps a queue waiting with
    the limit unreached and no retraction: KvPressure (which reads retractions) holds, KvBound grows the pool
    -- at the ceiling, by halving the prefill chunk, whose smaller activation reserve lifts it."""
    limit = limit_of(PLAN)
    assert limit > 1000  # SGLang's default from the pool: far above what runs
    full = window(kv_usage=0.94, running=180, waiting=300, preemption_rate=0.0)
    decision = decide(PLAN, samples=full)
    assert decision.action == Action.RETUNE and decision.trigger == sglang_bound.KV_BOUND
    grown = effective(decision.settings)
    assert fraction(decision.settings) > fraction(PLAN)
    assert grown.chunked_prefill_size == effective(PLAN).chunked_prefill_size // 2  # type: ignore[operator]
    assert pool_of(decision.settings) >= pool_of(PLAN) * (1 + PolicyConfig().kv_bound_min_gain)
    assert f"of {limit} run" in decision.reason and "holds them back" in decision.reason


@pytest.mark.parametrize(
    "fields",
    [
        {"kv_usage": 0.60, "running": 180, "waiting": 300},  # room in the pool: the prefill, not the pool
        {"kv_usage": 0.94, "running": 180, "waiting": 0.2},  # no queue
    ],
    ids=["pool-not-full", "no-queue"],
)
def test_no_kv_bound_without_a_queue_behind_a_full_pool(fields: dict[str, float]) -> None:
    decision = decide(PLAN, samples=window(**fields))
    assert decision.trigger != sglang_bound.KV_BOUND


def test_a_queue_at_the_limit_is_not_kv_bound() -> None:
    """Running at ``--max-running-requests``: the limit holds the queue (the idle rule's), not the pool."""
    current = dataclasses.replace(PLAN, max_running_requests=180)
    decision = decide(current, samples=window(kv_usage=0.94, running=180, waiting=300))
    assert decision.trigger != sglang_bound.KV_BOUND


def test_retractions_with_the_pool_below_the_target_are_kv_bound() -> None:
    decision = decide(PLAN, samples=window(kv_usage=0.70, running=180, waiting=300, preemption_rate=0.2))
    assert decision.trigger in (rules.KV_PRESSURE, sglang_bound.KV_BOUND)
    assert decision.action == Action.RETUNE and fraction(decision.settings) > fraction(PLAN)


def test_no_larger_pool_within_the_bounds_falls_through() -> None:
    """The fraction's bound at the current fraction and no fp8 allowed: no growth, so no KvBound (the later
    rules may still help, as vLLM's ``_kv_bound_step`` falls through)."""
    held = dataclasses.replace(BOUNDS, max_gpu_memory_utilization=fraction(PLAN))
    decision = decide(PLAN, samples=window(kv_usage=0.94, running=180, waiting=300), bounds=held)
    assert decision.trigger != sglang_bound.KV_BOUND


def test_fp8_is_offered_after_the_fraction_where_allowed() -> None:
    allowed = dataclasses.replace(BOUNDS, allow_fp8_kv=True)
    held = dataclasses.replace(allowed, max_gpu_memory_utilization=fraction(PLAN))
    decision = decide(PLAN, samples=window(kv_usage=0.94, running=180, waiting=300), bounds=held)
    assert decision.trigger == sglang_bound.KV_BOUND
    assert decision.settings.kv_cache_dtype == sglang.FP8_KV_CACHE_DTYPE


SPENT = sglang.SglangSettings(context_length=32768, mem_fraction_static=0.75, max_running_requests=200)
"""200 running at a fraction under the ceiling: a window with the pool full has no room left for more."""
FULL = sglang.ADMISSION_TOKEN_USAGE
"""The share of the pool SGLang's own admission guards: the idle rules size the limit to it."""


def spent_window(**fields: float) -> ObservationWindow:
    return window(kv_usage=FULL, running=200, waiting=400, **fields)


def test_a_queue_at_the_limit_with_the_room_spent_grows_the_pool_and_the_limit_in_one_rollout() -> None:
    """The room in the pool is the limit: more running requests alone would not fit in it.
    The pool grows (+0.05 of fraction, 0.75 -> 0.80), the limit to what the larger pool holds there."""
    decision = decide(SPENT, samples=spent_window())
    assert decision.action == Action.RETUNE and decision.trigger == sglang_idle.IDLE_CAPACITY
    gain = pool_of(decision.settings) / pool_of(SPENT)
    assert gain >= 1 + PolicyConfig().kv_bound_min_gain
    room = engine_room.measure_room(spent_window(), PolicyConfig(), FULL)
    assert room is not None and decision.settings.max_running_requests == math.floor(room * gain)
    assert fraction(decision.settings) == 0.80
    assert "a larger pool holds" in decision.reason


def test_with_room_left_the_running_requests_are_raised_alone_first() -> None:
    """A deep queue (1,200) behind 32 running at 0.13 usage: the room in the pool (246) first, the pool
    unchanged -- one move at a time, so an OOM tells which (the policy's ``_propose_for_idle``)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    decision = decide(current, samples=window(kv_usage=0.13, running=32, waiting=1200))
    assert decision.trigger == sglang_idle.IDLE_CAPACITY
    assert decision.settings.max_running_requests == math.floor(FULL * 32 / 0.13)
    assert decision.settings.mem_fraction_static is None  # SGLang's default still: no pool growth
    assert decision.settings.chunked_prefill_size is None


def test_a_growth_worth_less_than_the_least_raise_holds() -> None:
    """At SGLang's default fraction on an H100 the pool grows ~5 % (a halved chunk under the 10 GiB floor of
    the reserve): 196 running in a full pool, x 1.05 = 205, under the 5 % least raise from 200 -- not worth a
    rollout."""
    current = dataclasses.replace(SPENT, mem_fraction_static=None)
    decision = decide(current, samples=window(kv_usage=FULL, running=196, waiting=400))
    assert decision.action == Action.HOLD
    more = decide(current, samples=window(kv_usage=FULL * 0.9, running=196, waiting=400))
    assert more.action == Action.RETUNE  # the same queue with a tenth of the pool left is worth it


def test_the_idle_growth_stays_below_a_raise_that_failed() -> None:
    """A raise to 205 that ran out of memory caps the growth's limit as it caps the plain raise
    (:func:`~kvpilot.tuner.loop.sglang_idle.propose_for_idle`)."""
    failed = fit.FailedRun(effective(dataclasses.replace(SPENT, max_running_requests=205)), "runtime_oom")
    decision = decide(SPENT, samples=spent_window(), failed=(failed,))
    assert decision.action == Action.HOLD  # the growth's 216 capped below 205: not worth a rollout
    unfailed = decide(SPENT, samples=spent_window())
    assert (unfailed.settings.max_running_requests or 0) > 205


def test_the_idle_growth_raises_to_the_rooms_lower_end_in_a_noisy_window() -> None:
    """Scrapes alternating between a full pool at 200 running and 0.8 of it at 190: a room (216) whose lower
    end is not worth a raise alone, so the pool grows -- with the room less its standard error, scaled by
    the pool's growth, not the noisy room itself."""
    noisy = tuple(
        MetricsSample(
            time=NOW - 30 * (9 - i),
            kv_usage=0.8 if i % 2 else FULL,
            running=190 if i % 2 else 200,
            waiting=1800,
        )
        for i in range(10)
    )
    w = ObservationWindow(NOW - 300, NOW, noisy, pods=1)
    decision = decide(SPENT, samples=w)
    room = engine_room.measure_room(w, PolicyConfig(), FULL)
    error = engine_room.compute_room_error(w, PolicyConfig(), FULL)
    assert room is not None and error > 5 and room - error < 200 * (1 + PolicyConfig().min_seqs_raise)
    assert decision.action == Action.RETUNE
    gain = pool_of(decision.settings) / pool_of(SPENT)
    assert (
        decision.settings.max_running_requests == math.floor((room - error) * gain) < math.floor(room * gain)
    )


def test_the_idle_growth_waits_while_the_latency_objective_is_near() -> None:
    decision = decide(SPENT, samples=spent_window(itl_p95=0.049), itl=0.05)
    assert decision.settings == SPENT
