"""Constant Prometheus load: one closed-loop tick over N services asks each metric once, for all of them.

Every service's timer calls ``kvpilot.operator.clients.prometheus.fetch_observations`` in the same tick, as
kopf runs
them; they share one fleet snapshot (one query per metric, aggregated ``by (namespace, pod)``), and each
takes its own pods' series from it. Prometheus is replaced by an in-process client that answers every
query with a series per pod (2 pods per service, a 300 s window at a 30 s step), so what is timed is the
operator's own work: parsing the fleet's answers and splitting them into N windows.

    python bench/prometheus_load.py [--services 100 1000] [--pods 2]

Prints, per N: the queries the tick sent (the per-service queries of the previous design, 12 per service,
for comparison), the tick's CPU time and wall time in the operator, and how many windows came out usable.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvpilot.operator.clients import prometheus  # noqa: E402
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings  # noqa: E402

PER_SERVICE_QUERIES_BEFORE = 12
"""What one service's fetch asked before the aggregation (8 range and 4 instant queries, selected by pod)."""
NOW = 1_800_000_000.0
WINDOW_S, STEP_S = 300.0, 30.0


class FleetClient:
    """Answers like Prometheus for ``services`` x ``pods`` vLLM pods in namespace ``bench``."""

    def __init__(self, services: int, pods: int) -> None:
        self.labels = [
            {"namespace": "bench", "pod": f"svc{i}-5d8f7c-{j:05d}"}
            for i in range(services)
            for j in range(pods)
        ]
        self.queries = 0

    def custom_query_range(
        self, query: str, start_time: datetime.datetime, end_time: datetime.datetime, step: str
    ) -> list[dict[str, Any]]:
        self.queries += 1
        start, end, dt = start_time.timestamp(), end_time.timestamp(), float(step)
        times = [start + k * dt for k in range(int((end - start) // dt) + 1)]
        value = "0.5" if "kv_cache" in query else "3"
        return [{"metric": m, "values": [[t, value] for t in times]} for m in self.labels]

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.queries += 1
        if query.startswith(prometheus.CACHE_CONFIG_INFO):
            info = {
                "block_size": "16",
                "num_gpu_blocks": "27000",
                "kv_cache_size_tokens": "432000",
                "gpu_memory_utilization": "0.9",
                "cache_dtype": "auto",
            }
            return [{"metric": {**m, **info}, "value": [NOW, "1"]} for m in self.labels]
        value = str(NOW - 5) if "timestamp(" in query else "10"
        return [{"metric": m, "value": [NOW, value]} for m in self.labels]


async def one_tick(services: int, pods: int) -> dict[str, Any]:
    client = FleetClient(services, pods)
    settings = PrometheusSettings(url=f"http://bench-{services}-{pods}.invalid:9090")
    names = [(f"svc{i}", tuple(f"svc{i}-5d8f7c-{j:05d}" for j in range(pods))) for i in range(services)]

    def factory(_settings: PrometheusSettings) -> FleetClient:
        return client  # one factory: the shared snapshot is keyed by it, as by the settings

    cpu0, wall0 = time.process_time(), time.perf_counter()
    windows = await asyncio.gather(
        *(
            prometheus.fetch_observations(
                settings,
                "bench",
                name,
                NOW,
                pods=own,
                window_seconds=WINDOW_S,
                step_seconds=STEP_S,
                max_age_seconds=30.0,
                client_factory=factory,
            )
            for name, own in names
        )
    )
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "services": services,
        "pods": services * pods,
        "queries_per_tick": client.queries,
        "queries_per_tick_before": PER_SERVICE_QUERIES_BEFORE * services,
        "tick_cpu_s": round(cpu, 3),
        "tick_wall_s": round(wall, 3),
        "usable_windows": sum(1 for w in windows if w.available and w.pods == pods),
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python bench/prometheus_load.py", description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--pods", type=int, default=2, help="pods per service")
    a = ap.parse_args()
    print(
        f"{'services':>8} {'pods':>6} {'queries/tick':>12} {'(per-service before)':>20} "
        f"{'tick CPU s':>10} {'tick wall s':>11} {'usable':>7}"
    )
    for n in a.services:
        r = asyncio.run(one_tick(n, a.pods))
        print(
            f"{r['services']:>8} {r['pods']:>6} {r['queries_per_tick']:>12} "
            f"{r['queries_per_tick_before']:>20} {r['tick_cpu_s']:>10} {r['tick_wall_s']:>11} "
            f"{r['usable_windows']:>7}"
        )
        if r["usable_windows"] != n:
            print(f"error: {n - r['usable_windows']} services got no usable window", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
