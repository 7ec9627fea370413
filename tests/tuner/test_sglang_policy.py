"""SGLang's closed-loop policy (:mod:`kvpilot.tuner.loop.sglang_policy`): one test per rule, the inverted
meaning of ``--mem-fraction-static`` at start-up and at run time, no repeat of a ruled-out value, the gates.

The expected figures are asked of SGLang's memory model (:mod:`kvpilot.tuner.loop.sglang_fit`), never
written down: a change of the model moves the test's expectation with it.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.loop import Action, PolicyConfig, Trigger, TuningBounds, sglang_idle
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.observations import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import compute_oom_step
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    classify_restart,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = fit.SglangMemory(gpus.lookup_gpu("H100-SXM"), LLAMA)
L4 = fit.SglangMemory(gpus.lookup_gpu("L4"), LLAMA)
NOW = 100_000.0
BOUNDS = TuningBounds()
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
CAPTURE_TEXT = "Exception: Capture cuda graph failed: CUDA out of memory."


def window(n: int = 10, **fields: float | None) -> ObservationWindow:
    samples = tuple(MetricsSample(time=NOW - 30 * (n - 1 - i), **fields) for i in range(n))  # type: ignore[arg-type]
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(
    current: sglang.SglangSettings,
    *,
    memory: fit.SglangMemory = H100,
    logs: tuple[str, ...] = (),
    samples: ObservationWindow | None = None,
    failed: tuple[fit.FailedRun, ...] = (),
    changes: tuple[SglangChange, ...] = (),
    bounds: TuningBounds = BOUNDS,
    ttft: float | None = None,
    ready: bool = True,
    itl: float | None = None,
) -> SglangDecision:
    restarts = tuple(classify_restart(NOW - 10 - i, log, f"pod-{i}") for i, log in enumerate(logs))
    return compute_sglang_decision(
        SglangLoopState(current, failed, changes),
        SglangEvidence(samples or window(kv_usage=0.6, running=8, waiting=0), restarts, ready=ready),
        SglangContext(memory, bounds, PolicyConfig(), ttft, itl),
        NOW,
    )


def effective(settings: sglang.SglangSettings, memory: fit.SglangMemory = H100) -> sglang.SglangSettings:
    return fit.compute_effective(settings, memory)


def fraction(settings: sglang.SglangSettings, memory: fit.SglangMemory = H100) -> float:
    return fit.fraction_of(effective(settings, memory))


# --- start-up memory short: raise the fraction, within what leaves activations and graphs room -------------


def test_start_memory_short_raises_the_fraction_to_what_the_model_says_holds_a_request() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.5, max_running_requests=64)
    decision = decide(current, memory=L4, logs=(sglang.no_kv_pool_error(0.5),))
    assert decision.action == Action.RETUNE and decision.trigger == rules.START_MEMORY_SHORT
    new = effective(decision.settings, L4)
    needed = fit.compute_fraction_for_context(effective(current, L4), L4)
    assert needed is not None and fit.fraction_of(new) == needed > 0.5  # raised, not lowered
    assert fit.fraction_of(new) <= fit.compute_fraction_ceiling(new, L4)  # activations and graphs fit
    # on an L4 the default chunk's reserve leaves less than that: the chunk was halved to lift the ceiling
    assert fit.compute_fraction_ceiling(effective(current, L4), L4) < needed
    assert (new.chunked_prefill_size or 0) < (effective(current, L4).chunked_prefill_size or 0)
    assert decision.failed == fit.FailedRun(effective(current, L4), "start_memory_short")
    assert any("at most" in line for line in decision.explanation)


def test_weights_exceed_static_raises_past_sglangs_own_minimum() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.2)
    decision = decide(current, logs=(sglang.weights_exceed_static_error(0.2, 0.31),))
    assert decision.action == Action.RETUNE and fraction(decision.settings) > 0.31


def test_a_failure_the_model_does_not_explain_raises_to_the_ceiling() -> None:
    # the model says 0.5 holds an 8192-token request on an H100; SGLang said otherwise: less was free
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.5)
    decision = decide(current, logs=(sglang.no_kv_pool_error(0.5),))
    assert decision.action == Action.RETUNE
    assert fraction(decision.settings) == fit.compute_fraction_ceiling(effective(decision.settings), H100)


def test_past_every_ceiling_the_context_is_shortened_to_the_pool() -> None:
    current = sglang.SglangSettings(context_length=131072, mem_fraction_static=0.6)
    decision = decide(current, memory=L4, logs=(sglang.no_kv_pool_error(0.6),))
    assert decision.action == Action.RETUNE
    new = effective(decision.settings, L4)
    tokens = fit.predict_pool_tokens(new, L4)
    assert new.context_length is not None and tokens is not None
    assert tokens >= new.context_length and new.context_length < 131072
    assert "--context-length" in decision.reason


def test_weights_past_every_ceiling_shorten_the_context_to_the_pool_sglangs_minimum_leaves() -> None:
    """SGLang's minimum (weights / free memory before the load) refutes the memory model's free memory: past
    every ceiling, the fraction goes to the ceiling and the context to the pool that minimum leaves there,
    not to the model's larger one (bench scenario sglang-startup-short: Qwen3-30B-A3B on an H100 another
    process shares; before, "infeasible" while 0.874 starts with a ~19k-token pool)."""
    qwen = fit.SglangMemory(
        gpus.lookup_gpu("H100-SXM"), build_model_spec(lookup_model_config("Qwen/Qwen3-30B-A3B"))
    )
    current = sglang.SglangSettings(
        context_length=32768, mem_fraction_static=0.835, chunked_prefill_size=8192
    )
    decision = decide(current, memory=qwen, logs=(sglang.weights_exceed_static_error(0.835, 0.8474),))
    assert decision.action == Action.RETUNE and decision.trigger == rules.START_MEMORY_SHORT
    new = effective(decision.settings, qwen)
    assert fit.fraction_of(new) > 0.8474
    budget = fit.compute_budget(new, qwen)
    assert budget is not None and new.context_length is not None
    measured = budget.weight_bytes * (fit.fraction_of(new) / 0.8474 - 1) / budget.cell_bytes
    assert 0 < new.context_length <= measured < 32768


def test_when_no_context_within_the_bounds_fits_it_is_infeasible() -> None:
    current = sglang.SglangSettings(context_length=131072, mem_fraction_static=0.6)
    bounds = TuningBounds(min_max_model_len=65536)
    decision = decide(current, memory=L4, logs=(sglang.no_kv_pool_error(0.6),), bounds=bounds)
    assert decision.action == Action.INFEASIBLE and decision.settings == current
    assert decision.failed is not None and "larger GPU" in decision.reason


# --- OOM at graph capture or run time: lower the fraction, or the activations ------------------------------


@pytest.mark.parametrize("text", [OOM_TEXT, CAPTURE_TEXT])
def test_an_oom_lowers_the_fraction(text: str) -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84, max_running_requests=64)
    decision = decide(current, logs=(text,))
    assert decision.action == Action.RETUNE
    assert decision.trigger == (rules.START_OOM if text == CAPTURE_TEXT else rules.RUNTIME_OOM)
    assert fraction(decision.settings) < 0.84  # the opposite way from a start-up memory short
    assert decision.settings.chunked_prefill_size == current.chunked_prefill_size


def test_an_oom_while_serving_records_the_running_requests_sglangs_log_shows_before_it() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84, max_running_requests=128)
    log = "[TP0] " + sglang.decode_batch_line(97, 97_000, 0.2) + "\n" + OOM_TEXT
    decision = decide(current, logs=(log,))
    assert decision.trigger == rules.RUNTIME_OOM
    assert decision.failed is not None and decision.failed.running == 97  # the window saw 8
    bare = decide(current, logs=(OOM_TEXT,))
    assert bare.failed is not None and bare.failed.running == 8  # the window's count alone


def test_an_oom_again_after_a_smaller_fraction_cuts_the_running_requests() -> None:
    """The memory that follows the batch: 64 running requests ran out of memory at 0.84, the fraction went
    to 0.80 and they ran out again. A third fraction is not the answer (each OOM lowered it again: 0.84 ->
    0.5 in ten crashes); fewer running requests are, below those the crash saw when the batch never
    filled its limit. A first OOM still lowers the fraction."""
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.80, max_running_requests=64)
    first = fit.FailedRun(effective(dataclasses.replace(current, mem_fraction_static=0.84)), "runtime_oom")
    full = window(kv_usage=0.5, running=64, waiting=30)
    again = decide(current, logs=(OOM_TEXT,), failed=(first,), samples=full)
    assert again.action == Action.RETUNE and again.trigger == rules.RUNTIME_OOM
    assert again.settings.max_running_requests == 48 and fraction(again.settings) == 0.80
    assert "the memory follows the batch" in " ".join(again.explanation)
    busy = window(kv_usage=0.5, running=40, waiting=0)
    seen = decide(current, logs=(OOM_TEXT,), failed=(first,), samples=busy)
    assert seen.settings.max_running_requests == 39
    other = fit.FailedRun(
        effective(dataclasses.replace(current, mem_fraction_static=0.84, max_running_requests=32)),
        "runtime_oom",
    )
    assert fraction(decide(current, logs=(OOM_TEXT,), failed=(other,), samples=full).settings) < 0.80


def test_an_oom_that_leaves_no_smaller_fraction_cuts_the_prefill_chunk_and_pins_the_fraction() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84)
    lower = fit.floor_grid(0.84 - compute_oom_step(0.84, PolicyConfig()))  # what the OOM step would try ...
    failed = (
        fit.FailedRun(
            dataclasses.replace(effective(current), mem_fraction_static=lower), "start_memory_short"
        ),
    )
    decision = decide(current, logs=(OOM_TEXT,), failed=failed)  # ... which the history ruled out
    assert decision.action == Action.RETUNE
    new = effective(decision.settings)
    assert (
        fit.fraction_of(new) == 0.84
    )  # written: SGLang's default would hand the freed activations to the pool
    assert decision.settings.mem_fraction_static == 0.84
    assert (new.chunked_prefill_size or 0) == (effective(current).chunked_prefill_size or 0) // 2


def test_a_graph_capture_oom_at_the_floors_cuts_the_running_requests() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84, chunked_prefill_size=2048)
    lower = dataclasses.replace(effective(current), mem_fraction_static=0.80)
    failed = (fit.FailedRun(lower, "start_memory_short"),)
    decision = decide(current, logs=(CAPTURE_TEXT,), failed=failed)
    assert decision.action == Action.RETUNE and decision.settings.max_running_requests is not None
    graph = sglang.default_cuda_graph_max_bs(H100.gpu_mib, 1)
    assert decision.settings.max_running_requests < graph


def test_a_service_whose_pool_is_already_shorter_than_its_context_still_gets_an_oom_remedy() -> None:
    # SGLang's defaults on an L4: the 8B's full 128k context never fit its pool of a few hundred tokens; the
    # bar for a remedy is then a pool SGLang starts with, not one the service never had
    current = sglang.SglangSettings()
    eff = effective(current, L4)
    tokens = fit.predict_pool_tokens(eff, L4)
    assert tokens is not None and 0 < tokens < (eff.context_length or 0)
    decision = decide(current, memory=L4, logs=(OOM_TEXT,))
    assert decision.action == Action.RETUNE
    new = effective(decision.settings, L4)
    assert fit.fraction_of(new) <= fit.fraction_of(eff) and (fit.predict_pool_tokens(new, L4) or 0) > 0
    assert new != eff


def test_no_value_the_history_ruled_out_is_tried_again() -> None:
    # OOM at 0.84 before; now memory-short at 0.7: the raise stops short of 0.84 at this chunk
    oomed = effective(sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84))
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.7)
    failed = (fit.FailedRun(oomed, "runtime_oom"),)
    decision = decide(current, logs=(sglang.no_kv_pool_error(0.7),), failed=failed)
    new = effective(decision.settings)
    assert decision.action == Action.RETUNE
    assert not (fit.fraction_of(new) >= 0.84 and new.chunked_prefill_size == oomed.chunked_prefill_size)
    assert fit.fraction_of(new) > 0.7


def test_an_unexplained_restart_holds() -> None:
    decision = decide(sglang.SglangSettings(context_length=8192), logs=("ImportError: no module named x",))
    assert decision.action == Action.HOLD and decision.trigger == "Other" and decision.failed is None


# --- metrics rules ------------------------------------------------------------------------------------------


def test_pressure_with_retractions_cuts_the_running_requests_at_the_ceiling() -> None:
    # the fraction at its ceiling, the prefill chunk at its floor: nothing lifts the ceiling
    current = sglang.SglangSettings(context_length=8192, max_running_requests=64, chunked_prefill_size=2048)
    decision = decide(current, samples=window(kv_usage=0.97, preemption_rate=0.5, running=64, waiting=5))
    assert decision.action == Action.RETUNE and decision.trigger == rules.KV_PRESSURE
    assert (decision.settings.max_running_requests or 0) < 64
    assert decision.settings.mem_fraction_static is None


def test_pressure_at_the_ceiling_halves_the_prefill_chunk_for_more_pool() -> None:
    """As a start-up short of memory: a smaller activation reserve lifts the ceiling, so at the ceiling
    pressure grows the pool by halving --chunked-prefill-size before it turns requests away (bench
    sglang-noisy-metrics: 261 running at 0.835 and 8192 retracted; 0.87 and 4096 hold them)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=64)  # fraction: the ceiling
    decision = decide(current, samples=window(kv_usage=0.97, preemption_rate=0.5, running=64, waiting=5))
    assert decision.action == Action.RETUNE and decision.trigger == rules.KV_PRESSURE
    new = effective(decision.settings)
    assert new.chunked_prefill_size == 4096 and fraction(decision.settings) > fraction(current)
    assert fraction(decision.settings) <= fit.compute_fraction_ceiling(new, H100)
    assert decision.settings.max_running_requests == 64


