"""Who decides the settings in a bench run: the engine's defaults, a fixed "safe" choice, kvpilot's closed
loop (the real ``compute_decision`` with the operator's bookkeeping; SGLang's ``compute_sglang_decision``
with its operator's: :mod:`bench.loopsim.sglang`), and the oracle (the best static settings, found with
hindsight by searching over whole runs)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.loopsim import sglang as sg
from bench.loopsim import tgi as tg
from bench.loopsim.scenario import BenchScenario, Settings
from bench.loopsim.world import DT, Stats, World
from e2e.fleet.truth import Workload
from kvpilot.operator.api import RolloutSpec
from kvpilot.operator.pods.rollout_strategy import compute_lost_fraction, compute_rollout_choice
from kvpilot.operator.status.loop_patch import QUIET_TRIGGERS
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    Action,
    Evidence,
    HistoryAction,
    HistoryEntry,
    LoopState,
    PolicyConfig,
    RestartEvent,
    RolloutState,
    Trigger,
    TuningContext,
    build_history,
    classify_termination,
    compute_decision,
)
from kvpilot.tuner.sglang import SglangSettings
from kvpilot.tuner.types import EngineSettings

H100 = lookup_gpu("H100-SXM")
TICK = 30.0
DEFAULTS = EngineSettings(gpu_memory_utilization=0.92, max_num_seqs=1024, max_num_batched_tokens=8192)
SAFE = EngineSettings(
    gpu_memory_utilization=0.85, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=32768
)


@dataclass
class Kvpilot:
    """kvpilot's closed loop over the simulated Deployment, with the operator's bookkeeping: a ``Planned``
    entry for the first settings, one rollout at a time, rollback to the last good settings, the
    measured start-to-Ready as ``Evidence.restart_seconds``, and the rollout strategy the operator's
    ``Auto`` picks (:func:`kvpilot.operator.pods.rollout_strategy.compute_rollout_choice`: surge with a spare
    GPU; else replace when the pod serves nothing, recreate when downtime is allowed, or hold), with its
    lost capacity and block passed to the policy as the operator passes them."""

    scenario: BenchScenario
    policy: PolicyConfig = PolicyConfig()
    current: EngineSettings = EngineSettings()
    history: tuple[HistoryEntry, ...] = ()
    failed: tuple[EngineSettings, ...] = ()
    last_good: EngineSettings | None = None
    rollout: RolloutState | None = None
    observed: int | None = None
    restart_seconds: float | None = None
    log: list[str] = field(default_factory=list)
    first_change: float | None = None
    changes: list[float] = field(default_factory=list)

    def plan(self, now: float) -> None:
        self._record(now, HistoryAction.PLANNED, "Planned", "the planner's settings", self.current)

    @property
    def failed_settings(self) -> tuple[EngineSettings, ...]:
        return self.failed

    def tick(self, world: World, now: float) -> None:
        sc = self.scenario
        mine = [p for p in world.pods if p.settings == self.current]
        restarts = tuple(
            RestartEvent(
                p.last[0],
                classify_termination(p.last[1], p.last[2], p.last[3]),
                pod=p.name,
                restart_count=p.restarts,
                crash_looping=p.state == "backoff",
            )
            for p in mine
            if p.last is not None
        )
        ready = any(p.state == "serving" for p in mine) and len(mine) == len(world.pods)
        for p in mine:
            if p.ready_at is not None and p.started_at is not None:
                self.restart_seconds = p.ready_at - p.started_at
        not_started = bool(mine) and all(p.state == "pending" for p in mine)
        serving = next((p for p in mine if p.state == "serving"), None)
        capacity = (
            serving.engine.num_blocks * serving.engine.block_size if serving and serving.engine else None
        )
        if capacity:
            self.observed = capacity
        window = world.observe(
            now,
            self.policy.window_seconds,
            kv_capacity_tokens=capacity,
            reported_gpu_memory_utilization=self.current.gpu_memory_utilization,
            reported_kv_cache_dtype=self.current.kv_cache_dtype or "auto",
        )
        assert sc.plan_budget is not None, "a vLLM scenario states the plan's budget"
        state = LoopState(
            current=self.current,
            history=self.history,
            failed=self.failed,
            rollout=self.rollout,
            last_good=self.last_good,
            observed_kv_tokens=self.observed,
        )
        serving_now = any(p.state == "serving" for p in world.pods)
        choice = compute_rollout_choice(
            RolloutSpec(allowDowntime=sc.allow_downtime), 1, fits_now=sc.spare_gpu, serving=serving_now
        )
        evidence = Evidence(
            budget=sc.plan_budget,
            window=window,
            restarts=restarts,
            ready=ready,
            not_started=not_started,
            restart_seconds=self.restart_seconds,
            # what the operator knows before a pod starts: the model's checkpoint and its weight cache
            checkpoint_gib=sc.truth.startup.checkpoint_gib or None,
            weights_cached=sc.weights_cached,
            compile_cache_persistent=sc.compile_cache,
            rollout_lost_fraction=compute_lost_fraction(choice, 1, serving=serving_now),
            rollout_blocked=choice.reason if choice.held else None,
        )
        context = TuningContext(
            gpu=H100, default_max_model_len=sc.truth.model_max_len, bounds=sc.bounds, policy=self.policy
        )
        d = compute_decision(state, evidence, context, now)
        if d.failed is not None and d.failed not in self.failed:
            self.failed = (*self.failed, d.failed)
        if d.good is not None:
            self.last_good = d.good
        if self.rollout is not None and d.trigger == Trigger.ROLLOUT_PROBATION:
            self.rollout = dataclasses.replace(self.rollout, probation_until=d.probation_until)
        elif self.rollout is not None and d.trigger not in (
            Trigger.ROLLOUT_IN_PROGRESS,
            Trigger.ROLLOUT_PENDING,
        ):
            self.rollout = None
        if d.action == Action.INFEASIBLE and (
            not self.history or self.history[-1].action != HistoryAction.INFEASIBLE
        ):
            world.stats.infeasible += 1
            self._record(now, HistoryAction.INFEASIBLE, d.trigger, d.reason, d.settings)
        if d.action == Action.HOLD and d.trigger not in QUIET_TRIGGERS:  # as the operator's status history
            to = d.recommended or d.settings
            held = (HistoryAction.HELD, d.trigger, to)
            last = self.history[-1] if self.history else None
            if last is None or (last.action, last.trigger, last.to_settings) != held:
                self.history = build_history(
                    self.history, HistoryEntry(now, HistoryAction.HELD, d.trigger, d.reason, self.current, to)
                )
        if choice.held and d.action == Action.HOLD and choice.reason in d.reason:  # no spare GPU
            world.stats.holds += 1
            if not self.log or "no spare GPU" not in self.log[-1]:
                self.log.append(f"    t={now / 60:5.1f} min  Held       {d.reason[:140]}")
        if not d.changes:
            return
        strategy = "recreate" if choice.strategy in ("Recreate", "Replace") else "surge"
        if self.first_change is None:
            self.first_change = now
        self.changes.append(now)
        action = HistoryAction.RETUNED if d.action == Action.RETUNE else HistoryAction.ROLLED_BACK
        self._record(now, action, d.trigger, d.reason, d.settings, strategy)
        world.stats.rollouts += 1
        world.stats.rollbacks += d.action == Action.ROLLBACK
        self.current, self.observed = d.settings, None
        self.rollout = RolloutState(d.settings, now, now + self.policy.rollout_deadline_seconds)
        world.roll_out(d.settings, now, strategy=strategy)

    def _record(
        self,
        now: float,
        action: HistoryAction,
        trigger: str,
        reason: str,
        to: EngineSettings,
        strategy: str = "",
    ) -> None:
        self.history = build_history(
            self.history, HistoryEntry(now, action, trigger, reason, self.current, to)
        )
        how = f" [{strategy}]" if strategy else ""
        self.log.append(f"    t={now / 60:5.1f} min  {action:<10} {trigger:<16}{how} {reason[:140]}")


Loop = Kvpilot | sg.KvpilotSglang | tg.KvpilotTgi


def defaults(sc: BenchScenario) -> Settings:
    """The engine's own defaults."""
    return {"sglang": sg.DEFAULTS, "tgi": tg.DEFAULTS}.get(sc.engine, DEFAULTS)


