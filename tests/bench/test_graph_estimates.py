"""kvpilot's CUDA-graph estimate against the one real vLLM logs subtract (bench/graph_estimates.py).

The records are public start-up logs (``tests/data/vllm_graph_estimates.json``); the estimate's constants
were fitted on the dense single-GPU ones, so this holds the model to all of them and names the records it
does not explain.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from bench import graph_estimates
from kvpilot.tuner import vllm
from kvpilot.tuner.memory import graphs
from kvpilot.tuner.model.quantization import QuantSpec
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.types import GIB, GpuSpec

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDS = json.loads((DATA / "vllm_graph_estimates.json").read_text())
UNEXPLAINED = {
    "g-018": "Qwen3-8B on an A100-40GB at 0.19.1 logs 2.35 GiB (a 2.44 GiB pool) where every other dense "
    "model of its size logs 0.6-0.8 at the same 86 graphs; 0.19 did not apply the estimate",
    "g-020": "DeepSeek-V4-Flash at TP 2 with MTP: the drafter's graphs and sparse-MLA indexer are not "
    "modelled",
    "g-028": "a start that failed after logging 0.08 GiB for 86 graphs of a model that logs 0.36 for 2",
}
H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink")


def _discrete() -> list[graph_estimates.Scored]:
    return [s for s in graph_estimates.compute_scores(RECORDS) if not s.unified_memory]


def test_every_record_but_the_named_ones_is_within_a_fifth_of_a_gib() -> None:
    scores = _discrete()
    assert len(scores) >= 15
    off = {s.id: round(s.error_gib, 2) for s in scores if abs(s.error_gib) > 0.2}
    assert set(off) == set(UNEXPLAINED), off
    assert statistics.median(abs(s.error_gib) for s in scores) < 0.1


def test_a_4bit_moe_pays_its_first_capture() -> None:
    """Gemma-4-26B-A4B NVFP4 logs 0.26 GiB for five graphs (g-026): the first capture of its FP4 MoE kernels;
    the same layers in 16 bits would be estimated at a tenth of that and miss the log."""
    cfg = json.loads((DATA / "hf_configs" / "google__gemma-4-26B-A4B.json").read_text())
    bf16 = build_model_spec(cfg)
    nvfp4 = dataclasses.replace(bf16, quantization=QuantSpec("nvfp4", 4, 16))
    fp4 = graphs.compute_graph_estimate_bytes(nvfp4, piecewise=3, full=2, pp=1, tp=1) / GIB
    plain = graphs.compute_graph_estimate_bytes(bf16, piecewise=3, full=2, pp=1, tp=1) / GIB
    assert abs(fp4 - 0.26) <= 0.05
    assert plain < 0.1


def test_the_estimate_is_what_each_runner_subtracts_and_the_pool_otherwise() -> None:
    spec = build_model_spec(
        json.loads((DATA / "hf_configs" / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
    )
    sizes = vllm.cuda_graph_capture_sizes((0, 27), H100, 256, 8192)
    pool = graphs.compute_graph_pool_bytes(spec, len(sizes), pp=1)
    kw = {"pp": 1, "max_num_seqs": 256, "max_num_batched_tokens": 8192}
    assert graphs.compute_cuda_graph_bytes(spec, H100, version=(0, 27), model_runner_v2=True, **kw) == pool
    estimate = graphs.compute_cuda_graph_bytes(spec, H100, version=(0, 27), model_runner_v2=False, **kw)
    full = sum(1 for s in sizes if s <= 256)
    assert estimate == graphs.compute_graph_estimate_bytes(spec, piecewise=len(sizes), full=full, pp=1, tp=1)
    assert estimate < pool  # the 0.19 pools' 0.45 GiB base is not in the estimate
    tp2 = graphs.compute_cuda_graph_bytes(spec, H100, version=(0, 27), tp=2, **kw)
    assert tp2 > estimate
    assert graphs.compute_cuda_graph_bytes(spec, H100, version=(0, 27), enforce_eager=True, **kw) == 0