def test_pressure_under_the_ceiling_grows_the_pool_unless_an_oom_ruled_it_out() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.7, max_running_requests=64)
    samples = window(kv_usage=0.97, preemption_rate=0.5, running=64, waiting=5)
    grown = decide(current, samples=samples)
    assert grown.action == Action.RETUNE and fraction(grown.settings) > 0.7
    assert grown.settings.max_running_requests == 64
    failed = (fit.FailedRun(effective(grown.settings), "runtime_oom"),)
    cut = decide(current, samples=samples, failed=failed)
    assert cut.action == Action.RETUNE and fraction(cut.settings) == 0.7
    assert (cut.settings.max_running_requests or 0) < 64


def test_sglangs_retraction_warning_is_pressure_even_between_samples() -> None:
    current = sglang.SglangSettings(context_length=8192, max_running_requests=64, chunked_prefill_size=2048)
    decision = decide(
        current, logs=(sglang.kv_pool_full_warning(4, 512),), samples=window(kv_usage=0.7, running=60)
    )
    assert decision.trigger == rules.KV_PRESSURE and (decision.settings.max_running_requests or 0) < 64


def test_a_queue_at_the_limit_with_low_token_usage_adds_running_requests_within_the_room() -> None:
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    decision = decide(current, samples=window(kv_usage=0.2, running=32, waiting=40))
    assert decision.action == Action.RETUNE and decision.trigger == sglang_idle.IDLE_CAPACITY
    raised = decision.settings.max_running_requests or 0
    room = sglang.ADMISSION_TOKEN_USAGE * 32 / 0.2
    assert 32 < raised <= room


