"""SGLang's crash rules and an fp8 KV cache (:mod:`kvpilot.tuner.loop.sglang_fp8`, :mod:`.sglang_rules`).

As vLLM's crash rules order it: after a start-up short of memory, SGLang's raise of the fraction and a
context cut within ``minContextLength`` come first, then fp8 with the full context, then fp8 with the context
its pool holds (vLLM's ``KvCacheTooSmall``); after an out-of-memory outside the share, fp8 at a smaller
fraction that keeps the pool's tokens comes before any cut of ``--max-running-requests`` (vLLM's pressure
order: fp8 before the sequences). The gates are the pressure rule's: ``allow_fp8_kv`` (the user and the
GPU) and a cache not fp8 yet; where only the user's permission keeps it out, the exhausted rule says so.
The figures are asked of the memory model, never written down.
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.loop import Action, PolicyConfig, TuningBounds
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    classify_restart,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.types import ServingBounds

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = fit.SglangMemory(gpus.lookup_gpu("H100-SXM"), LLAMA)
L4 = fit.SglangMemory(gpus.lookup_gpu("L4"), LLAMA)
A10G = fit.SglangMemory(gpus.lookup_gpu("A10G"), LLAMA)
NOW = 100_000.0
FP8 = sglang.FP8_KV_CACHE_DTYPE
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
CAPTURE_TEXT = "Exception: Capture cuda graph failed: CUDA out of memory."
SHORT = sglang.SglangSettings(context_length=32768, mem_fraction_static=0.6)
"""On an L4 the 8B's 16-bit pool holds 24005 tokens at the highest ceiling (0.835): not one 32K request."""


def window(running: float = 8) -> ObservationWindow:
    samples = tuple(
        MetricsSample(time=NOW - 30 * (9 - i), kv_usage=0.5, running=running, waiting=0) for i in range(10)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(
    current: sglang.SglangSettings,
    log: str,
    bounds: TuningBounds,
    memory: fit.SglangMemory = H100,
    failed: tuple[fit.FailedRun, ...] = (),
    running: float = 8,
) -> SglangDecision:
    return compute_sglang_decision(
        SglangLoopState(current, failed, ()),
        SglangEvidence(window(running), (classify_restart(NOW - 10, log, "pod-0"),), ready=True),
        SglangContext(memory, bounds, PolicyConfig(), None, None),
        NOW,
    )


def tokens(settings: sglang.SglangSettings, memory: fit.SglangMemory) -> int:
    return fit.predict_pool_tokens(fit.compute_effective(settings, memory), memory) or 0


def allowed(min_context: int | None = None) -> TuningBounds:
    return TuningBounds(min_max_model_len=min_context, allow_fp8_kv=True)


# --- a start short of memory: the fraction up, then the context that fits, then fp8 ------------------------


def test_a_start_short_of_memory_at_the_minimum_context_keeps_it_with_fp8() -> None:
    decision = decide(SHORT, sglang.no_kv_pool_error(0.6), allowed(32768), L4)
    assert decision.action == Action.RETUNE and decision.trigger == rules.START_MEMORY_SHORT
    new = decision.settings
    assert new.kv_cache_dtype == FP8 and new.context_length == 32768
    assert (new.mem_fraction_static or 0) > 0.6  # a start-up short of memory only ever raises the fraction
    assert tokens(new, L4) >= 32768 and tokens(dataclasses.replace(new, kv_cache_dtype=None), L4) < 32768
    assert any(FP8 in line for line in decision.explanation)


def test_a_context_cut_within_the_bounds_comes_before_fp8_as_vllms_order() -> None:
    decision = decide(SHORT, sglang.no_kv_pool_error(0.6), allowed(16384), L4)
    assert decision.action == Action.RETUNE and decision.settings.kv_cache_dtype is None
    assert 16384 <= (decision.settings.context_length or 0) < 32768


def test_fp8_with_the_context_its_pool_holds_when_even_fp8_misses_the_full_context() -> None:
    current = dataclasses.replace(SHORT, context_length=65536)
    decision = decide(current, sglang.no_kv_pool_error(0.6), allowed(32768), L4)
    assert decision.action == Action.RETUNE and decision.settings.kv_cache_dtype == FP8
    context = decision.settings.context_length or 0
    assert 32768 <= context < 65536 and tokens(decision.settings, L4) >= context


def test_without_the_permission_the_infeasible_start_says_fp8_fits_and_how_to_allow_it() -> None:
    decision = decide(SHORT, sglang.no_kv_pool_error(0.6), TuningBounds(min_max_model_len=32768), L4)
    assert decision.action == Action.INFEASIBLE and decision.settings == SHORT
    assert f"An fp8 KV cache (--kv-cache-dtype {FP8}) fits" in decision.reason
    assert "spec.tuning.allowFp8KvCache: true" in decision.reason and "--allow-fp8-kv" in decision.reason


def test_no_fp8_hint_where_the_gpu_has_no_fp8_kv_or_fp8_would_not_fit_either() -> None:
    unsupported = TuningBounds.from_serving(
        ServingBounds(allow_fp8_kv=True, min_context=32768), fp8_supported=False
    )
    a10g = decide(SHORT, sglang.no_kv_pool_error(0.6), unsupported, A10G)
    assert a10g.settings.kv_cache_dtype is None and "allowFp8KvCache" not in a10g.reason
    longer = dataclasses.replace(SHORT, context_length=131072)
    too_long = decide(longer, sglang.no_kv_pool_error(0.6), TuningBounds(min_max_model_len=65536), L4)
    assert too_long.action == Action.INFEASIBLE and "allowFp8KvCache" not in too_long.reason


# --- an out-of-memory outside the share: fp8 at a smaller fraction before fewer running requests ----------


def test_an_oom_back_at_the_same_batch_switches_to_fp8_before_cutting_the_running_requests() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.80, max_running_requests=64)
    first = fit.FailedRun(
        fit.compute_effective(dataclasses.replace(current, mem_fraction_static=0.84), H100), "runtime_oom"
    )
    cut = decide(current, OOM_TEXT, TuningBounds(), failed=(first,), running=64)
    assert cut.settings.max_running_requests == 48  # without fp8: fewer running requests
    switched = decide(current, OOM_TEXT, allowed(), failed=(first,), running=64)
    assert switched.action == Action.RETUNE and switched.trigger == rules.RUNTIME_OOM
    new = switched.settings
    assert new.kv_cache_dtype == FP8 and new.max_running_requests == 64
    assert (new.mem_fraction_static or 1) < 0.80  # a run-time OOM only ever lowers the fraction
    assert tokens(new, H100) >= tokens(current, H100)  # the same tokens in half the bytes


