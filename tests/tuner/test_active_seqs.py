"""vLLM 0.33's ``--max-num-active-seqs``: read from the engine's arguments, planned (max_num_seqs stays the
capacity, the cap is reported and refused above it) and known to the closed loop (the running requests are
at the sequence limit at the cap; the sequence rules hold and name it)."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import BUDGET, CURRENT, NOW, context, state_and_evidence, window

from kvpilot.tuner import errors, gpus, vllm
from kvpilot.tuner.loop import candidates, kv_bound, remedies, slo
from kvpilot.tuner.loop.config import LatencySlo, PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.observations import ObservationWindow
from kvpilot.tuner.loop.policy import Action, Decision, Trigger, compute_decision
from kvpilot.tuner.loop.remedies import Situation
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

CAP = 64
BOUNDS = TuningBounds(min_max_model_len=4096)


def capped(cap: int | None = CAP, **fields: object) -> TuningContext:
    return dataclasses.replace(context(BOUNDS, PolicyConfig()), max_num_active_seqs=cap, **fields)


def decide(win: ObservationWindow, ctx: TuningContext, current: EngineSettings = CURRENT) -> Decision:
    state, evidence = state_and_evidence(current, win)
    return compute_decision(state, evidence, ctx, NOW)


# --- the flag, as vLLM 0.33 reads it ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "cap"),
    [
        ([], None),
        (["--max-num-active-seqs", "32"], 32),
        (["--max_num_active_seqs=48"], 48),
        (["--max-num-active-seqs", "32", "--max-num-active-seqs", "16"], 16),  # the last one wins
        (["--max-num-active-seqs", "32", "--max-num-active-seqs", "None"], None),  # optional_type: unset
    ],
)
def test_the_cap_is_read_in_any_spelling(args: list[str], cap: int | None) -> None:
    assert vllm.find_active_seqs(args) == cap
    assert vllm.build_engine_flags(args).max_num_active_seqs == cap
    vllm.check_engine_flags(args)


@pytest.mark.parametrize("value", ["0", "-3", "many", ""])
def test_a_cap_vllm_refuses_is_refused_by_name(value: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs) as caught:
        vllm.check_engine_flags(["--max-num-active-seqs", value])
    assert caught.value.flag == vllm.ACTIVE_SEQS_FLAG


def test_the_cap_has_no_memory_of_its_own_and_admits() -> None:
    assert vllm.ACTIVE_SEQS_FLAG not in vllm.UNMODELLED_MEMORY_FLAGS
    assert vllm.build_engine_flags(["--max-num-active-seqs", "8"]).unmodelled == ()
    assert vllm.compute_admission_limit(256, None) == 256
    assert vllm.compute_admission_limit(256, 64) == 64


# --- the plan -----------------------------------------------------------------------------------------

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
H100 = gpus.lookup_gpu("H100-SXM")


def test_the_plan_sizes_max_num_seqs_and_says_which_limit_admits() -> None:
    model = build_model_spec(LLAMA_8B)
    plain = compute_plan(model, H100, 1, ServingBounds())
    seqs = plain.settings.max_num_seqs
    assert seqs is not None and seqs > 8
    plan = compute_plan(
        model, H100, 1, ServingBounds(), engine=vllm.build_engine_flags(["--max-num-active-seqs", "8"])
    )
    assert plan.settings == plain.settings  # the cap has no memory: the same capacity and memory
    assert plan.budget == plain.budget
    notes = [w for w in plan.warnings if w.startswith("--max-num-active-seqs")]
    assert notes == [vllm.describe_active_seqs_plan(8, seqs)]
    assert "admits the running requests" in notes[0] and f"--max-num-seqs {seqs} sizes" in notes[0]
    assert not [w for w in plan.warnings if "is not in kvpilot's memory model" in w]


def test_a_cap_above_max_num_seqs_is_refused_by_name() -> None:
    """vLLM 0.33: 'max_num_active_seqs (N) cannot be greater than max_num_seqs (M)' (config/scheduler.py)."""
    model = build_model_spec(LLAMA_8B)
    engine = vllm.build_engine_flags(["--max-num-active-seqs", "64"])
    with pytest.raises(errors.InvalidEngineArgs) as caught:
        compute_plan(model, H100, 1, ServingBounds(), pinned=EngineSettings(max_num_seqs=32), engine=engine)
    assert caught.value.flag == vllm.ACTIVE_SEQS_FLAG
    assert "--max-num-active-seqs 64 is above --max-num-seqs 32" in str(caught.value)
    ok = compute_plan(model, H100, 1, ServingBounds(), pinned=EngineSettings(max_num_seqs=64), engine=engine)
    assert ok.settings.max_num_seqs == 64


# --- the closed loop ----------------------------------------------------------------------------------

QUEUE_AT_THE_CAP = window(kv=0.3, waiting=12, running=CAP, prompt=300, output=200)


def test_a_queue_at_the_cap_holds_and_names_the_flag() -> None:
    """64 of 256 run with 12 waiting and the KV cache at 0.30: the cap admits no more. Without the cap the
    loop read it as no queue at the limit (steady); a raise of max_num_seqs would admit nobody."""
    assert decide(QUEUE_AT_THE_CAP, capped(None)).trigger == Trigger.STEADY
    d = decide(QUEUE_AT_THE_CAP, capped())
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, Trigger.IDLE_CAPACITY, CURRENT)
    assert "64 of 64 admitted sequences run" in d.reason
    assert "--max-num-active-seqs 64 admits the running requests" in d.reason
    assert "raise --max-num-active-seqs in the engine's arguments (up to 256)" in d.reason


def test_a_queue_at_the_limit_without_a_cap_still_raises() -> None:
    d = decide(window(kv=0.3, waiting=12, running=256, prompt=300, output=200), capped(None))
    assert (d.action, d.settings.max_num_seqs) == (Action.RETUNE, 320)


def test_the_room_is_measured_at_the_cap() -> None:
    s = _situation(window(kv=0.2, running=CAP, prompt=None, output=None), capped())
    assert s.admission_limit == CAP
    assert remedies.compute_room_seqs(s) == 281  # 0.88 x 64 / 0.2: the samples at the cap are the ones read


def test_kv_pressure_at_the_cap_does_not_cut_below_it() -> None:
    """Preemptions with 64 running at the cap: a cut of max_num_seqs below 64 does not start in vLLM 0.33
    and one above it cuts nothing; the hold says to lower the cap."""
    d = decide(window(kv=0.97, preempt=0.5, running=CAP), capped())
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, Trigger.KV_PRESSURE, CURRENT)
    assert "lower --max-num-active-seqs in the engine's arguments" in d.reason
    bounds = dataclasses.replace(BOUNDS, allow_fp8_kv=True)
    fp8 = decide(window(kv=0.97, preempt=0.5, running=CAP), capped(bounds=bounds))
    assert (fp8.action, fp8.settings.kv_cache_dtype, fp8.settings.max_num_seqs) == (Action.RETUNE, "fp8", 256)


def test_running_at_the_cap_is_not_taken_for_a_full_kv_cache() -> None:
    """KV usage 0.92 with a queue and 64 of 256 running, free GPU memory: without the cap it is KV-bound (a
    larger cache); at the cap it is the cap that holds the queue, and a larger cache is no answer."""
    win = window(kv=0.92, waiting=12, running=CAP, prompt=300, output=200)
    win = dataclasses.replace(
        win,
        samples=tuple(
            dataclasses.replace(x, gpu_memory_free_gib=8.0, gpu_memory_used_gib=71.19) for x in win.samples
        ),
    )
    assert kv_bound.propose_for_kv_bound(_situation(win, capped(None))) is not None
    assert kv_bound.propose_for_kv_bound(_situation(win, capped())) is None


def _situation(win: ObservationWindow, ctx: TuningContext) -> Situation:
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


def test_a_cut_stops_at_the_cap() -> None:
    s = _situation(window(), capped())
    assert candidates.normalize(CURRENT.replace(max_num_seqs=16), s).max_num_seqs == CAP
    assert candidates.normalize(CURRENT.replace(max_num_seqs=128), s).max_num_seqs == 128


def _with_latency(win: ObservationWindow, **fields: float) -> ObservationWindow:
    return dataclasses.replace(win, samples=tuple(dataclasses.replace(x, **fields) for x in win.samples))


def test_latency_objectives_under_the_cap_hold_and_name_it() -> None:
    itl = _with_latency(window(kv=0.6, running=CAP, prompt=400, output=300), itl_p95=0.080)
    d = decide(itl, capped(slo=LatencySlo(itl_p95_seconds=0.050)))
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, slo.LATENCY_SLO, CURRENT)
    assert "lower --max-num-active-seqs" in d.reason
    ttft = _with_latency(window(kv=0.5, running=CAP, waiting=40, prompt=800, output=300), ttft_p95=6.0)
    d = decide(ttft, capped(slo=LatencySlo(ttft_p95_seconds=2.0)))
    assert (d.action, d.trigger, d.settings) == (Action.HOLD, slo.LATENCY_SLO, CURRENT)
    assert "raise --max-num-active-seqs" in d.reason
