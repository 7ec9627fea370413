"""SGLang's rollouts in mode Auto (:func:`kvpilot.tuner.loop.sglang_policy.compute_sglang_decision`, step 0):
probation once every replica is Ready, success after it, a crash or the deadline rolls back to the last good
flags and rules the new ones out, pods that never started wait. Judged by the same
:func:`kvpilot.tuner.loop.rollout.judge_rollout` as vLLM's rollouts.
"""

from __future__ import annotations

from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.loop import Action, PolicyConfig, Trigger
from kvpilot.tuner.loop import rollout as rollout_step
from kvpilot.tuner.loop import sglang_fit as fit
from kvpilot.tuner.loop.observations import MetricsSample, ObservationWindow
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangRollout,
    classify_restart,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = fit.SglangMemory(gpus.lookup_gpu("H100-SXM"), LLAMA)
NOW = 100_000.0
POLICY = PolicyConfig()
GOOD = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.80, max_running_requests=64)
NEW = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.86, max_running_requests=64)
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def window() -> ObservationWindow:
    samples = tuple(
        MetricsSample(time=NOW - 30 * (9 - i), kv_usage=0.6, running=8, waiting=0) for i in range(10)
    )
    return ObservationWindow(NOW - 300, NOW, samples, pods=1)


def decide(
    rollout: SglangRollout | None,
    *,
    ready: bool = False,
    not_started: bool = False,
    logs: tuple[tuple[float, str], ...] = (),
    last_good: sglang.SglangSettings | None = GOOD,
    failed: tuple[fit.FailedRun, ...] = (),
) -> SglangDecision:
    restarts = tuple(classify_restart(t, log, f"pod-{i}") for i, (t, log) in enumerate(logs))
    return compute_sglang_decision(
        SglangLoopState(NEW, failed, (), rollout, last_good),
        SglangEvidence(window(), restarts, ready=ready, not_started=not_started),
        SglangContext(H100, policy=POLICY),
        NOW,
    )


def started(ago: float, *, probation_until: float | None = None) -> SglangRollout:
    return SglangRollout(NEW, NOW - ago, NOW - ago + POLICY.rollout_deadline_seconds, probation_until)


def test_a_rollout_whose_pods_are_not_ready_waits_and_changes_nothing() -> None:
    decision = decide(started(60))
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.ROLLOUT_IN_PROGRESS)
    assert decision.settings == NEW and "to deadline" in decision.reason


def test_every_replica_ready_puts_the_flags_on_probation() -> None:
    decision = decide(started(60), ready=True)
    assert decision.trigger == Trigger.ROLLOUT_PROBATION
    assert decision.probation_until == NOW + POLICY.probation_seconds
    assert decision.good is None


def test_probation_passed_makes_the_flags_the_last_good_ones() -> None:
    decision = decide(started(900, probation_until=NOW - 1), ready=True)
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.ROLLOUT_SUCCEEDED)
    assert decision.good == NEW


def test_a_crash_on_probation_rolls_back_and_rules_the_new_flags_out_by_its_kind() -> None:
    rollout = started(300, probation_until=NOW + 200)
    decision = decide(rollout, ready=True, logs=((NOW - 5, OOM_TEXT),))
    assert (decision.action, decision.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    assert decision.settings == GOOD and decision.changes
    assert decision.failed is not None and decision.failed.kind == "runtime_oom"
    assert decision.failed.running == 8  # the most running requests the window saw before the crash
    assert "on probation" in decision.reason


def test_a_crash_whose_log_shows_a_larger_batch_than_the_scrapes_records_the_logs_count() -> None:
    """A restarted pod's backlog fills its batch between two scrapes: the window saw 8 running, SGLang's
    batch lines before the OOM say 96 ran; the failed run keeps 96, the count the next raise stays below."""
    log = "\n".join(
        ["[TP0] " + sglang.decode_batch_line(n, 1000 * n, 0.3) for n in (40, 96, 72)] + [OOM_TEXT]
    )
    rollout = started(300, probation_until=NOW + 200)
    decision = decide(rollout, ready=True, logs=((NOW - 5, log),))
    assert decision.action == Action.ROLLBACK
    assert decision.failed is not None and decision.failed.running == 96
    smaller = "\n".join(["[TP0] " + sglang.decode_batch_line(3, 300, 0.01), OOM_TEXT])
    decision = decide(rollout, ready=True, logs=((NOW - 5, smaller),))
    assert decision.failed is not None and decision.failed.running == 8  # the window's larger count


def test_a_crash_from_before_the_rollout_is_not_the_new_flags_fault() -> None:
    decision = decide(started(60), logs=((NOW - 120, OOM_TEXT),))
    assert decision.trigger == Trigger.ROLLOUT_IN_PROGRESS


def test_the_deadline_passed_without_ready_rolls_back_and_rules_out_exactly_the_new_flags() -> None:
    decision = decide(started(POLICY.rollout_deadline_seconds + 10))
    assert decision.action == Action.ROLLBACK and decision.settings == GOOD
    assert decision.failed is not None and decision.failed.kind == fit.ROLLOUT_FAILED
    assert "not Ready within" in decision.reason


def test_pods_that_never_started_wait_for_capacity_and_are_not_marked_failed() -> None:
    decision = decide(started(POLICY.rollout_deadline_seconds + 10), not_started=True)
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.ROLLOUT_PENDING)
    assert decision.failed is None


