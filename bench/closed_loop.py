"""The closed loop in simulation: kvpilot against vLLM's defaults and a fixed "safe" configuration.

Nine scenarios (the first five from the start, four more for the weaknesses of
``closed_loop_findings.md``: edge-of-fit, band-queue, startup-oom, noisy-peak), each with its
own ground truth (GPU memory, weights, activation, KV bytes per token, memory vLLM does not
account for at run time, start-up failure thresholds) and workload. The ground truth is written
out here, number by number: it does **not** use kvpilot's memory model, so kvpilot is judged
against a world it did not write. What kvpilot knows is the planner's budget for its first
settings (deliberately imperfect in some scenarios), what the pods say when they stop (vLLM's
own error texts, classified by ``kvpilot.tuner.loop.restarts``) and the metrics a Prometheus
would have (30 s samples).

Controllers:

* ``vllm-defaults`` -- vLLM 0.33's defaults on an 80 GB GPU: utilisation 0.92, 1024 sequences,
  8192 batched tokens, the model's full context. Fixed.
* ``fixed-safe``   -- what a cautious person pins: utilisation 0.85, 64 sequences, 32k context. Fixed.
* ``kvpilot``      -- starts from the plan and runs ``kvpilot.tuner.loop.policy.compute_decision``
  every 30 s, with the operator's rules: a ``Planned`` history entry for the first settings, one
  rollout at a time, the old pod serves until the new one is Ready (``maxSurge: 1,
  maxUnavailable: 0``), rollback to the last good settings, and the measured start-to-Ready
  seconds passed as ``Evidence.restart_seconds`` (when the policy has that field: the bench also
  runs against older policies, for before/after figures on the same scenarios).

The serving model is a fluid approximation of vLLM V1 (10 s steps): admission while the KV
cache has room for the running sequences' live tokens, decode steps that slow down with
batch size, preemption by recomputation when running sequences outgrow the cache, a
CUDA OOM when run-time memory outside vLLM's budget exceeds ``1 - gpu_memory_utilization``,
and CrashLoopBackOff (10 s doubling to 5 min) on every crash.

    python bench/closed_loop.py [--hours H] [--scenario NAME ...]

Prints, per scenario and controller: crashes, downtime, goodput (output tokens/s of
completed requests), preemptions, served share, rollouts and rollbacks, minutes to kvpilot's
first change after the plan, final settings.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    Action,
    Evidence,
    HistoryAction,
    HistoryEntry,
    LengthSummary,
    LoopState,
    MetricsSample,
    ObservationWindow,
    PolicyConfig,
    RestartEvent,
    RolloutState,
    Trigger,
    TuningBounds,
    TuningContext,
    build_history,
    classify_termination,
    compute_decision,
)
from kvpilot.tuner.types import EngineSettings, MemoryBudget

GIB = 1 << 30
H100 = lookup_gpu("H100-SXM")
"""The scenarios' GPU (79.19 GiB to CUDA): vLLM's batch defaults follow from it."""
DT = 10.0
TICK = 30.0
MAX_QUEUE = 3000
"""Requests waiting beyond this are dropped (client time-outs)."""
START_FAIL_AFTER = 60.0
"""Seconds from container start to a start-up failure (load + profile)."""
PREFILL_COST = 0.25
"""Cost of recomputing one prompt token, in decode-token equivalents."""


# --- ground truth ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """How the simulated GPU and model really behave (numbers of this scenario only)."""

    gpu_total_gib: float = 79.19
    weights_gib: float = 14.99
    non_torch_gib: float = 0.6
    activation_base_gib: float = 1.0
    activation_per_1k_batched_gib: float = 0.25
    kv_bytes_per_token: int = 131072
    model_max_len: int = 131072
    runtime_extra_base_gib: float = 1.0
    """Run-time memory vLLM's profile did not see (fragmentation, sampler spikes, NCCL) ..."""
    runtime_extra_per_seq_gib: float = 0.004
    """... growing with the running batch."""
    startup_extra_per_seq_gib: float = 0.0
    """CUDA-graph capture memory outside the budget per sequence (start-up CUDA OOM when too many)."""
    startup_seconds: float = 150.0
    step_base_s: float = 0.012
    step_per_seq_s: float = 0.00008


