"""The bookkeeping the operator keeps for an SGLang or TGI service in mode Auto, over the bench's simulated
Deployment: one home for :class:`bench.loopsim.sglang.KvpilotSglang` and
:class:`bench.loopsim.tgi.KvpilotTgi`, which differ only in their engine's flags, context and decision
(as the operator's shared engine loop,
:func:`kvpilot.operator.inferenceservice.engine_loop.run_engine_tick`, differs by profile).

Each tick, mirrored from the operator:

* the state (:func:`kvpilot.operator.loop.engine_reading.build_state_and_evidence`): the flags
  ``status.appliedEngineArgs`` says the Deployment runs, ``status.rollout`` while it is theirs,
  ``status.lastGoodEngineArgs``, the ruled-out runs of ``status.failedEngineArgs`` (the newest
  :data:`~kvpilot.operator.status.engine_patch.FAILED_LIMIT`), the changes of ``status.history``
  (``Retuned``/``RolledBack``; the reconciler's ``Planned`` at t=0) and its newest ``Held`` entries in a
  row (a gate's hold, recorded once while it stays the same: the restart-cost trade counts its gain over how
  long the loop has held);
* the evidence: the last termination of each pod that runs the current flags, its log classified by the
  engine's seam, Ready when every pod runs them and one serves, not started when one waits for a GPU and
  none restarted; the measured start (the newest pod of the current flags' start to Ready:
  ``status.startupSeconds``); what a rollout of a change would lose under the strategy the cluster allows
  now, or why it cannot roll out (:func:`kvpilot.operator.pods.rollout_strategy.compute_costs`: a surge 0, a
  recreate 1; one replica, no spare GPU, no ``allowDowntime``: held with the HELD message, as vLLM's);
* the answer (:func:`kvpilot.operator.status.engine_patch.build_engine_patch`): a change recorded as rolled
  out (a new rollout with the configured deadline), a rollout's probation kept, a judged one cleared, the
  good flags kept, the failed ones added;
* the Deployment follows a change with the strategy the cluster allows now
  (:func:`kvpilot.operator.pods.rollout_strategy.compute_rollout_choice`): a surge with a spare GPU, a
  replace when no pod serves, a recreate with ``allowDowntime``; a held choice holds a retune (the plan keeps
  serving), and renders a surge only for a rollback, whose new pod waits for a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from bench.loopsim.scenario import BenchScenario
from bench.loopsim.world import World
from kvpilot.operator.api import RolloutSpec
from kvpilot.operator.pods.rollout_strategy import compute_costs, compute_rollout_choice
from kvpilot.operator.status.engine_patch import FAILED_LIMIT
from kvpilot.operator.status.loop_patch import ROLLOUT_ACTIVE
from kvpilot.tuner.loop import Action, EngineHold, PolicyConfig, Trigger
from kvpilot.tuner.loop.engine_state import (
    EngineChange,
    EngineDecision,
    EngineEvidence,
    EngineFailedRun,
    EngineLoopState,
    EngineRestart,
    EngineRollout,
)

S = TypeVar("S")


@dataclass
class EngineLoopSim(Generic[S]):
    """kvpilot's loop for one engine over the simulated Deployment (module docstring); a subclass gives the
    engine's :meth:`decide`, :meth:`classify` and :meth:`render`, and its flags' default as ``current``."""

    scenario: BenchScenario
    policy: PolicyConfig = PolicyConfig()
    current: Any = None
    failed: tuple[EngineFailedRun[S], ...] = ()
    failed_settings: tuple[S, ...] = ()
    """The flags as written of each ruled-out run (the runs hold the engine's effective settings)."""
    changes: list[EngineChange[S]] = field(default_factory=list)
    """The loop's changes (``Retuned``, ``RolledBack``, as ``status.history`` keeps them): the gates' and
    the flap guard's."""
    rollout: EngineRollout[S] | None = None
    last_good: S | None = None
    holds: list[EngineHold] = field(default_factory=list)
    """The newest ``Held`` entries of ``status.history`` in a row (a change or a verdict ends the run)."""
    held: S | None = None
    """What the newest ``Held`` entry would have rolled out (the operator records a hold once)."""
    log: list[str] = field(default_factory=list)
    first_change: float | None = None
    restart_seconds: float | None = None
    """The newest measured start to Ready of a pod of the current flags (``status.startupSeconds``)."""
    planned_at: float = 0.0

    # ------------------------------------------------------------------ the engine's part
    def decide(self, state: EngineLoopState[S], evidence: EngineEvidence, now: float) -> EngineDecision[S]:
        raise NotImplementedError

    def classify(self, time: float, log: str, pod: str) -> EngineRestart:
        raise NotImplementedError

    def render(self, settings: S) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------------ the operator's bookkeeping
    def plan(self, now: float) -> None:
        self.planned_at = now
        self.log.append(f"    t={now / 60:5.1f} min  Planned    {self.render(self.current)}")

    def _state(self) -> EngineLoopState[S]:
        changes = tuple(self.changes)
        if all(c.time != self.planned_at for c in self.changes):
            changes = (*changes, EngineChange(self.planned_at, "Planned", planned=True))
        return EngineLoopState(
            self.current, self.failed, changes, self.rollout, self.last_good, tuple(self.holds)
        )

    def _evidence(self, world: World, now: float, lost: float, blocked: str | None) -> EngineEvidence:
        mine = [p for p in world.pods if p.settings == self.current]
        for p in mine:  # the measured start (status.startupSeconds), as vLLM's bench
            if p.ready_at is not None and p.started_at is not None:
                self.restart_seconds = p.ready_at - p.started_at
        restarts = tuple(self.classify(p.last[0], p.last[1], p.name) for p in mine if p.last is not None)
        ready = any(p.state == "serving" for p in mine) and len(mine) == len(world.pods)
        not_started = any(p.state == "pending" for p in mine) and not restarts
        window = world.observe(now, self.policy.window_seconds)
        return EngineEvidence(
            window,
            restarts,
            restart_seconds=self.restart_seconds,
            ready=ready,
            not_started=not_started,
            rollout_lost_fraction=lost,
            rollout_blocked=blocked,
        )

    def tick(self, world: World, now: float) -> None:
        sc = self.scenario
        serving = any(p.state == "serving" for p in world.pods)
        choice = compute_rollout_choice(
            RolloutSpec(allowDowntime=sc.allow_downtime), 1, fits_now=sc.spare_gpu, serving=serving
        )
        lost, blocked = compute_costs(choice, 1, serving=serving)
        d = self.decide(self._state(), self._evidence(world, now, lost, blocked), now)
        if d.failed is not None and d.failed not in self.failed:
            self.failed = (*self.failed, d.failed)[-FAILED_LIMIT:]
            self.failed_settings = (*self.failed_settings, self.current)
        if d.good is not None:
            self.last_good = d.good
        if d.action == Action.INFEASIBLE and (not self.log or "Infeasible" not in self.log[-1]):
            world.stats.infeasible += 1
            self._note(now, "Infeasible", d.trigger, d.reason)
        if d.action == Action.INFEASIBLE or d.changes:  # a new history entry that is no hold
            self.holds, self.held = [], None
        if d.action == Action.HOLD and d.recommended is not None:  # a gate held a change: ``Held``, once
            last = self.holds[-1] if self.holds else None
            if last is None or (last.trigger, self.held) != (d.trigger, d.recommended):
                self.holds.append(EngineHold(now, d.trigger))
                self.held = d.recommended
                if "not worth a restart" in d.reason or choice.reason in d.reason:
                    self._note(now, "Held", d.trigger, d.reason)
        if choice.held and d.action == Action.HOLD and choice.reason in d.reason:  # no spare GPU, as vLLM's
            world.stats.holds += 1
        if not d.changes:
            self._keep_rollout(d)
            return
        strategy = "recreate" if choice.strategy in ("Recreate", "Replace") else "surge"
        if self.first_change is None:
            self.first_change = now
        self.changes.append(EngineChange(now, d.trigger, before=self.current, after=d.settings))
        action = "Retuned" if d.action == Action.RETUNE else "RolledBack"
        how = f"{strategy}{', held: the new pod waits for a GPU' if choice.held else ''}"
        self._note(now, action, d.trigger, f"[{how}] {d.reason}")
        world.stats.rollouts += 1
        world.stats.rollbacks += d.action == Action.ROLLBACK
        self.current = d.settings
        self.rollout = EngineRollout(d.settings, now, now + self.policy.rollout_deadline_seconds)
        world.roll_out(d.settings, now, strategy=strategy)

    def _keep_rollout(self, d: EngineDecision[S]) -> None:
        """No change: a rollout the decision no longer judges is over; its probation's end is kept."""
        active = self.rollout is not None and d.trigger in ROLLOUT_ACTIVE
        if self.rollout is not None and not active:
            self.rollout = None
        elif (
            self.rollout is not None
            and d.trigger == Trigger.ROLLOUT_PROBATION
            and self.rollout.probation_until is None
            and d.probation_until is not None
        ):
            self.rollout = replace(self.rollout, probation_until=d.probation_until)

    def _note(self, now: float, action: str, trigger: str, reason: str) -> None:
        self.log.append(f"    t={now / 60:5.1f} min  {action:<10} {trigger:<16} {reason[:160]}")
