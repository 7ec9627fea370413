"""SGLang's and TGI's loops weigh a metrics-driven change against its restart, as vLLM's does
(:mod:`kvpilot.tuner.loop.restart_trade`, :func:`kvpilot.tuner.loop.engine_chain.choose`): a small gain on a
rollout that loses capacity (Recreate, Replace) is held with vLLM's words, the same on a surge goes ahead, a
condition that persists wins its restart after a while, and a crash remedy or a rollback is never weighed.

The gains are asked of each engine's :func:`compute_gain_fraction` and the costs of the policy's defaults,
never written down: the tests say which side of the trade a case is on.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner import gpus, sglang, tgi
from kvpilot.tuner.loop import (
    Action,
    PolicyConfig,
    TgiDecision,
    Trigger,
    classify_tgi_restart,
    restart_trade,
    tgi_rules,
)
from kvpilot.tuner.loop import sglang_fit as sfit
from kvpilot.tuner.loop import tgi_fit as tfit
from kvpilot.tuner.loop.decision import compute_cooldown
from kvpilot.tuner.loop.engine_state import EngineEvidence, EngineHold, EngineLoopState, EngineRollout
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY, KV_PRESSURE
from kvpilot.tuner.loop.sglang_policy import compute_gain_fraction as sglang_gain
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import SglangChange, SglangContext, SglangDecision, classify_restart
from kvpilot.tuner.loop.tgi_fit import TgiMemory, TgiSituation
from kvpilot.tuner.loop.tgi_policy import compute_gain_fraction as tgi_gain
from kvpilot.tuner.loop.tgi_policy import compute_tgi_decision
from kvpilot.tuner.loop.tgi_state import TgiChange, TgiContext
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = gpus.lookup_gpu("H100-SXM")
NOW = 100_000.0
POLICY = PolicyConfig()
COOLDOWN = compute_cooldown(POLICY)
RESTART = POLICY.restart_seconds
NOT_WORTH = "it is not worth a restart (expected gain"
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
PROVEN = NOW - 3000.0
"""The plan, long enough ago that its flags are proven and no gate but the trade holds a change."""


def window(kv: float, running: float, waiting: float, preemption: float | None = None) -> ObservationWindow:
    samples = tuple(
        MetricsSample(
            time=NOW - 30 * (9 - i), kv_usage=kv, running=running, waiting=waiting, preemption_rate=preemption
        )
        for i in range(10)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def held_for(trigger: str, seconds: float) -> tuple[EngineHold, ...]:
    """The history's newest holds: the loop has held for ``trigger`` for ``seconds``."""
    return (EngineHold(NOW - seconds, trigger),)


# --- SGLang ---------------------------------------------------------------------------------------------

SGLANG = sglang.SglangSettings(context_length=8192, max_running_requests=32)
SGLANG_CONTEXT = SglangContext(sfit.SglangMemory(H100, LLAMA), policy=POLICY)
SHALLOW = window(kv=0.2, running=32, waiting=2)
"""A queue of two at the running-request limit with the pool mostly free: a raise admits two, 1/16 of the
running requests."""


def decide_sglang(
    w: ObservationWindow,
    lost: float,
    *,
    current: sglang.SglangSettings = SGLANG,
    holds: tuple[EngineHold, ...] = (),
    logs: tuple[str, ...] = (),
    restart_seconds: float | None = None,
    rollout: EngineRollout[sglang.SglangSettings] | None = None,
    last_good: sglang.SglangSettings | None = None,
) -> SglangDecision:
    restarts = tuple(classify_restart(NOW - 10 - i, log, f"pod-{i}") for i, log in enumerate(logs))
    state = EngineLoopState(
        current, (), (SglangChange(PROVEN, "Planned", planned=True),), rollout, last_good, holds
    )
    evidence = EngineEvidence(
        w, restarts, restart_seconds=restart_seconds, ready=True, rollout_lost_fraction=lost
    )
    return compute_sglang_decision(state, evidence, SGLANG_CONTEXT, NOW)