def safe(sc: BenchScenario) -> Settings:
    """A fixed "safe" choice in the engine's settings."""
    return {"sglang": sg.SAFE, "tgi": tg.SAFE}.get(sc.engine, SAFE)


@dataclass(frozen=True)
class Run:
    stats: Stats
    final: Settings
    seconds: float
    loop: Loop | None = None

    @property
    def goodput(self) -> float:
        """Output tokens per second of completed requests (no SLO: every completed request counts)."""
        return self.stats.output_tokens / self.seconds


def _loop(scenario: BenchScenario, start: Settings) -> Loop:
    if isinstance(start, EngineSettings):
        return Kvpilot(scenario, current=start)
    if isinstance(start, SglangSettings):
        return sg.KvpilotSglang(scenario, current=start)
    return tg.KvpilotTgi(scenario, current=start)


def run(scenario: BenchScenario, start: Settings, *, closed_loop: bool, hours: float | None = None) -> Run:
    hours = scenario.hours if hours is None else hours
    world = World(scenario)
    loop = _loop(scenario, start) if closed_loop else None
    world.roll_out(start, 0.0, strategy="surge")
    if loop is not None:
        loop.plan(0.0)
    now, end = 0.0, hours * 3600
    while now < end:
        now += DT
        world.step(now)
        if loop is not None and now % TICK == 0:
            loop.tick(world, now)
    if loop is not None:
        world.stats.failed_never_ran = sum(1 for s in loop.failed_settings if s not in world.ran)
    return Run(world.stats, loop.current if loop else start, end, loop)