def test_a_metrics_change_waits_for_flags_proven_through_a_probation_and_marks_them_good() -> None:
    """A raise two minutes after the plan had nothing to roll back to (no last good flags yet): its run-time
    OOM could only be answered by ever smaller fractions (bench sglang-bad-new-settings: 37 crashes, the
    fraction 0.84 -> 0.5). It waits until the current flags served Ready through a probation, and the change
    then marks them good, where its rollout returns."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    queue = window(kv_usage=0.2, running=32, waiting=40)
    early = decide(current, samples=queue, changes=(SglangChange(NOW - 120, "Planned", planned=True),))
    assert early.action == Action.HOLD and "not yet proven" in early.reason
    assert early.recommended is not None and (early.recommended.max_running_requests or 0) > 32
    assert decide(current, samples=queue, ready=False).action == Action.HOLD
    later = decide(current, samples=queue, changes=(SglangChange(NOW - 400, "Planned", planned=True),))
    assert later.action == Action.RETUNE and later.good == current


def test_the_plan_is_no_change_for_the_hourly_limit() -> None:
    """As vLLM's gates (``history.compute_changes_since``): the plan judged nothing, so three retunes and
    the plan within the hour leave room for a fourth; four retunes do not."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    queue = window(kv_usage=0.2, running=32, waiting=40)
    retunes = tuple(SglangChange(NOW - 3000 + 700 * i, "IdleCapacity") for i in range(3))
    plan = SglangChange(NOW - 3500, "Planned", planned=True)
    assert decide(current, samples=queue, changes=(plan, *retunes)).action == Action.RETUNE
    four = (*retunes, SglangChange(NOW - 3400, "IdleCapacity"))
    held = decide(current, samples=queue, changes=four)
    assert held.action == Action.HOLD and "changes in the last hour" in held.reason


