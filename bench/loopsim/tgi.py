"""kvpilot's closed loop for TGI in the bench: ``compute_tgi_decision`` every tick, with the bookkeeping the
operator keeps for a TGI service in mode Auto (the counterpart of :mod:`bench.loopsim.sglang`).

What :func:`kvpilot.operator.inferenceservice.tgi_loop.run_tgi_tick` (:func:`~kvpilot.operator.
inferenceservice.engine_loop.run_engine_tick` with TGI's profile) reads and writes, mirrored over the
simulated Deployment (:mod:`bench.loopsim.world`):

* the context (:func:`kvpilot.operator.loop.engine_profiles.build_tgi_context`): the GPU, the catalogue
  model and its checkpoint as :class:`~kvpilot.tuner.loop.TgiMemory`; the scenario's bounds merged with the
  plan's ``serving.maxContextLength`` (``spec.to_bounds``: the context the plan was asked for bounds
  ``--max-total-tokens``); no fp8 KV (the operator passes none for TGI);
* the state (:func:`kvpilot.operator.loop.engine_reading.build_state_and_evidence`): the flags
  ``status.appliedEngineArgs`` says the Deployment runs, ``status.rollout`` while it is theirs,
  ``status.lastGoodEngineArgs``, the ruled-out runs of ``status.failedEngineArgs`` (the newest
  :data:`~kvpilot.operator.status.engine_patch.FAILED_LIMIT`), and the changes of ``status.history``
  (``Retuned``/``RolledBack``; the reconciler's ``Planned`` at t=0);
* the evidence: the last termination of each pod that runs the current flags, its log classified by the
  seam (:func:`kvpilot.tuner.loop.classify_tgi_restart`: the warm-up's "Not enough memory to handle N
  prefill tokens", ``NotEnoughMemory(N)``, a CUDA OOM while serving), Ready when every pod runs them and
  one serves, not started when one waits for a GPU and none restarted; the measured start (the newest pod
  of the current flags' start to Ready: ``status.startupSeconds``, as the operator keeps it for TGI and vLLM's
  bench passes it); what a rollout of a change would lose under the strategy the cluster allows now (a surge
  0, a recreate 1) or why it cannot roll out (one replica, no spare GPU, no ``allowDowntime``: held with
  :data:`~kvpilot.operator.pods.rollout_strategy.HELD_MESSAGE`, as vLLM's), and the history's newest
  ``Held`` entries in a row (the restart-cost trade counts its gain over how long the loop has held), as
  SGLang's and vLLM's benches pass them;
* the answer (:func:`kvpilot.operator.status.engine_patch`): a change recorded as rolled out (a new rollout
  with the configured deadline), a rollout's probation kept, a judged one cleared, the good flags kept, the
  failed ones added;
* the Deployment follows a change with the strategy the cluster allows now
  (:func:`kvpilot.operator.pods.rollout_strategy.compute_rollout_choice`), as for SGLang.

The oracle's grid (:func:`oracle_grid`) is TGI's static flags: ``--cuda-memory-fraction`` x
``--max-concurrent-requests`` x ``--max-batch-prefill-tokens`` x ``--max-total-tokens`` (never below the
workload's longest requests; ``--max-input-tokens`` one below it, as kvpilot's plan renders it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.loopsim.scenario import BenchScenario, TgiPlan
from bench.loopsim.world import World
from kvpilot.operator.api import RolloutSpec
from kvpilot.operator.pods.rollout_strategy import compute_costs, compute_rollout_choice
from kvpilot.operator.status.engine_patch import FAILED_LIMIT
from kvpilot.operator.status.loop_patch import ROLLOUT_ACTIVE
from kvpilot.tuner import tgi
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    Action,
    EngineHold,
    PolicyConfig,
    TgiChange,
    TgiContext,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    TgiRollout,
    Trigger,
    classify_tgi_restart,
    compute_tgi_decision,
)
from kvpilot.tuner.loop.tgi_fit import FailedRun
from kvpilot.tuner.model import build_model_spec, lookup_checkpoint_bytes, lookup_model_config

DEFAULTS = tgi.TgiSettings()
"""TGI's own defaults: the launcher's prefill for the card, the KV and ``--max-total-tokens`` the warm-up
infers, 128 concurrent requests, the whole GPU (``--cuda-memory-fraction`` 1)."""
SAFE = tgi.TgiSettings(
    max_input_tokens=8191,
    max_total_tokens=8192,
    max_batch_prefill_tokens=4096,
    max_concurrent_requests=64,
    cuda_memory_fraction=0.85,
)
"""A fixed "safe" choice: 8k per request, a 4096-token prefill, 64 concurrent requests, 0.85 of the GPU."""


def _plan(sc: BenchScenario) -> TgiPlan:
    assert sc.tgi_plan is not None, "a TGI scenario states its plan"
    return sc.tgi_plan


def build_context(sc: BenchScenario, policy: PolicyConfig) -> TgiContext:
    """What the operator resolves for the policy (module docstring)."""
    plan = _plan(sc)
    spec = build_model_spec(lookup_model_config(plan.model))
    memory = TgiMemory(lookup_gpu(plan.gpu), spec, lookup_checkpoint_bytes(plan.model))
    bounds = sc.bounds
    if plan.max_context and bounds.max_max_model_len is None:
        bounds = replace(bounds, max_max_model_len=plan.max_context)
    return TgiContext(memory, bounds, policy)


@dataclass
class KvpilotTgi:
    """kvpilot's TGI loop over the simulated Deployment (module docstring)."""

    scenario: BenchScenario
    policy: PolicyConfig = PolicyConfig()
    current: tgi.TgiSettings = tgi.TgiSettings()
    failed: tuple[FailedRun, ...] = ()
    failed_settings: tuple[tgi.TgiSettings, ...] = ()
    """The flags as written of each ruled-out run (the runs hold TGI's effective settings)."""
    changes: list[TgiChange] = field(default_factory=list)
    """The loop's changes (``Retuned``, ``RolledBack``, as ``status.history`` keeps them)."""
    rollout: TgiRollout | None = None
    last_good: tgi.TgiSettings | None = None
    holds: list[EngineHold] = field(default_factory=list)
    """The newest ``Held`` entries of ``status.history`` in a row (a change or a verdict ends the run)."""
    held: tgi.TgiSettings | None = None
    """What the newest ``Held`` entry would have rolled out (the operator records a hold once)."""
    log: list[str] = field(default_factory=list)
    first_change: float | None = None
    restart_seconds: float | None = None
    """The newest measured start to Ready of a pod of the current flags (``status.startupSeconds``)."""
    planned_at: float = 0.0

    def __post_init__(self) -> None:
        self.context = build_context(self.scenario, self.policy)

    def plan(self, now: float) -> None:
        self.planned_at = now
        self.log.append(f"    t={now / 60:5.1f} min  Planned    {tgi.build_tgi_args(self.current)}")

    def _state(self) -> TgiLoopState:
        changes = tuple(self.changes)
        if all(c.time != self.planned_at for c in self.changes):
            changes = (*changes, TgiChange(self.planned_at, "Planned", planned=True))
        return TgiLoopState(
            self.current, self.failed, changes, self.rollout, self.last_good, tuple(self.holds)
        )

    def _evidence(self, world: World, now: float, lost: float, blocked: str | None) -> TgiEvidence:
        mine = [p for p in world.pods if p.settings == self.current]
        for p in mine:  # the measured start (status.startupSeconds), as vLLM's bench
            if p.ready_at is not None and p.started_at is not None:
                self.restart_seconds = p.ready_at - p.started_at
        restarts = tuple(
            classify_tgi_restart(p.last[0], p.last[1], p.name) for p in mine if p.last is not None
        )
        ready = any(p.state == "serving" for p in mine) and len(mine) == len(world.pods)
        not_started = any(p.state == "pending" for p in mine) and not restarts
        window = world.observe(now, self.policy.window_seconds)
        return TgiEvidence(
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
        d = compute_tgi_decision(self._state(), self._evidence(world, now, lost, blocked), self.context, now)
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
        self.changes.append(TgiChange(now, d.trigger, before=self.current, after=d.settings))
        action = "Retuned" if d.action == Action.RETUNE else "RolledBack"
        how = f"{strategy}{', held: the new pod waits for a GPU' if choice.held else ''}"
        self._note(now, action, d.trigger, f"[{how}] {d.reason}")
        world.stats.rollouts += 1
        world.stats.rollbacks += d.action == Action.ROLLBACK
        self.current = d.settings
        self.rollout = TgiRollout(d.settings, now, now + self.policy.rollout_deadline_seconds)
        world.roll_out(d.settings, now, strategy=strategy)

    def _note(self, now: float, action: str, trigger: str, reason: str) -> None:
        self.log.append(f"    t={now / 60:5.1f} min  {action:<10} {trigger:<16} {reason[:160]}")


FRACTIONS = (0.80, 0.85, 0.90, 0.95, 1.0)
"""The oracle's ``--cuda-memory-fraction`` grid (TGI's default, 1, among them)."""
CONCURRENT = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
"""The oracle's ``--max-concurrent-requests`` (TGI's default, 128, among them)."""
PREFILLS = (2048, 4096, 8192, 16384, 32768)
"""The oracle's ``--max-batch-prefill-tokens``."""

Build = Callable[[tuple[int, ...]], tgi.TgiSettings]


def build_static(fraction: float, concurrent: int, prefill: int, total: int | None) -> tgi.TgiSettings:
    """One static setting of the oracle's grid (``total``: ``--max-total-tokens``, ``None``: TGI's own)."""
    return tgi.TgiSettings(
        max_input_tokens=total - 1 if total else None,
        max_total_tokens=total,
        max_batch_prefill_tokens=prefill,
        max_concurrent_requests=concurrent,
        cuda_memory_fraction=fraction,
    )


def oracle_grid(
    lengths: Sequence[int | None],
) -> tuple[tuple[int, ...], list[tuple[int, ...]], Build]:
    """The oracle's grid over TGI's flags (``lengths``: the ``--max-total-tokens`` that serve the workload's
    longest requests, :func:`bench.loopsim.controllers.contexts`): its sizes, the starting points of the
    coordinate search (0.95 of the GPU; 16, 64, 128 and 512 concurrent requests; 4096 and 16384 prefill
    tokens; the shortest and the longest context), and the settings of a point."""
    sizes = (len(FRACTIONS), len(CONCURRENT), len(PREFILLS), len(lengths))
    starts = [(3, q, b, c) for q in (2, 5, 7, 11) for b in (1, 3) for c in sorted({0, len(lengths) - 1})]

    def build(p: tuple[int, ...]) -> tgi.TgiSettings:
        return build_static(FRACTIONS[p[0]], CONCURRENT[p[1]], PREFILLS[p[2]], lengths[p[3]])

    return sizes, starts, build