GMU = (0.80, 0.85, 0.90, 0.92, 0.95)
SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCHED = (2048, 4096, 8192, 16384)


def longest_request(sc: BenchScenario) -> int:
    """Prompt plus output of the workload's longest requests (the top of a uniform spread, the 99th
    percentile of a lognormal one), over every phase."""

    def top(mean: int, w: Workload) -> float:
        if w.distribution == "lognormal" and w.spread > 0:
            sigma = math.sqrt(math.log(1 + w.spread**2))
            return math.exp(math.log(mean) - sigma**2 / 2 + 2.326 * sigma)
        return mean * (1 + w.spread)

    return max(
        math.ceil(top(ph.workload.prompt_tokens, ph.workload) + top(ph.workload.output_tokens, ph.workload))
        for ph in sc.phases
    )


def contexts(sc: BenchScenario) -> tuple[int | None, ...]:
    """The oracle's context lengths: from the bounds' minimum (or 4096) to the planned one, doubling, and
    never below the workload's longest requests (:func:`longest_request`): a context that refuses the
    traffic's long requests wins goodput by turning users away, which no static setting may count."""
    top = sc.planned_context or sc.truth.model_max_len
    low = sc.bounds.min_max_model_len or min(4096, top)
    out, length = [], low
    while length < top:
        out.append(length)
        length *= 2
    serving = [x for x in out if x >= longest_request(sc)]
    return (*serving, top)


def _static(
    sc: BenchScenario, gmu: float, seqs: int, batched: int, fp8: bool, length: int | None
) -> EngineSettings:
    return EngineSettings(
        max_model_len=length,
        max_num_seqs=seqs,
        gpu_memory_utilization=gmu,
        max_num_batched_tokens=batched,
        kv_cache_dtype="fp8" if fp8 else None,
    )


