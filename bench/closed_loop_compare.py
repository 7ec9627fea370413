"""kvpilot before and after a policy change, per scenario: kvpilot / oracle, repeat OOMs, rollouts.

The oracle (the best static settings with hindsight) depends on the scenario alone, not on kvpilot's policy,
and is most of ``bench/closed_loop.py``'s time (dozens of whole runs per scenario against kvpilot's one).
This script runs only kvpilot's closed loop on each scenario with the code it is run from, saves its rows
and decisions (``--out``), and prints them beside an earlier saved run (``--before``). The oracle's goodput
comes from ``--oracle-from`` (a ``bench/closed_loop.py --json`` document), the ``--before`` document, or
``--oracle`` (search it here, slow); without one the ratio is ``-``.

    python bench/closed_loop_compare.py --out before.json             # at the old commit
    python bench/closed_loop_compare.py --before before.json --out after.json [--scenario NAME ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.closed_loop import _resolve, _row  # noqa: E402
from bench.loopsim.controllers import compute_oracle, run  # noqa: E402
from bench.loopsim.scenario import BenchScenario  # noqa: E402


def compute_kvpilot(sc: BenchScenario, oracle: float | None, search: bool) -> dict[str, Any]:
    """kvpilot's row on ``sc`` (ratio to ``oracle``'s goodput; searched first when ``search`` and unknown)
    and its decisions."""
    if oracle is None and search:
        oracle = compute_oracle(sc).goodput
    kv = run(sc, sc.start, closed_loop=True)
    row = _row(kv, None)
    row["vs_oracle"] = round(kv.goodput / oracle, 3) if oracle else None
    return {"kvpilot": row, "oracle": oracle, "decisions": kv.loop.log[1:] if kv.loop else []}


def _cells(row: dict[str, Any] | None) -> str:
    if row is None:
        return f"{'-':>8} {'-':>7} {'-':>4} {'-':>8}"
    ratio = f"{row['vs_oracle']:.3f}" if row["vs_oracle"] is not None else "-"
    return f"{row['goodput']:>8.0f} {ratio:>7} {row['repeat_ooms']:>4} {row['rollouts']:>8}"


def _summary(label: str, rows: list[dict[str, Any] | None]) -> None:
    ratios = [r["vs_oracle"] for r in rows if r is not None and r["vs_oracle"] is not None]
    if ratios:
        print(
            f"{label}: kvpilot / oracle min {min(ratios):.3f}, "
            f"mean {sum(ratios) / len(ratios):.3f} ({len(ratios)} scenarios)"
        )


def _print(after: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> None:
    head = f"{'goodput':>8} {'/oracle':>7} {'rOOM':>4} {'rollouts':>8}"
    print(f"{'scenario':<24} {'before':^30}   {'after':^30}")
    print(f"{'':<24} {head}   {head}")
    for name, now in after.items():
        old = before.get(name, {}).get("kvpilot")
        print(f"{name:<24} {_cells(old)}   {_cells(now['kvpilot'])}")
    if before:
        _summary("before", [before.get(n, {}).get("kvpilot") for n in after])
    _summary("after", [r["kvpilot"] for r in after.values()])


def _oracles(before: dict[str, dict[str, Any]], path: Path | None) -> dict[str, float]:
    found = {name: r["oracle"] for name, r in before.items() if r.get("oracle")}
    if path is not None:
        for r in json.loads(path.read_text())["scenarios"]:
            oracle = r["controllers"].get("oracle")
            if oracle and oracle["goodput"]:
                found[r["scenario"]] = oracle["goodput"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", nargs="*", help="scenario files or names (default: all shipped)")
    parser.add_argument("--before", type=Path, help="an earlier --out document, printed beside this run")
    parser.add_argument("--oracle-from", type=Path, help="a bench/closed_loop.py --json document")
    parser.add_argument("--oracle", action="store_true", help="search the oracle where none is known (slow)")
    parser.add_argument("--out", type=Path, help="save this run's rows, oracles and decisions here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="scenarios run in parallel")
    args = parser.parse_args()
    before = json.loads(args.before.read_text())["scenarios"] if args.before else {}
    oracles = _oracles(before, args.oracle_from)
    scenarios = _resolve(args.scenario)
    with multiprocessing.Pool(min(args.jobs, len(scenarios))) as pool:
        rows = pool.starmap(compute_kvpilot, [(sc, oracles.get(sc.name), args.oracle) for sc in scenarios])
    after = {sc.name: row for sc, row in zip(scenarios, rows, strict=True)}
    if args.out is not None:
        args.out.write_text(json.dumps({"scenarios": after}, indent=1) + "\n")
    _print(after, before)


if __name__ == "__main__":
    main()
