"""How close kvpilot's memory model comes to real vLLM start-ups.

Runs :func:`kvpilot.tuner.memory.estimate.compute_estimates` (the core of
``kvpilot estimate --cases``) over the calibration set of real vLLM start-up logs
(``tests/data/vllm_memory_cases.json`` by default, or ``--cases FILE``) and
prints, for the V1-engine cases: the median and worst relative error of the
available KV-cache GiB and of the KV-cache tokens, the worst over-prediction,
whether every logged start-up failure is predicted to fail (and which successful
starts are predicted to fail); beside it the same figures for the two formulas
popular guides give:

* naive-MHA: ``KV = 2 x layers x head_dim x heads x seq x batch x bytes`` (no GQA,
  no sliding windows), with ``available = total x util - weights``;
* naive-hidden: ``KV = batch x seq x hidden x layers x bytes``, same ``available``.

Usage: ``.venv/bin/python bench/memory_accuracy.py [--cases FILE] [--all] [--quiet]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvpilot.tuner.memory import estimate, weights  # noqa: E402
from kvpilot.tuner.model import spec as model_spec  # noqa: E402
from kvpilot.tuner.types import GIB  # noqa: E402

DEFAULT_CASES = ROOT / "tests" / "data" / "vllm_memory_cases.json"


def _gpu_lookup():
    try:
        from kvpilot.tuner import gpus

        return gpus.lookup_gpu
    except ImportError:  # the catalogue is optional for the bench
        return None


def _naive(case: dict[str, Any]) -> tuple[float, float, float] | None:
    """(available GiB, tokens by naive-MHA, tokens by naive-hidden) of the guides' formulas."""
    cfg = case.get("hf_config")
    if not cfg or not case.get("gpu_total_gib"):
        return None
    try:
        spec = model_spec.build_model_spec(cfg)
    except Exception:
        return None
    tp = case.get("tensor_parallel_size") or 1
    pp = case.get("pipeline_parallel_size") or 1
    util = case.get("gpu_memory_utilization") or 0.9
    bits = case.get("weight_bits")
    params = weights.compute_weight_breakdown(spec, dtype="bfloat16").params / 2
    wbytes = params * ((bits / 8) if bits else (4 if case.get("dtype") == "float32" else 2)) / (tp * pp)
    available = case["gpu_total_gib"] * GIB * util - wbytes
    kv_bytes = 1 if str(case.get("kv_cache_dtype") or "").startswith("fp8") else 2
    layers = spec.num_layers / pp
    mha = 2 * layers * spec.head_dim * spec.num_attention_heads * kv_bytes / tp
    hidden = layers * spec.hidden_size * kv_bytes / tp
    return available / GIB, max(0.0, available / mha), max(0.0, available / hidden)


def _rel(pred: float | None, obs: float | None) -> float | None:
    if pred is None or obs is None or obs == 0:
        return None
    return (pred - obs) / abs(obs)


def _summary(name: str, errs: list[float]) -> str:
    if not errs:
        return f"  {name:<34} n=0"
    absolute = [abs(e) for e in errs]
    worst = max(errs, key=abs)
    over = max(errs)
    return (
        f"  {name:<34} n={len(errs):<3} median |err| {statistics.median(absolute) * 100:6.2f} %   "
        f"worst {worst * 100:+8.2f} %   worst over-prediction {max(0.0, over) * 100:+7.2f} %"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--all", action="store_true", help="include V0-engine cases in the figures")
    parser.add_argument("--quiet", action="store_true", help="summary only")
    args = parser.parse_args(argv)
    cases = json.loads(args.cases.read_text())
    rows = estimate.compute_estimates(cases, _gpu_lookup())

    kv_err: list[float] = []
    tok_err: list[float] = []
    naive_kv: list[float] = []
    naive_mha: list[float] = []
    naive_hidden: list[float] = []
    failures: list[str] = []
    false_alarms: list[str] = []
    skipped: list[str] = []
    if not args.quiet:
        print(
            f"{'case':<9} {'model':<42} {'vLLM':<7} {'obs KV':>7} {'pred':>7} {'err':>7}  "
            f"{'obs tok':>10} {'pred tok':>10} {'err':>7}  outcome / predicted"
        )
    for case, row in zip(cases, rows, strict=True):
        engine = str(case.get("engine") or "")
        if not args.all and not engine.startswith("V1"):
            continue
        obs = case.get("observed") or {}
        failed = case.get("outcome_class") == "failed"
        if row["error"] and row["available_kv_cache_gib"] is None:
            skipped.append(f"{case['id']}: {row['error']}")
            if failed:
                failures.append(f"{case['id']}: NOT predicted (no estimate: {row['error']})")
            continue
        e_kv = _rel(row["available_kv_cache_gib"], obs.get("available_kv_cache_gib"))
        e_tok = _rel(row["kv_cache_tokens"], obs.get("kv_cache_tokens")) if not failed else None
        if e_kv is not None and not failed:
            kv_err.append(e_kv)
        if e_tok is not None:
            tok_err.append(e_tok)
        naive = _naive(case)
        if naive is not None and not failed:
            if obs.get("available_kv_cache_gib"):
                naive_kv.append(_rel(naive[0], obs["available_kv_cache_gib"]))
            if obs.get("kv_cache_tokens"):
                naive_mha.append(_rel(naive[1], obs["kv_cache_tokens"]))
                naive_hidden.append(_rel(naive[2], obs["kv_cache_tokens"]))
        if failed:
            verdict = "predicted" if not row["starts"] else "NOT predicted"
            failures.append(f"{case['id']}: {verdict} -- logged: {str(case.get('outcome'))[:90]}")
        elif not row["starts"]:
            false_alarms.append(f"{case['id']}: {row['error'][:140]}")
        if not args.quiet:

            def fmt(x, spec):
                return format(x, spec) if x is not None else "-"

            print(
                f"{case['id']:<9} {str(case.get('model'))[:42]:<42} {str(case.get('vllm_version'))[:7]:<7} "
                f"{fmt(obs.get('available_kv_cache_gib'), '7.2f'):>7} "
                f"{fmt(row['available_kv_cache_gib'], '7.2f'):>7} "
                f"{fmt(e_kv and e_kv * 100, '+6.1f'):>7}  {fmt(obs.get('kv_cache_tokens'), ','):>10} "
                f"{fmt(row['kv_cache_tokens'], ','):>10} {fmt(e_tok and e_tok * 100, '+6.1f'):>7}  "
                f"{case.get('outcome_class')} / {'starts' if row['starts'] else 'fails'}"
            )
    scope = "all engines" if args.all else "V1-engine cases"
    print(f"\nAccuracy on {args.cases.name} ({scope}); err = (predicted - logged) / logged")
    print(" kvpilot:")
    print(_summary("available KV cache GiB", kv_err))
    print(_summary("KV cache tokens", tok_err))
    print(" naive guide formulas (available = total x util - weights):")
    print(_summary("available KV cache GiB", naive_kv))
    print(_summary("tokens, 2 x L x head_dim x heads x B", naive_mha))
    print(_summary("tokens, L x hidden x B", naive_hidden))
    predicted = sum(1 for line in failures if ": predicted" in line)
    print(f" logged start-up failures: {predicted} of {len(failures)} predicted")
    for line in failures or ["  (none)"]:
        print(f"  {line}")
    print(" successful starts predicted to fail:")
    for line in false_alarms or ["(none)"]:
        print(f"  {line}")
    print(f" cases not estimated: {len(skipped)}")
    for line in skipped:
        print(f"  {line[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