@dataclass(frozen=True)
class Load:
    rate: float
    """Requests per second."""
    prompt: int
    output: int


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    truth: Truth
    load: Load
    planned: EngineSettings
    """kvpilot's first settings (the planner's)."""
    plan_budget: MemoryBudget
    """What the planner believed of ``planned``: kvpilot's only prior (may be wrong)."""
    bounds: TuningBounds = TuningBounds()
    later: Load | None = None
    """The load from ``switch_at`` on (a load that changes once), if any."""
    switch_at: float = 0.0


DEFAULTS = EngineSettings(gpu_memory_utilization=0.92, max_num_seqs=1024, max_num_batched_tokens=8192)
SAFE = EngineSettings(
    gpu_memory_utilization=0.85, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=32768
)


def _resolve(truth: Truth, s: EngineSettings) -> tuple[float, int, int, int, float]:
    gmu = s.gpu_memory_utilization or 0.92
    return (
        gmu,
        s.max_num_seqs or 1024,
        s.max_num_batched_tokens or 8192,
        s.max_model_len or truth.model_max_len,
        0.5 if (s.kv_cache_dtype or "").startswith("fp8") else 1.0,
    )


def start_engine(truth: Truth, s: EngineSettings) -> tuple[int, str | None]:
    """(KV tokens, None) if vLLM starts with ``s``; (0, the text vLLM prints) if not."""
    gmu, seqs, batched, length, kv_scale = _resolve(truth, s)
    outside = (1.0 - gmu) * truth.gpu_total_gib
    if truth.startup_extra_per_seq_gib * seqs > outside - truth.runtime_extra_base_gib:
        need = truth.startup_extra_per_seq_gib * seqs
        free = outside - truth.runtime_extra_base_gib
        return 0, (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{need * 1024:.2f} MiB. GPU 0 has a total capacity of {truth.gpu_total_gib:.2f} GiB "
            f"of which {free * 1024:.2f} MiB is free."
        )
    activation = truth.activation_base_gib + truth.activation_per_1k_batched_gib * batched / 1000
    available = gmu * truth.gpu_total_gib - truth.weights_gib - activation - truth.non_torch_gib
    if available <= 0:
        return 0, (
            "ValueError: No available memory for the cache blocks. "
            "Try increasing `gpu_memory_utilization` when initializing the engine "
            "(this flag also controls CPU memory reservation on the CPU backend, "
            "despite its name)."
        )
    per_token = truth.kv_bytes_per_token * kv_scale
    tokens = int(available * GIB / per_token) // 16 * 16
    if tokens < length:
        need = length * per_token / GIB
        return 0, (
            f"ValueError: To serve at least one request with the model's max seq len ({length}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({available:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{tokens - 16}. Try increasing `gpu_memory_utilization` "
            "(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` "
            "when initializing the engine."
        )
    return tokens, None


def oom_text(truth: Truth) -> str:
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. "
        f"GPU 0 has a total capacity of {truth.gpu_total_gib:.2f} GiB of which 140.75 MiB is free."
    )


# --- pods -----------------------------------------------------------------------------------------------


@dataclass
class Pod:
    name: str
    settings: EngineSettings
    state: str = "starting"  # starting | serving | waiting (start-up failure pending) | backoff
    until: float = 0.0
    kv_tokens: int = 0
    restarts: int = 0
    running: float = 0.0
    last: tuple[float, str, str, int] | None = None
    """(finished at, message, reason, exit code) of the last termination."""
    pending_error: str | None = None


@dataclass
class Stats:
    crashes: int = 0
    downtime: float = 0.0
    output_tokens: float = 0.0
    preemptions: float = 0.0
    arrived: float = 0.0
    completed: float = 0.0
    dropped: float = 0.0
    rollouts: int = 0
    rollbacks: int = 0
    infeasible: int = 0


