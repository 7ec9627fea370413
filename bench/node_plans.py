"""The 2026 flagships across nodes: the layout kvpilot's node planner chooses, and the TP x PP it weighed.

For each published config (tests/data/hf_configs) on nodes of 8 GPUs at a 32K context: the fewest nodes that
serve it (``compute_node_plan``, ``nodes=None``), the chosen layout, its sequences of 32K at once, weights per
GPU, and the same figures for tensor parallelism within a node x pipeline stages across the same nodes.
Estimates of kvpilot's memory model, not measured start-ups (no multi-node log exists yet); expert
parallelism's all-to-all buffers are not in them.

    python bench/node_plans.py
"""

from __future__ import annotations

import json
import pathlib

from kvpilot.tuner import gpus
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan import compute_node_plan
from kvpilot.tuner.types import ServingBounds

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "hf_configs"
MODELS = (
    "deepseek-ai__DeepSeek-V3.2",
    "deepseek-ai__DeepSeek-V4-Pro",
    "moonshotai__Kimi-K2.5",
    "moonshotai__Kimi-K3",
    "zai-org__GLM-5",
    "zai-org__GLM-5-FP8",
    "Qwen__Qwen3.5-397B-A17B",
    "Qwen__Qwen3-Coder-480B-A35B-Instruct",
    "nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
    "meta-llama__Llama-3.1-70B-Instruct",
)
GPUS = ("H100-SXM", "B200")
BOUNDS = ServingBounds(max_context=32768)


def main() -> None:
    print(
        f"{'model':<48}{'GPU':<10}{'nodes':>6}  {'chosen':<44}{'seqs':>8}{'GiB/GPU':>9}  {'TP x PP seqs':>12}"
    )
    for name in MODELS:
        spec = build_model_spec(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
        for gpu_name in GPUS:
            gpu = gpus.lookup_gpu(gpu_name)
            plan = compute_node_plan(spec, gpu, 8, BOUNDS)
            layout = plan.layout
            tp_pp = [
                c
                for c in plan.considered
                if c.layout.nodes == layout.nodes and c.layout.data_parallel_size == 1
            ]
            chosen = next(c for c in plan.considered if c.layout == layout)
            shown = layout.describe(where=False)
            fits = "" if plan.feasible else " (does not fit)"
            tp_pp_seqs = tp_pp[0].concurrency if tp_pp else float("nan")
            print(
                f"{name:<48}{gpu_name:<10}{layout.nodes:>6}  {shown + fits:<44}{chosen.concurrency:>8.1f}"
                f"{plan.plan.budget.weights_gib:>9.1f}  {tp_pp_seqs:>12.1f}"
            )


if __name__ == "__main__":
    main()
