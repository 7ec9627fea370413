"""TGI's closed loop (:func:`kvpilot.tuner.loop.compute_tgi_decision`): its start-up failures and run-time
OOM remedied, its metrics rules, the gates, and its rollouts judged as SGLang's (the shared
:mod:`kvpilot.tuner.loop.engine_rollout`)."""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner import engines, gpus, tgi
from kvpilot.tuner.loop import (
    Action,
    EngineFailedRun,
    PolicyConfig,
    TgiChange,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    TgiRollout,
    Trigger,
    TuningBounds,
    classify_tgi_restart,
    compute_tgi_decision,
)
from kvpilot.tuner.loop import tgi_fit as fit
from kvpilot.tuner.loop import tgi_rules as rules
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = gpus.lookup_gpu("H100-SXM")
BARE = TgiMemory(H100)
"""No model: only TGI's fixed defaults fill the settings in."""
MODELLED = TgiMemory(H100, LLAMA)
NOW = 100_000.0
POLICY = PolicyConfig()
BOUNDS = TuningBounds()
CURRENT = tgi.TgiSettings(max_total_tokens=8192, max_input_tokens=8000, max_batch_prefill_tokens=8192)
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def window(kv: float = 0.5, running: float = 8, waiting: float = 0, n: int = 10) -> ObservationWindow:
    samples = tuple(
        MetricsSample(time=NOW - 30 * (n - 1 - i), kv_usage=kv, running=running, waiting=waiting)
        for i in range(n)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(
    current: tgi.TgiSettings = CURRENT,
    *,
    logs: tuple[tuple[float, str], ...] = (),
    w: ObservationWindow | None = None,
    memory: TgiMemory = BARE,
    bounds: TuningBounds = BOUNDS,
    failed: tuple[EngineFailedRun[tgi.TgiSettings], ...] = (),
    changes: tuple[TgiChange, ...] = (),
    rollout: TgiRollout | None = None,
    last_good: tgi.TgiSettings | None = None,
    ready: bool = False,
) -> TgiDecision:
    restarts = tuple(classify_tgi_restart(t, log, f"pod-{i}") for i, (t, log) in enumerate(logs))
    return compute_tgi_decision(
        TgiLoopState(current, failed, changes, rollout, last_good),
        TgiEvidence(w or window(), restarts, ready=ready),
        TgiContext(memory, bounds, POLICY),
        NOW,
    )


# --- the seam and the flags -----------------------------------------------------------------------


def test_the_seam_classifies_tgis_failures_by_their_remedy() -> None:
    engine = engines.TgiEngine()
    prefill = engine.classify_failure(tgi.prefill_tokens_error(8192))
    total = engine.classify_failure(tgi.max_total_tokens_error(32768))
    oom = engine.classify_failure("shard 0 died\n" + OOM_TEXT)
    overloaded = engine.classify_failure('{"error":"Model is overloaded"}')
    assert prefill is not None and (prefill.kind, prefill.memory_share_direction) == ("start_oom", 0)
    assert total is not None and (total.kind, total.memory_share_direction) == ("start_memory_short", 1)
    assert oom is not None and (oom.kind, oom.memory_share_direction) == ("runtime_oom", -1)
    assert oom.text == OOM_TEXT
    assert overloaded is not None and overloaded.kind == "kv_pressure"
    assert engine.metrics.kv_used_tokens == "tgi_batch_current_max_tokens"


def test_flags_read_back_from_a_container_are_what_was_rendered() -> None:
    settings = tgi.TgiSettings(max_total_tokens=4096, max_concurrent_requests=64, cuda_memory_fraction=0.9)
    args = ["--model-id", "m", "--port", "80", *tgi.build_tgi_args(settings), "--json-output"]
    assert tgi.parse_tgi_args(args) == settings
    assert tgi.parse_tgi_args(["--max-total-tokens=2048"]) == tgi.TgiSettings(max_total_tokens=2048)


# --- crash rules ----------------------------------------------------------------------------------


def test_a_warmup_prefill_that_does_not_fit_halves_the_prefill_it_names() -> None:
    decision = decide(logs=((NOW - 10, tgi.prefill_tokens_error(8192)),))
    assert (decision.action, decision.trigger) == (Action.RETUNE, rules.START_OOM)
    assert decision.settings.max_batch_prefill_tokens == 4096
    assert decision.failed is not None and decision.failed.kind == "start_oom"
    assert decision.failed.settings.max_batch_prefill_tokens == 8192


def test_the_failed_run_records_the_prefill_tgi_ran_where_the_flags_left_it_to_tgi() -> None:
    defaults = tgi.TgiSettings()  # mode Recommend: TGI's own defaults run
    decision = decide(defaults, logs=((NOW - 10, tgi.prefill_tokens_error(4096)),), memory=MODELLED)
    assert decision.failed is not None and decision.failed.settings.max_batch_prefill_tokens == 4096
    assert decision.settings.max_batch_prefill_tokens == 2048


def test_a_prefill_already_failed_at_half_is_never_retried() -> None:
    half = dataclasses.replace(CURRENT, max_batch_prefill_tokens=4096)
    failed = (EngineFailedRun(fit.compute_effective(half, BARE), "start_oom"),)
    decision = decide(logs=((NOW - 10, tgi.prefill_tokens_error(8192)),), failed=failed)
    assert decision.settings.max_batch_prefill_tokens == 2048


def test_a_prefill_at_its_floor_with_the_whole_gpu_is_infeasible() -> None:
    floor = dataclasses.replace(CURRENT, max_batch_prefill_tokens=256, max_input_tokens=200)
    decision = decide(floor, logs=((NOW - 10, tgi.prefill_tokens_error(256)),))
    assert decision.action == Action.INFEASIBLE and decision.settings == floor
    assert decision.failed is not None


def test_a_max_total_tokens_below_the_whole_gpu_gets_the_whole_gpu_first() -> None:
    current = dataclasses.replace(CURRENT, cuda_memory_fraction=0.8)
    decision = decide(current, logs=((NOW - 10, tgi.max_total_tokens_error(8192)),))
    assert (decision.action, decision.trigger) == (Action.RETUNE, rules.START_MEMORY_SHORT)
    assert decision.settings.cuda_memory_fraction is None  # TGI's default, 1.0, left unset
    assert decision.settings.max_total_tokens == 8192


def test_a_max_total_tokens_the_kv_cannot_hold_is_shortened_within_the_min_context() -> None:
    decision = decide(logs=((NOW - 10, tgi.max_total_tokens_error(8192)),))
    assert decision.trigger == rules.START_MEMORY_SHORT
    total, max_input = decision.settings.max_total_tokens, decision.settings.max_input_tokens
    assert total is not None and max_input is not None
    assert total < 8192 and total % POLICY.context_multiple == 0 and max_input < total


def test_the_min_context_stops_the_shortening_and_the_prefill_is_halved_instead() -> None:
    bounds = TuningBounds(min_max_model_len=8192)
    decision = decide(logs=((NOW - 10, tgi.max_total_tokens_error(8192)),), bounds=bounds)
    assert decision.action == Action.RETUNE
    assert decision.settings.max_total_tokens == 8192 and decision.settings.max_batch_prefill_tokens == 4096


def test_the_memory_model_sizes_the_shorter_max_total_tokens() -> None:
    gpu = gpus.lookup_gpu("L4")
    memory = TgiMemory(gpu, LLAMA)
    inferred = fit.predict_kv_tokens(fit.compute_effective(tgi.TgiSettings(), memory), memory)
    assert inferred is not None and inferred < 65536
    wanted = tgi.TgiSettings(max_total_tokens=65536, max_input_tokens=65535)
    decision = decide(wanted, logs=((NOW - 10, tgi.max_total_tokens_error(65536)),), memory=memory)
    total = decision.settings.max_total_tokens
    assert total is not None and inferred * 0.9 < total <= inferred
    assert any("infers" in line for line in decision.explanation)


def test_a_run_time_oom_lowers_the_fraction_then_the_prefill() -> None:
    first = decide(logs=((NOW - 10, OOM_TEXT),))
    assert (first.action, first.trigger) == (Action.RETUNE, rules.RUNTIME_OOM)
    lowered = first.settings.cuda_memory_fraction
    assert lowered is not None and lowered < 1.0
    assert first.settings.max_batch_prefill_tokens == CURRENT.max_batch_prefill_tokens
    again = first.settings
    failed = (EngineFailedRun(fit.compute_effective(again, BARE), "runtime_oom"),)
    bounds = TuningBounds(min_gpu_memory_utilization=lowered)
    second = decide(again, logs=((NOW - 10, OOM_TEXT),), failed=failed, bounds=bounds)
    assert second.settings.max_batch_prefill_tokens == 4096


def test_run_time_ooms_that_a_step_did_not_cure_double_the_next_step() -> None:
    """TGI's OOM names only the allocation that failed: a second OOM below the first takes twice VPA's
    step, a third four times (0.02 x (2^k - 1) after k OOMs, not 0.02 x k)."""
    at = dataclasses.replace(CURRENT, cuda_memory_fraction=1.0)
    first = decide(at, logs=((NOW - 10, OOM_TEXT),))
    assert first.settings.cuda_memory_fraction == 0.98  # VPA's step: the headroom 0, its 0.02 floor
    ran = (EngineFailedRun(fit.compute_effective(at, BARE), "runtime_oom"),)
    second = decide(first.settings, logs=((NOW - 10, OOM_TEXT),), failed=ran)
    assert second.settings.cuda_memory_fraction == 0.94
    assert any("x2 after 1 OOM(s) above it" in line for line in second.explanation)
    ran += (EngineFailedRun(fit.compute_effective(first.settings, BARE), "runtime_oom"),)
    third = decide(second.settings, logs=((NOW - 10, OOM_TEXT),), failed=ran)
    assert third.settings.cuda_memory_fraction == 0.86
    # a failure of another kind above it is no repeat of this one: VPA's step alone
    other = (EngineFailedRun(fit.compute_effective(at, BARE), "rollout_failed"),)
    alone = decide(first.settings, logs=((NOW - 10, OOM_TEXT),), failed=other)
    assert alone.settings.cuda_memory_fraction == 0.96


def test_a_restart_no_text_explains_holds() -> None:
    decision = decide(logs=((NOW - 10, "Segmentation fault"),))
    assert (decision.action, decision.trigger) == (Action.HOLD, "Other")
    assert "TGI's failure texts" in decision.reason


# --- metrics rules --------------------------------------------------------------------------------


def test_the_admission_limit_binding_with_spare_kv_raises_it_to_the_measured_room() -> None:
    limited = dataclasses.replace(CURRENT, max_concurrent_requests=32)
    decision = decide(limited, w=window(kv=0.4, running=24, waiting=8), ready=True)
    assert (decision.action, decision.trigger) == (Action.RETUNE, IDLE_CAPACITY)
    assert decision.settings.max_concurrent_requests == 52  # 0.88 x 24 running / 0.4 used, in one raise


def test_the_raise_stops_at_the_upper_bound() -> None:
    limited = dataclasses.replace(CURRENT, max_concurrent_requests=32)
    decision = decide(limited, w=window(kv=0.4, running=32), bounds=TuningBounds(max_max_num_seqs=32))
    assert decision.action == Action.HOLD and decision.trigger == IDLE_CAPACITY
    assert "upper bound" in decision.reason


def test_a_full_kv_with_a_queue_at_the_whole_gpu_neither_raises_nor_cuts_the_limit() -> None:
    """TGI's scheduler admits a request into the batch only when the tokens it may reach fit the KV
    (``next_batch`` within ``max_batch_total_tokens``) and never evicts one: at a full KV the batch is what
    the KV holds and the queue waits for room, with no recompute to stop. A limit cut below the running
    batch (vLLM's answer to preemption) would leave KV tokens idle and answer 429 to requests the queue
    would have served (the closed-loop bench's ``tgi-kv-pressure``: 128 -> 47 served 1,843 tok/s where 128
    served 1,880, and 1,908 against 2,133 with a 2048-token prefill). Nothing to change: hold."""
    limited = dataclasses.replace(CURRENT, max_concurrent_requests=32)
    decision = decide(limited, w=window(kv=0.97, running=20, waiting=12), ready=True)
    assert decision.action == Action.HOLD
    assert decision.settings.max_concurrent_requests == 32


def test_a_full_kv_below_the_whole_gpu_asks_for_more_of_it() -> None:
    current = dataclasses.replace(CURRENT, cuda_memory_fraction=0.85)
    decision = decide(current, w=window(kv=0.97, running=20, waiting=12), ready=True)
    assert decision.trigger == rules.KV_PRESSURE and decision.settings.cuda_memory_fraction == 0.9


def test_a_quiet_service_holds_steady_and_its_flags_become_good() -> None:
    decision = decide(w=window(kv=0.3, running=2), ready=True)
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.STEADY)
    assert decision.good == CURRENT


