"""Step 1 of the loop's chain: a retune on its way to the pods.

Ready = probation starts; Ready and crash-free for ``probation_seconds`` = it succeeded (the settings
are *good*: ``status.lastGoodSettings``); a crash of the new pods (before Ready or on probation) or the
deadline passed without Ready = roll back to the last good settings and mark the new ones failed (the
deadline follows the service's start time: :func:`compute_deadline_seconds`); pods that never started
(no node with a free GPU, weights still downloading, a lost node) wait and are never marked failed;
otherwise wait.
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import candidates
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.decision import Action, Decision, RolloutState, Trigger
from kvpilot.tuner.loop.observations import CRASH_KINDS_FIXABLE_BY_ARGS, RestartEvent
from kvpilot.tuner.loop.remedies import Situation
from kvpilot.tuner.types import EngineSettings


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
    until = rollout.probation_until
    probation_over = until is not None and s.now >= until
    # the deadline bounds the wait for Ready; on probation only its end is judged (a pod may
    # briefly be unready then without a crash, e.g. rescheduled)
    timed_out = not ready and s.now >= rollout.deadline and (until is None or probation_over)
    if not crashes and not timed_out:
        return _rollout_wait(s, rollout, ready)
    if not crashes and not_started:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PENDING,
            "the new settings' pods have not started (no node with a free GPU for them, their weights "
            "still download, or their node was lost); they are not marked failed, and the rollout waits "
            "for capacity",
        )
    if crashes:
        why = describe_crashes(crashes) + (" on probation" if until is not None else "")
    elif until is None:
        why = f"not Ready within {rollout.deadline - rollout.started_at:.0f}s"
    else:
        why = "not Ready at the end of probation"
    target = last_good
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


def _rollout_wait(s: Situation, rollout: RolloutState, ready: bool) -> Decision:
    """No crash of the new settings and no deadline passed: start or go on with probation, or succeed."""
    until = rollout.probation_until
    settings = vllm.describe_settings(s.current)
    if until is None and ready and s.policy.probation_seconds > 0:
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"every replica runs the new settings and is Ready: {settings}; on probation for "
            f"{s.policy.probation_seconds:.0f}s (a crash of them until then rolls back)",
            probation_until=s.now + s.policy.probation_seconds,
        )
    if ready and (until is None or s.now >= until):
        ran = f" and ran {s.policy.probation_seconds:.0f}s without a crash" if until is not None else ""
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_SUCCEEDED,
            f"every replica runs the new settings, is Ready{ran}: {settings}",
            good=s.current,
        )
    if until is not None:
        left = (
            f"{until - s.now:.0f}s left" if s.now < until else "over; waiting for every replica to be Ready"
        )
        return Decision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"new settings on probation ({left}): {settings}",
            probation_until=until,
        )
    left_s = rollout.deadline - s.now
    return Decision(
        Action.HOLD,
        s.current,
        Trigger.ROLLOUT_IN_PROGRESS,
        f"waiting for the rollout ({left_s:.0f}s to deadline)",
    )


def describe_crashes(crashes: tuple[RestartEvent, ...]) -> str:
    latest = max(crashes, key=lambda c: (c.time, c.pod))
    return f"{latest.cause.kind} on {latest.pod or 'a pod'}: {latest.cause.detail}"
