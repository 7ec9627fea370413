"""Latency objectives in the policy (kvpilot.tuner.loop.slo)."""

from __future__ import annotations

import dataclasses

from policy_fixtures import CURRENT, NOW, context, state_and_evidence, window

from kvpilot.tuner.loop import slo
from kvpilot.tuner.loop.config import LatencySlo, PolicyConfig, TuningBounds
from kvpilot.tuner.loop.observations import ObservationWindow
from kvpilot.tuner.loop.policy import Action, Decision, compute_decision
from kvpilot.tuner.types import EngineSettings


def with_fields(win: ObservationWindow, **fields: float | None) -> ObservationWindow:
    return dataclasses.replace(win, samples=tuple(dataclasses.replace(s, **fields) for s in win.samples))


def decide(
    win: ObservationWindow,
    objective: LatencySlo | None,
    current: EngineSettings = CURRENT,
    history: tuple = (),
) -> Decision:
    state, evidence = state_and_evidence(current, win, history=history)
    ctx = dataclasses.replace(context(TuningBounds(min_max_model_len=4096), PolicyConfig()), slo=objective)
    return compute_decision(state, evidence, ctx, NOW)


ITL_50MS = LatencySlo(itl_p95_seconds=0.050)
TTFT_2S = LatencySlo(ttft_p95_seconds=2.0)
CHAT = EngineSettings(
    max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
)


def test_an_inter_token_latency_violation_cuts_sequences() -> None:
    win = with_fields(window(kv=0.6, running=200, prompt=400, output=300), itl_p95=0.080)
    d = decide(win, ITL_50MS, CHAT)
    assert d.action == Action.RETUNE and d.trigger == slo.LATENCY_SLO
    assert d.settings.max_num_seqs is not None and d.settings.max_num_seqs <= 200 * 0.05 / 0.08 + 1
    assert "inter-token latency p95 80 ms above the 50 ms objective" in d.reason


def test_with_long_prompts_smaller_prefill_chunks_come_first() -> None:
    win = with_fields(window(kv=0.6, running=100, prompt=12000, output=300), itl_p95=0.080)
    d = decide(win, ITL_50MS, CHAT)
    assert d.action == Action.RETUNE
    assert d.settings.max_num_batched_tokens == 4096 and d.settings.max_num_seqs == CHAT.max_num_seqs


def test_within_the_objective_nothing_changes_and_raises_stop_near_it() -> None:
    # a queue at the sequence limit with an empty KV cache would raise max_num_seqs ...
    idle = window(kv=0.2, running=256, waiting=30, prompt=400, output=300)
    assert decide(idle, None, CHAT).settings.max_num_seqs > 256
    # ... but not while the inter-token latency is within 10 % of its objective
    near = with_fields(idle, itl_p95=0.047)
    d = decide(near, ITL_50MS, CHAT)
    assert d.action == Action.HOLD and d.settings == CHAT
    # well below it, the raise goes ahead
    assert decide(with_fields(idle, itl_p95=0.020), ITL_50MS, CHAT).settings.max_num_seqs > 256


def test_a_ttft_violation_with_a_queue_and_kv_room_raises_sequences() -> None:
    win = with_fields(window(kv=0.5, running=250, waiting=40, prompt=800, output=300), ttft_p95=6.0)
    d = decide(win, TTFT_2S, CHAT)
    assert d.action == Action.RETUNE and d.trigger == slo.LATENCY_SLO
    assert d.settings.max_num_seqs is not None and d.settings.max_num_seqs > 256
    assert "time to first token p95 6000 ms above the 2000 ms objective" in d.reason


def test_a_ttft_violation_without_a_queue_from_long_prompts_raises_the_prefill_budget() -> None:
    win = with_fields(window(kv=0.5, running=20, waiting=0, prompt=30000, output=300), ttft_p95=6.0)
    d = decide(win, TTFT_2S, CHAT)
    assert d.action == Action.RETUNE and d.settings.max_num_batched_tokens == 16384


def test_a_ttft_violation_when_the_kv_cache_is_full_is_not_answered_with_more_sequences() -> None:
    win = with_fields(window(kv=0.97, running=250, waiting=40, prompt=800, output=300), ttft_p95=6.0)
    d = decide(win, TTFT_2S, CHAT)
    assert d.trigger != slo.LATENCY_SLO or d.settings.max_num_seqs <= 256