def test_sglang_a_small_gain_on_a_recreate_rollout_is_held_with_the_trades_message() -> None:
    decision = decide_sglang(SHALLOW, 1.0)
    assert decision.action == Action.HOLD and decision.trigger == IDLE_CAPACITY
    assert NOT_WORTH in decision.reason
    assert f"restart cost {RESTART:.0f}s" in decision.reason
    recommended = decision.recommended
    assert recommended is not None and (recommended.max_running_requests or 0) > 32


def test_sglang_the_same_on_a_surge_goes_ahead() -> None:
    decision = decide_sglang(SHALLOW, 0.0)
    assert decision.action == Action.RETUNE and decision.trigger == IDLE_CAPACITY


def test_sglang_a_replace_loses_its_share_of_the_replicas() -> None:
    """Replacing one of ten replicas at a time loses a tenth of the restart: the same small gain outweighs
    that."""
    share = sglang_gain(
        sfit_situation(SHALLOW), IDLE_CAPACITY, dataclasses.replace(SGLANG, max_running_requests=64), COOLDOWN
    )
    assert share * COOLDOWN < RESTART and share * COOLDOWN > 0.1 * RESTART
    assert decide_sglang(SHALLOW, 0.1).action == Action.RETUNE


def test_sglang_a_deep_queue_is_worth_a_recreate() -> None:
    decision = decide_sglang(window(kv=0.13, running=32, waiting=1200), 1.0)
    assert decision.action == Action.RETUNE and decision.trigger == IDLE_CAPACITY


def test_sglang_a_persisting_condition_wins_its_restart_after_a_while() -> None:
    assert decide_sglang(SHALLOW, 1.0, holds=held_for(IDLE_CAPACITY, 60)).action == Action.HOLD
    later = decide_sglang(SHALLOW, 1.0, holds=held_for(IDLE_CAPACITY, 3000))
    assert later.action == Action.RETUNE
    # held for another trigger since: the queue's own hold starts again
    other = (EngineHold(NOW - 3000, IDLE_CAPACITY), EngineHold(NOW - 60, KV_PRESSURE))
    assert decide_sglang(SHALLOW, 1.0, holds=other).action == Action.HOLD


def test_sglang_the_measured_restart_is_the_cost() -> None:
    """A service that restarts in 10 s loses little even on a recreate."""
    assert decide_sglang(SHALLOW, 1.0, restart_seconds=10.0).action == Action.RETUNE


def test_sglang_few_retractions_are_not_worth_a_recreate_many_are() -> None:
    """A retraction every 17 s among 200 running requests throws a seventh of them away over the cooldown:
    not worth a recreate's restart; two a second are."""
    current = sglang.SglangSettings(context_length=8192, max_running_requests=256)
    few = window(kv=0.97, running=200, waiting=0, preemption=0.06)
    held = decide_sglang(few, 1.0, current=current)
    assert held.action == Action.HOLD and held.trigger == KV_PRESSURE
    assert NOT_WORTH in held.reason
    assert decide_sglang(few, 0.0, current=current).action == Action.RETUNE
    many = window(kv=0.97, running=200, waiting=0, preemption=2.0)
    assert decide_sglang(many, 1.0, current=current).action == Action.RETUNE


def test_sglang_a_crash_remedy_ignores_the_trade() -> None:
    decision = decide_sglang(SHALLOW, 1.0, logs=(OOM_TEXT,))
    assert decision.action == Action.RETUNE and decision.failed is not None
    assert NOT_WORTH not in decision.reason


def test_sglang_a_rollback_ignores_the_trade() -> None:
    new = dataclasses.replace(SGLANG, max_running_requests=40)
    rollout = EngineRollout(new, NOW - 120, NOW + 600, NOW + 100)
    decision = decide_sglang(SHALLOW, 1.0, current=new, rollout=rollout, last_good=SGLANG, logs=(OOM_TEXT,))
    assert decision.action == Action.ROLLBACK and decision.settings == SGLANG


