"""The closed loop's vocabulary: what :func:`kvpilot.tuner.loop.policy.compute_decision` is given (the
:class:`LoopState` the status remembers, the :class:`Evidence` of this tick) and what it answers (a
:class:`Decision`: an :class:`Action`, a trigger, the settings to run next and why).

The trigger of a decision is a :class:`Trigger`, a :class:`~kvpilot.tuner.loop.observations.RestartKind`
or a rule's own name (``KvPressure``, ``IdleCapacity``, ``KvBound``, ``LatencySlo``,
``GpuMemoryPressure``): the ``status.history`` entries and the events carry it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvpilot.tuner.loop import kv_bound, remedies
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.history import HistoryEntry
from kvpilot.tuner.loop.observations import ObservationWindow, RestartEvent
from kvpilot.tuner.types import EngineSettings, MemoryBudget


class Action(enum.StrEnum):
    HOLD = "hold"
    RETUNE = "retune"
    ROLLBACK = "rollback"
    INFEASIBLE = "infeasible"


class Trigger(enum.StrEnum):
    """``Decision.trigger`` values that are not a :class:`RestartKind` (those are triggers too)."""

    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    ROLLOUT_PROBATION = "RolloutProbation"
    ROLLOUT_SUCCEEDED = "RolloutSucceeded"
    ROLLOUT_FAILED = "RolloutFailed"
    ROLLOUT_PENDING = "RolloutPending"
    """The new settings' pods have not started (no node with a free GPU, weights still downloading): a
    deadline passing then is not their failure, and they are never marked failed for it."""
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    INSUFFICIENT_DATA = "InsufficientData"
    KV_PRESSURE = remedies.KV_PRESSURE
    IDLE_CAPACITY = remedies.IDLE_CAPACITY
    KV_BOUND = kv_bound.KV_BOUND
    STEADY = "Steady"


@dataclass(frozen=True, slots=True)
class RolloutState:
    """``status.rollout``: a retune on its way to the pods."""

    settings: EngineSettings
    started_at: float
    deadline: float
    """Not Ready by then = failed (does not apply while on probation)."""
    probation_until: float | None = None
    """Set once every replica was Ready (``status.rollout.probationUntil``): the settings are on
    probation until then, and a crash of them until then is a failed rollout."""

    @property
    def on_probation(self) -> bool:
        return self.probation_until is not None


@dataclass(frozen=True, slots=True)
class MetricsStatus:
    """For the ``MetricsAvailable`` condition."""

    available: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now. ``settings`` = what should run next (the current ones on hold)."""

    action: Action
    settings: EngineSettings
    trigger: str
    reason: str
    failed: EngineSettings | None = None
    """Settings to add to ``status.failedSettings`` (never to be used again)."""
    good: EngineSettings | None = None
    """Settings proven healthy: the new ``status.lastGoodSettings``."""
    probation_until: float | None = None
    """With trigger ``RolloutProbation``: the rollout's settings are on probation until then."""
    effective: EngineSettings | None = None
    """The current settings as vLLM runs them (what the decision stepped from)."""
    metrics: MetricsStatus | None = None
    """The metrics window's status at decision time (the ``MetricsAvailable`` condition)."""
    observed_kv_tokens: int | None = None
    """vLLM's KV capacity report, when the window's report is for the current settings."""
    recommended: EngineSettings | None = None
    """A hold of the rollout gates: the settings it would have rolled out (``status.recommendation``)."""
    scale_out: int | None = None
    """Tuning is at its floor under sustained pressure: the replicas to recommend
    (:func:`kvpilot.tuner.loop.scaling.compute_scale_out`; ``status.recommendation.replicas``)."""

    @property
    def changes(self) -> bool:
        return self.action in (Action.RETUNE, Action.ROLLBACK)