def test_a_deep_queue_with_measured_room_is_served_in_one_raise_not_doubling_steps() -> None:
    """As vLLM's rule: where the window measured the room, the step's cap (at most doubling) does not hold a
    raise back; the queue's demand is taken, within the room (bench scenario sglang-queue: 32 -> 64 -> 128
    -> 209 in three rollouts, 24 minutes, with 1,000+ requests waiting)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    decision = decide(current, samples=window(kv_usage=0.13, running=32, waiting=1200))
    assert decision.action == Action.RETUNE and decision.trigger == sglang_idle.IDLE_CAPACITY
    assert decision.settings.max_running_requests == int(sglang.ADMISSION_TOKEN_USAGE * 32 / 0.13)
    # a shallow queue asks for less than the room: its demand, not the room
    shallow = decide(current, samples=window(kv_usage=0.13, running=32, waiting=40))
    assert shallow.settings.max_running_requests == 72


def test_a_raise_that_ran_out_of_memory_is_approached_by_a_step_not_retried_one_less() -> None:
    """As vLLM's rule, a raise of the running requests that failed (an OOM on probation, rolled back) caps
    the next raise below it (bench scenario sglang-bad-new-settings: 210 failed, then 209 and 208 were tried,
    each another CUDA OOM); leaning low: one ``seqs_step_up`` from what runs, halfway once that is closer
    (bisecting 64 -> 210 tried 137 and 100, two more OOMs where the limit was 96: a probe above the failure is
    a crash and a rollback, one below it a rollout)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=64)
    raised = sglang.SglangSettings(context_length=8192, max_running_requests=210)
    failed = fit.FailedRun(effective(raised), "runtime_oom")
    decision = decide(current, samples=window(kv_usage=0.13, running=64, waiting=900), failed=(failed,))
    assert decision.action == Action.RETUNE and decision.trigger == sglang_idle.IDLE_CAPACITY
    assert decision.settings.max_running_requests == 80  # 64 x 1.25, not halfway (137)
    # close to the failure, halfway is the smaller raise
    at_90 = dataclasses.replace(current, max_running_requests=90)
    nearer = fit.FailedRun(effective(dataclasses.replace(raised, max_running_requests=100)), "runtime_oom")
    near = decide(at_90, samples=window(kv_usage=0.13, running=90, waiting=900), failed=(nearer,))
    assert near.settings.max_running_requests == 95
    # a failure at a larger fraction (less memory left outside the share) says nothing about this one
    roomier = fit.FailedRun(
        dataclasses.replace(failed.settings, mem_fraction_static=fraction(current) + 0.05), "runtime_oom"
    )
    again = decide(current, samples=window(kv_usage=0.13, running=64, waiting=900), failed=(roomier,))
    assert (again.settings.max_running_requests or 0) > 80


