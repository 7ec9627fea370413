"""What an engine's own closed loop (SGLang's, TGI's) is given and answers, in that engine's flags. Pure data.

The loops of the engines whose flags are not vLLM's share their shape: the status keeps the flags on the
Deployment, the runs that failed, the changes made, a rollout on its way and the last good flags; a tick
brings a metrics window and the restarts of the current flags (classified by the engine seam,
:meth:`kvpilot.tuner.engines.Engine.classify_failure`); the answer is a decision in the engine's flags.
Each type is generic in the engine's settings ``S`` (:class:`~kvpilot.tuner.sglang.SglangSettings`,
:class:`~kvpilot.tuner.tgi.TgiSettings`); :mod:`.sglang_state` and :mod:`.tgi_state` name them for their
engine. :mod:`.engine_chain` and :mod:`.engine_rollout` hold the steps the engines' decision chains share.
The generic ones are not slotted: a slotted frozen generic dataclass cannot be built through its alias
(``typing`` sets ``__orig_class__`` on the instance).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from kvpilot.tuner.engines import Engine, EngineFailure, FailureKind
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.decision import Action, MetricsStatus

S = TypeVar("S")

UNCLASSIFIED = "Other"
"""The trigger of a restart whose log the engine's texts do not explain."""
CRASH_ORDER: tuple[FailureKind, ...] = ("start_memory_short", "start_oom", "runtime_oom")
"""The failures engine flags may cure, the most telling first."""
ROLLOUT_FAILED: Literal["rollout_failed"] = "rollout_failed"
"""A run that failed its rollout without a failure the engine's texts name (not Ready by the deadline, an
unexplained crash): it rules out exactly its own settings."""
RunFailure = FailureKind | Literal["rollout_failed"]
RUN_FAILURES: tuple[RunFailure, ...] = (*CRASH_ORDER, ROLLOUT_FAILED)
"""Every failure ``status.failedEngineArgs`` records."""

START_MEMORY_SHORT = "StartMemoryShort"
START_OOM = "StartOOM"
RUNTIME_OOM = "RuntimeOOM"
KV_PRESSURE = "KvPressure"
TRIGGERS: dict[FailureKind, str] = {
    "start_memory_short": START_MEMORY_SHORT,
    "start_oom": START_OOM,
    "runtime_oom": RUNTIME_OOM,
    "kv_pressure": KV_PRESSURE,
}
"""The seam's failure kinds as the decision's trigger (``status.history``, the Warning events)."""


@dataclass(frozen=True, slots=True)
class EngineRestart:
    """One container termination of a pod running the current settings."""

    time: float
    failure: EngineFailure | None
    """The seam's classification of its log (``None``: nothing the engine's texts explain)."""
    pod: str = ""


def classify_restart(engine: Engine, time: float, log: str, pod: str = "") -> EngineRestart:
    """A termination and its log, classified by ``engine``'s seam."""
    return EngineRestart(time, engine.classify_failure(log), pod)


def kind_of(r: EngineRestart) -> str:
    """The restart's failure kind (:data:`UNCLASSIFIED` when the engine's texts do not explain it)."""
    return r.failure.kind if r.failure is not None else UNCLASSIFIED


@dataclass(frozen=True)
class EngineFailedRun(Generic[S]):
    """Settings that failed, and how (``status.failedEngineArgs``)."""

    settings: S
    kind: RunFailure
    running: int | None = None
    """A run-time OOM: the most running requests the window saw with these settings before it (the memory
    that follows the batch ran out with at most about this many running; ``None``: not seen)."""


def running_before(
    window: obs.ObservationWindow, time: float, logged: Iterable[int | None] = ()
) -> int | None:
    """The most running requests ``window`` saw at or before ``time``, or the engine's log said ran before a
    run-time OOM (``logged``: :attr:`EngineFailure.running`; a batch that fills in seconds after a restart
    runs out between two scrapes); ``None``: neither says."""
    seen = [x.running for x in window.samples if x.time <= time and x.running is not None]
    counts = [round(max(seen))] if seen else []
    counts += [n for n in logged if n is not None]
    return max(counts) if counts else None


@dataclass(frozen=True)
class EngineChange(Generic[S]):
    """A change the loop made (not a hold): when, why, and whether it was the initial plan."""

    time: float
    trigger: str
    planned: bool = False
    before: S | None = None
    """The flags it changed from (``status.history``'s ``fromEngineArgs``; ``None``: unknown)."""
    after: S | None = None
    """The flags it changed to (``toEngineArgs``)."""


