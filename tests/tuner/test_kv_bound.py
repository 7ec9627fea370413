"""A queue held back by a full KV cache grows the cache (kvpilot.tuner.loop.kv_bound)."""

from __future__ import annotations

import dataclasses

from policy_fixtures import BUDGET, NOW, context, entry, state_and_evidence, window

from kvpilot.tuner.loop import kv_bound, remedies
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.observations import ObservationWindow, RestartKind
from kvpilot.tuner.loop.policy import Action, Decision, compute_decision
from kvpilot.tuner.types import EngineSettings

TOTAL_GIB = 79.19
BIG = dataclasses.replace(
    BUDGET, kv_bytes_per_token=327680, kv_cache_tokens=30000, available_kv_cache_gib=9.16
)
"""A 70B-class model at the edge of an H100: 30k KV tokens of 320 KiB; 2.5 GiB of activations."""
CURRENT = EngineSettings(
    max_model_len=4096, max_num_seqs=64, gpu_memory_utilization=0.90, max_num_batched_tokens=8192
)


def with_gpu(win: ObservationWindow, free_gib: float) -> ObservationWindow:
    """dcgm-exporter's framebuffer on every sample: ``free_gib`` free of :data:`TOTAL_GIB`."""
    samples = tuple(
        dataclasses.replace(s, gpu_memory_free_gib=free_gib, gpu_memory_used_gib=TOTAL_GIB - free_gib)
        for s in win.samples
    )
    return dataclasses.replace(win, samples=samples)


def held_back(**kw: float) -> ObservationWindow:
    """30 requests wait while 20 of 64 sequences run in an 86 % full KV cache that preempts."""
    return window(kv=0.86, preempt=0.2, running=20, waiting=30, prompt=1000, output=200, capacity=30000, **kw)


def decide(
    win: ObservationWindow, current: EngineSettings = CURRENT, history: tuple = (), budget: object = BIG
) -> Decision:
    tokens = win.kv_capacity_tokens
    big = dataclasses.replace(BIG, kv_cache_tokens=tokens) if tokens else BIG
    state, evidence = state_and_evidence(
        current,
        win,
        history=history,
        observed_kv_tokens=tokens,
        budget=big if budget is BIG else budget,  # type: ignore[arg-type]
    )
    return compute_decision(state, evidence, context(TuningBounds(), PolicyConfig()), NOW)


def test_telemetry_with_free_memory_raises_utilisation_and_halves_the_prefill_chunk() -> None:
    d = decide(with_gpu(held_back(), free_gib=8.0))
    assert d.action == Action.RETUNE and d.trigger == kv_bound.KV_BOUND
    # 8 GiB free, twice the 1.58 GiB early-warning floor kept: at most one 0.05 step
    assert d.settings.gpu_memory_utilization == 0.95
    assert d.settings.max_num_batched_tokens == 4096
    assert d.settings.max_num_seqs == CURRENT.max_num_seqs  # more sequences would not be admitted
    assert "30.0 requests wait while 20 of 64 sequences run" in d.reason


def test_the_raise_is_what_the_fullest_gpu_has_free_beyond_the_margin() -> None:
    d = decide(with_gpu(held_back(), free_gib=5.0))
    # (5.0 - 2 x 1.58) / 79.19 = 0.023 -> one 0.02 step
    assert d.settings.gpu_memory_utilization == 0.92


def test_without_telemetry_only_the_prefill_chunk_is_cut() -> None:
    d = decide(held_back())
    assert d.trigger == kv_bound.KV_BOUND
    assert d.settings.gpu_memory_utilization == CURRENT.gpu_memory_utilization
    assert d.settings.max_num_batched_tokens == 4096
    assert "no GPU memory telemetry" in d.reason


def test_a_chunk_cut_that_frees_too_little_for_the_cache_is_not_made() -> None:
    # an 8B model: 2.5 GiB of activations against 54 GiB of KV cache, half the chunk frees ~1 %
    win = window(kv=0.86, preempt=0.2, running=20, waiting=30, prompt=1000, output=200, capacity=None)
    assert decide(win, budget=BUDGET).trigger != kv_bound.KV_BOUND


def test_never_back_up_to_a_utilisation_that_ran_out_of_memory() -> None:
    oom = entry(
        7200, trigger=RestartKind.CUDA_OOM, before=CURRENT.replace(gpu_memory_utilization=0.93), after=CURRENT
    )
    d = decide(with_gpu(held_back(), free_gib=8.0), history=(oom,))
    assert d.settings.gpu_memory_utilization == 0.92


def test_a_saturated_sequence_limit_is_not_kv_bound() -> None:
    # 62 of 64 run: the limit holds them, the idle-capacity rule's business
    win = with_gpu(window(kv=0.85, running=62, waiting=30, prompt=1000, output=200, capacity=30000), 8.0)
    assert kv_bound.propose_for_kv_bound(_situation(win)) is None


def test_no_queue_no_change() -> None:
    win = with_gpu(window(kv=0.95, preempt=0.2, running=20, waiting=0, capacity=30000), 8.0)
    assert kv_bound.propose_for_kv_bound(_situation(win)) is None