def test_a_runtime_oom_before_the_batch_filled_keeps_the_next_raise_below_the_running_it_saw() -> None:
    """A run-time OOM of a raise whose batch had not filled its limit (120 of 210 running when it crashed):
    the memory that follows the batch ran out at about 120, so the next raise stays below it. A batch that
    had filled its limit says nothing below it (the step)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=64)
    raised = effective(sglang.SglangSettings(context_length=8192, max_running_requests=210))
    busy = window(kv_usage=0.13, running=64, waiting=900)
    seen = decide(current, samples=busy, failed=(fit.FailedRun(raised, "runtime_oom", running=120),))
    assert seen.settings.max_running_requests == 119 and "below 120" in seen.reason
    filled = decide(current, samples=busy, failed=(fit.FailedRun(raised, "runtime_oom", running=205),))
    assert filled.settings.max_running_requests == 80
    # the crash step records the running requests the window saw before the OOM
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    crashed = decide(raised, samples=window(kv_usage=0.3, running=120, waiting=50), logs=(oom,))
    assert crashed.failed is not None and crashed.failed.running == 120


def _pressure(time: float, before: int, after: int) -> SglangChange:
    flags = sglang.SglangSettings(context_length=8192)
    return SglangChange(
        time,
        rules.KV_PRESSURE,
        before=dataclasses.replace(flags, max_running_requests=before),
        after=dataclasses.replace(flags, max_running_requests=after),
    )


def test_after_token_pressure_a_raise_stays_below_where_it_found_the_pool_full() -> None:
    """As vLLM's flap guard: within the hour after KvPressure cut from N, a calm window's room raises only
    below N, and only by a step worth the risk (bench scenario sglang-retractions: 158 -> 118 -> 144 ->
    108 -> 148 ..., eleven rollouts in three hours)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=118)
    calm = window(kv_usage=0.5, running=118, waiting=700)  # room in the pool: 1.0 x 118 / 0.5 = 236
    cut = _pressure(NOW - 1200, 158, 118)
    decision = decide(current, samples=calm, changes=(cut,))
    assert decision.action == Action.RETUNE and decision.settings.max_running_requests == 157
    # a raise under flap_min_raise (25 %) is not worth its rollout so soon after the cut
    small = decide(current, samples=calm, changes=(_pressure(NOW - 1200, 140, 118),))
    assert small.trigger == Trigger.STEADY
    # an hour on, the cut is forgotten: the room
    later = decide(current, samples=calm, changes=(_pressure(NOW - 4000, 158, 118),))
    assert later.settings.max_running_requests == 236


