"""Step 1 of the loop's chain: a retune on its way to the pods.

Ready = probation starts; Ready and crash-free for ``probation_seconds`` = it succeeded (the settings
are *good*: ``status.lastGoodSettings``); a crash of the new pods (before Ready or on probation) or the
deadline passed without Ready = roll back to the last good settings and mark the new ones failed (the
deadline follows the service's start time: :func:`compute_deadline_seconds`); pods that never started
(no node with a free GPU, weights still downloading, a lost node) wait and are never marked failed;
otherwise wait. :func:`judge_rollout` says where a rollout stands for any engine (SGLang's and TGI's loops
ask it too: :mod:`.engine_rollout`); :func:`compute_rollout_step` turns that into vLLM's decision.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import candidates
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.decision import Action, Decision, RolloutState, Trigger
from kvpilot.tuner.loop.observations import CRASH_KINDS_FIXABLE_BY_ARGS, RestartEvent
from kvpilot.tuner.loop.remedies import Situation
from kvpilot.tuner.types import EngineSettings


class Verdict(enum.StrEnum):
    """Where a rollout stands (:func:`judge_rollout`), the same for every engine."""

    IN_PROGRESS = "InProgress"
    """Not every replica Ready yet, the deadline not passed."""
    PROBATION_STARTS = "ProbationStarts"
    """Every replica Ready for the first time: probation starts now."""
    ON_PROBATION = "OnProbation"
    SUCCEEDED = "Succeeded"
    """Ready, and crash-free to the end of probation (or no probation configured)."""
    PENDING = "Pending"
    """The deadline passed with no crash and pods that never started: wait for capacity, not failed."""
    FAILED = "Failed"
    """A crash of the new settings, or the deadline passed without Ready."""


@dataclass(frozen=True, slots=True)
class RolloutJudgement:
    """:func:`judge_rollout`'s answer: the verdict, and what it rests on."""

    verdict: Verdict
    why: str = ""
    """``FAILED``: what failed (the crash, or the deadline); ``IN_PROGRESS``, ``ON_PROBATION``: time left."""
    probation_until: float | None = None
    """The end of probation, once it started."""


def judge_rollout(
    *,
    started_at: float,
    deadline: float,
    probation_until: float | None,
    crash: str | None,
    ready: bool,
    not_started: bool,
    now: float,
    probation_seconds: float,
) -> RolloutJudgement:
    """Where a rollout that started at ``started_at`` stands at ``now``, for any engine: ``crash`` describes
    the crashes of the new settings since it started (``None``: none), ``ready`` whether every replica runs
    them and is Ready, ``not_started`` whether some of their pods never started (no GPU, a download). The
    deadline bounds the wait for Ready; on probation only its end is judged (a pod may briefly be unready
    then without a crash, e.g. rescheduled)."""
    until = probation_until
    probation_over = until is not None and now >= until
    timed_out = not ready and now >= deadline and (until is None or probation_over)
    if crash is None and not timed_out:
        return _judge_wait(until, deadline, ready=ready, now=now, probation_seconds=probation_seconds)
    if crash is None and not_started:
        return RolloutJudgement(Verdict.PENDING)
    if crash is not None:
        why = crash + (" on probation" if until is not None else "")
    elif until is None:
        why = f"not Ready within {deadline - started_at:.0f}s"
    else:
        why = "not Ready at the end of probation"
    return RolloutJudgement(Verdict.FAILED, why, until)


def _judge_wait(
    until: float | None, deadline: float, *, ready: bool, now: float, probation_seconds: float
) -> RolloutJudgement:
    """No crash and no deadline passed: probation starts or goes on, or the rollout succeeded."""
    if until is None and ready and probation_seconds > 0:
        return RolloutJudgement(Verdict.PROBATION_STARTS, probation_until=now + probation_seconds)
    if ready and (until is None or now >= until):
        return RolloutJudgement(Verdict.SUCCEEDED, probation_until=until)
    if until is not None:
        left = f"{until - now:.0f}s left" if now < until else "over; waiting for every replica to be Ready"
        return RolloutJudgement(Verdict.ON_PROBATION, left, until)
    return RolloutJudgement(Verdict.IN_PROGRESS, f"{deadline - now:.0f}s to deadline")


def compute_rollout_step(
    s: Situation,
    rollout: RolloutState | None,
    crashes: tuple[RestartEvent, ...],
    *,
    ready: bool,
    not_started: bool,
    last_good: EngineSettings | None,
    deadline_seconds: float | None = None,
) -> Decision | None:
    """Step 1 of the chain: ``None`` when no rollout is in progress, or when its new settings crashed with
    nothing safe to go back to (the crash step cures them). ``crashes`` are the crashes since the rollout
    started: before Ready and on probation alike. ``deadline_seconds``: :func:`compute_deadline_seconds`
    (``None``: the configured deadline)."""
    if rollout is None:
        return None
    rollout = _with_start_deadline(rollout, s.policy, deadline_seconds)
    judged = judge_rollout(
        started_at=rollout.started_at,
        deadline=rollout.deadline,
        probation_until=rollout.probation_until,
        crash=describe_crashes(crashes) if crashes else None,
        ready=ready,
        not_started=not_started,
        now=s.now,
        probation_seconds=s.policy.probation_seconds,
    )
    if judged.verdict == Verdict.PENDING:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PENDING,
            "the new settings' pods have not started (no node with a free GPU for them, their weights "
            "still download, or their node was lost); they are not marked failed, and the rollout waits "
            "for capacity",
        )
    if judged.verdict != Verdict.FAILED:
        return _rollout_wait(s, judged)
    why, target = judged.why, last_good
    if target is not None and target != s.current and not candidates.known_bad(target, s):
        return Decision(
            Action.ROLLBACK,
            target,
            Trigger.ROLLOUT_FAILED,
            f"new settings failed ({why}); rolling back: {vllm.describe_change(s.current, target)}",
            failed=s.current,
        )
    if crashes and any(c.cause.kind in CRASH_KINDS_FIXABLE_BY_ARGS for c in crashes):
        return None  # nothing safe to go back to: let the crash step cure the new settings
    return Decision(
        Action.HOLD,
        s.current,
        Trigger.ROLLOUT_FAILED,
        f"new settings failed ({why}) and there are no known-good settings to return to",
        failed=s.current,
    )