def test_a_metrics_driven_change_waits_out_the_cooldown_and_says_what_it_would_do() -> None:
    limited = dataclasses.replace(CURRENT, max_concurrent_requests=32)
    changes = (TgiChange(NOW - 200, IDLE_CAPACITY),)  # 7 samples since: enough, but within the cooldown
    decision = decide(limited, w=window(kv=0.4, running=24, waiting=8), changes=changes)
    assert (decision.action, decision.trigger) == (Action.HOLD, IDLE_CAPACITY)
    assert "cooldown" in decision.reason
    assert decision.recommended is not None and decision.recommended.max_concurrent_requests == 52


def test_a_crash_remedy_skips_the_cooldown() -> None:
    changes = (TgiChange(NOW - 200, IDLE_CAPACITY),)
    decision = decide(logs=((NOW - 10, tgi.prefill_tokens_error(8192)),), changes=changes)
    assert decision.action == Action.RETUNE


def test_a_metrics_driven_change_waits_for_the_current_flags_to_be_proven() -> None:
    limited = dataclasses.replace(CURRENT, max_concurrent_requests=32)
    decision = decide(limited, w=window(kv=0.4, running=24, waiting=8))  # not Ready, never good
    assert (decision.action, decision.trigger) == (Action.HOLD, IDLE_CAPACITY)
    assert "not yet proven" in decision.reason and decision.recommended is not None


