"""What SGLang's closed loop is given and answers: the state its status keeps, the evidence of a tick, the
context it tunes within, its decision. Pure data, and the classification of a restart by the seam.

:func:`kvpilot.tuner.loop.sglang_policy.compute_sglang_decision` takes these; :mod:`.sglang_rollout` judges a
rollout in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import sglang
from kvpilot.tuner.engines import EngineFailure, SglangEngine
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.decision import Action, MetricsStatus
from kvpilot.tuner.loop.sglang_fit import FailedRun, SglangMemory

UNCLASSIFIED = "Other"
"""The trigger of a restart whose log SGLang's texts do not explain."""
CRASH_ORDER = ("start_memory_short", "start_oom", "runtime_oom")
"""The failures engine flags may cure, the most telling first."""


@dataclass(frozen=True, slots=True)
class SglangRestart:
    """One container termination of a pod running the current settings."""

    time: float
    failure: EngineFailure | None
    """The seam's classification of its log (``None``: nothing SGLang's texts explain)."""
    pod: str = ""


def classify_restart(time: float, log: str, pod: str = "") -> SglangRestart:
    """A termination and its log, classified by the seam (:meth:`SglangEngine.classify_failure`)."""
    return SglangRestart(time, SglangEngine().classify_failure(log), pod)


@dataclass(frozen=True, slots=True)
class SglangChange:
    """A change the loop made (not a hold): when, why, and whether it was the initial plan."""

    time: float
    trigger: str
    planned: bool = False
    before: sglang.SglangSettings | None = None
    """The flags it changed from (``status.history``'s ``fromEngineArgs``; ``None``: unknown)."""
    after: sglang.SglangSettings | None = None
    """The flags it changed to (``toEngineArgs``)."""


@dataclass(frozen=True, slots=True)
class SglangRollout:
    """``status.rollout`` of an SGLang service (mode Auto): flags on their way to the pods."""

    settings: sglang.SglangSettings
    started_at: float
    deadline: float
    """Not Ready by then = failed (does not apply while on probation)."""
    probation_until: float | None = None


@dataclass(frozen=True, slots=True)
class SglangLoopState:
    """What the service's status remembers between ticks."""

    current: sglang.SglangSettings
    """The settings on the Deployment now, as rendered (``None``: SGLang's default)."""
    failed: tuple[FailedRun, ...] = ()
    changes: tuple[SglangChange, ...] = ()
    rollout: SglangRollout | None = None
    last_good: sglang.SglangSettings | None = None
    """The flags that last passed probation (``status.lastGoodEngineArgs``), where a rollout returns."""


@dataclass(frozen=True, slots=True)
class SglangEvidence:
    """What this tick observed of the current settings."""

    window: obs.ObservationWindow
    restarts: tuple[SglangRestart, ...] = ()
    restart_seconds: float | None = None
    ready: bool = False
    """Every replica runs the current settings and is Ready."""
    not_started: bool = False
    """A pod of the current settings has not started (no node with a free GPU, weights downloading)."""


@dataclass(frozen=True, slots=True)
class SglangContext:
    """What one SGLang service is tuned on and within."""

    memory: SglangMemory
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    ttft_p95_seconds: float | None = None
    itl_p95_seconds: float | None = None
    """``spec.serving.slo``'s objectives (``None``: none)."""


@dataclass(frozen=True, slots=True)
class SglangDecision:
    """What to do now. ``settings`` = what should run next (the current ones on a hold)."""

    action: Action
    settings: sglang.SglangSettings
    trigger: str
    reason: str
    """The evidence and the change (or why none), in one line."""
    explanation: tuple[str, ...] = ()
    """The memory model's steps behind a change of the fraction, the prefill chunk or the context."""
    failed: FailedRun | None = None
    """The current settings, ruled out by the crash this decision answers."""
    recommended: sglang.SglangSettings | None = None
    """A hold of the gates: the settings it would have rolled out."""
    metrics: MetricsStatus | None = None
    probation_until: float | None = None
    """The rollout on probation until then (``status.rollout.probationUntil``)."""
    good: sglang.SglangSettings | None = None
    """The rollout succeeded: these flags are the last good ones."""

    @property
    def changes(self) -> bool:
        return self.action in (Action.RETUNE, Action.ROLLBACK)


def kind_of(r: SglangRestart) -> str:
    """The restart's failure kind (:data:`UNCLASSIFIED` when SGLang's texts do not explain it)."""
    return r.failure.kind if r.failure is not None else UNCLASSIFIED
