"""SGLang's KvPressure rule and an fp8 KV cache (:mod:`kvpilot.tuner.loop.sglang_rules`).

As vLLM's pressure rule (:func:`kvpilot.tuner.loop.remedies.propose_for_pressure`): fp8 where the bounds
allow it (``allow_fp8_kv``: the user's ``allowFp8KvCache`` and the GPU's support, no pinned dtype) and the
cache is not fp8 yet, before running requests are turned away; SGLang's own pool growth (the fraction under
its ceiling) comes first.
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.loop import Action, PolicyConfig, TuningBounds
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop import sglang_rules as rules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import SglangContext, SglangDecision, SglangEvidence, SglangLoopState
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.types import ServingBounds

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = fit.SglangMemory(gpus.lookup_gpu("H100-SXM"), LLAMA)
NOW = 100_000.0
FP8 = TuningBounds(allow_fp8_kv=True)
AT_CEILING = sglang.SglangSettings(context_length=8192, max_running_requests=64, chunked_prefill_size=2048)
"""The fraction at its ceiling (SGLang's default) and the prefill chunk at its floor: no more pool."""


def pressure(n: int = 10, running: float = 64) -> ObservationWindow:
    samples = tuple(
        MetricsSample(
            time=NOW - 30 * (n - 1 - i), kv_usage=0.97, preemption_rate=0.5, running=running, waiting=5
        )
        for i in range(n)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(current: sglang.SglangSettings, bounds: TuningBounds, running: float = 64) -> SglangDecision:
    return compute_sglang_decision(
        SglangLoopState(current, (), ()),
        SglangEvidence(pressure(running=running), (), ready=True),
        SglangContext(H100, bounds, PolicyConfig(), None, None),
        NOW,
    )


def test_pressure_at_the_ceiling_switches_to_fp8_where_allowed_before_the_cut() -> None:
    decision = decide(AT_CEILING, FP8)
    assert decision.action == Action.RETUNE and decision.trigger == rules.KV_PRESSURE
    assert decision.settings.kv_cache_dtype == "fp8_e4m3"
    assert decision.settings.max_running_requests == 64 and decision.settings.mem_fraction_static is None
    before = fit.predict_pool_tokens(fit.compute_effective(AT_CEILING, H100), H100) or 0
    after = fit.predict_pool_tokens(fit.compute_effective(decision.settings, H100), H100) or 0
    assert after >= 2 * before - 1


def test_at_the_lower_bound_of_running_requests_fp8_is_what_is_left() -> None:
    current = sglang.SglangSettings(context_length=8192, max_running_requests=1, chunked_prefill_size=2048)
    held = decide(current, TuningBounds(), running=1)
    assert held.action != Action.RETUNE and held.settings.kv_cache_dtype is None
    switched = decide(current, FP8, running=1)
    assert switched.action == Action.RETUNE and switched.settings.kv_cache_dtype == "fp8_e4m3"


def test_not_when_disallowed_unsupported_or_already_fp8() -> None:
    for bounds in (
        TuningBounds(),
        TuningBounds.from_serving(ServingBounds(allow_fp8_kv=True), fp8_supported=False),
    ):
        cut = decide(AT_CEILING, bounds)
        assert cut.settings.kv_cache_dtype is None and (cut.settings.max_running_requests or 0) < 64
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        already = decide(dataclasses.replace(AT_CEILING, kv_cache_dtype=dtype), FP8)
        assert already.settings.kv_cache_dtype == dtype and (already.settings.max_running_requests or 0) < 64


def test_under_the_ceiling_the_fraction_grows_first() -> None:
    current = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.7, max_running_requests=64)
    grown = decide(current, FP8)
    assert grown.action == Action.RETUNE and (grown.settings.mem_fraction_static or 0) > 0.7
    assert grown.settings.kv_cache_dtype is None
