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

By default it scores the calibration set, ``tests/data/vllm_memory_cases_2026.json`` (the public
start-ups of 2026 models, made scoreable by ``bench/memory_cases_2026.py``) and
``tests/data/vllm_memory_cases_public_2x.json`` (public vLLM 0.20-0.28 start-ups collected afterwards,
not used to fit anything), each file on its own and, for every file, the error of the available KV cache
per vLLM release (``by release``).

Each case is also put to the planner as a user would put it to ``kvpilot plan --gpu GPU --engine-args
ARGS``: its ``gpu`` and its ``engine_args`` (the run's vLLM arguments that have no field of their own;
absent: none known). The bench counts the cases the plan refuses by name before planning (a GPU not in
the catalogue, an engine argument :func:`kvpilot.tuner.vllm.check_engine_flags` refuses) or warns about by
name (a flag its memory model does not budget, :mod:`kvpilot.tuner.vllm.unmodelled`: the plan's warning
names it), lists them with the plan's words, and gives kvpilot's figures again over the cases it neither
refused nor warned about. The first figures still include every case: a case the plan warned about is
scored as it ran (the flags it warned about are not budgeted).

Usage: ``.venv/bin/python bench/memory_accuracy.py [--cases FILE ...] [--all] [--quiet]``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvpilot.tuner import (  # noqa: E402
    errors,
    memory,  # noqa: E402
    vllm,
)
from kvpilot.tuner.memory import estimate, weights  # noqa: E402
from kvpilot.tuner.model import spec as model_spec  # noqa: E402
from kvpilot.tuner.types import GIB  # noqa: E402

DEFAULT_CASES = (
    ROOT / "tests" / "data" / "vllm_memory_cases.json",
    ROOT / "tests" / "data" / "vllm_memory_cases_2026.json",
    ROOT / "tests" / "data" / "vllm_memory_cases_public_2x.json",
)


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


def engine_args(case: dict[str, Any]) -> list[str]:
    """The case's ``engine_args``: the run's vLLM arguments that have no field of their own (``[]`` when
    absent or null)."""
    args = case.get("engine_args")
    if args is None:
        return []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{case.get('id')}: engine_args must be a list of strings, got {args!r}")
    return args


def plan_verdict(case: dict[str, Any], gpu_lookup: Callable[[str], object] | None) -> tuple[str, str] | None:
    """What ``kvpilot plan --gpu GPU --engine-args ARGS`` says by name of the case's run, asked with its
    ``gpu`` and :func:`engine_args`: ``("refused", why)`` when it refuses before planning (the GPU is not in
    the catalogue: ``gpu_lookup`` raises; or :func:`kvpilot.tuner.vllm.check_engine_flags` refuses an
    argument), ``("warned", the plan's warnings)`` when the arguments hold flags its memory model does not
    budget (the planner's own list, :func:`kvpilot.tuner.vllm.build_engine_flags`' ``unmodelled``, each in
    the words of :func:`kvpilot.tuner.vllm.describe_unmodelled_flag`, and speculative decoding whose drafter
    it does not model for the case's config, :func:`kvpilot.tuner.memory.describe_unbudgeted_speculative`),
    else ``None``. A case that names no
    GPU is not refused for it (the user would name theirs)."""
    args = engine_args(case)
    try:
        if case.get("gpu") and gpu_lookup is not None:
            gpu_lookup(str(case["gpu"]))
        vllm.check_engine_flags(args)
    except errors.TunerError as exc:
        return "refused", exc.message.split(" Known GPUs: ")[0]  # not the catalogue's whole list
    engine = vllm.build_engine_flags(args)
    named = [vllm.describe_unmodelled_flag(flag) for flag in engine.unmodelled]
    model = None
    if engine.speculative_flags or engine.moe_backend:  # what is budgeted of them depends on the model
        try:
            model = estimate.build_case_model(case)
        except (errors.TunerError, estimate.CaseError):
            model = None
    if engine.moe_backend:
        try:
            if model is not None:
                memory.check_moe_backend_model(model, engine.moe_backend)
        except errors.TunerError as exc:
            return "refused", exc.message
        if model is None:
            named.append(
                f"--moe-backend {engine.moe_backend} is not in kvpilot's memory model for this case's config."
            )
        elif (
            gap := memory.describe_unbudgeted_moe_backend(model, engine.moe_backend, _version(case))
        ) is not None:
            named.append(gap)
    if engine.speculative_flags:  # what is budgeted of it depends on the model (and its one stage)
        if model is None:
            gap = f"{engine.speculative_flags[0]} is not in kvpilot's memory model for this case's config."
        else:
            pp = int(case.get("pipeline_parallel_size") or 1)
            gap = memory.describe_unbudgeted_speculative(
                model, engine.speculative, engine.speculative_flags, pp
            )
        named = ([gap] if gap else []) + named
    if named:
        return "warned", " ".join(named)
    return None