def compute_deadline_seconds(
    policy: PolicyConfig,
    *,
    restart_seconds: float | None,
    checkpoint_gib: float,
    weights_cached: bool = False,
    warm_compile_seconds: float = 0.0,
) -> float:
    """Seconds a rollout may take to Ready: the configured ``rollout_deadline_seconds``, and at least
    ``rollout_deadline_start_factor`` x the start expected of the new pods: the longer of the measured one
    (``restart_seconds``, the last pod's start to Ready) and the start predicted by
    :func:`compute_predicted_start_seconds`. The longer of the two: a measured start may have found the
    weights cached, a new pod on another node may not; a deadline too long only delays the verdict on a
    start that hangs."""
    if restart_seconds is not None and restart_seconds < 0:
        raise ValueError(f"negative start evidence: start {restart_seconds} s")
    predicted = compute_predicted_start_seconds(
        policy,
        checkpoint_gib=checkpoint_gib,
        weights_cached=weights_cached,
        warm_compile_seconds=warm_compile_seconds,
        measured_start_seconds=restart_seconds,
    )
    expected = max(predicted, restart_seconds or 0.0)
    return max(policy.rollout_deadline_seconds, policy.rollout_deadline_start_factor * expected)


def compute_predicted_start_seconds(
    policy: PolicyConfig,
    *,
    checkpoint_gib: float,
    weights_cached: bool,
    warm_compile_seconds: float,
    measured_start_seconds: float | None = None,
) -> float:
    """A new pod's start as predicted from what the operator knows before it runs: the checkpoint's
    download at ``weights_download_gib_per_s`` unless every start finds it on a volume
    (``weights_cached``), then the load and engine start-up, less the compile a warm compile cache skips
    (``warm_compile_seconds``: :func:`kvpilot.tuner.loop.trade.compute_warm_compile_seconds`).

    The load and engine start-up is ``policy.restart_seconds`` (the assumption), or the service's own
    measured start (``measured_start_seconds``) where that is shorter: a service seen to start in 20 s does
    not take 180 s once its weights are there. A measured start longer than the assumption may hold a
    download of its own, so it does not replace the assumption here (the deadline takes it as it is)."""
    if checkpoint_gib < 0 or warm_compile_seconds < 0 or (measured_start_seconds or 0.0) < 0:
        raise ValueError(
            f"negative start evidence: checkpoint {checkpoint_gib} GiB, warm compile "
            f"{warm_compile_seconds} s, measured start {measured_start_seconds} s"
        )
    download = 0.0 if weights_cached else checkpoint_gib / policy.weights_download_gib_per_s
    engine = policy.restart_seconds
    if measured_start_seconds is not None:
        engine = min(engine, measured_start_seconds)
    return download + max(0.0, engine - warm_compile_seconds)


def _with_start_deadline(
    rollout: RolloutState, policy: PolicyConfig, deadline_seconds: float | None
) -> RolloutState:
    """``rollout`` with its deadline moved out by what ``deadline_seconds`` adds to the configured one
    (the stored deadline counts the configured seconds from the rollout's, or its newest pod's, start)."""
    extra = (deadline_seconds or 0.0) - policy.rollout_deadline_seconds
    return dataclasses.replace(rollout, deadline=rollout.deadline + extra) if extra > 0 else rollout


def _rollout_wait(s: Situation, judged: RolloutJudgement) -> Decision:
    """No crash of the new settings and no deadline passed: probation starts or goes on, or it succeeded."""
    settings = vllm.describe_settings(s.current)
    if judged.verdict == Verdict.PROBATION_STARTS:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"every replica runs the new settings and is Ready: {settings}; on probation for "
            f"{s.policy.probation_seconds:.0f}s (a crash of them until then rolls back)",
            probation_until=judged.probation_until,
        )
    if judged.verdict == Verdict.SUCCEEDED:
        ran = (
            f" and ran {s.policy.probation_seconds:.0f}s without a crash"
            if judged.probation_until is not None
            else ""
        )
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_SUCCEEDED,
            f"every replica runs the new settings, is Ready{ran}: {settings}",
            good=s.current,
        )
    if judged.verdict == Verdict.ON_PROBATION:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"new settings on probation ({judged.why}): {settings}",
            probation_until=judged.probation_until,
        )
    return Decision(
        Action.HOLD, s.current, Trigger.ROLLOUT_IN_PROGRESS, f"waiting for the rollout ({judged.why})"
    )


def describe_crashes(crashes: tuple[RestartEvent, ...]) -> str:
    latest = max(crashes, key=lambda c: (c.time, c.pod))
    return f"{latest.cause.kind} on {latest.pod or 'a pod'}: {latest.cause.detail}"