def test_token_pressure_that_comes_back_within_the_hour_holds_the_limit_it_set() -> None:
    current = sglang.SglangSettings(context_length=8192, max_running_requests=108)
    calm = window(kv_usage=0.5, running=108, waiting=700)
    again = (_pressure(NOW - 3000, 158, 118), _pressure(NOW - 600, 144, 108))
    assert decide(current, samples=calm, changes=again).trigger == Trigger.STEADY


def test_no_queue_or_no_room_holds_steady() -> None:
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    assert decide(current, samples=window(kv_usage=0.2, running=32, waiting=0)).trigger == Trigger.STEADY
    # inside the band with no room worth a rollout in the pool (1.0 x 32 / 0.97 = 32 < 32 x 1.05), and no
    # larger pool within the bounds (tests/tuner/test_sglang_bound.py)
    held = dataclasses.replace(BOUNDS, max_gpu_memory_utilization=fraction(current))
    full = window(kv_usage=0.97, running=32, waiting=9)
    assert decide(current, samples=full, bounds=held).trigger == Trigger.STEADY


def test_a_queue_at_the_limit_inside_the_band_takes_the_measured_room() -> None:
    """As vLLM's rule: usage inside the 0.50..0.90 band is no reason to leave a queue waiting at the limit
    when the window shows room (bench scenario sglang-queue: 128 running at 0.54 usage, 1,600 waiting,
    held Steady for hours)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=128)
    decision = decide(current, samples=window(kv_usage=0.54, running=128, waiting=1600))
    assert decision.action == Action.RETUNE and decision.trigger == sglang_idle.IDLE_CAPACITY
    assert decision.settings.max_running_requests == int(sglang.ADMISSION_TOKEN_USAGE * 128 / 0.54)


def test_inside_the_band_a_raise_must_clear_the_rooms_own_noise() -> None:
    """As VPA's recommendation moves only outside its confidence band: inside the usage band the measured
    room raises the limit only when it stands over the 5 % minimum by more than its standard error sample to
    sample (bench scenario sglang-noisy-metrics, 30 % noise: the room crept 200 -> 217 -> 234 -> 247 -> 267,
    each just over the minimum, one rollout each)."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=200)
    quiet = window(kv_usage=0.8, running=180, waiting=1800)  # room in the pool 1.0 x 180 / 0.8 = 225 (+12 %)
    taken = decide(current, samples=quiet)
    assert taken.action == Action.RETUNE and taken.settings.max_running_requests == 225
    # the same means, the scrapes apart (200 running at 0.6, 160 at a full pool): the room's standard error
    # (~29) leaves it under 210 (+5 %)
    noisy = tuple(
        MetricsSample(
            time=NOW - 30 * (9 - i),
            kv_usage=0.6 if i % 2 else 1.0,
            running=200 if i % 2 else 160,
            waiting=1800,
        )
        for i in range(10)
    )
    # (no larger pool within the bounds: the growth's own lower end is in tests/tuner/test_sglang_bound.py)
    no_growth = dataclasses.replace(BOUNDS, max_gpu_memory_utilization=fraction(current))
    held = decide(current, samples=ObservationWindow(NOW - 300, NOW, noisy, pods=1), bounds=no_growth)
    assert held.trigger == Trigger.STEADY
    # usage low is not the band: the step goes however noisy
    low = tuple(dataclasses.replace(x, kv_usage=(x.kv_usage or 0) * 0.4) for x in noisy)
    idle = decide(current, samples=ObservationWindow(NOW - 300, NOW, low, pods=1))
    assert idle.action == Action.RETUNE


