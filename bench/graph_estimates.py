"""How close kvpilot's CUDA-graph estimate comes to the one vLLM logs and subtracts.

Scores :func:`kvpilot.tuner.memory.graphs.compute_graph_estimate_bytes` on the public records of
``tests/data/vllm_graph_estimates.json`` ("Estimated CUDA graph memory: X GiB total", with the graph counts
"Profiling CUDA graph memory" logs beside it): each record with a published config in
``tests/data/hf_configs/`` is put to the model with its own counts and tensor-parallel size; a record whose
quantization is a 4-bit float (NVFP4, MXFP4) on a base model's config gets an NVFP4 quantization. Records of
unified-memory devices (GB10 / DGX Spark), whose free-memory deltas the page cache disturbs, are listed apart.

Usage: ``python bench/graph_estimates.py``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvpilot.tuner.memory import graphs  # noqa: E402
from kvpilot.tuner.model import ModelSpec  # noqa: E402
from kvpilot.tuner.model.quantization import QuantSpec  # noqa: E402
from kvpilot.tuner.model.spec import build_model_spec  # noqa: E402
from kvpilot.tuner.types import GIB  # noqa: E402

RECORDS = ROOT / "tests" / "data" / "vllm_graph_estimates.json"
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
UNIFIED = ("GB10", "DGX Spark", "unified")


@dataclasses.dataclass(frozen=True)
class Scored:
    id: str
    model: str
    logged_gib: float
    predicted_gib: float
    unified_memory: bool

    @property
    def error_gib(self) -> float:
        return self.predicted_gib - self.logged_gib


def _model(record: dict[str, Any]) -> ModelSpec | None:
    ref = record.get("hf_config_ref")
    if not ref or not (CONFIGS / ref).exists():
        return None
    spec = build_model_spec(json.loads((CONFIGS / ref).read_text()))
    quant = str(record.get("quantization") or "").upper()
    if spec.quantization is None and ("NVFP4" in quant or "MXFP4" in quant):
        spec = dataclasses.replace(spec, quantization=QuantSpec("nvfp4", 4, 16))
    return spec


def compute_scores(records: list[dict[str, Any]]) -> list[Scored]:
    """Each scorable record: a published config, the estimate and both graph counts logged."""
    out = []
    for r in records:
        model = _model(r)
        if model is None or r.get("estimated_gib") is None or r.get("piecewise_graphs") is None:
            continue
        predicted = graphs.compute_graph_estimate_bytes(
            model,
            piecewise=int(r["piecewise_graphs"]),
            full=int(r.get("full_graphs") or 0),
            pp=int(r.get("pipeline_parallel_size") or 1),
            tp=int(r.get("tensor_parallel_size") or 1),
        )
        unified = any(u in str(r.get("gpu") or "") for u in UNIFIED)
        out.append(Scored(r["id"], r["model"], float(r["estimated_gib"]), predicted / GIB, unified))
    return out


def main() -> int:
    scores = compute_scores(json.loads(RECORDS.read_text()))
    print(f"{'record':<7} {'model':<44} {'logged':>7} {'kvpilot':>8} {'error':>7}")
    for s in scores:
        mark = "  (unified memory)" if s.unified_memory else ""
        figures = f"{s.logged_gib:>7.2f} {s.predicted_gib:>8.2f} {s.error_gib:>+7.2f}"
        print(f"{s.id:<7} {s.model[:44]:<44} {figures}{mark}")
    discrete = [abs(s.error_gib) for s in scores if not s.unified_memory]
    print(
        f"\n{len(discrete)} records on discrete GPUs: median |error| {statistics.median(discrete):.2f} GiB, "
        f"worst {max(discrete):.2f} GiB; {sum(e <= 0.2 for e in discrete)} within 0.2 GiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