def sfit_situation(w: ObservationWindow) -> sfit.SglangSituation:
    memory = SGLANG_CONTEXT.memory
    return sfit.SglangSituation(
        current=SGLANG,
        effective=sfit.compute_effective(SGLANG, memory),
        window=w,
        memory=memory,
        failed=(),
        bounds=SGLANG_CONTEXT.bounds,
        policy=POLICY,
        now=NOW,
    )


def test_sglangs_gain_in_its_own_terms() -> None:
    s = sfit_situation(SHALLOW)
    raised = dataclasses.replace(SGLANG, max_running_requests=64)
    assert sglang_gain(s, IDLE_CAPACITY, raised, COOLDOWN) == pytest.approx(2 / 32)
    pressure = sfit_situation(window(kv=0.97, running=64, waiting=0, preemption=0.1))
    assert sglang_gain(pressure, KV_PRESSURE, SGLANG, COOLDOWN) == pytest.approx(0.1 * COOLDOWN / 64)
    # a restart SGLang's "KV cache pool is full" explains threw every running request away
    assert sglang_gain(pressure, KV_PRESSURE, SGLANG, COOLDOWN, pool_full_texts=1) == restart_trade.WHOLE
    assert sglang_gain(s, "LatencySlo", SGLANG, COOLDOWN) == restart_trade.WHOLE


# --- TGI ------------------------------------------------------------------------------------------------

TGI = tgi.TgiSettings(
    max_total_tokens=8192, max_input_tokens=8000, max_batch_prefill_tokens=8192, max_concurrent_requests=32
)
TGI_CONTEXT = TgiContext(TgiMemory(H100, LLAMA), policy=POLICY)
BINDING = window(kv=0.4, running=30, waiting=2)
"""The admission limit binding (30 running, 2 queued, of 32) with KV tokens to spare: a raise admits the
two queued, 1/15 of the running requests."""


def decide_tgi(
    w: ObservationWindow,
    lost: float,
    *,
    current: tgi.TgiSettings = TGI,
    holds: tuple[EngineHold, ...] = (),
    logs: tuple[str, ...] = (),
    rollout: EngineRollout[tgi.TgiSettings] | None = None,
    last_good: tgi.TgiSettings | None = None,
) -> TgiDecision:
    restarts = tuple(classify_tgi_restart(NOW - 10 - i, log, f"pod-{i}") for i, log in enumerate(logs))
    state = EngineLoopState(
        current, (), (TgiChange(PROVEN, "Planned", planned=True),), rollout, last_good, holds
    )
    evidence = EngineEvidence(w, restarts, ready=True, rollout_lost_fraction=lost)
    return compute_tgi_decision(state, evidence, TGI_CONTEXT, NOW)


def test_tgi_a_small_gain_on_a_recreate_rollout_is_held_with_the_trades_message() -> None:
    decision = decide_tgi(BINDING, 1.0)
    assert decision.action == Action.HOLD and decision.trigger == IDLE_CAPACITY
    assert NOT_WORTH in decision.reason
    recommended = decision.recommended
    assert recommended is not None and (recommended.max_concurrent_requests or 0) > 32


def test_tgi_the_same_on_a_surge_goes_ahead() -> None:
    decision = decide_tgi(BINDING, 0.0)
    assert decision.action == Action.RETUNE and decision.trigger == IDLE_CAPACITY


def test_tgi_a_persisting_condition_wins_its_restart_after_a_while() -> None:
    assert decide_tgi(BINDING, 1.0, holds=held_for(IDLE_CAPACITY, 60)).action == Action.HOLD
    assert decide_tgi(BINDING, 1.0, holds=held_for(IDLE_CAPACITY, 3000)).action == Action.RETUNE