def test_too_few_samples_hold() -> None:
    decision = decide(w=window(n=3))
    assert decision.trigger == Trigger.INSUFFICIENT_DATA


# --- rollouts -------------------------------------------------------------------------------------

GOOD = CURRENT
NEW = dataclasses.replace(CURRENT, max_concurrent_requests=160)


def started(ago: float, probation_until: float | None = None) -> TgiRollout:
    return TgiRollout(NEW, NOW - ago, NOW - ago + POLICY.rollout_deadline_seconds, probation_until)


def test_a_ready_rollout_goes_on_probation_then_becomes_good() -> None:
    probation = decide(NEW, rollout=started(60), last_good=GOOD, ready=True)
    assert probation.trigger == Trigger.ROLLOUT_PROBATION
    assert probation.probation_until == NOW + POLICY.probation_seconds
    done = decide(NEW, rollout=started(900, NOW - 1), last_good=GOOD, ready=True)
    assert (done.trigger, done.good) == (Trigger.ROLLOUT_SUCCEEDED, NEW)


def test_a_crash_on_probation_rolls_back_and_rules_the_new_flags_out() -> None:
    decision = decide(
        NEW, rollout=started(120, NOW + 100), last_good=GOOD, ready=True, logs=((NOW - 5, OOM_TEXT),)
    )
    assert (decision.action, decision.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    assert decision.settings == GOOD
    assert decision.failed is not None and decision.failed.kind == "runtime_oom"


def test_the_deadline_without_ready_rolls_back_exactly() -> None:
    decision = decide(NEW, rollout=started(POLICY.rollout_deadline_seconds + 60), last_good=GOOD)
    assert decision.action == Action.ROLLBACK and decision.settings == GOOD
    assert decision.failed is not None and decision.failed.kind == "rollout_failed"


@pytest.mark.parametrize("kind", ["start_oom", "start_memory_short", "runtime_oom"])
def test_a_remedy_never_proposes_the_settings_that_failed(kind: str) -> None:
    text = {
        "start_oom": tgi.prefill_tokens_error(8192),
        "start_memory_short": tgi.max_total_tokens_error(8192),
        "runtime_oom": OOM_TEXT,
    }[kind]
    decision = decide(logs=((NOW - 10, text),), memory=MODELLED)
    assert decision.failed is not None
    assert fit.compute_effective(decision.settings, MODELLED) != decision.failed.settings