def _version(case: dict[str, Any]) -> str:
    """The case's vLLM release as the tuner takes it (its first word, e.g. ``0.20.0``)."""
    return next(
        iter(str(case.get("vllm_version") or vllm.PINNED_VLLM_VERSION).split()), vllm.PINNED_VLLM_VERSION
    )


def _release(case: dict[str, Any]) -> str:
    """The case's vLLM release as major.minor ("?" where the log names none)."""
    found = re.match(r"\s*(\d+)\.(\d+)", str(case.get("vllm_version") or ""))
    return f"{found.group(1)}.{found.group(2)}" if found else "?"


def _by_release(errs: list[tuple[str, float]]) -> None:
    print(" available KV cache GiB by release:")
    for release in sorted(
        {r for r, _ in errs}, key=lambda r: [int(x) if x.isdigit() else -1 for x in r.split(".")]
    ):
        print(_summary(f"vLLM {release}", [e for r, e in errs if r == release]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, action="append", help="a cases file (repeatable)")
    parser.add_argument("--all", action="store_true", help="include V0-engine cases in the figures")
    parser.add_argument("--quiet", action="store_true", help="summary only")
    args = parser.parse_args(argv)
    for path in args.cases or DEFAULT_CASES:
        _score(path, args.all, args.quiet)
    return 0


def _logged_terms(case: dict[str, Any], row: dict[str, Any]) -> str | None:
    """The budget's terms beside the ones the start-up summary line logged, compared as the release logs them:
    from 0.27 the logged "peak activation" holds the applied CUDA-graph estimate
    (:func:`kvpilot.tuner.vllm.logs_graph_estimate_in_activation`) and "non-torch" is the consumed memory
    less the weights (persistent torch buffers allocated during the profile run included)."""
    obs = case.get("observed") or {}
    if obs.get("peak_activation_gib") is None or row.get("activation_gib") is None:
        return None
    version = vllm.parse_version(next(iter(str(case.get("vllm_version") or "").split()), None))
    combined = vllm.logs_graph_estimate_in_activation(version) and bool(row.get("cuda_graphs_in_budget"))
    activation = row["activation_gib"] + (row["cuda_graph_gib"] if combined else 0.0)
    label = "activation + graph estimate" if combined else "activation"

    def pair(name: str, logged: float | None, predicted: float) -> str:
        return f"{name} {'-' if logged is None else f'{logged:.2f}'} / {predicted:.2f}"

    return "; ".join(
        [
            pair("weights", obs.get("weights_gib"), row["weights_gib"]),
            pair("non-torch", obs.get("non_torch_gib"), row["non_torch_gib"]),
            pair(label, obs["peak_activation_gib"], activation),
        ]
    )


def _score(path: Path, include_v0: bool, quiet: bool) -> None:
    cases = json.loads(path.read_text())
    lookup = _gpu_lookup()
    rows = estimate.compute_estimates(cases, lookup)

    kv_err: list[float] = []
    kv_by_release: list[tuple[str, float]] = []
    tok_err: list[float] = []
    naive_kv: list[float] = []
    naive_mha: list[float] = []
    naive_hidden: list[float] = []
    failures: list[str] = []
    false_alarms: list[str] = []
    skipped: list[str] = []
    terms: list[str] = []
    in_scope: list[str] = []
    verdicts: list[str] = []
    flagged: set[str] = set()
    kv_ids: list[str] = []
    tok_ids: list[str] = []
    failure_ids: list[str] = []
    false_alarm_ids: list[str] = []
    if not quiet:
        print(
            f"{'case':<9} {'model':<42} {'vLLM':<7} {'obs KV':>7} {'pred':>7} {'err':>7}  "
            f"{'obs tok':>10} {'pred tok':>10} {'err':>7}  outcome / predicted"
        )
    for case, row in zip(cases, rows, strict=True):
        engine = str(case.get("engine") or "")
        if not include_v0 and not engine.startswith("V1"):
            continue
        obs = case.get("observed") or {}
        failed = case.get("outcome_class") == "failed"
        in_scope.append(case["id"])
        if (verdict := plan_verdict(case, lookup)) is not None:
            flagged.add(case["id"])
            unscored = " (not estimated)" if row["available_kv_cache_gib"] is None else ""
            verdicts.append(f"{case['id']}{unscored}: {verdict[0]}: {verdict[1]}")
        if row["error"] and row["available_kv_cache_gib"] is None:
            skipped.append(f"{case['id']}: {row['error']}")
            if failed:
                failures.append(f"{case['id']}: NOT predicted (no estimate: {row['error']})")
                failure_ids.append(case["id"])
            continue
        e_kv = _rel(row["available_kv_cache_gib"], obs.get("available_kv_cache_gib"))
        e_tok = _rel(row["kv_cache_tokens"], obs.get("kv_cache_tokens")) if not failed else None
        if e_kv is not None and not failed:
            kv_err.append(e_kv)
            kv_ids.append(case["id"])
            kv_by_release.append((_release(case), e_kv))
        if e_tok is not None:
            tok_err.append(e_tok)
            tok_ids.append(case["id"])
        naive = _naive(case)
        if naive is not None and not failed:
            if obs.get("available_kv_cache_gib"):
                naive_kv.append(_rel(naive[0], obs["available_kv_cache_gib"]))
            if obs.get("kv_cache_tokens"):
                naive_mha.append(_rel(naive[1], obs["kv_cache_tokens"]))
                naive_hidden.append(_rel(naive[2], obs["kv_cache_tokens"]))
        if (logged := _logged_terms(case, row)) is not None:
            terms.append(f"{case['id']} (vLLM {_release(case)}): {logged}")
        if failed:
            said = "predicted" if not row["starts"] else "NOT predicted"
            failures.append(f"{case['id']}: {said} -- logged: {str(case.get('outcome'))[:90]}")
            failure_ids.append(case["id"])
        elif not row["starts"]:
            false_alarms.append(f"{case['id']}: {row['error'][:140]}")
            false_alarm_ids.append(case["id"])
        if not quiet:

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
    scope = "all engines" if include_v0 else "V1-engine cases"
    print(f"\nAccuracy on {path.name} ({scope}); err = (predicted - logged) / logged")
    print(" kvpilot:")
    print(_summary("available KV cache GiB", kv_err))
    print(_summary("KV cache tokens", tok_err))
    _by_release(kv_by_release)
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
    print(" logged terms, GiB (logged / predicted):")
    for line in terms or ["(none)"]:
        print(f"  {line}")
    print(f" cases not estimated: {len(skipped)}")
    for line in skipped:
        print(f"  {line[:150]}")
    print(" the plan, asked as `kvpilot plan --gpu GPU --engine-args ARGS` (a case's gpu and engine_args):")
    print(f"  refused or warned about by name: {len(verdicts)} of {len(in_scope)} cases")
    for line in verdicts:
        print(f"   {line[:320]}")
    clean = len(in_scope) - len(flagged)
    print(f" kvpilot, over the {clean} cases the plan neither refused nor warned about by name:")
    print(
        _summary(
            "available KV cache GiB", [e for i, e in zip(kv_ids, kv_err, strict=True) if i not in flagged]
        )
    )
    print(_summary("KV cache tokens", [e for i, e in zip(tok_ids, tok_err, strict=True) if i not in flagged]))
    kept = [line for i, line in zip(failure_ids, failures, strict=True) if i not in flagged]
    predicted = sum(1 for line in kept if ": predicted" in line)
    print(f"  logged start-up failures: {predicted} of {len(kept)} predicted")
    alarms = [i for i in false_alarm_ids if i not in flagged]
    print(
        f"  successful starts predicted to fail: {len(alarms)}", *[f"({', '.join(alarms)})"][: bool(alarms)]
    )
    print()


if __name__ == "__main__":
    raise SystemExit(main())
