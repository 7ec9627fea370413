"""SGLang's and TGI's loops read dcgm-exporter's framebuffer as vLLM's does (issue 29): the engine-neutral
early warning (:func:`kvpilot.tuner.loop.gpu_memory.detect_memory_warning`) answered in each engine's flags
-- a *smaller* ``--mem-fraction-static`` (SGLang) or ``--cuda-memory-fraction`` (TGI) ahead of a run-time
OOM, else the OOM rule's next remedy -- one step, urgent (no cooldown), never a crash."""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import gpus, sglang, tgi
from kvpilot.tuner.loop import (
    Action,
    PolicyConfig,
    TgiChange,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    Trigger,
    TuningBounds,
    compute_tgi_decision,
    gpu_memory,
)
from kvpilot.tuner.loop import sglang_fit as sfit
from kvpilot.tuner.loop import sglang_rules as srules
from kvpilot.tuner.loop import tgi_fit as tfit
from kvpilot.tuner.loop import tgi_rules as trules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import KV_PRESSURE
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = gpus.lookup_gpu("H100-SXM")
SGLANG_H100 = sfit.SglangMemory(H100, LLAMA)
TGI_H100 = TgiMemory(H100, LLAMA)
NOW = 100_000.0
TOTAL_GIB = 80.0
EVIDENCE = "(dcgm-exporter): below 1.60 GiB now, ahead of a CUDA OOM"
"""The floor on an 80 GiB GPU: 2 % of it (``gpu_memory_free_min_fraction``) beats the 1 GiB minimum."""


def window(
    free: float | None = 0.5, n: int = 10, kv: float | None = 0.6, running: float = 8
) -> ObservationWindow:
    """A serving window with dcgm-exporter's framebuffer (``free`` GiB of 80; ``None``: no exporter)."""
    used = None if free is None else TOTAL_GIB - free
    samples = tuple(
        MetricsSample(
            time=NOW - 30 * (n - 1 - i),
            kv_usage=kv,
            running=running,
            waiting=0,
            gpu_memory_free_gib=free,
            gpu_memory_used_gib=used,
        )
        for i in range(n)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


# --- the shared detection ---------------------------------------------------------------------------------


def test_the_detection_is_vllms_floor_and_evidence_for_every_engine() -> None:
    warning = gpu_memory.detect_memory_warning(window(0.5).samples, PolicyConfig())
    assert warning is not None and warning.below_now and warning.floor_gib == 1.6
    assert warning.describe() == f"GPU memory free 0.50 GiB of 80.0 GiB {EVIDENCE}"
    assert gpu_memory.detect_memory_warning(window(None).samples, PolicyConfig()) is None
    assert gpu_memory.detect_memory_warning(window(10.0).samples, PolicyConfig()) is None
    # dcgm-exporter shows the GPU filling before the engine serves: start-up is no warning
    assert gpu_memory.detect_memory_warning(window(0.5, kv=None).samples, PolicyConfig()) is None


# --- SGLang: a smaller --mem-fraction-static (the memory outside it ran short) --------------------------

SGLANG = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84, max_running_requests=64)


def decide_sglang(
    current: sglang.SglangSettings = SGLANG,
    w: ObservationWindow | None = None,
    *,
    bounds: TuningBounds | None = None,
    changes: tuple[SglangChange, ...] = (),
) -> SglangDecision:
    return compute_sglang_decision(
        SglangLoopState(current, (), changes),
        SglangEvidence(w or window(), (), ready=True),
        SglangContext(SGLANG_H100, bounds or TuningBounds(), PolicyConfig()),
        NOW,
    )


def test_sglang_low_free_memory_while_serving_lowers_the_fraction_ahead_of_the_oom() -> None:
    decision = decide_sglang()
    assert (decision.action, decision.trigger) == (Action.RETUNE, gpu_memory.GPU_MEMORY_PRESSURE)
    assert sfit.fraction_of(sfit.compute_effective(decision.settings, SGLANG_H100)) < 0.84  # smaller
    assert decision.settings.chunked_prefill_size == SGLANG.chunked_prefill_size
    assert decision.settings.max_running_requests == 64
    assert EVIDENCE in decision.reason and "--mem-fraction-static 0.84" in decision.reason
    assert decision.failed is None  # not a crash: the current flags are not ruled out


def test_sglang_without_dcgm_telemetry_changes_nothing() -> None:
    decision = decide_sglang(w=window(None))
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.STEADY)
    roomy = decide_sglang(w=window(12.0))
    assert (roomy.action, roomy.trigger) == (Action.HOLD, Trigger.STEADY)


def test_sglang_at_the_fractions_lower_bound_takes_the_oom_rules_next_remedy_then_holds() -> None:
    at_bound = decide_sglang(bounds=TuningBounds(min_gpu_memory_utilization=0.84))
    assert (at_bound.action, at_bound.trigger) == (Action.RETUNE, gpu_memory.GPU_MEMORY_PRESSURE)
    chunk = sfit.compute_effective(SGLANG, SGLANG_H100).chunked_prefill_size
    assert chunk is not None and at_bound.settings.chunked_prefill_size == chunk // 2
    assert sfit.fraction_of(sfit.compute_effective(at_bound.settings, SGLANG_H100)) == 0.84
    floors = dataclasses.replace(SGLANG, chunked_prefill_size=PolicyConfig().batched_tokens_floor)
    cut = decide_sglang(floors, bounds=TuningBounds(min_gpu_memory_utilization=0.84))
    assert cut.action == Action.RETUNE and (cut.settings.max_running_requests or 64) < 64
    bottom = TuningBounds(min_gpu_memory_utilization=0.84, min_max_num_seqs=64)
    held = decide_sglang(floors, bounds=bottom)
    assert (held.action, held.trigger) == (Action.HOLD, gpu_memory.GPU_MEMORY_PRESSURE)
    assert EVIDENCE in held.reason and "holding" in held.reason and held.failed is None