def test_at_the_floor_of_the_prefill_chunk_and_without_free_memory_it_falls_through() -> None:
    current = CURRENT.replace(max_num_batched_tokens=2048)
    s = _situation(with_gpu(held_back(), free_gib=2.0), current)
    assert kv_bound.propose_for_kv_bound(s) is None


def test_chunks_never_go_below_the_mean_prompt() -> None:
    win = window(kv=0.9, preempt=0.2, running=20, waiting=30, prompt=6000, output=200, capacity=30000)
    current = CURRENT.replace(max_model_len=32768)
    assert kv_bound.propose_for_kv_bound(_situation(win, current)) is None


def test_kv_pressure_grows_the_cache_before_cutting_sequences() -> None:
    # two long requests preempt each other: a few per cent more blocks keeps both
    win = with_gpu(
        window(kv=0.97, preempt=0.2, running=2, waiting=20, prompt=40000, output=500, capacity=95696), 5.3
    )
    current = EngineSettings(
        max_model_len=93696, max_num_seqs=16, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
    )
    d = decide(win, current)
    assert d.trigger == remedies.KV_PRESSURE
    # and, in the same rollout, the limit cut to what the larger cache holds (2 x 40k below 0.90 of ~100k
    # tokens): at 16 vLLM would keep admitting a third request and preempting
    assert d.settings.gpu_memory_utilization == 0.94 and d.settings.max_num_seqs == 2


def test_growth_keeps_the_limit_when_the_larger_cache_holds_it() -> None:
    win = with_gpu(
        window(kv=0.93, preempt=0.2, running=16, waiting=20, prompt=1000, output=500, capacity=30000), 5.3
    )
    current = EngineSettings(
        max_model_len=32768, max_num_seqs=16, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
    )
    pressure = remedies.propose_for_pressure(_situation(win, current))
    assert pressure is not None
    grown = kv_bound.with_growth(_situation(win, current), pressure)
    # 30,000 x 0.80 / 1,250 = 19 sequences fit already: the growth candidates keep 16, the cut stays last
    assert len(grown.candidates) > len(pressure.candidates)
    assert [c.max_num_seqs for c in grown.candidates[:-1]] == [16] * (len(grown.candidates) - 1)
    assert grown.candidates[-1] == pressure.candidates[-1]


def test_the_trade_counts_what_the_larger_cache_admits() -> None:
    from kvpilot.tuner.loop import trade

    win = held_back()
    share = trade.compute_gain_fraction(kv_bound.KV_BOUND, win, CURRENT, CURRENT, 600.0, kv_growth=1.05)
    assert abs(share - 0.05) < 1e-9  # 30 waiting per 20 running, but 5 % more blocks admit 5 %
    assert trade.compute_gain_fraction(kv_bound.KV_BOUND, win, CURRENT, CURRENT, 600.0, kv_growth=3.0) == 1.0


def _situation(win: ObservationWindow, current: EngineSettings = CURRENT) -> remedies.Situation:
    ctx = context(TuningBounds(), PolicyConfig())
    return remedies.Situation(
        current=current,
        effective=remedies.compute_effective(current, ctx),
        budget=BIG,
        window=win,
        context=ctx,
        history=(),
        now=NOW,
        capacity_tokens=30000,
    )


def at_the_limit(**kw: float) -> ObservationWindow:
    """30 requests wait while all 64 sequences run with the KV cache at its 0.88 target: no room left."""
    return window(kv=0.88, running=64, waiting=30, prompt=200, output=100, capacity=30000, **kw)


def test_a_queue_at_the_limit_with_the_room_spent_grows_the_cache_and_the_limit_together() -> None:
    # without telemetry only the halved chunk: its freed activation memory holds 4 more sequences
    blind = decide(at_the_limit())
    assert blind.trigger == remedies.IDLE_CAPACITY
    assert (blind.settings.gpu_memory_utilization, blind.settings.max_num_batched_tokens) == (0.90, 4096)
    assert blind.settings.max_num_seqs == 68
    d = decide(with_gpu(at_the_limit(), free_gib=8.0))
    assert d.action == Action.RETUNE and d.trigger == remedies.IDLE_CAPACITY
    assert d.settings.gpu_memory_utilization == 0.95 and d.settings.max_num_batched_tokens == 4096
    # 64 sequences fill 0.88 of 30k tokens; 0.05 more of 79 GiB and half the chunk add ~13k+ tokens
    assert 84 <= d.settings.max_num_seqs <= 100
    assert "no room for more at 0.88" in d.reason


def test_without_room_or_growth_the_band_holds() -> None:
    current = CURRENT.replace(max_num_batched_tokens=2048)  # the chunk at its floor, no telemetry
    d = decide(at_the_limit(), current)
    assert d.action == Action.HOLD