@dataclass(frozen=True, slots=True)
class EngineHold:
    """A hold the loop recorded (``status.history``'s ``Held`` entries: a gate held a change back): when,
    and for which trigger. How long the loop has held for a trigger weighs a change against its restart
    (:mod:`.restart_trade`)."""

    time: float
    trigger: str


@dataclass(frozen=True)
class EngineRollout(Generic[S]):
    """``status.rollout`` (mode Auto): flags on their way to the pods."""

    settings: S
    started_at: float
    deadline: float
    """Not Ready by then = failed (does not apply while on probation)."""
    probation_until: float | None = None


@dataclass(frozen=True)
class EngineLoopState(Generic[S]):
    """What the service's status remembers between ticks."""

    current: S
    """The settings on the Deployment now, as rendered (``None`` fields: the engine's default)."""
    failed: tuple[EngineFailedRun[S], ...] = ()
    changes: tuple[EngineChange[S], ...] = ()
    rollout: EngineRollout[S] | None = None
    last_good: S | None = None
    """The flags that last passed probation (``status.lastGoodEngineArgs``), where a rollout returns."""
    holds: tuple[EngineHold, ...] = ()
    """The newest ``Held`` entries of ``status.history`` in a row, oldest first (none when the newest entry
    is anything else): since when the loop has held a change back, and for which trigger."""


@dataclass(frozen=True, slots=True)
class EngineEvidence:
    """What this tick observed of the current settings."""

    window: obs.ObservationWindow
    restarts: tuple[EngineRestart, ...] = ()
    restart_seconds: float | None = None
    ready: bool = False
    """Every replica runs the current settings and is Ready."""
    not_started: bool = False
    """A pod of the current settings has not started (no node with a free GPU, weights downloading)."""
    rollout_lost_fraction: float = 0.0
    """The share of the service's serving capacity a rollout of a change loses while a pod restarts, under
    the strategy it would use (as vLLM's ``Evidence.rollout_lost_fraction``): 0 surge (or pods serving
    nothing anyway), ``k/N`` replacing ``k`` of ``N`` replicas at a time, 1 recreating."""
    rollout_blocked: str | None = None
    """Why a change cannot roll out now (as vLLM's ``Evidence.rollout_blocked``: one replica, no spare GPU
    for a surge pod, no ``allowDowntime``): a change is held with it recommended, saying this."""
    replicas: int = 1
    """``spec.replicas``: what a scale-out recommendation starts from (as vLLM's ``Evidence.replicas``)."""
    replicas_changing: str | None = None
    """Why the replica count is changing (:func:`kvpilot.tuner.loop.scaling.compute_replica_change`), if it
    is: no scale-out is recommended then (the window mixes two counts)."""


@dataclass(frozen=True)
class EngineProposal(Generic[S]):
    """A rule's answer: candidates in order of preference, and why."""

    trigger: str
    evidence: str
    candidates: tuple[S, ...]
    crash: bool = False
    exhausted: str = ""
    infeasible_when_exhausted: bool = False
    explanation: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineDecision(Generic[S]):
    """What to do now. ``settings`` = what should run next (the current ones on a hold)."""

    action: Action
    settings: S
    trigger: str
    reason: str
    """The evidence and the change (or why none), in one line."""
    explanation: tuple[str, ...] = ()
    """The memory model's steps behind a change."""
    failed: EngineFailedRun[S] | None = None
    """The current settings, ruled out by the crash this decision answers."""
    recommended: S | None = None
    """A hold of the gates: the settings it would have rolled out."""
    metrics: MetricsStatus | None = None
    probation_until: float | None = None
    """The rollout on probation until then (``status.rollout.probationUntil``)."""
    good: S | None = None
    """The rollout succeeded: these flags are the last good ones."""
    scale_out: int | None = None
    """A rule under sustained pressure has nothing left to propose: the replicas to recommend
    (:func:`kvpilot.tuner.loop.scaling.recommend_scale_out`; ``status.recommendation.replicas``), as vLLM's
    ``Decision.scale_out``."""

    @property
    def changes(self) -> bool:
        return self.action in (Action.RETUNE, Action.ROLLBACK)