def compute_oracle(sc: BenchScenario, *, hours: float | None = None) -> Run:
    """The best static settings with hindsight: whole runs, a coordinate search over utilisation x
    sequences x batched tokens x context (x fp8 when the bounds allow it), from the best of twelve
    starting points, until no neighbour is better. SGLang: ``--mem-fraction-static`` x
    ``--max-running-requests`` x ``--chunked-prefill-size`` x ``--context-length`` (the grids of
    :mod:`bench.loopsim.sglang`), from the same kind of starting points; TGI: ``--cuda-memory-fraction`` x
    ``--max-concurrent-requests`` x ``--max-batch-prefill-tokens`` x ``--max-total-tokens``
    (:func:`bench.loopsim.tgi.oracle_grid`)."""
    lengths = contexts(sc)
    if sc.engine == "tgi":
        tgi_sizes, tgi_starts, tgi_build = tg.oracle_grid(lengths)
        return _search(sc, tgi_sizes, tgi_starts, tgi_build, hours)
    if sc.engine == "sglang":
        running = sg.RUNNING
        sglang_starts = [
            (3, q, b, c)
            for q in (2, 4, 8, len(running) - 1)
            for b in (0, 2)
            for c in sorted({0, len(lengths) - 1})
        ]
        return _search(
            sc,
            (len(sg.FRACTIONS), len(running), len(sg.CHUNKS), len(lengths)),
            sglang_starts,
            lambda p: sg.build_static(sg.FRACTIONS[p[0]], running[p[1]], sg.CHUNKS[p[2]], lengths[p[3]]),
            hours,
        )
    sizes = (len(GMU), len(SEQS), len(BATCHED), 2 if sc.bounds.allow_fp8_kv else 1, len(lengths))
    starts = [(2, q, b, 0, c) for q in (1, 4, 6, 8) for b in (0, 2) for c in sorted({0, len(lengths) - 1})]
    return _search(
        sc,
        sizes,
        starts,
        lambda p: _static(sc, GMU[p[0]], SEQS[p[1]], BATCHED[p[2]], bool(p[3]), lengths[p[4]]),
        hours,
    )


def _search(
    sc: BenchScenario,
    sizes: tuple[int, ...],
    starts: Sequence[tuple[int, ...]],
    build: Callable[[tuple[int, ...]], Settings],
    hours: float | None,
) -> Run:
    """A coordinate search over the grid ``sizes`` of static settings (``build``), from the best start."""
    memo: dict[tuple[int, ...], Run] = {}

    def score(p: tuple[int, ...]) -> float:
        if p not in memo:
            memo[p] = run(sc, build(p), closed_loop=False, hours=hours)
        return memo[p].goodput

    best = max(starts, key=score)
    improved = True
    while improved:
        improved = False
        for axis in range(len(sizes)):
            for d in (-1, 1):
                n = tuple(v + d if i == axis else v for i, v in enumerate(best))
                if 0 <= n[axis] < sizes[axis] and score(n) > score(best) * 1.001:
                    best, improved = n, True
    return memo[best]


def compute_reachable(sc: BenchScenario, oracle: Run, *, hours: float | None = None) -> Run:
    """The most any closed loop can serve from the scenario's plan: the plan's pod starts, and at the first
    evidence there is (its pod serves, or it fails) the oracle's settings roll out at once, with a surge
    where a spare GPU allows it, else recreated (only where ``allowDowntime`` lets it take a serving pod down,
    or none serves: else the plan is what serves, as :func:`~kvpilot.operator.pods.rollout_strategy.
    compute_rollout_choice` holds a loop's change); or the plan alone, when it is as good. A loop needs that
    evidence and one restart, so a plan far from the oracle's settings with a long start loses what no
    policy can win back (``slow-start``: 21 minutes of start at the plan's 8 sequences): the ratio
    ``kvpilot / reachable`` judges the policy, ``kvpilot / oracle`` the policy and the plan together."""
    hours = sc.hours if hours is None else hours
    static = run(sc, sc.start, closed_loop=False, hours=hours)
    if oracle.final == sc.start:
        return static
    world = World(sc)
    world.roll_out(sc.start, 0.0, strategy="surge")
    now, end, switched = 0.0, hours * 3600, False
    while now < end:
        now += DT
        world.step(now)
        evidence = any(p.state in ("serving", "failing", "backoff") or p.restarts for p in world.pods)
        if not switched and evidence:
            serving = any(p.state == "serving" for p in world.pods)
            if not sc.spare_gpu and serving and not sc.allow_downtime:
                return static  # no GPU for a surge pod, and the spec forbids taking the serving one down
            world.roll_out(oracle.final, now, strategy="surge" if sc.spare_gpu else "recreate")
            switched = True
    switched_run = Run(world.stats, oracle.final, end)
    return max(static, switched_run, key=lambda r: r.goodput)