def test_a_raise_of_utilisation_alone_is_cheaper_on_a_warm_compile_cache() -> None:
    """The prefill chunk is already below twice the mean prompt, so only ``gpu_memory_utilization`` rises:
    outside vLLM's compile hash, so pods that keep the compile cache on a volume restart without the 30 s
    compile. 229 s gained against a 230 s restart holds; against 200 s it goes."""
    current = CURRENT.replace(max_num_batched_tokens=2048)
    win = window(kv=0.86, preempt=0.2, running=20, waiting=30, prompt=1500, output=200, capacity=30000)
    decisions, ctx = {}, context(TuningBounds(), PolicyConfig())
    for persistent in (False, True):
        state, evidence = state_and_evidence(
            current, with_gpu(win, free_gib=8.0), observed_kv_tokens=30000, budget=BIG, restart_seconds=230.0
        )
        evidence = dataclasses.replace(
            evidence, rollout_lost_fraction=1.0, compile_cache_persistent=persistent
        )
        decisions[persistent] = compute_decision(state, evidence, ctx, NOW)
    assert decisions[False].action == Action.HOLD
    assert "expected gain 229s of full capacity over 530s, restart cost 230s" in decisions[False].reason
    assert decisions[True].action == Action.RETUNE
    assert decisions[True].settings == current.replace(gpu_memory_utilization=0.95)


def short_of_room(**kw: float) -> ObservationWindow:
    """80 requests wait while all 64 sequences run with the KV cache at 0.70: room for 80 at 0.88 by the
    usage per sequence (0.70 / 64 each), not for the 144 the queue asks for."""
    return window(kv=0.70, running=64, waiting=80, prompt=100, output=50, capacity=30000, **kw)


def test_a_queue_beyond_the_room_grows_the_cache_and_the_limit_in_one_rollout() -> None:
    """The raise the current cache allows (80) would leave most of the queue waiting: the larger cache and
    what it holds go in the same rollout, not in a second one a cooldown (and a restart) later."""
    blind = decide(short_of_room())  # no telemetry: only the halved chunk's freed activations
    assert (blind.trigger, blind.settings.max_num_seqs) == (remedies.IDLE_CAPACITY, 85)
    assert (blind.settings.gpu_memory_utilization, blind.settings.max_num_batched_tokens) == (0.90, 4096)
    assert "room for 80 at 0.88, fewer than the 144 the queue asks for" in blind.reason
    d = decide(with_gpu(short_of_room(), free_gib=8.0))
    assert d.action == Action.RETUNE and d.trigger == remedies.IDLE_CAPACITY
    assert d.settings.gpu_memory_utilization == 0.95
    assert d.settings.max_num_seqs > 85


def test_a_raise_that_drains_the_queue_keeps_the_cache() -> None:
    """5 waiting at 64 running: 80 sequences drain them, so the cache stays as it is."""
    d = decide(with_gpu(window(kv=0.70, running=64, waiting=5, prompt=100, output=50, capacity=30000), 8.0))
    assert d.trigger == remedies.IDLE_CAPACITY
    assert d.settings.gpu_memory_utilization == CURRENT.gpu_memory_utilization
    assert d.settings.max_num_batched_tokens == CURRENT.max_num_batched_tokens
    assert 64 < d.settings.max_num_seqs <= 80


def test_measured_room_and_a_deep_queue_take_the_raise_in_one_step() -> None:
    """8 sequences run at KV usage 0.30 with 40 waiting: the window measures room for 22 (the fewer of
    0.88 / (0.30 / 8) = 23 and 30k x 0.88 / 1,150 tokens), past the step (+25 % to +100 % by the queue)
    that caps a raise without that evidence; the queue asks for 48, so 22 in one rollout rather than 16
    and then 22. No larger cache (the chunk at its floor, no telemetry)."""
    current = CURRENT.replace(max_num_seqs=8, max_num_batched_tokens=2048)
    win = window(kv=0.30, running=8, waiting=40, prompt=1000, output=300, capacity=30000)
    d = decide(win, current)
    assert (d.action, d.trigger, d.settings.max_num_seqs) == (Action.RETUNE, remedies.IDLE_CAPACITY, 22)
    few = decide(window(kv=0.30, running=8, waiting=4, prompt=1000, output=300, capacity=30000), current)
    assert few.settings.max_num_seqs == 12  # a shallow queue: the step, +50 % (4 waiting per 8 running)


def test_prompts_already_longer_than_the_chunk_get_a_smaller_one() -> None:
    """Without telemetry only the halved chunk grows the cache. It splits no prompt that the chunk holds
    whole (6000-token prompts in 8192: each would take two steps, held), but prompts already longer than
    the chunk (12,000 in 8192) are chunked either way: halved, they take more, cheaper steps."""
    current = CURRENT.replace(max_model_len=16384)

    def rag(prompt: float) -> ObservationWindow:
        return window(kv=0.89, running=2, waiting=12, prompt=prompt, output=300, capacity=30000)

    whole = decide(rag(6000), current)
    assert whole.action == Action.HOLD or whole.settings.max_num_batched_tokens == 8192
    chunked = decide(rag(12000), current)
    assert chunked.action == Action.RETUNE and chunked.trigger == kv_bound.KV_BOUND
    assert chunked.settings.max_num_batched_tokens == 4096