def at_the_floor() -> sglang.SglangSettings:
    """On an L4 the pool at 0.835 barely holds the context: no OOM step lower holds one request, and the
    prefill chunk is at its floor."""
    pool = tokens(sglang.SglangSettings(mem_fraction_static=0.835, chunked_prefill_size=2048), L4)
    return sglang.SglangSettings(
        context_length=pool * 97 // 100 // 256 * 256, mem_fraction_static=0.835, chunked_prefill_size=2048
    )


def test_a_graph_capture_oom_at_the_floors_takes_fp8_before_fewer_running_requests() -> None:
    current = at_the_floor()
    cut = decide(current, CAPTURE_TEXT, TuningBounds(), L4)
    assert cut.action == Action.RETUNE and cut.settings.max_running_requests is not None
    decision = decide(current, CAPTURE_TEXT, allowed(), L4)
    assert decision.action == Action.RETUNE and decision.trigger == rules.START_OOM
    assert decision.settings.kv_cache_dtype == FP8 and decision.settings.max_running_requests is None
    assert (decision.settings.mem_fraction_static or 1) < 0.835
    assert decision.settings.context_length == current.context_length


def test_fp8_is_not_tried_below_a_fraction_that_left_no_pool() -> None:
    """A start-up short of memory at a fraction says the weights filled it: no KV dtype starts at or below
    it, so an OOM's fp8 at a smaller fraction is ruled out there too."""
    current = at_the_floor()
    short = fit.FailedRun(
        dataclasses.replace(fit.compute_effective(current, L4), mem_fraction_static=0.8), "start_memory_short"
    )
    decision = decide(current, CAPTURE_TEXT, allowed(), L4, failed=(short,))
    assert decision.settings.kv_cache_dtype is None or (decision.settings.mem_fraction_static or 0) > 0.8


def test_an_oom_with_no_smaller_fraction_left_is_cured_by_fp8_or_names_it() -> None:
    """At the floors (:func:`at_the_floor`) a run-time OOM has no smaller fraction or chunk left: fp8 holds
    the same tokens at a far smaller fraction."""
    pool = tokens(sglang.SglangSettings(mem_fraction_static=0.835, chunked_prefill_size=2048), L4)
    current = dataclasses.replace(at_the_floor(), max_running_requests=8)
    held = decide(current, OOM_TEXT, TuningBounds(), L4)
    assert held.action == Action.INFEASIBLE
    assert (
        f"An fp8 KV cache (--kv-cache-dtype {FP8}) fits" in held.reason and "allowFp8KvCache" in held.reason
    )
    cured = decide(current, OOM_TEXT, allowed(), L4)
    assert cured.action == Action.RETUNE and cured.settings.kv_cache_dtype == FP8
    assert cured.settings.context_length == current.context_length
    assert cured.settings.max_running_requests == 8
    assert (cured.settings.mem_fraction_static or 1) < 0.835 and tokens(cured.settings, L4) >= pool


def test_no_fp8_remedy_where_the_cache_is_fp8_already_or_the_gpu_has_none() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.80, max_running_requests=64)
    unsupported = TuningBounds.from_serving(ServingBounds(allow_fp8_kv=True), fp8_supported=False)
    for settings, bounds in (
        (current, unsupported),
        (dataclasses.replace(current, kv_cache_dtype=FP8), allowed()),
    ):
        first = fit.FailedRun(
            fit.compute_effective(dataclasses.replace(settings, mem_fraction_static=0.84), H100),
            "runtime_oom",
        )
        decision = decide(settings, OOM_TEXT, bounds, failed=(first,), running=64)
        assert decision.settings.kv_cache_dtype == settings.kv_cache_dtype
        assert decision.settings.max_running_requests == 48
