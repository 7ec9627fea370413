"""A fingerprint of the tuner's answers: plans, budgets and estimates over a fixed grid.

Refactors of the tuner must not change what it computes. This prints one SHA-256 per
kind of answer (and the count of points), and with ``--out FILE`` writes every point
as a JSON line, so two runs (before and after a change) can be compared line by line:

    python bench/fingerprint.py --out /tmp/before.jsonl
    ... change the code ...
    python bench/fingerprint.py --out /tmp/after.jsonl --against /tmp/before.jsonl

``--against`` lists the points that differ (key, then old and new answer) and exits 0
either way: a difference is a fact to explain, not a test failure. The grid is every
catalogue model on every catalogue GPU: plans at 1/2/4/8 GPUs under five sets of
bounds; budgets at TP 1/2/4/8 x PP 1/2 over context, sequence, utilisation and KV
dtype choices; estimates of the calibration and validation cases under three
utilisations.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

from kvpilot import tuner
from kvpilot.tuner.types import EngineSettings, ServingBounds

try:  # the layout after issue 9
    from kvpilot.tuner.memory.estimate import compute_estimates
    from kvpilot.tuner.model.catalogue import lookup_checkpoint_bytes
except ImportError:  # the flat layout before it
    from kvpilot.tuner.estimate import compute_estimates  # type: ignore[no-redef]
    from kvpilot.tuner.models import lookup_checkpoint_bytes  # type: ignore[no-redef]

HERE = pathlib.Path(__file__).resolve().parent
CASE_FILES = (HERE / "validation_cases.json", HERE.parent / "tests" / "data" / "vllm_memory_cases.json")

BOUNDS = (
    ServingBounds(),
    ServingBounds(max_context=8192, concurrency=32, allow_fp8_kv=True),
    ServingBounds(min_context=4096, max_context=32768),
    ServingBounds(min_context=131072),
    ServingBounds(max_context=16384, allow_fp8_kv=True, max_gpu_memory_utilization=0.9),
)
LENGTHS = (2048, 8192, 32768)
SEQS = (None, 16, 256)
UTILS = (0.85, 0.95)
KV_DTYPES = ("auto", "fp8")


def _answer(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _answer(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_answer(x) for x in obj]
    if isinstance(obj, float):
        return round(obj, 9)
    return obj


def _specs() -> dict[str, tuple[Any, int | None]]:
    out = {}
    for model_id, _ in tuner.list_models():
        try:
            out[model_id] = (tuner.build_model_spec(tuner.lookup_model_config(model_id)), None)
        except tuner.TunerError:
            continue
        out[model_id] = (out[model_id][0], lookup_checkpoint_bytes(model_id))
    return out


def iter_points() -> Iterator[tuple[str, str, Any]]:
    """(kind, key, answer) for every grid point."""
    specs = _specs()
    for (model_id, (spec, checkpoint)), gpu in itertools.product(specs.items(), tuner.list_gpus()):
        for count, (index, bounds) in itertools.product((1, 2, 4, 8), enumerate(BOUNDS)):
            key = f"{model_id}|{gpu.name}|{count}|b{index}"
            try:
                answer = _answer(tuner.compute_plan(spec, gpu, count, bounds, weights_total_bytes=checkpoint))
            except tuner.TunerError as exc:
                answer = f"{type(exc).__name__}: {exc}"
            yield "plan", key, answer
        for tp, pp, length, seqs, util, kv in itertools.product(
            (1, 2, 4, 8), (1, 2), LENGTHS, SEQS, UTILS, KV_DTYPES
        ):
            settings = EngineSettings(
                max_model_len=length,
                max_num_seqs=seqs,
                gpu_memory_utilization=util,
                kv_cache_dtype=kv,
                tensor_parallel_size=tp,
            )
            key = f"{model_id}|{gpu.name}|tp{tp}|pp{pp}|{length}|{seqs}|{util}|{kv}"
            try:
                answer = _answer(
                    tuner.compute_budget(
                        spec, gpu, settings, pipeline_parallel_size=pp, weights_total_bytes=checkpoint
                    )
                )
            except tuner.TunerError as exc:
                answer = f"{type(exc).__name__}: {exc}"
            yield "budget", key, answer
    cases: list[dict[str, Any]] = []
    for path in CASE_FILES:
        if path.exists():
            data = json.loads(path.read_text())
            cases += data["cases"] if isinstance(data, dict) else data
    for util in (None, 0.8, 0.95):
        varied = [dict(c, **({"gpu_memory_utilization": util} if util else {})) for c in cases]
        for row in compute_estimates(varied, tuner.lookup_gpu, tuner.lookup_model_config):
            yield "estimate", f"{row['id']}|{util}", row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, help="write every point as a JSON line here")
    parser.add_argument("--against", type=pathlib.Path, help="compare with an earlier --out file")
    parser.add_argument("--show", type=int, default=40, help="differing points to print (40)")
    args = parser.parse_args()
    digests: dict[str, Any] = {}
    counts: dict[str, int] = {}
    lines: dict[str, str] = {}
    for kind, key, answer in iter_points():
        line = json.dumps(answer, sort_keys=True, default=str)
        digests.setdefault(kind, hashlib.sha256()).update(f"{key}\t{line}\n".encode())
        counts[kind] = counts.get(kind, 0) + 1
        lines[f"{kind}|{key}"] = line
    total = sum(counts.values())
    for kind in sorted(digests):
        print(f"{kind:<9}{counts[kind]:>7} points  sha256 {digests[kind].hexdigest()[:16]}")
    print(f"{'all':<9}{total:>7} points")
    if args.out:
        with args.out.open("w") as fh:
            for key, line in lines.items():
                fh.write(json.dumps({"key": key, "answer": json.loads(line)}) + "\n")
    if args.against:
        old = {}
        for raw in args.against.read_text().splitlines():
            row = json.loads(raw)
            old[row["key"]] = json.dumps(row["answer"], sort_keys=True, default=str)
        added: set[str] = set()

        def comparable(key: str) -> str:
            """The new answer without the fields the old run did not have (new outputs are not changes)."""
            if key not in old:
                return lines[key]

            def strip(then: Any, now_: Any) -> Any:
                if isinstance(then, dict) and isinstance(now_, dict):
                    added.update(k for k in now_ if k not in then)
                    return {k: strip(then[k], v) for k, v in now_.items() if k in then}
                return now_

            return json.dumps(
                strip(json.loads(old[key]), json.loads(lines[key])), sort_keys=True, default=str
            )

        differ = [k for k in lines if old.get(k) != comparable(k)]
        if added:
            print(f"fields only in the new run (not compared): {', '.join(sorted(added))}")
        missing = [k for k in old if k not in lines]
        print(f"differ: {len(differ)}; only in the old run: {len(missing)}")
        for key in differ[: args.show]:
            print(f"  {key}\n    old {old.get(key, '(absent)')[:400]}\n    new {comparable(key)[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
