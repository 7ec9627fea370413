"""Step 0 of an engine's own chain (SGLang's, TGI's): flags on their way to the pods (mode Auto), judged as
vLLM's are. Pure, and generic in the engine's settings.

:func:`kvpilot.tuner.loop.rollout.judge_rollout` says where the rollout stands; :func:`compute_rollout_step`
turns it into the engine's decision: probation once every replica runs the new flags and is Ready, the flags
good after it, a crash of them or the deadline rolls back to the last good flags and rules the new ones out
(by the crash's kind, else exactly: :data:`~kvpilot.tuner.loop.engine_state.ROLLOUT_FAILED`); pods that never
started wait. :func:`compute_good` says when flags the loop did not roll out (the first plan) are good. What
is the engine's own comes in a :class:`Subject`: how its flags read, what its history rules out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import rollout as rollout_step
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.decision import Action, Trigger
from kvpilot.tuner.loop.engine_state import (
    CRASH_ORDER,
    ROLLOUT_FAILED,
    EngineDecision,
    EngineEvidence,
    EngineFailedRun,
    EngineLoopState,
    EngineRestart,
    EngineRollout,
    kind_of,
    running_before,
)
from kvpilot.tuner.types import GIB

S = TypeVar("S")


class Situation(Protocol[S]):
    """What every engine's situation (:class:`~.sglang_fit.SglangSituation`, :class:`~.tgi_fit.TgiSituation`)
    tells the rollout step."""

    @property
    def current(self) -> S: ...

    @property
    def effective(self) -> S: ...

    @property
    def window(self) -> obs.ObservationWindow: ...

    @property
    def policy(self) -> PolicyConfig: ...

    @property
    def failed(self) -> tuple[EngineFailedRun[S], ...]: ...


@dataclass(frozen=True)
class Subject(Generic[S]):
    """The engine's view of the flags being rolled out."""

    current: S
    effective: S
    """``current`` with the engine's defaults filled in: what a failed run records."""
    window: obs.ObservationWindow
    policy: PolicyConfig
    failed: tuple[EngineFailedRun[S], ...]
    describe: Callable[[S], str]
    """The flags on one line."""
    describe_change: Callable[[S, S], str]
    ruled_out: Callable[[S, tuple[EngineFailedRun[S], ...]], bool]
    """Whether these runs rule the settings out."""
    weights_bytes: int | None = None
    """The checkpoint the new pods load (the deadline waits for its download)."""

    @classmethod
    def of(
        cls,
        s: Situation[S],
        describe: Callable[[S], str],
        describe_change: Callable[[S, S], str],
        ruled_out: Callable[[S, tuple[EngineFailedRun[S], ...]], bool],
        weights_bytes: int | None,
    ) -> Subject[S]:
        """The subject of an engine's situation ``s``, in that engine's words and history."""
        return cls(
            s.current,
            s.effective,
            s.window,
            s.policy,
            s.failed,
            describe,
            describe_change,
            ruled_out,
            weights_bytes,
        )


def compute_rollout_step(
    s: Subject[S],
    state: EngineLoopState[S],
    evidence: EngineEvidence,
    restarts: tuple[EngineRestart, ...],
    now: float,
) -> EngineDecision[S] | None:
    """A rollout in progress, judged as vLLM's (:func:`rollout_step.judge_rollout`); ``None`` when there is
    none, or when its flags crashed with nothing safe to go back to (the crash step cures them)."""
    rollout = state.rollout
    if rollout is None:
        return None
    since = tuple(r for r in restarts if r.time >= rollout.started_at and kind_of(r) != "kv_pressure")
    latest = max(since, key=lambda r: (r.time, r.pod), default=None)
    judged = rollout_step.judge_rollout(
        started_at=rollout.started_at,
        deadline=compute_deadline(s, rollout, evidence),
        probation_until=rollout.probation_until,
        crash=None if latest is None else f"{kind_of(latest)} on {latest.pod or 'a pod'}",
        ready=evidence.ready,
        not_started=evidence.not_started,
        now=now,
        probation_seconds=s.policy.probation_seconds,
    )
    verdict, flags = judged.verdict, s.describe(s.current)
    if verdict == rollout_step.Verdict.PENDING:
        why = "the new flags' pods have not started (no node with a free GPU, or their weights download)"
        return EngineDecision(Action.HOLD, s.current, Trigger.ROLLOUT_PENDING, f"{why}; not marked failed")
    if verdict == rollout_step.Verdict.SUCCEEDED:
        ran = f", ran {s.policy.probation_seconds:.0f}s without a crash" if judged.probation_until else ""
        why = f"every replica runs the new flags and is Ready{ran}: {flags}"
        return EngineDecision(Action.HOLD, s.current, Trigger.ROLLOUT_SUCCEEDED, why, good=s.current)
    if verdict in (rollout_step.Verdict.PROBATION_STARTS, rollout_step.Verdict.ON_PROBATION):
        why = judged.why or f"{s.policy.probation_seconds:.0f}s, a crash until then rolls back"
        return EngineDecision(
            Action.HOLD,
            s.current,
            Trigger.ROLLOUT_PROBATION,
            f"new flags on probation ({why}): {flags}",
            probation_until=judged.probation_until,
        )
    if verdict == rollout_step.Verdict.IN_PROGRESS:
        return EngineDecision(
            Action.HOLD, s.current, Trigger.ROLLOUT_IN_PROGRESS, f"waiting for the rollout ({judged.why})"
        )
    return _rollout_failed(s, state, since, judged.why)