def test_tgi_the_429_rate_is_the_raises_demand() -> None:
    """The limit binding with no queue but 429s: each refusal over the cooldown is a request's work lost (as
    vLLM's preemptions); a refusal a second is worth a recreate, one every few minutes is not."""
    refusing = tuple(dataclasses.replace(x, waiting=0.0, rejected_rate=1.0) for x in BINDING.samples)
    many = dataclasses.replace(BINDING, samples=refusing)
    assert decide_tgi(many, 1.0).action == Action.RETUNE
    rare = tuple(dataclasses.replace(x, rejected_rate=0.005) for x in refusing)
    held = decide_tgi(dataclasses.replace(BINDING, samples=rare), 1.0)
    assert held.action == Action.HOLD and NOT_WORTH in held.reason
    raised = dataclasses.replace(TGI, max_concurrent_requests=52)
    s = tgi_situation(dataclasses.replace(BINDING, samples=rare))
    assert tgi_gain(s, IDLE_CAPACITY, raised, COOLDOWN) == pytest.approx(0.005 * COOLDOWN / 30)
    assert tgi_gain(tgi_situation(many), IDLE_CAPACITY, raised, COOLDOWN) == pytest.approx(20 / 30)


def tgi_situation(w: ObservationWindow) -> TgiSituation:
    memory = TGI_CONTEXT.memory
    return TgiSituation(
        current=TGI,
        effective=tfit.compute_effective(TGI, memory),
        window=w,
        memory=memory,
        failed=(),
        bounds=TGI_CONTEXT.bounds,
        policy=POLICY,
        now=NOW,
    )


def test_tgi_a_deep_queue_is_worth_a_recreate() -> None:
    decision = decide_tgi(window(kv=0.4, running=20, waiting=12), 1.0)
    assert decision.action == Action.RETUNE and decision.trigger == IDLE_CAPACITY


def test_tgi_pressure_more_kv_for_a_short_queue_waits_on_a_recreate() -> None:
    """The KV full with a short queue: more KV (a larger fraction) admits the queue, a small share of the
    running requests, held on a recreate; at the whole GPU nothing is proposed to weigh (TGI never evicts:
    the queue waits for room, and a cut of the admission limit would only refuse it), so no trade."""
    below = dataclasses.replace(TGI, cuda_memory_fraction=0.85)
    short = window(kv=0.97, running=30, waiting=1)
    held = decide_tgi(short, 1.0, current=below)
    assert held.action == Action.HOLD and held.trigger == tgi_rules.KV_PRESSURE
    assert NOT_WORTH in held.reason
    assert decide_tgi(short, 0.0, current=below).action == Action.RETUNE
    whole = decide_tgi(short, 1.0)
    assert whole.action == Action.HOLD and NOT_WORTH not in whole.reason
    assert "never" in whole.reason or "no eviction" in whole.reason


def test_tgi_a_crash_remedy_ignores_the_trade() -> None:
    decision = decide_tgi(BINDING, 1.0, logs=(OOM_TEXT,))
    assert decision.action == Action.RETUNE and decision.failed is not None
    assert NOT_WORTH not in decision.reason


def test_tgi_a_rollback_ignores_the_trade() -> None:
    new = dataclasses.replace(TGI, max_concurrent_requests=40)
    rollout = EngineRollout(new, NOW - 120, NOW + 600, NOW + 100)
    decision = decide_tgi(BINDING, 1.0, current=new, rollout=rollout, last_good=TGI, logs=(OOM_TEXT,))
    assert (decision.action, decision.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)


# --- the shared arithmetic: vLLM's -----------------------------------------------------------------------


def test_the_engine_neutral_arithmetic_is_vllms() -> None:
    trade = restart_trade.weigh(0.1, cooldown_seconds=480, restart_seconds=180, lost_fraction=1.0)
    assert (trade.gain_seconds, trade.cost_seconds, trade.worth_it) == (pytest.approx(48.0), 180.0, False)
    longer = restart_trade.weigh(
        0.1, cooldown_seconds=480, restart_seconds=180, lost_fraction=1.0, persisted_seconds=1500
    )
    assert longer.worth_it and longer.horizon_seconds == 1980
    assert restart_trade.compute_persisted_seconds(NOW - 7200, NOW, 3600) == 3600
    assert restart_trade.compute_persisted_seconds(None, NOW, 3600) == 0
