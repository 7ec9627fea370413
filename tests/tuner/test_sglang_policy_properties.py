"""Hypothesis properties of SGLang's closed-loop policy over arbitrary inputs.

- a retune stays within the bounds, under the fraction's ceiling, and changes something;
- a retune never proposes what the history (or the crash it answers) ruled out;
- a start-up memory short never lowers the fraction, an OOM never raises it;
- the same inputs give the same decision.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.loop import Action, TuningBounds
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangEvidence,
    SglangLoopState,
    classify_restart,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
NOW = 100_000.0
MEMORIES = (
    fit.SglangMemory(gpus.lookup_gpu("H100-SXM"), LLAMA),
    fit.SglangMemory(gpus.lookup_gpu("L4"), LLAMA),
    fit.SglangMemory(gpus.lookup_gpu("A100-40GB"), None),
)
LOGS = {
    "start_memory_short": sglang.no_kv_pool_error(0.5),
    "weights": sglang.weights_exceed_static_error(0.5, 0.6),
    "start_oom": "Exception: Capture cuda graph failed: CUDA out of memory.",
    "runtime_oom": "torch.OutOfMemoryError: CUDA out of memory.",
    "kv_pressure": sglang.kv_pool_full_warning(3, 100),
    "other": "ImportError: no module named flashinfer",
}

fractions = st.integers(30, 95).map(lambda x: x / 100)
settings_st = st.builds(
    sglang.SglangSettings,
    context_length=st.sampled_from([2048, 8192, 32768, 131072]),
    mem_fraction_static=st.one_of(st.none(), fractions),
    max_running_requests=st.one_of(st.none(), st.integers(1, 512)),
    chunked_prefill_size=st.one_of(st.none(), st.sampled_from([2048, 4096, 8192, 16384])),
    kv_cache_dtype=st.sampled_from([None, None, sglang.FP8_KV_CACHE_DTYPE]),
)
failed_st = st.lists(
    st.builds(
        fit.FailedRun,
        settings_st,
        st.sampled_from(["start_memory_short", "start_oom", "runtime_oom"]),
    ),
    max_size=4,
)


@st.composite
def bounds_st(draw: st.DrawFn) -> TuningBounds:
    lo_f, hi_f = sorted(draw(st.lists(fractions, min_size=2, max_size=2)))
    lo_s = draw(st.integers(1, 64))
    hi_s = draw(st.one_of(st.none(), st.integers(lo_s, 1024)))
    return TuningBounds(
        min_max_num_seqs=lo_s,
        max_max_num_seqs=hi_s,
        min_gpu_memory_utilization=lo_f,
        max_gpu_memory_utilization=hi_f,
        min_max_model_len=draw(st.one_of(st.none(), st.sampled_from([1024, 4096, 16384]))),
        allow_fp8_kv=draw(st.booleans()),
    )


@st.composite
def window_st(draw: st.DrawFn) -> ObservationWindow:
    n = draw(st.integers(0, 12))
    usage = st.one_of(st.none(), st.floats(0, 1))
    samples = tuple(
        MetricsSample(
            time=NOW - 30 * (n - 1 - i),
            kv_usage=draw(usage),
            preemption_rate=draw(st.one_of(st.none(), st.floats(0, 5))),
            running=draw(st.one_of(st.none(), st.floats(0, 600))),
            waiting=draw(st.one_of(st.none(), st.floats(0, 200))),
            ttft_p95=draw(st.one_of(st.none(), st.floats(0, 10))),
        )
        for i in range(n)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


@st.composite
def busy_window_st(draw: st.DrawFn) -> ObservationWindow:
    """A full window of one load: every series present, so the metrics rules speak."""
    n = draw(st.integers(5, 12))
    usage, rate = draw(st.floats(0, 1)), draw(st.sampled_from([0.0, 0.5]))
    running, waiting = draw(st.floats(1, 600)), draw(st.sampled_from([0.0, 20.0]))
    ttft = draw(st.floats(0.01, 5))
    samples = tuple(
        MetricsSample(NOW - 30 * (n - 1 - i), usage, rate, running, waiting, ttft) for i in range(n)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


@st.composite
def case_st(draw: st.DrawFn) -> tuple[SglangLoopState, SglangEvidence, SglangContext, tuple[str, ...]]:
    kinds = tuple(draw(st.lists(st.sampled_from(sorted(LOGS)), max_size=2)))
    restarts = tuple(classify_restart(NOW - 5 - i, LOGS[k], f"pod-{i}") for i, k in enumerate(kinds))
    changes = tuple(
        SglangChange(NOW - t, "KvPressure") for t in draw(st.lists(st.integers(1, 20000), max_size=2))
    )
    state = SglangLoopState(draw(settings_st), tuple(draw(failed_st)), changes)
    evidence = SglangEvidence(draw(st.one_of(window_st(), busy_window_st())), restarts)
    context = SglangContext(
        draw(st.sampled_from(MEMORIES)),
        draw(bounds_st()),
        ttft_p95_seconds=draw(st.one_of(st.none(), st.floats(0.1, 5))),
    )
    return state, evidence, context, kinds


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(case_st())
def test_a_retune_stays_in_bounds_and_never_repeats_a_ruled_out_value(
    case: tuple[SglangLoopState, SglangEvidence, SglangContext, tuple[str, ...]],
) -> None:
    state, evidence, context, _ = case
    decision = compute_sglang_decision(state, evidence, context, NOW)
    assert decision == compute_sglang_decision(state, evidence, context, NOW)  # deterministic
    if decision.action != Action.RETUNE:
        assert decision.settings == state.current
        return
    memory, bounds = context.memory, context.bounds
    new = fit.compute_effective(decision.settings, memory)
    assert new != fit.compute_effective(state.current, memory)
    f = fit.fraction_of(new)
    assert (
        f <= fit.compute_fraction_ceiling(new, memory) + 1e-9
        and f <= bounds.max_gpu_memory_utilization + 1e-9
    )
    assert f >= min(bounds.min_gpu_memory_utilization, fit.compute_fraction_ceiling(new, memory)) - 1e-9
    running = new.max_running_requests
    if running is not None and decision.settings.max_running_requests is not None:
        assert running >= bounds.min_max_num_seqs
        assert bounds.max_max_num_seqs is None or running <= bounds.max_max_num_seqs
    if bounds.min_max_model_len is not None and new.context_length is not None:
        assert new.context_length >= min(bounds.min_max_model_len, state.current.context_length or 0)
    if new.kv_cache_dtype != state.current.kv_cache_dtype:  # fp8 only where the bounds allow it
        assert bounds.allow_fp8_kv and new.kv_cache_dtype == sglang.FP8_KV_CACHE_DTYPE
    ruled = [*state.failed, *([decision.failed] if decision.failed else [])]
    for run in ruled:
        assert fit.compute_effective(run.settings, memory) != new
        failed = fit.compute_effective(run.settings, memory)
        if run.kind == "start_memory_short" and fit._same_layout(failed, new):
            assert f > fit.fraction_of(failed)


@PROPERTY
@given(case_st())
def test_the_fraction_moves_the_way_the_failure_says(
    case: tuple[SglangLoopState, SglangEvidence, SglangContext, tuple[str, ...]],
) -> None:
    state, evidence, context, _ = case
    decision = compute_sglang_decision(state, evidence, context, NOW)
    if decision.action != Action.RETUNE or decision.failed is None:
        return
    before = fit.fraction_of(fit.compute_effective(state.current, context.memory))
    after = fit.fraction_of(fit.compute_effective(decision.settings, context.memory))
    bounds = context.bounds
    if not bounds.min_gpu_memory_utilization <= before <= bounds.max_gpu_memory_utilization:
        return  # the bounds moved it first
    if decision.failed.kind == "start_memory_short":
        assert after > before
    else:
        assert after <= before