def test_a_missed_ttft_objective_halves_the_prefill_chunk() -> None:
    current = sglang.SglangSettings(context_length=8192, chunked_prefill_size=8192)
    decision = decide(current, samples=window(kv_usage=0.6, running=8, waiting=0, ttft_p95=2.0), ttft=0.5)
    assert decision.action == Action.RETUNE and decision.trigger == rules.LATENCY_SLO
    assert decision.settings.chunked_prefill_size == 4096
    met = decide(current, samples=window(kv_usage=0.6, running=8, waiting=0, ttft_p95=0.2), ttft=0.5)
    assert met.action == Action.HOLD


def test_a_missed_itl_objective_cuts_the_running_requests_even_for_long_prompts() -> None:
    """As vLLM's rule: every decode step reads each running request's KV, so fewer of them shorten it, to
    the objective's share of what ran (at most by half a step). Unlike vLLM's, long prompts do not halve the
    prefill chunk first: SGLang 0.5.23 runs a prefill batch alone and a chunked prompt's chunks back to back
    (``Scheduler.get_next_batch_to_run``), so the decodes wait for the whole prompt whatever the chunk. Met,
    it holds."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=128, chunked_prefill_size=8192)
    slow = window(kv_usage=0.6, running=120, waiting=0, itl_p95=0.08)
    decision = decide(current, samples=slow, itl=0.06)
    assert decision.action == Action.RETUNE and decision.trigger == rules.LATENCY_SLO
    assert decision.settings.max_running_requests == 90  # 120 x 0.06 / 0.08
    assert decision.settings.chunked_prefill_size == 8192
    long = dataclasses.replace(slow, prompt_tokens=LengthSummary(mean=4000.0))
    cut = decide(current, samples=long, itl=0.06).settings
    assert (cut.chunked_prefill_size, cut.max_running_requests) == (8192, 90)
    met = window(kv_usage=0.6, running=120, waiting=0, itl_p95=0.03)
    assert decide(current, samples=met, itl=0.06).action == Action.HOLD


def test_no_idle_raise_while_the_inter_token_latency_is_near_its_objective() -> None:
    """vLLM's ``allows_raise``: a queue at the limit with room is not raised past the objective's margin."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=32)
    near = window(kv_usage=0.2, running=32, waiting=40, itl_p95=0.058)
    assert decide(current, samples=near, itl=0.06).action == Action.HOLD
    clear = window(kv_usage=0.2, running=32, waiting=40, itl_p95=0.02)
    assert decide(current, samples=clear, itl=0.06).trigger == sglang_idle.IDLE_CAPACITY