def test_sglang_early_warning_skips_the_cooldown_but_not_the_minimum_interval() -> None:
    recent = decide_sglang(changes=(SglangChange(NOW - 200, KV_PRESSURE),))
    assert (recent.action, recent.trigger) == (Action.RETUNE, gpu_memory.GPU_MEMORY_PRESSURE)
    too_soon = decide_sglang(changes=(SglangChange(NOW - 30, KV_PRESSURE),))
    assert (too_soon.action, too_soon.trigger) == (Action.HOLD, gpu_memory.GPU_MEMORY_PRESSURE)
    assert "only 30s since the last change" in too_soon.reason and too_soon.recommended is not None
    assert too_soon.failed is None


def test_sglang_memory_falling_towards_the_floor_warns_within_the_horizon() -> None:
    samples = tuple(  # 3.0 -> 2.1 GiB free, above the 1.60 floor, falling 0.20 GiB/min: under it in 600 s
        dataclasses.replace(x, gpu_memory_free_gib=3.0 - 0.1 * i, gpu_memory_used_gib=77.0 + 0.1 * i)
        for i, x in enumerate(window().samples)
    )
    decision = decide_sglang(w=ObservationWindow(NOW - 300, NOW, samples, pods=1))
    assert (decision.action, decision.trigger) == (Action.RETUNE, gpu_memory.GPU_MEMORY_PRESSURE)
    assert "falling 0.20 GiB/min: below 1.60 GiB within 600s" in decision.reason


# --- TGI: a smaller --cuda-memory-fraction (the share its warm-up sizes the KV from) ---------------------

TGI = tgi.TgiSettings(max_total_tokens=8192, max_input_tokens=8000, max_batch_prefill_tokens=8192)


def decide_tgi(
    current: tgi.TgiSettings = TGI,
    w: ObservationWindow | None = None,
    *,
    bounds: TuningBounds | None = None,
    changes: tuple[TgiChange, ...] = (),
) -> TgiDecision:
    return compute_tgi_decision(
        TgiLoopState(current, (), changes),
        TgiEvidence(w or window(), (), ready=True),
        TgiContext(TGI_H100, bounds or TuningBounds(), PolicyConfig()),
        NOW,
    )


def test_tgi_low_free_memory_while_serving_lowers_the_fraction_ahead_of_the_oom() -> None:
    decision = decide_tgi()
    assert (decision.action, decision.trigger) == (Action.RETUNE, trules.GPU_MEMORY_PRESSURE)
    lowered = decision.settings.cuda_memory_fraction
    assert lowered is not None and lowered < 1.0
    assert decision.settings.max_batch_prefill_tokens == TGI.max_batch_prefill_tokens
    assert EVIDENCE in decision.reason and "--cuda-memory-fraction 1.0" in decision.reason
    assert decision.failed is None


def test_tgi_without_dcgm_telemetry_changes_nothing() -> None:
    decision = decide_tgi(w=window(None))
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.STEADY)


def test_tgi_at_the_fractions_lower_bound_halves_the_prefill_then_holds() -> None:
    lowered = decide_tgi().settings.cuda_memory_fraction
    assert lowered is not None
    current = dataclasses.replace(TGI, cuda_memory_fraction=lowered)
    at_bound = decide_tgi(current, bounds=TuningBounds(min_gpu_memory_utilization=lowered))
    assert (at_bound.action, at_bound.trigger) == (Action.RETUNE, trules.GPU_MEMORY_PRESSURE)
    assert at_bound.settings.max_batch_prefill_tokens == 4096
    assert tfit.fraction_of(tfit.compute_effective(at_bound.settings, TGI_H100)) == lowered
    floor = dataclasses.replace(current, max_batch_prefill_tokens=16, max_input_tokens=8)
    held = decide_tgi(floor, bounds=TuningBounds(min_gpu_memory_utilization=lowered))
    assert (held.action, held.trigger) == (Action.HOLD, trules.GPU_MEMORY_PRESSURE)
    assert EVIDENCE in held.reason and "holding" in held.reason and held.failed is None


def test_tgi_early_warning_skips_the_cooldown_and_is_not_a_crash() -> None:
    recent = decide_tgi(changes=(TgiChange(NOW - 200, trules.KV_PRESSURE),))
    assert (recent.action, recent.trigger) == (Action.RETUNE, trules.GPU_MEMORY_PRESSURE)
    assert recent.failed is None
    too_soon = decide_tgi(changes=(TgiChange(NOW - 30, trules.KV_PRESSURE),))
    assert too_soon.action == Action.HOLD and "only 30s" in too_soon.reason


def test_the_engines_share_vllms_trigger() -> None:
    assert srules.GPU_MEMORY_PRESSURE == trules.GPU_MEMORY_PRESSURE == gpu_memory.GPU_MEMORY_PRESSURE