@dataclass
class World:
    truth: Truth
    load: Load
    pods: list[Pod] = field(default_factory=list)
    queue: float = 0.0
    stats: Stats = field(default_factory=Stats)
    samples: list[MetricsSample] = field(default_factory=list)
    serial: int = 0

    def create(self, settings: EngineSettings, now: float) -> None:
        self.serial += 1
        pod = Pod(f"llm-{self.serial:04x}-pod", settings)
        self._boot(pod, now)
        self.pods.append(pod)

    def _boot(self, pod: Pod, now: float) -> None:
        tokens, error = start_engine(self.truth, pod.settings)
        pod.kv_tokens, pod.pending_error = tokens, error
        if error is None:
            pod.state, pod.until = "starting", now + self.truth.startup_seconds
        else:
            pod.state, pod.until = "waiting", now + START_FAIL_AFTER

    def _crash(self, pod: Pod, now: float, message: str) -> None:
        self.stats.crashes += 1
        pod.restarts += 1
        pod.last = (now, message, "Error", 1)
        self.stats.dropped += pod.running
        pod.running = 0.0
        pod.state, pod.until = "backoff", now + min(300.0, 10.0 * 2 ** (pod.restarts - 1))

    def set_desired(self, settings: EngineSettings, now: float) -> None:
        """A Deployment update: surge a pod with ``settings``; pods with other settings go once it serves."""
        if not any(p.settings == settings for p in self.pods):
            self.create(settings, now)
        self.desired = settings

    desired: EngineSettings = EngineSettings()

    def step(self, now: float) -> None:
        t, load = self.truth, self.load
        for pod in self.pods:
            if pod.state == "waiting" and now >= pod.until:
                self._crash(pod, now, pod.pending_error or "")
            elif pod.state == "backoff" and now >= pod.until:
                self._boot(pod, now)
            elif pod.state == "starting" and now >= pod.until:
                pod.state = "serving"
        mine = [p for p in self.pods if p.settings == self.desired]
        if any(p.state == "serving" for p in mine):  # rollout done: the old pods go (their requests drain)
            self.pods = mine
        serving = [p for p in self.pods if p.state == "serving"]
        arrivals = load.rate * DT
        self.stats.arrived += arrivals
        if not serving:
            self.stats.downtime += DT
            self.queue += arrivals
        else:
            pod = serving[-1]
            _, seqs, _, length, _ = _resolve(t, pod.settings)
            if load.prompt + load.output > length:
                self.stats.dropped += arrivals  # rejected: longer than max-model-len
            else:
                self.queue += arrivals
                self._serve(pod, now, seqs)
        overflow = max(0.0, self.queue - MAX_QUEUE)
        self.stats.dropped += overflow
        self.queue -= overflow

    def _serve(self, pod: Pod, now: float, seqs: int) -> None:
        """One fluid step: the running batch is what fits (sequences, KV) of the requests in the system."""
        t, load = self.truth, self.load
        live, peak = load.prompt + load.output / 2, load.prompt + load.output
        admit = min(float(seqs), pod.kv_tokens / live)  # V1 admits while the KV cache has room now
        r = min(admit, self.queue)
        pod.running = r
        gmu = pod.settings.gpu_memory_utilization or 0.92
        extra = t.runtime_extra_base_gib + t.runtime_extra_per_seq_gib * r
        if extra > (1.0 - gmu) * t.gpu_total_gib:
            self.queue -= r
            self._crash(pod, now, oom_text(t))
            return
        step = t.step_base_s + t.step_per_seq_s * r
        tokens = r / step * DT if r > 0 else 0.0
        over = max(0.0, r * peak - pod.kv_tokens) / peak  # sequences that outgrow the cache before they end
        preempt_rate = over / (load.output * step) if r > 0 else 0.0
        waste = preempt_rate * DT * (load.prompt * PREFILL_COST + load.output / 2)
        done = min(self.queue, max(0.0, tokens - waste) / load.output)
        self.queue -= done
        self.stats.completed += done
        self.stats.output_tokens += done * load.output
        self.stats.preemptions += preempt_rate * DT
        usage = min(1.0, (r * live + over * load.output / 2) / pod.kv_tokens)
        self.samples.append(MetricsSample(now, usage, preempt_rate, r, max(0.0, self.queue - r)))


# --- controllers ------------------------------------------------------------------------------------------


