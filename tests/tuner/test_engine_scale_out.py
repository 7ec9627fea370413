"""Scale-out recommendations of SGLang's and TGI's own loops (``EngineDecision.scale_out``), as vLLM's
(``tests/tuner/test_scaling.py``): a pressure or latency rule with nothing left to propose holds and
recommends the replicas the window's demand asks for (:func:`kvpilot.tuner.loop.scaling.compute_scale_out`:
running + waiting over running, at least one more), never while the replica count changes, never for a
crash or a rule that still has a change to make."""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import gpus, sglang, tgi
from kvpilot.tuner.loop import (
    Action,
    EngineFailedRun,
    PolicyConfig,
    TgiContext,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    Trigger,
    TuningBounds,
    classify_tgi_restart,
    compute_tgi_decision,
    scaling,
    sglang_fit,
)
from kvpilot.tuner.loop import sglang_rules as srules
from kvpilot.tuner.loop import tgi_rules as trules
from kvpilot.tuner.loop.engine_state import EngineDecision, EngineEvidence
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import SglangContext, SglangLoopState, classify_restart
from kvpilot.tuner.model import build_model_spec, lookup_model_config

NOW = 100_000.0
H100 = gpus.lookup_gpu("H100-SXM")
SGLANG_MEMORY = sglang_fit.SglangMemory(
    H100, build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
)
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."

SGLANG_FLOOR = sglang.SglangSettings(context_length=8192, max_running_requests=64, chunked_prefill_size=2048)
"""The fraction at its ceiling and the prefill chunk at its floor: only fewer running requests are left."""
AT_64 = TuningBounds(min_max_num_seqs=64)
"""...and the running requests may not go below 64."""
TGI_WHOLE_GPU = tgi.TgiSettings(max_total_tokens=8192, max_input_tokens=8000, max_batch_prefill_tokens=8192)
"""``--cuda-memory-fraction`` left at TGI's default, the whole GPU: no more KV to give."""


def window(n: int = 10, **fields: float) -> ObservationWindow:
    samples = tuple(MetricsSample(time=NOW - 30 * (n - 1 - i), **fields) for i in range(n))
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def evidence(w: ObservationWindow, replicas: int = 1, changing: str | None = None) -> EngineEvidence:
    return EngineEvidence(w, (), ready=True, replicas=replicas, replicas_changing=changing)


def decide_sglang(
    w: ObservationWindow,
    *,
    current: sglang.SglangSettings = SGLANG_FLOOR,
    bounds: TuningBounds = AT_64,
    replicas: int = 1,
    changing: str | None = None,
    logs: tuple[str, ...] = (),
    itl: float | None = None,
) -> EngineDecision[sglang.SglangSettings]:
    restarts = tuple(classify_restart(NOW - 10 - i, log, f"pod-{i}") for i, log in enumerate(logs))
    ev = dataclasses.replace(evidence(w, replicas, changing), restarts=restarts)
    context = SglangContext(SGLANG_MEMORY, bounds, PolicyConfig(), None, itl)
    return compute_sglang_decision(SglangLoopState(current), ev, context, NOW)


def decide_tgi(
    w: ObservationWindow,
    *,
    current: tgi.TgiSettings = TGI_WHOLE_GPU,
    failed: tuple[EngineFailedRun[tgi.TgiSettings], ...] = (),
    replicas: int = 1,
    changing: str | None = None,
    logs: tuple[str, ...] = (),
    itl: float | None = None,
) -> EngineDecision[tgi.TgiSettings]:
    restarts = tuple(classify_tgi_restart(NOW - 10 - i, log, f"pod-{i}") for i, log in enumerate(logs))
    ev: TgiEvidence = dataclasses.replace(evidence(w, replicas, changing), restarts=restarts)
    return compute_tgi_decision(
        TgiLoopState(current, failed),
        ev,
        TgiContext(TgiMemory(H100), TuningBounds(), PolicyConfig(), itl),
        NOW,
    )


SGLANG_PRESSURE = window(kv_usage=0.97, preemption_rate=0.5, running=64, waiting=64)
TGI_FULL = window(kv_usage=0.97, running=20, waiting=12)


# --- SGLang ---------------------------------------------------------------------------------------------


def test_sglang_pressure_at_the_floor_recommends_replicas_from_the_demand() -> None:
    d = decide_sglang(SGLANG_PRESSURE, replicas=2)
    assert (d.action, d.trigger) == (Action.HOLD, srules.KV_PRESSURE)
    assert d.scale_out == 4 == scaling.compute_scale_out(SGLANG_PRESSURE, 2)  # 2 x (64 + 64) / 64
    assert d.settings == SGLANG_FLOOR and d.recommended is None


def test_sglang_pressure_with_room_to_tune_retunes_and_recommends_no_replicas() -> None:
    d = decide_sglang(SGLANG_PRESSURE, bounds=TuningBounds(), replicas=2)
    assert (d.action, d.trigger, d.scale_out) == (Action.RETUNE, srules.KV_PRESSURE, None)


def test_sglang_no_scale_out_while_the_replica_count_changes() -> None:
    d = decide_sglang(SGLANG_PRESSURE, replicas=2, changing="1 of 2 replica(s) Ready")
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, srules.KV_PRESSURE, None)


