"""Hypothesis properties of TGI's closed-loop policy over arbitrary inputs.

- a retune stays within the bounds (the fraction in [the floor, 1], the admission limit and
  ``--max-total-tokens`` within theirs), is a set of flags TGI takes, and changes something;
- a retune never proposes what the history (or the crash it answers) ruled out;
- each crash moves its own knob the way its remedy says (a prefill OOM never raises the prefill, a run-time
  OOM never raises the fraction, a ``max_total_tokens`` failure never lowers it);
- the same inputs give the same decision;
- a latency objective only ever shortens the steps: fewer admitted requests or prefill tokens, never more,
  never a shorter prompt or request served;
- an idle raise (the admission limit binding by running + queued at it or by the router's 429s) stays within
  the KV's measured room and the flap guard.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpilot.tuner import gpus, tgi
from kvpilot.tuner.loop import (
    Action,
    EngineFailedRun,
    TgiChange,
    TgiContext,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    TuningBounds,
    classify_tgi_restart,
    compute_tgi_decision,
    engine_room,
)
from kvpilot.tuner.loop import tgi_fit as fit
from kvpilot.tuner.loop.engine_latency import LATENCY_SLO
from kvpilot.tuner.loop.observations import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
NOW = 100_000.0
MEMORIES = (
    TgiMemory(gpus.lookup_gpu("H100-SXM"), LLAMA),
    TgiMemory(gpus.lookup_gpu("L4"), LLAMA),
    TgiMemory(gpus.lookup_gpu("A100-40GB"), None),
)
LOGS = {
    "start_oom": tgi.prefill_tokens_error(8192),
    "start_memory_short": tgi.max_total_tokens_error(16384),
    "runtime_oom": "torch.OutOfMemoryError: CUDA out of memory.",
    "kv_pressure": '{"error":"Model is overloaded","error_type":"overloaded"}',
    "other": "Segmentation fault",
}


@st.composite
def settings_st(draw: st.DrawFn) -> tgi.TgiSettings:
    total = draw(st.one_of(st.none(), st.sampled_from([2048, 8192, 16384, 32768])))
    max_input = total - 1 if total is not None and draw(st.booleans()) else None
    return tgi.TgiSettings(
        max_input_tokens=max_input,
        max_total_tokens=total,
        max_batch_prefill_tokens=draw(st.one_of(st.none(), st.sampled_from([1024, 4096, 8192, 16384]))),
        max_concurrent_requests=draw(st.one_of(st.none(), st.integers(1, 512))),
        cuda_memory_fraction=draw(st.one_of(st.none(), st.integers(50, 100).map(lambda x: x / 100))),
    )


failed_st = st.lists(
    st.builds(
        EngineFailedRun,
        settings_st(),
        st.sampled_from(["start_memory_short", "start_oom", "runtime_oom", "rollout_failed"]),
    ),
    max_size=4,
)


@st.composite
def bounds_st(draw: st.DrawFn) -> TuningBounds:
    lo_s = draw(st.integers(1, 64))
    return TuningBounds(
        min_max_num_seqs=lo_s,
        max_max_num_seqs=draw(st.one_of(st.none(), st.integers(lo_s, 1024))),
        min_gpu_memory_utilization=draw(st.integers(30, 90).map(lambda x: x / 100)),
        min_max_model_len=draw(st.one_of(st.none(), st.sampled_from([1024, 4096, 8192]))),
    )


@st.composite
def window_st(draw: st.DrawFn) -> ObservationWindow:
    n = draw(st.integers(0, 12))
    usage = draw(st.one_of(st.sampled_from([0.3, 0.95]), st.floats(0, 1)))
    running = draw(st.floats(0, 600))
    waiting = draw(st.sampled_from([0.0, 5.0, 50.0]))
    itl = draw(st.one_of(st.none(), st.floats(0.001, 1.0)))
    rejected = draw(st.one_of(st.none(), st.sampled_from([0.0, 2.0]), st.floats(0, 100)))  # 429s a second
    samples = tuple(
        MetricsSample(
            NOW - 30 * (n - 1 - i), usage, None, running, waiting, itl_p95=itl, rejected_rate=rejected
        )
        for i in range(n)
    )
    prompt = draw(st.one_of(st.none(), st.sampled_from([200.0, 3000.0]).map(LengthSummary)))
    return ObservationWindow(NOW - 300, NOW, samples, prompt_tokens=prompt, pods=1)


Case = tuple[TgiLoopState, TgiEvidence, TgiContext]


@st.composite
def case_st(draw: st.DrawFn) -> Case:
    kinds = draw(st.lists(st.sampled_from(sorted(LOGS)), max_size=2))
    restarts = tuple(classify_tgi_restart(NOW - 5 - i, LOGS[k], f"pod-{i}") for i, k in enumerate(kinds))
    changes = tuple(
        TgiChange(NOW - t, "IdleCapacity") for t in draw(st.lists(st.integers(1, 20000), max_size=2))
    )
    current = draw(settings_st())
    proven = draw(st.booleans())  # the current flags the last good ones: the metrics rules may act
    state = TgiLoopState(current, tuple(draw(failed_st)), changes, last_good=current if proven else None)
    objective = draw(st.one_of(st.none(), st.sampled_from([0.02, 0.05])))
    context = TgiContext(draw(st.sampled_from(MEMORIES)), draw(bounds_st()), itl_p95_seconds=objective)
    return state, TgiEvidence(draw(window_st()), restarts), context


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(case_st())
def test_a_retune_stays_in_bounds_and_never_repeats_a_ruled_out_value(case: Case) -> None:
    state, evidence, context = case
    decision = compute_tgi_decision(state, evidence, context, NOW)
    assert decision == compute_tgi_decision(state, evidence, context, NOW)  # deterministic
    if decision.action != Action.RETUNE:
        assert decision.settings == state.current
        return
    memory, bounds = context.memory, context.bounds
    tgi.check_settings(decision.settings)  # TGI takes it
    new = fit.compute_effective(decision.settings, memory)
    assert new != fit.compute_effective(state.current, memory)
    fraction = fit.fraction_of(new)
    if decision.settings.cuda_memory_fraction is not None:
        assert bounds.min_gpu_memory_utilization - 1e-9 <= fraction <= 1.0
    limit = decision.settings.max_concurrent_requests
    if limit is not None and limit != state.current.max_concurrent_requests:
        assert limit >= bounds.min_max_num_seqs
        assert bounds.max_max_num_seqs is None or limit <= bounds.max_max_num_seqs
    total = decision.settings.max_total_tokens
    if total is not None and total != state.current.max_total_tokens and bounds.min_max_model_len:
        assert total >= bounds.min_max_model_len
    ruled = [*state.failed, *([decision.failed] if decision.failed else [])]
    for run in ruled:
        assert fit.compute_effective(run.settings, memory) != new
    situation = fit.TgiSituation(
        state.current, new, evidence.window, memory, tuple(ruled), bounds, context.policy
    )
    assert not fit.is_ruled_out(decision.settings, situation)


@PROPERTY
@given(case_st())
def test_each_crash_moves_its_own_knob_the_way_its_remedy_says(case: Case) -> None:
    state, evidence, context = case
    decision = compute_tgi_decision(state, evidence, context, NOW)
    if decision.action != Action.RETUNE or decision.failed is None:
        return
    before = fit.compute_effective(state.current, context.memory)
    after = fit.compute_effective(decision.settings, context.memory)
    if not context.bounds.min_gpu_memory_utilization <= fit.fraction_of(before):
        return  # the bounds moved the fraction first
    kind = decision.failed.kind
    if kind == "start_oom":
        assert (after.max_batch_prefill_tokens or 0) <= (before.max_batch_prefill_tokens or 1 << 30)
        assert fit.fraction_of(after) >= fit.fraction_of(before)
    if kind == "runtime_oom":
        assert fit.fraction_of(after) <= fit.fraction_of(before)
    if kind == "start_memory_short":
        assert fit.fraction_of(after) >= fit.fraction_of(before)


@PROPERTY
@given(case_st())
def test_a_latency_retune_only_shortens_the_steps(case: Case) -> None:
    state, evidence, context = case
    decision = compute_tgi_decision(state, evidence, context, NOW)
    chosen = decision.settings if decision.action == Action.RETUNE else decision.recommended
    if decision.trigger != LATENCY_SLO or chosen is None:
        return
    memory = context.memory
    situation = fit.TgiSituation(
        state.current,
        fit.compute_effective(state.current, memory),
        evidence.window,
        memory,
        (),
        context.bounds,
        context.policy,
    )
    before = fit.compute_effective(fit.clamp(situation.effective, situation), memory)  # the bounds first
    after = fit.compute_effective(chosen, memory)
    assert fit.concurrency_of(after) <= fit.concurrency_of(before)
    assert (after.max_batch_prefill_tokens or 0) <= (before.max_batch_prefill_tokens or 1 << 30)
    assert after.max_input_tokens == before.max_input_tokens
    assert after.max_total_tokens == before.max_total_tokens
    assert fit.fraction_of(after) == fit.fraction_of(before)


@PROPERTY
@given(case_st(), st.integers(2, 512), st.integers(1, 7000), st.sampled_from(["KvPressure", "LatencySlo"]))
def test_an_idle_raise_never_goes_back_to_what_pressure_found_too_many_within_the_hour(
    case: Case, found: int, ago: int, trigger: str
) -> None:
    state, evidence, context = case
    before = tgi.TgiSettings(max_concurrent_requests=found)
    after = state.current
    changes = (TgiChange(NOW - ago, trigger, before=before, after=after),)
    state = TgiLoopState(state.current, state.failed, changes, last_good=state.last_good)
    decision = compute_tgi_decision(state, evidence, context, NOW)
    chosen = decision.settings if decision.action == Action.RETUNE else decision.recommended
    if decision.trigger != "IdleCapacity" or chosen is None:
        return
    memory = context.memory
    effective = fit.compute_effective(state.current, memory)
    situation = fit.TgiSituation(
        state.current, effective, evidence.window, memory, (), context.bounds, context.policy
    )
    if fit.compute_effective(fit.clamp(effective, situation), memory) != effective:
        return  # the bounds move the flags first
    limit, now = fit.concurrency_of(chosen), fit.concurrency_of(state.current)
    assert limit > now
    if ago < context.policy.flap_guard_seconds:
        assert limit < found


@PROPERTY
@given(case_st())
def test_an_idle_raise_stays_within_the_room_the_window_measured(case: Case) -> None:
    state, evidence, context = case
    state = TgiLoopState(state.current, state.failed, (), last_good=state.current)
    decision = compute_tgi_decision(state, evidence, context, NOW)
    chosen = decision.settings if decision.action == Action.RETUNE else decision.recommended
    if decision.trigger != "IdleCapacity" or chosen is None:
        return
    memory = context.memory
    effective = fit.compute_effective(state.current, memory)
    situation = fit.TgiSituation(
        state.current, effective, evidence.window, memory, (), context.bounds, context.policy
    )
    if fit.compute_effective(fit.clamp(effective, situation), memory) != effective:
        return  # the bounds move the flags first
    limit, now = fit.concurrency_of(chosen), fit.concurrency_of(state.current)
    room = engine_room.measure_room(evidence.window, context.policy)
    assert limit > now
    assert room is None or limit <= room