@dataclass
class Kvpilot:
    """kvpilot's closed loop over the simulated Deployment, with the operator's bookkeeping."""

    scenario: Scenario
    policy: PolicyConfig = PolicyConfig()
    current: EngineSettings = EngineSettings()
    history: tuple[HistoryEntry, ...] = ()
    failed: tuple[EngineSettings, ...] = ()
    last_good: EngineSettings | None = None
    rollout: RolloutState | None = None
    observed: int | None = None
    log: list[str] = field(default_factory=list)
    first_change: float | None = None
    """Seconds from the start to the first change after the plan."""

    def plan(self, now: float) -> None:
        """The operator's ``Planned`` history entry for the first settings (status.py writes one)."""
        self._record(now, HistoryAction.PLANNED, "Planned", "the planner's settings", self.current)

    def tick(self, world: World, now: float) -> None:
        mine = [p for p in world.pods if p.settings == self.current]
        restarts = tuple(
            RestartEvent(p.last[0], classify_termination(p.last[1], p.last[2], p.last[3]), pod=p.name,
                         restart_count=p.restarts, crash_looping=p.state == "backoff")
            for p in mine if p.last is not None
        )  # fmt: skip
        ready = any(p.state == "serving" for p in mine) and len(mine) == len(world.pods)
        recent = tuple(s for s in world.samples if s.time > now - self.policy.window_seconds)
        serving = next((p for p in mine if p.state == "serving"), None)
        capacity = serving.kv_tokens if serving is not None else None
        if capacity:
            self.observed = capacity
        window = ObservationWindow(
            now - self.policy.window_seconds, now, recent,
            LengthSummary(world.load.prompt), LengthSummary(world.load.output),
            kv_capacity_tokens=capacity, reported_gpu_memory_utilization=self.current.gpu_memory_utilization,
            reported_kv_cache_dtype=self.current.kv_cache_dtype or "auto", pods=len(world.pods),
        ) if recent else ObservationWindow.unavailable("no samples", now)  # fmt: skip
        state = LoopState(
            current=self.current, history=self.history, failed=self.failed, rollout=self.rollout,
            last_good=self.last_good, observed_kv_tokens=self.observed,
        )  # fmt: skip
        evidence = Evidence(budget=self.scenario.plan_budget, window=window, restarts=restarts, ready=ready)
        if _RESTART_HOOK:  # the measured start-to-Ready (the bench also runs against policies without it)
            evidence = dataclasses.replace(evidence, restart_seconds=self.scenario.truth.startup_seconds)
        context = TuningContext(
            gpu=H100, default_max_model_len=self.scenario.truth.model_max_len, bounds=self.scenario.bounds,
            policy=self.policy,
        )  # fmt: skip
        d = compute_decision(state, evidence, context, now)
        if d.failed is not None and d.failed not in self.failed:
            self.failed = (*self.failed, d.failed)
        if d.good is not None:
            self.last_good = d.good
        if self.rollout is not None and d.trigger == Trigger.ROLLOUT_PROBATION:
            self.rollout = dataclasses.replace(self.rollout, probation_until=d.probation_until)
        elif self.rollout is not None and d.trigger != Trigger.ROLLOUT_IN_PROGRESS:
            self.rollout = None
        if (
            d.action == Action.INFEASIBLE
            and not self.history
            or (d.action == Action.INFEASIBLE and self.history[-1].action != HistoryAction.INFEASIBLE)
        ):
            world.stats.infeasible += 1
            self._record(now, HistoryAction.INFEASIBLE, d.trigger, d.reason, d.settings)
        if d.changes:
            if self.first_change is None:
                self.first_change = now
            action = HistoryAction.RETUNED if d.action == Action.RETUNE else HistoryAction.ROLLED_BACK
            self._record(now, action, d.trigger, d.reason, d.settings)
            world.stats.rollouts += 1
            world.stats.rollbacks += d.action == Action.ROLLBACK
            self.current, self.observed = d.settings, None
            self.rollout = RolloutState(d.settings, now, now + self.policy.rollout_deadline_seconds)
            world.set_desired(d.settings, now)

    def _record(
        self, now: float, action: HistoryAction, trigger: str, reason: str, to: EngineSettings
    ) -> None:
        entry = HistoryEntry(now, action, trigger, reason, self.current, to)
        self.history = build_history(self.history, entry)
        self.log.append(f"    t={now / 60:5.1f} min  {action:<10} {trigger:<16} {reason[:150]}")