def compute_metrics_status(window: ObservationWindow, policy: PolicyConfig, now: float) -> MetricsStatus:
    """Whether the window is usable at ``now``: present, with KV usage, and fresh."""
    if window.unavailable_reason is not None:
        reason = window.unavailable_code or "MetricsUnavailable"
        return MetricsStatus(False, reason, window.unavailable_reason)
    last = window.last_sample_time
    if last is None:
        return MetricsStatus(False, "MetricsUnavailable", "no KV-cache usage series for the service's pods")
    age = now - last
    if age > policy.staleness_seconds:
        return MetricsStatus(
            False, "MetricsStale", f"newest sample is {age:.0f}s old (limit {policy.staleness_seconds:.0f}s)"
        )
    return MetricsStatus(True, "MetricsFresh", f"{len(window.samples)} samples from {window.pods} pod(s)")


@dataclass(frozen=True, slots=True)
class LoopState:
    """What the service's status remembers between ticks (the operator converts it to and from
    ``status.applied``, ``history``, ``failedSettings``, ``rollout``, ``lastGoodSettings`` and
    ``calibration``)."""

    current: EngineSettings
    """Settings on the Deployment now, as written (``None`` = vLLM's default)."""
    history: tuple[HistoryEntry, ...] = ()
    failed: tuple[EngineSettings, ...] = ()
    """Settings that crashed or failed to roll out: never proposed again."""
    rollout: RolloutState | None = None
    """The rollout of ``current`` in progress, if any."""
    last_good: EngineSettings | None = None
    observed_kv_tokens: int | None = None
    """vLLM's capacity report for ``current``, kept from an earlier window."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What this tick observed of the current settings."""

    budget: MemoryBudget
    """The memory model's budget of the current settings on this GPU."""
    window: ObservationWindow
    restarts: tuple[RestartEvent, ...] = ()
    """Terminations of containers that ran the current settings (the operator filters by the pod's args)."""
    ready: bool = False
    """Every desired replica runs the current settings and is Ready."""
    not_started: bool = False
    """Pods of the current settings exist but have not started vLLM: no node could take them
    (Unschedulable: a full GPU pool) or their weights still download. Pending is not failure."""
    restart_seconds: float | None = None
    """Measured start-to-Ready seconds of a vLLM pod of this service (e.g. the last rollout's: its
    pods' start to Ready), when the operator has it; ``None`` = ``PolicyConfig.restart_seconds``.
    The cooldown grows with it (:func:`compute_cooldown`), and it is the restart a change costs
    (:mod:`kvpilot.tuner.loop.trade`)."""
    compile_cache_persistent: bool = False
    """The pods keep vLLM's compile cache on a persistent volume (``spec.model.storage``, writable): a
    restart whose change leaves vLLM's compile hash alone skips ``PolicyConfig.compile_seconds``."""
    checkpoint_gib: float | None = None
    """The whole checkpoint's size, when the operator knows it; ``None`` = the budget's weights (one rank's
    share: a lower bound under tensor parallelism). Predicts a cold start for the rollout deadline."""
    weights_cached: bool = False
    """Every start of the service's pods finds the checkpoint on a volume they all mount (a
    PersistentVolumeClaim in ``spec.model.storage``): the predicted start loads it, no download."""
    rollout_lost_fraction: float = 0.0
    """The share of the service's serving capacity a rollout loses while a pod restarts, under the strategy
    it would use: 0 surge (or pods serving nothing anyway), ``k/N`` replacing ``k`` of ``N`` replicas at a
    time, 1 recreating."""
    rollout_blocked: str | None = None
    """Why no change can roll out now (no spare GPU for a surge pod, no downtime allowed), if so."""
    replicas: int = 1
    """``spec.replicas``: what a scale-out recommendation starts from."""
    replicas_changing: str | None = None
    """Why the replica count is changing (:func:`kvpilot.tuner.loop.scaling.compute_replica_change`), if it
    is: no metrics-driven retune starts then."""


def compute_cooldown(policy: PolicyConfig, restart_seconds: float | None = None) -> float:
    """Seconds a metrics-driven change waits after the last retune: ``cooldown_seconds``, and at least
    a restart of vLLM plus ``cooldown_restart_windows`` metrics windows of the new settings, so the
    window the next change is judged on holds only samples of the settings it judges."""
    restart = policy.restart_seconds if restart_seconds is None else max(0.0, restart_seconds)
    return max(policy.cooldown_seconds, restart + policy.cooldown_restart_windows * policy.window_seconds)
