"""kvpilot's closed loop for SGLang in the bench: ``compute_sglang_decision`` every tick, with the bookkeeping
the operator keeps for an SGLang service in mode Auto.

What :func:`kvpilot.operator.inferenceservice.sglang_loop.run_sglang_tick` reads and writes, mirrored over
the simulated Deployment (:mod:`bench.loopsim.world`):

* the state (:func:`kvpilot.operator.inferenceservice.sglang_reading.build_state_and_evidence`): the flags
  ``status.appliedEngineArgs`` says the Deployment runs, ``status.rollout`` while it is theirs,
  ``status.lastGoodEngineArgs``, the ruled-out runs of ``status.failedEngineArgs`` (the newest
  :data:`~kvpilot.operator.status.sglang_patch.FAILED_LIMIT`), and the changes of ``status.history``
  (``Retuned``/``RolledBack``) and ``lastChangeTime`` (the reconciler's plan at t=0);
* the evidence: the last termination of each pod that runs the current flags, its log classified by the
  seam (:func:`kvpilot.tuner.loop.classify_restart`), Ready when every pod runs them and one serves, not
  started when one waits for a GPU and none restarted; the measured start (the newest pod of the current
  flags' start to Ready: ``status.startupSeconds``, as the operator keeps it for SGLang and vLLM's bench
  passes it); what a rollout of a change would lose under the strategy the cluster allows now, or why it
  cannot roll out (:func:`kvpilot.operator.pods.workloads.fetch_rollout_costs`: a surge 0, a recreate 1; one
  replica, no spare GPU, no ``allowDowntime``: held with the HELD message, as vLLM's), and the history's
  newest ``Held`` entries in a row (a gate's hold, recorded once while it stays the same: the
  restart-cost trade counts its gain over how long the loop has held), as vLLM's bench passes them;
* the answer (:func:`kvpilot.operator.status.sglang_patch.build_sglang_patch`): a change is recorded as
  rolled out (a new rollout with the configured deadline), a rollout's probation kept, a judged one cleared,
  the good flags kept, the failed ones added;
* the Deployment follows a change with the strategy the cluster allows now
  (:func:`kvpilot.operator.pods.workloads.fetch_rollout_strategy`): a surge with a spare GPU, a replace
  when no pod serves, a recreate with ``allowDowntime``; a held choice holds a retune (the plan keeps
  serving), and renders a surge only for a rollback, whose new pod waits for a GPU (the old one keeps
  serving: the rollout pends).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.loopsim.scenario import BenchScenario
from bench.loopsim.world import World
from kvpilot.operator.api import RolloutSpec
from kvpilot.operator.pods.rollout_strategy import compute_costs, compute_rollout_choice
from kvpilot.operator.status.loop_patch import ROLLOUT_ACTIVE
from kvpilot.operator.status.sglang_patch import FAILED_LIMIT
from kvpilot.tuner import sglang
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    Action,
    EngineHold,
    FailedRun,
    PolicyConfig,
    SglangChange,
    SglangContext,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
    SglangRollout,
    Trigger,
    classify_restart,
    compute_sglang_decision,
)
from kvpilot.tuner.model import build_model_spec, lookup_checkpoint_bytes, lookup_model_config

DEFAULTS = sglang.SglangSettings()
"""SGLang's own defaults: the fraction its reserve leaves, the model's context, the running requests and
prefill chunk it sizes."""
SAFE = sglang.SglangSettings(
    context_length=32768, mem_fraction_static=0.80, max_running_requests=64, chunked_prefill_size=2048
)
"""A fixed "safe" choice: a lower fraction, 64 running requests, a small prefill chunk, 32k."""


def build_memory(sc: BenchScenario) -> SglangMemory:
    """What the operator resolves for the policy: the GPU, the catalogue model and its checkpoint."""
    plan = sc.sglang_plan
    assert plan is not None
    spec = build_model_spec(lookup_model_config(plan.model))
    return SglangMemory(lookup_gpu(plan.gpu), spec, lookup_checkpoint_bytes(plan.model))


@dataclass
class KvpilotSglang:
    """kvpilot's SGLang loop over the simulated Deployment (module docstring)."""

    scenario: BenchScenario
    policy: PolicyConfig = PolicyConfig()
    current: sglang.SglangSettings = sglang.SglangSettings()
    failed: tuple[FailedRun, ...] = ()
    failed_settings: tuple[sglang.SglangSettings, ...] = ()
    """The flags as written of each ruled-out run (the runs hold SGLang's effective settings)."""
    changes: list[SglangChange] = field(default_factory=list)
    """The loop's changes (``Retuned``, ``RolledBack``, as ``status.history`` keeps them): the gates' and
    the flap guard's."""
    rollout: SglangRollout | None = None
    last_good: sglang.SglangSettings | None = None
    holds: list[EngineHold] = field(default_factory=list)
    """The newest ``Held`` entries of ``status.history`` in a row (a change or a verdict ends the run)."""
    held: sglang.SglangSettings | None = None
    """What the newest ``Held`` entry would have rolled out (the operator records a hold once)."""
    log: list[str] = field(default_factory=list)
    first_change: float | None = None
    restart_seconds: float | None = None
    """The newest measured start to Ready of a pod of the current flags (``status.startupSeconds``)."""
    planned_at: float = 0.0

    def __post_init__(self) -> None:
        self.context = SglangContext(build_memory(self.scenario), self.scenario.bounds, self.policy)

    def plan(self, now: float) -> None:
        self.planned_at = now
        self.log.append(f"    t={now / 60:5.1f} min  Planned    {sglang.build_sglang_args(self.current)}")

    def _state(self) -> SglangLoopState:
        changes = tuple(self.changes)
        if all(c.time != self.planned_at for c in self.changes):
            changes = (*changes, SglangChange(self.planned_at, "Planned", planned=True))
        return SglangLoopState(
            self.current, self.failed, changes, self.rollout, self.last_good, tuple(self.holds)
        )

    def _evidence(self, world: World, now: float, lost: float, blocked: str | None) -> SglangEvidence:
        mine = [p for p in world.pods if p.settings == self.current]
        for p in mine:  # the measured start (status.startupSeconds), as vLLM's bench
            if p.ready_at is not None and p.started_at is not None:
                self.restart_seconds = p.ready_at - p.started_at
        restarts = tuple(classify_restart(p.last[0], p.last[1], p.name) for p in mine if p.last is not None)
        ready = any(p.state == "serving" for p in mine) and len(mine) == len(world.pods)
        not_started = any(p.state == "pending" for p in mine) and not restarts
        window = world.observe(now, self.policy.window_seconds)
        return SglangEvidence(
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
        evidence = self._evidence(world, now, lost, blocked)
        d = compute_sglang_decision(self._state(), evidence, self.context, now)
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
            return
        strategy = "recreate" if choice.strategy in ("Recreate", "Replace") else "surge"
        if self.first_change is None:
            self.first_change = now
        self.changes.append(SglangChange(now, d.trigger, before=self.current, after=d.settings))
        action = "Retuned" if d.action == Action.RETUNE else "RolledBack"
        how = f"{strategy}{', held: the new pod waits for a GPU' if choice.held else ''}"
        self._note(now, action, d.trigger, f"[{how}] {d.reason}")
        world.stats.rollouts += 1
        world.stats.rollbacks += d.action == Action.ROLLBACK
        self.current = d.settings
        self.rollout = SglangRollout(d.settings, now, now + self.policy.rollout_deadline_seconds)
        world.roll_out(d.settings, now, strategy=strategy)

    def _note(self, now: float, action: str, trigger: str, reason: str) -> None:
        self.log.append(f"    t={now / 60:5.1f} min  {action:<10} {trigger:<16} {reason[:160]}")


FRACTIONS = (0.70, 0.75, 0.80, 0.835, 0.85, 0.88, 0.90, 0.92)
"""The oracle's ``--mem-fraction-static`` grid (SGLang's H100 default, 0.835, among them)."""
RUNNING = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, None)
"""The oracle's ``--max-running-requests`` (``None``: SGLang sizes it from the pool)."""
CHUNKS = (2048, 4096, 8192, 16384)


def build_static(
    fraction: float, running: int | None, chunk: int, context: int | None
) -> sglang.SglangSettings:
    """One static setting of the oracle's grid."""
    return sglang.SglangSettings(
        context_length=context,
        mem_fraction_static=fraction,
        max_running_requests=running,
        chunked_prefill_size=chunk,
    )