_RESTART_HOOK = "restart_seconds" in {f.name for f in dataclasses.fields(Evidence)}


def run(scenario: Scenario, controller: str, hours: float) -> tuple[Stats, EngineSettings, Kvpilot | None]:
    world = World(scenario.truth, scenario.load)
    start = {"vllm-defaults": DEFAULTS, "fixed-safe": SAFE, "kvpilot": scenario.planned}[controller]
    world.set_desired(start, 0.0)
    loop = Kvpilot(scenario, current=start) if controller == "kvpilot" else None
    if loop is not None:
        loop.plan(0.0)
    now = 0.0
    while now < hours * 3600:
        now += DT
        if scenario.later is not None and now >= scenario.switch_at:
            world.load = scenario.later
        world.step(now)
        if loop is not None and now % TICK == 0:
            loop.tick(world, now)
    final = loop.current if loop is not None else start
    return world.stats, final, loop


# --- scenarios ----------------------------------------------------------------------------------------------


def _budget(kv_tokens: int, kv_bytes: int = 131072, weights: float = 14.99) -> MemoryBudget:
    kv_gib = kv_tokens * kv_bytes / GIB
    return MemoryBudget(
        gpu_total_gib=79.19, requested_gib=72.85, weights_gib=weights, activation_gib=3.0, non_torch_gib=0.6,
        cuda_graph_gib=0.5, available_kv_cache_gib=kv_gib, kv_bytes_per_token=kv_bytes,
        num_gpu_blocks=kv_tokens // 16, kv_cache_tokens=kv_tokens, max_concurrency=kv_tokens / 32768,
        starts=True,
    )  # fmt: skip


