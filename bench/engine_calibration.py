"""The engine model (``e2e/fleet/engine.py``) against published vLLM benchmark figures.

The fleet, the demo and ``bench/closed_loop.py`` run one engine model; its step time is a roofline
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

    python bench/engine_calibration.py [--fit]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="search mfu, mbu and overhead_s again")
    args = ap.parse_args()
    perf = EnginePerf()
    if args.fit:
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
        print(f"{p.gpu:<10} {p.clients:>3} {p.metric:<20} {p.published * scale:>8.2f}{unit:3} "
              f"{got * scale:>8.2f}{unit:3} {err:>+6.1%}  {p.source}")  # fmt: skip
    print(f"calibration error: mean |error| {sum(errs) / len(errs):.1%}, worst {max(errs):.1%}")


if __name__ == "__main__":
    main()