def _rollout_failed(
    s: Subject[S], state: EngineLoopState[S], crashes: tuple[EngineRestart, ...], why: str
) -> EngineDecision[S] | None:
    """The new flags failed: back to the last good ones (the new ones ruled out, by the crash's kind or
    exactly); ``None`` for a crash the crash step cures when there is nothing to go back to."""
    known = [r.failure.kind for r in crashes if r.failure is not None and r.failure.kind in CRASH_ORDER]
    kind = min(known, key=CRASH_ORDER.index) if known else ROLLOUT_FAILED
    ooms = [r for r in crashes if kind_of(r) == "runtime_oom"]
    running = None
    if kind == "runtime_oom" and ooms:
        logged = (r.failure.running for r in ooms if r.failure is not None)
        running = running_before(s.window, min(r.time for r in ooms), logged)
    ran = EngineFailedRun(s.effective, kind, running)
    target = state.last_good
    if target is not None and target != s.current and not s.ruled_out(target, (*s.failed, ran)):
        change = s.describe_change(s.current, target)
        return EngineDecision(
            Action.ROLLBACK,
            target,
            Trigger.ROLLOUT_FAILED,
            f"new flags failed ({why}); rolling back: {change}",
            failed=ran,
        )
    if known:
        return None
    why = f"new flags failed ({why}) and there are no known-good flags to return to"
    return EngineDecision(Action.HOLD, s.current, Trigger.ROLLOUT_FAILED, why, failed=ran)


def compute_deadline(s: Subject[S], rollout: EngineRollout[S], evidence: EngineEvidence) -> float:
    """The rollout's deadline, moved out to what the start of the new pods is expected to take
    (:func:`rollout_step.compute_deadline_seconds`: the measured start, the checkpoint's download) where that
    is longer than the configured seconds the stored deadline counts."""
    weights = s.weights_bytes or 0
    wanted = rollout_step.compute_deadline_seconds(
        s.policy, restart_seconds=evidence.restart_seconds, checkpoint_gib=weights / GIB
    )
    return rollout.deadline + max(0.0, wanted - s.policy.rollout_deadline_seconds)


def compute_good(
    s: Subject[S],
    state: EngineLoopState[S],
    evidence: EngineEvidence,
    restarts: tuple[EngineRestart, ...],
    decision: EngineDecision[S],
    now: float,
) -> EngineDecision[S]:
    """``decision`` with the current flags marked good when they are, outside a rollout (e.g. the first
    plan; a rollout's own step decides): every replica Ready, no restart since the last change, which was at
    least ``probation_seconds`` ago. A retune the metrics ask for on that tick marks them too: they are
    where its rollout returns if the new flags fail."""
    if decision.good is not None or decision.failed is not None or restarts:
        return decision
    if decision.changes and decision.action != Action.RETUNE:
        return decision
    if not evidence.ready or state.rollout is not None or state.last_good == s.current:
        return decision
    last = max((c.time for c in state.changes), default=None)
    if last is not None and now - last < s.policy.probation_seconds:
        return decision
    return dataclasses.replace(decision, good=s.current)
