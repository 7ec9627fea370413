"""The CPU one closed-loop tick costs the operator per service, without a cluster.

The whole tick (:func:`kvpilot.operator.inferenceservice.closed_loop.run_once`: the pods from the reader,
resolve from the
caches, the memory budget, the decision, the status patch and its conditional write) on a service the real
planner planned, with the unit tests' fakes for the API server and the pods (``tests/operator``) and
Prometheus down: the steady cost of a service that is serving, times the number of services, is the
operator's CPU per tick (docs/operator.md, "Scale"; the Prometheus fetch: ``bench/prometheus_load.py``).

Usage::

    PYTHONPATH=. .venv/bin/python bench/tick_cpu.py [--ticks 500]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "operator")]

from closed_loop_fakes import LoopHarness  # noqa: E402
from operator_fakes import Harness, isvc  # noqa: E402


async def measure(ticks: int) -> float:
    """Milliseconds of CPU per tick."""
    harness = Harness()
    harness.deps.plan_fn = None  # the real planner
    body = isvc(gpu={"count": 1, "product": "H100-SXM"})
    await harness.run(body)
    loop = LoopHarness(harness)
    loop.healthy_pods()
    await loop.tick(body)  # the first tick writes the pods' state; the rest change nothing
    cpu0 = time.process_time()
    for _ in range(ticks):
        await loop.tick(body)
    return 1000 * (time.process_time() - cpu0) / ticks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=500)
    a = ap.parse_args()
    ms = asyncio.run(measure(a.ticks))
    print(f"one closed-loop tick: {ms:.2f} ms of CPU per service ({ms:.1f} s per tick of 1000 services)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