def test_a_metrics_driven_retune_waits_for_the_replica_count_but_a_crash_remedy_does_not() -> None:
    """As vLLM's gate: a window that spans two replica counts judges neither."""
    changing = "a pod joined 40s ago (the metrics window of 300s spans two counts)"
    held = decide_sglang(SGLANG_PRESSURE, bounds=TuningBounds(), replicas=2, changing=changing)
    assert (held.action, held.trigger) == (Action.HOLD, srules.KV_PRESSURE)
    assert f"the replica count is changing ({changing})" in held.reason
    tgi_held = decide_tgi(TGI_FULL, current=tgi.TgiSettings(cuda_memory_fraction=0.8), changing=changing)
    assert tgi_held.action == Action.HOLD and "the replica count is changing" in tgi_held.reason
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    crash = decide_sglang(SGLANG_PRESSURE, bounds=TuningBounds(), changing=changing, logs=(oom,))
    assert crash.action == Action.RETUNE and crash.failed is not None


def test_sglang_the_latency_objective_at_the_floor_recommends_replicas() -> None:
    one = dataclasses.replace(SGLANG_FLOOR, max_running_requests=1)
    slow = window(kv_usage=0.5, running=1, waiting=3, itl_p95=0.08)
    d = decide_sglang(slow, current=one, bounds=TuningBounds(), itl=0.05)
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, srules.LATENCY_SLO, 4)  # 1 x (1 + 3) / 1


def test_sglang_a_crash_with_nothing_left_recommends_no_replicas() -> None:
    floor = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.3, chunked_prefill_size=2048)
    d = decide_sglang(SGLANG_PRESSURE, current=floor, replicas=2, logs=(OOM_TEXT,))
    assert (d.action, d.trigger, d.scale_out) == (Action.INFEASIBLE, srules.RUNTIME_OOM, None)
    assert d.failed is not None


def test_sglang_a_steady_service_recommends_no_replicas() -> None:
    d = decide_sglang(window(kv_usage=0.5, running=8, waiting=0), replicas=2)
    assert (d.trigger, d.scale_out) == (Trigger.STEADY, None)


# --- TGI ------------------------------------------------------------------------------------------------


def test_tgi_a_full_kv_at_the_whole_gpu_holds_and_recommends_replicas() -> None:
    """TGI never evicts: at a full KV with a queue and no more of the GPU to give, only more replicas serve
    the queue (the hold was a ``Steady`` one before scale-out recommendations)."""
    d = decide_tgi(TGI_FULL, replicas=2)
    assert (d.action, d.trigger) == (Action.HOLD, trules.KV_PRESSURE)
    assert d.scale_out == 4 == scaling.compute_scale_out(TGI_FULL, 2)  # ceil(2 x (20 + 12) / 20)
    assert "no eviction" in d.reason and d.settings == TGI_WHOLE_GPU


def test_tgi_a_full_kv_below_the_whole_gpu_asks_for_more_of_it_and_no_replicas() -> None:
    d = decide_tgi(TGI_FULL, current=dataclasses.replace(TGI_WHOLE_GPU, cuda_memory_fraction=0.85))
    assert (d.action, d.trigger, d.scale_out) == (Action.RETUNE, trules.KV_PRESSURE, None)


def test_tgi_a_raise_that_ran_out_of_memory_is_exhausted_pressure_too() -> None:
    below = dataclasses.replace(TGI_WHOLE_GPU, cuda_memory_fraction=0.85)
    raised = decide_tgi(TGI_FULL, current=below).settings
    failed = (EngineFailedRun(raised, "runtime_oom"),)
    d = decide_tgi(TGI_FULL, current=below, failed=failed, replicas=2)
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, trules.KV_PRESSURE, 4)
    assert "ruled out" in d.reason


def test_tgi_a_full_kv_still_lets_the_latency_objective_cut_the_limit() -> None:
    """Pressure with nothing to propose comes after the latency objective, which may still cut the limit."""
    slow = window(kv_usage=0.97, running=20, waiting=12, itl_p95=0.08)
    limited = dataclasses.replace(TGI_WHOLE_GPU, max_concurrent_requests=40)
    d = decide_tgi(slow, current=limited, itl=0.05)
    assert (d.action, d.trigger, d.scale_out) == (Action.RETUNE, trules.LATENCY_SLO, None)


def test_tgi_the_latency_objective_at_the_floor_recommends_replicas() -> None:
    one = dataclasses.replace(TGI_WHOLE_GPU, max_concurrent_requests=1)
    slow = window(kv_usage=0.5, running=1, waiting=0, itl_p95=0.08)
    d = decide_tgi(slow, current=one, replicas=3, itl=0.05)
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, trules.LATENCY_SLO, 4)  # one more


def test_tgi_no_scale_out_while_the_replica_count_changes() -> None:
    d = decide_tgi(TGI_FULL, replicas=2, changing="a pod joined 60s ago")
    assert (d.action, d.trigger, d.scale_out) == (Action.HOLD, trules.KV_PRESSURE, None)


def test_tgi_a_crash_under_pressure_is_answered_and_recommends_no_replicas() -> None:
    d = decide_tgi(TGI_FULL, replicas=2, logs=(OOM_TEXT,))
    assert d.failed is not None and d.trigger == trules.RUNTIME_OOM
    assert d.scale_out is None