# --- gates -----------------------------------------------------------------------------------------


def test_missing_or_scarce_metrics_hold() -> None:
    current = sglang.SglangSettings(context_length=8192)
    gone = decide(current, samples=ObservationWindow.unavailable("no series", NOW))
    assert gone.action == Action.HOLD and gone.trigger == "MetricsUnavailable"
    assert gone.metrics is not None and not gone.metrics.available
    few = decide(current, samples=window(n=2, kv_usage=0.99, preemption_rate=1.0, running=8))
    assert few.trigger == Trigger.INSUFFICIENT_DATA


def test_the_cooldown_holds_metrics_driven_changes_but_not_crash_remedies() -> None:
    current = sglang.SglangSettings(  # at the ceiling with the chunk at its floor: the remedy is a cut
        context_length=8192, mem_fraction_static=0.87, max_running_requests=64, chunked_prefill_size=2048
    )
    recent = (SglangChange(NOW - 200, rules.KV_PRESSURE),)
    samples = window(kv_usage=0.97, preemption_rate=0.5, running=64, waiting=5)
    held = decide(current, samples=samples, changes=recent)
    assert held.action == Action.HOLD and "cooldown" in held.reason
    assert held.recommended is not None and (held.recommended.max_running_requests or 0) < 64
    crash = decide(current, logs=(OOM_TEXT,), changes=recent)
    assert crash.action == Action.RETUNE
    too_soon = decide(current, logs=(OOM_TEXT,), changes=(SglangChange(NOW - 30, rules.KV_PRESSURE),))
    assert too_soon.action == Action.HOLD and too_soon.failed is not None


def test_a_restart_before_the_last_change_is_not_the_current_settings_failure() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84)
    decision = decide(current, logs=(OOM_TEXT,), changes=(SglangChange(NOW - 5, "Planned", planned=True),))
    assert decision.failed is None