SCENARIOS = (
    Scenario(
        "oom-crash",
        "8B model, 28 req/s of 1000+300 tokens; run-time memory outside vLLM's budget grows with the batch "
        "(1 GiB + 20 MiB/seq): at 0.92 the pod OOMs near 270 running sequences",
        Truth(runtime_extra_per_seq_gib=0.02),
        Load(rate=28.0, prompt=1000, output=300),
        EngineSettings(
            max_model_len=32768, max_num_seqs=512, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "startup-kv",
        "a 40 GiB model with 320 KiB of KV per token and 40k-token prompts; the plan over-estimated the KV "
        "cache (140k tokens, really 96k), so 128k context does not start",
        Truth(weights_gib=40.0, kv_bytes_per_token=327_680),
        Load(rate=0.3, prompt=40_000, output=500),
        EngineSettings(
            max_model_len=131072, max_num_seqs=16, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(140_000, kv_bytes=327_680, weights=37.0),
        TuningBounds(min_max_model_len=45_000),
    ),
    Scenario(
        "preemption-storm",
        "long generations (2000+2000 tokens, 2.6 req/s): 256 sequences outgrow the KV cache and preempt",
        Truth(),
        Load(rate=2.6, prompt=2000, output=2000),
        EngineSettings(
            max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "idle-queue",
        "short chat (200+100 tokens, 60 req/s), planned for 64 sequences: KV nearly empty, a queue grows",
        Truth(),
        Load(rate=60.0, prompt=200, output=100),
        EngineSettings(
            max_model_len=32768, max_num_seqs=64, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "bad-new-settings",
        "as idle-queue, but CUDA-graph capture needs 50 MiB per sequence outside the budget: more than ~110 "
        "sequences OOM at start-up (vLLM's default 1024 never starts)",
        Truth(startup_extra_per_seq_gib=0.05),
        Load(rate=60.0, prompt=200, output=100),
        EngineSettings(
            max_model_len=32768, max_num_seqs=64, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "edge-of-fit",
        "a 67 GiB model with 320 KiB of KV per token and a 4096-token minimum context: at the planned 0.90 "
        "and 8192 batched tokens only 2015 tokens fit (findings, weakness 1); 4096 batched tokens fit",
        Truth(weights_gib=67.0, kv_bytes_per_token=327_680),
        Load(rate=1.0, prompt=1000, output=200),
        EngineSettings(
            max_model_len=4096, max_num_seqs=8, gpu_memory_utilization=0.90, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(8_000, kv_bytes=327_680, weights=65.0),
        TuningBounds(min_max_model_len=4096),
    ),
    Scenario(
        "band-queue",
        "1500+500 tokens at 14 req/s, planned for 160 sequences: a queue at the limit with KV usage 0.63, "
        "inside the 0.50-0.90 band (weakness 2); about 190 sequences are needed, 203 fit at 0.80",
        Truth(),
        Load(rate=14.0, prompt=1500, output=500),
        EngineSettings(
            max_model_len=32768, max_num_seqs=160, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "startup-oom",
        "as bad-new-settings, but the plan itself asks for 256 sequences: CUDA-graph capture tries 12.8 GiB "
        "with 5.3 GiB free at start-up (weakness 4: a batch-shaped OOM)",
        Truth(startup_extra_per_seq_gib=0.05),
        Load(rate=60.0, prompt=200, output=100),
        EngineSettings(
            max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
    ),
    Scenario(
        "noisy-peak",
        "a 30-minute burst of long generations (2000+2000, 2.6 req/s) forces a cut, then the load becomes "
        "band-queue's (1500+500, 14 req/s): the cut must be undone (weakness 3)",
        Truth(),
        Load(rate=2.6, prompt=2000, output=2000),
        EngineSettings(
            max_model_len=32768, max_num_seqs=256, gpu_memory_utilization=0.92, max_num_batched_tokens=8192
        ),  # fmt: skip
        _budget(444_000),
        later=Load(rate=14.0, prompt=1500, output=500),
        switch_at=1800.0,
    ),
)


def _fmt(s: EngineSettings) -> str:
    parts = [f"gmu={s.gpu_memory_utilization}", f"seqs={s.max_num_seqs}", f"len={s.max_model_len or 'max'}"]
    if s.kv_cache_dtype and s.kv_cache_dtype != "auto":
        parts.append(f"kv={s.kv_cache_dtype}")
    if s.max_num_batched_tokens:
        parts.append(f"batch={s.max_num_batched_tokens}")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=3.0, help="simulated time per run (3)")
    parser.add_argument("--scenario", nargs="*", help="only these scenarios")
    parser.add_argument("--quiet", action="store_true", help="no decision log")
    args = parser.parse_args()
    header = (
        f"{'controller':<14} {'crashes':>7} {'down min':>8} {'goodput tok/s':>13} {'preempt/s':>9} "
        f"{'served %':>8} {'rollouts':>8} {'rollbacks':>9} {'1st chg min':>11}  final settings"
    )
    for sc in SCENARIOS:
        if args.scenario and sc.name not in args.scenario:
            continue
        print(f"\n== {sc.name}: {sc.what}")
        print(header)
        logs: list[str] = []
        for controller in ("vllm-defaults", "fixed-safe", "kvpilot"):
            st, final, loop = run(sc, controller, args.hours)
            duration = args.hours * 3600
            served = 100.0 * st.completed / st.arrived if st.arrived else 0.0
            first = f"{loop.first_change / 60:.1f}" if loop is not None and loop.first_change else "-"
            print(
                f"{controller:<14} {st.crashes:>7} {st.downtime / 60:>8.1f} "
                f"{st.output_tokens / duration:>13.0f} "
                f"{st.preemptions / duration:>9.3f} {served:>8.1f} {st.rollouts:>8} {st.rollbacks:>9} "
                f"{first:>11}  {_fmt(final)}"
            )
            logs = (loop.log[1:] if loop is not None else []) or logs
        if logs and not args.quiet:
            print("  kvpilot's decisions:")
            print("\n".join(logs))
    print(f"\n({args.hours:g} h simulated per run, {DT:g} s steps, kvpilot ticks every {TICK:g} s; "
          "ground truth per scenario, not kvpilot's memory model)")  # fmt: skip


if __name__ == "__main__":
    main()
