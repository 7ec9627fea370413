"""The closed loop in simulation: kvpilot against vLLM's defaults, a fixed "safe" configuration, and the
oracle (the best static settings, with hindsight), on every scenario in ``bench/scenarios/``.

Scenarios are data (``bench/scenarios/README.md`` gives the schema): the world's ground truth in the
fleet's terms, traffic phases, faults, spare GPU or not, and what kvpilot starts from. Each pod runs the
same engine model as the e2e fleet and the demo (``e2e/fleet/engine.py``: a step-by-step vLLM V1
scheduler with chunked prefill and recompute preemption, its block accounting matched step for step to
vLLM 0.32's, and a roofline step time; both calibrated by ``bench/engine_calibration.py``), so what is
scored is what the knobs really trade: memory against batch, prefill against decode, restarts against
gains.

Controllers: ``vllm-defaults`` (0.92, 1024 sequences, 8192 batched tokens, the model's full context),
``fixed-safe`` (0.85, 64, 2048, 32k), ``kvpilot`` (the plan, then ``compute_decision`` every 30 s with the
operator's bookkeeping and rollout strategy), ``oracle`` (a search over static settings), ``reachable``
(the plan until its first evidence, then the oracle's settings: the most any closed loop can serve from the
plan, :func:`bench.loopsim.controllers.compute_reachable`).

A scenario with ``"engine": "sglang"`` runs SGLang pods (the fleet's SGLang 0.5.23:
:mod:`bench.loopsim.physics`)
and is printed in SGLang's flags: ``sglang-defaults`` (SGLang's own), ``fixed-safe``
(``--mem-fraction-static 0.8``, 64 running requests, chunk 2048, 32k), ``kvpilot`` (the SGLang plan, then
``compute_sglang_decision`` every 30 s with its operator's bookkeeping: :mod:`bench.loopsim.sglang`), the
oracle over ``--mem-fraction-static`` x ``--max-running-requests`` x ``--chunked-prefill-size`` x
``--context-length``.

A scenario with ``"engine": "tgi"`` runs TGI 3.3.7 pods (the fleet's TGI: :class:`bench.loopsim.physics.
TgiPhysics`, the router's 429s beyond ``--max-concurrent-requests`` lost, as every refused request is) in
TGI's launcher flags: ``tgi-defaults`` (the launcher's own), ``fixed-safe`` (8k per request, prefill 4096,
64 concurrent requests, fraction 0.85), ``kvpilot`` (the TGI plan, then ``compute_tgi_decision`` every 30 s
with its operator's bookkeeping: :mod:`bench.loopsim.tgi`), the oracle over ``--cuda-memory-fraction`` x
``--max-concurrent-requests`` x ``--max-batch-prefill-tokens`` x ``--max-total-tokens``.

    python bench/closed_loop.py [--scenario FILE_OR_NAME ...] [--hours H] [--json] [--quiet] [--no-oracle]

Prints, per scenario: goodput (output tokens/s of completed requests) and its ratio to the oracle's,
crashes, repeat OOMs (after the first, and beyond the OOMs the scenario injects as faults), downtime,
rollouts, rollbacks, holds, settings marked failed that never ran (must be 0), minutes to the first change
and to convergence (the last change), final settings.
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

from bench.loopsim.controllers import (  # noqa: E402
    Loop,
    Run,
    compute_oracle,
    compute_reachable,
    defaults,
    run,
    safe,
)
from bench.loopsim.scenario import (  # noqa: E402
    SCENARIO_DIR,
    BenchScenario,
    Settings,
    load_scenario,
    load_scenarios,
)
from kvpilot.tuner import sglang, tgi  # noqa: E402


def _fmt(s: Settings) -> str:
    if isinstance(s, sglang.SglangSettings):  # SGLang's own flags, as kvpilot renders them
        return " ".join(sglang.build_sglang_args(s)) or "SGLang's defaults"
    if isinstance(s, tgi.TgiSettings):  # TGI's launcher flags, as kvpilot renders them
        return " ".join(tgi.build_tgi_args(s)) or "TGI's defaults"
    parts = [f"gmu={s.gpu_memory_utilization}", f"seqs={s.max_num_seqs}", f"len={s.max_model_len or 'max'}"]
    if s.kv_cache_dtype and s.kv_cache_dtype != "auto":
        parts.append(f"kv={s.kv_cache_dtype}")
    if s.max_num_batched_tokens:
        parts.append(f"batch={s.max_num_batched_tokens}")
    return " ".join(parts)


def _last_change(loop: Loop) -> float:
    last = loop.changes[-1]
    return last if isinstance(last, float) else last.time


def _row(r: Run, oracle: Run | None) -> dict[str, Any]:
    st = r.stats
    loop = r.loop
    return {
        "goodput": round(r.goodput, 1),
        "vs_oracle": round(r.goodput / oracle.goodput, 3) if oracle and oracle.goodput > 0 else None,
        "served": round(st.completed / st.arrived, 3) if st.arrived else None,
        "refused": st.refused,
        "crashes": st.crashes,
        # after the first, and beyond the scenario's injected faults: the OOMs the settings caused again
        "repeat_ooms": max(0, st.ooms - max(1, st.injected_ooms)),
        "injected_ooms": st.injected_ooms,
        "downtime_s": st.downtime_s,
        "rollouts": st.rollouts,
        "rollbacks": st.rollbacks,
        "holds": st.holds,
        "infeasible": st.infeasible,
        "failed_never_ran": st.failed_never_ran,
        "first_change_min": round(loop.first_change / 60, 1) if loop and loop.first_change else None,
        "converged_min": round(_last_change(loop) / 60, 1) if loop and loop.changes else None,
        "final": _fmt(r.final),
    }


def evaluate(sc: BenchScenario, hours: float | None, oracle: bool) -> dict[str, Any]:
    best = compute_oracle(sc, hours=hours) if oracle else None
    runs = {
        f"{sc.engine}-defaults": run(sc, defaults(sc), closed_loop=False, hours=hours),
        "fixed-safe": run(sc, safe(sc), closed_loop=False, hours=hours),
        "kvpilot": run(sc, sc.start, closed_loop=True, hours=hours),
    }
    if best is not None:
        runs["reachable"] = compute_reachable(sc, best, hours=hours)
        runs["oracle"] = best
    kv = runs["kvpilot"]
    return {
        "scenario": sc.name,
        "engine": sc.engine,
        "what": sc.what,
        "hours": hours or sc.hours,
        "spare_gpu": sc.spare_gpu,
        "controllers": {name: _row(r, best) for name, r in runs.items()},
        "decisions": kv.loop.log[1:] if kv.loop else [],
    }


def _print(result: dict[str, Any], quiet: bool) -> None:
    engine = {"sglang": " [SGLang]", "tgi": " [TGI]"}.get(result["engine"], "")
    print(f"\n== {result['scenario']}{engine}: {result['what']}")
    print(
        f"{'controller':<14} {'goodput':>8} {'/oracle':>7} {'served':>6} {'crash':>5} {'rOOM':>4} "
        f"{'down min':>8} {'rollouts':>8} {'rollback':>8} {'holds':>5} {'failedNR':>8} "
        f"{'1st/last chg':>12}  final"
    )
    for name, row in result["controllers"].items():
        ratio = f"{row['vs_oracle']:.2f}" if row["vs_oracle"] is not None else "-"
        served = f"{row['served']:.2f}" if row["served"] is not None else "-"
        chg = f"{row['first_change_min'] or '-'}/{row['converged_min'] or '-'}"
        print(
            f"{name:<14} {row['goodput']:>8.0f} {ratio:>7} {served:>6} {row['crashes']:>5} "
            f"{row['repeat_ooms']:>4} {row['downtime_s'] / 60:>8.1f} {row['rollouts']:>8} "
            f"{row['rollbacks']:>8} {row['holds']:>5} {row['failed_never_ran']:>8} {chg:>12}  {row['final']}"
        )
    if result["decisions"] and not quiet:
        print("  kvpilot's decisions:")
        print("\n".join(result["decisions"]))


def _resolve(names: list[str] | None) -> list[BenchScenario]:
    if not names:
        return load_scenarios()
    out = []
    for n in names:
        path = Path(n)
        if not path.exists():
            path = SCENARIO_DIR / f"{n}.json"
        out.append(load_scenario(path))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", nargs="*", help="scenario files or names in bench/scenarios/ (default: all)"
    )
    parser.add_argument("--hours", type=float, help="simulated hours per run (default: the scenario's)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--quiet", action="store_true", help="no decision log")
    parser.add_argument("--no-oracle", action="store_true", help="skip the oracle search (faster)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="scenarios run in parallel")
    args = parser.parse_args()
    scenarios = _resolve(args.scenario)
    with multiprocessing.Pool(min(args.jobs, len(scenarios))) as pool:
        results = pool.starmap(evaluate, [(sc, args.hours, not args.no_oracle) for sc in scenarios])
    if args.json:
        json.dump({"scenarios": results}, sys.stdout, indent=1)
        print()
        return
    for r in results:
        _print(r, args.quiet)
    for engine in sorted({r["engine"] for r in results}):
        _summary(engine, [r for r in results if r["engine"] == engine])


def _summary(engine: str, results: list[dict[str, Any]]) -> None:
    """kvpilot / oracle and / reachable over one engine's feasible scenarios."""
    feasible = [r for r in results if r["controllers"].get("oracle", {}).get("goodput")]
    if feasible:
        ratios = [r["controllers"]["kvpilot"]["vs_oracle"] for r in feasible]
        reach = [
            r["controllers"]["kvpilot"]["goodput"] / r["controllers"]["reachable"]["goodput"]
            for r in feasible
            if r["controllers"]["reachable"]["goodput"]
        ]
        print(
            f"\n{engine}: kvpilot / oracle over {len(feasible)} feasible scenarios: min {min(ratios):.2f}, "
            f"mean {sum(ratios) / len(ratios):.2f}; kvpilot / reachable: min {min(reach):.2f}, "
            f"mean {sum(reach) / len(reach):.2f}; settings marked failed that never ran: "
            f"{sum(r['controllers']['kvpilot']['failed_never_ran'] for r in results)}"
        )


if __name__ == "__main__":
    main()
