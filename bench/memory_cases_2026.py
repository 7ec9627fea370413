"""Write ``tests/data/vllm_memory_cases_2026.json``: the public real start-ups of 2026 models, scoreable.

The calibration set (``tests/data/vllm_memory_cases.json``, evidence copied byte for byte) holds four
public start-ups of 2026 models that ``bench/memory_accuracy.py`` could not score: their case has no
``hf_config`` or names its GPU without its size. This script copies them, adds the model's published
``config.json`` from ``tests/data/hf_configs`` (provenance in its INDEX.md) and the GPU the case's own
notes establish, and records each addition in the case's ``resolved`` field. Nothing observed is
changed. Run it again after either input changes; the output is deterministic.

Usage: ``python bench/memory_cases_2026.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
OUT = DATA / "vllm_memory_cases_2026.json"

RESOLUTIONS: dict[str, dict[str, Any]] = {
    "case-068": {
        "gpu": "A100-80GB",
        "resolved": "gpu: the case's notes (0.65 x total must exceed the logged 13.72 + 36.56 GiB: "
        "an 80 GB A100)",
    },
    "case-069": {
        "gpu": "A100-80GB",
        "resolved": "gpu: the case's notes (48.5 + 21.5 GiB within 0.9 x total: an 80 GB A100)",
    },
    "case-080": {
        "config": "Qwen__Qwen3-235B-A22B-FP8.json",
        "config_exact": False,
        "config_note": "Qwen3-235B-A22B-FP8's config: the 2507 Instruct build has the same layers and "
        "experts (it differs in max_position_embeddings and rope, which a 32768 max_model_len does not "
        "reach)",
        "resolved": "hf_config: Qwen/Qwen3-235B-A22B-FP8 (tests/data/hf_configs). In 0.27.1's "
        "gpu_worker.py::determine_available_memory the logged 'peak activation' is the transient headroom "
        "plus the applied CUDA-graph estimate, so 85.51 - 56.89 - 0.76 = 27.86 GiB includes the graph term; "
        "the 0.32 GiB 'CUDAGraph memory' is the pool measured after capture",
    },
    "case-081": {
        "config": "google__gemma-4-E2B-it.json",
        "config_exact": False,
        "config_note": "google/gemma-4-E2B-it's config (the instruction-tuned build of the same checkpoint "
        "layout; the article does not give the exact Hub id)",
        "gpu": "MI300X",
        "resolved": "hf_config: google/gemma-4-E2B-it (tests/data/hf_configs); gpu: the logged AMD Instinct "
        "MI300X (191.69 GiB kept as logged). The logged token count is the hybrid's derived figure",
    },
}
"""Per case: the config file to add, the GPU to name, and what was resolved and why."""


def build_cases() -> list[dict[str, Any]]:
    cases = {case["id"]: case for case in json.loads((DATA / "vllm_memory_cases.json").read_text())}
    out: list[dict[str, Any]] = []
    for case_id, fix in RESOLUTIONS.items():
        case = dict(cases[case_id])
        if "config" in fix:
            case["hf_config"] = json.loads((DATA / "hf_configs" / fix["config"]).read_text())
            case["config_exact"] = fix["config_exact"]
            case["config_note"] = fix["config_note"]
        if "gpu" in fix:
            case["gpu_as_logged"] = case["gpu"]
            case["gpu"] = fix["gpu"]
        case["resolved"] = fix["resolved"]
        out.append(case)
    return out


def main() -> int:
    OUT.write_text(json.dumps(build_cases(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
