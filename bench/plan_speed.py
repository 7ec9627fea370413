"""How long one ``compute_plan`` takes: every catalogue model x every catalogue GPU.

Prints the mean and 99th-percentile time per plan, overall and per model, and
whether the goal (under 5 ms per plan) is met. A benchmark, not a timed test:
``make bench`` runs it; the exit status is 0 either way.

    python bench/plan_speed.py [--repeat N] [--gpus N ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvpilot.tuner import TunerError, build_model_spec, compute_plan, gpus
from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.types import ServingBounds

GOAL_MS = 5.0

BOUNDS = (
    ServingBounds(),
    ServingBounds(max_context=8192, concurrency=32, allow_fp8_kv=True),
    ServingBounds(min_context=4096, max_context=32768),
)


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of the whole grid (3)")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 8], help="GPU counts (1 2 8)")
    args = parser.parse_args()

    specs = {}
    for model_id, _ in models.list_models():
        try:
            specs[model_id] = build_model_spec(models.lookup_model_config(model_id))
        except TunerError as exc:
            print(f"skip {model_id}: {exc}")
    per_model: dict[str, list[float]] = {model_id: [] for model_id in specs}
    slowest: dict[tuple[str, str, int, int], float] = {}
    failures = 0
    for _ in range(args.repeat):
        for model_id, spec in specs.items():
            checkpoint = models.lookup_checkpoint_bytes(model_id)
            for gpu in gpus.list_gpus():
                for count in args.gpus:
                    for index, bounds in enumerate(BOUNDS):
                        start = time.perf_counter()
                        try:
                            compute_plan(spec, gpu, count, bounds, weights_total_bytes=checkpoint)
                        except TunerError:
                            failures += 1
                        elapsed = (time.perf_counter() - start) * 1000
                        per_model[model_id].append(elapsed)
                        key = (model_id, gpu.name, count, index)
                        slowest[key] = max(slowest.get(key, 0.0), elapsed)

    every = [t for samples in per_model.values() for t in samples]
    width = max(len(m) for m in per_model) + 2
    print(f"{'model':<{width}}{'plans':>7}{'mean ms':>10}{'p99 ms':>10}")
    for model_id, samples in per_model.items():
        print(f"{model_id:<{width}}{len(samples):>7}{statistics.fmean(samples):>10.3f}{_p99(samples):>10.3f}")
    mean, p99 = statistics.fmean(every), _p99(every)
    print(f"{'all':<{width}}{len(every):>7}{mean:>10.3f}{p99:>10.3f}")
    print(f"plans that raised: {failures}")
    print("slowest plans (model, GPU, count, bounds #):")
    for (model_id, gpu_name, count, index), ms in sorted(slowest.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {ms:8.3f} ms  {model_id} on {count} x {gpu_name}, bounds #{index}")
    for label, value in (("mean", mean), ("p99", p99)):
        verdict = "met" if value < GOAL_MS else "NOT met"
        print(f"goal: {label} < {GOAL_MS} ms per plan -- {verdict} ({value:.3f} ms)")


if __name__ == "__main__":
    main()