def test_a_failed_rollout_with_nothing_to_go_back_to_holds_and_says_so() -> None:
    decision = decide(started(POLICY.rollout_deadline_seconds + 10), last_good=None)
    assert (decision.action, decision.trigger) == (Action.HOLD, Trigger.ROLLOUT_FAILED)
    assert decision.failed is not None and "no known-good" in decision.reason


def test_a_crash_with_nothing_to_go_back_to_is_cured_by_the_crash_rules() -> None:
    decision = decide(started(60), logs=((NOW - 5, OOM_TEXT),), last_good=None)
    assert decision.action == Action.RETUNE and decision.trigger != Trigger.ROLLOUT_FAILED
    assert decision.failed is not None and decision.failed.settings == fit.compute_effective(NEW, H100)
    assert fit.fraction_of(fit.compute_effective(decision.settings, H100)) < NEW.mem_fraction_static  # type: ignore[operator]


def test_a_last_good_that_the_history_rules_out_is_not_returned_to() -> None:
    failed = (fit.FailedRun(fit.compute_effective(GOOD, H100), "runtime_oom"),)
    decision = decide(started(POLICY.rollout_deadline_seconds + 10), failed=failed)
    assert decision.action == Action.HOLD and decision.trigger == Trigger.ROLLOUT_FAILED


def test_the_judgement_is_the_one_vllm_rollouts_get() -> None:
    judged = rollout_step.judge_rollout(
        started_at=0.0,
        deadline=100.0,
        probation_until=None,
        crash=None,
        ready=False,
        not_started=False,
        now=150.0,
        probation_seconds=300.0,
    )
    assert judged.verdict == rollout_step.Verdict.FAILED and judged.why == "not Ready within 100s"
    on_probation = rollout_step.judge_rollout(
        started_at=0.0,
        deadline=100.0,
        probation_until=400.0,
        crash=None,
        ready=False,
        not_started=False,
        now=150.0,
        probation_seconds=300.0,
    )
    assert on_probation.verdict == rollout_step.Verdict.ON_PROBATION  # the deadline bounds Ready only


def test_the_first_plan_is_good_once_ready_and_crash_free_for_probation() -> None:
    decision = compute_sglang_decision(
        SglangLoopState(NEW, (), (), None, None),
        SglangEvidence(window(), (), ready=True),
        SglangContext(H100, policy=POLICY),
        NOW,
    )
    assert decision.good == NEW and decision.action == Action.HOLD


def test_flags_not_ready_or_just_changed_are_not_yet_good() -> None:
    not_ready = compute_sglang_decision(
        SglangLoopState(NEW), SglangEvidence(window(), ()), SglangContext(H100, policy=POLICY), NOW
    )
    recent = compute_sglang_decision(
        SglangLoopState(NEW, (), (SglangChange(NOW - 60, "KVPressure"),)),
        SglangEvidence(window(), (), ready=True),
        SglangContext(H100, policy=POLICY),
        NOW,
    )
    assert not_ready.good is None and recent.good is None


def test_a_checkpoint_slower_to_fetch_than_the_deadline_moves_the_deadline_out() -> None:
    heavy = fit.SglangMemory(H100.gpu, LLAMA, weights_total_bytes=2000 * 2**30)  # 2 TB at the policy's rate
    rollout = started(POLICY.rollout_deadline_seconds + 10)
    decision = compute_sglang_decision(
        SglangLoopState(NEW, (), (), rollout, GOOD),
        SglangEvidence(window(), ()),
        SglangContext(heavy, policy=POLICY),
        NOW,
    )
    assert decision.trigger == Trigger.ROLLOUT_IN_PROGRESS  # still loading, not failed
