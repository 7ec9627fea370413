"""How ``kvpilot plan`` prints a vLLM plan: the table people read and the ``--json`` document scripts read,
on one node or across nodes."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpilot.tuner.plan import NodePlan
from kvpilot.tuner.types import Plan


def node_plan_as_json(node_plan: NodePlan, model: str) -> dict[str, Any]:
    """``plan --json`` across nodes: one engine's plan, then the layout, the per-GPU roles and why."""
    layout = node_plan.layout
    return {
        **plan_as_json(node_plan.plan, model),
        "args": list(node_plan.args),
        "layout": {
            **dataclasses.asdict(layout),
            "gpus": layout.gpus,
            "describe": layout.describe(),
        },
        "ranks": [
            {
                "role": r.role,
                "layers": [r.layers.start, r.layers.stop],
                "weights_gib": round(r.weights_gib, 4),
                "experts": r.experts,
            }
            for r in node_plan.ranks
        ],
        "explanation": list(node_plan.explanation),
    }


def format_node_plan(node_plan: NodePlan, model: str) -> str:
    """The ``plan`` table across nodes: the layout, each role's share, why, then one engine's table."""
    layout, plan = node_plan.layout, node_plan.plan
    lines = [
        f"{model} on {layout.nodes} node(s) x {layout.gpus_per_node} x {plan.gpu} (vLLM {plan.vllm_version})",
        "",
        f"Layout: {layout.describe()}",
    ]
    for r in node_plan.ranks:
        experts = f", {r.experts} routed experts" if r.experts is not None else ""
        lines.append(
            f"  {r.role:<18} layers {r.layers.start}-{r.layers.stop - 1}, "
            f"{r.weights_gib:.2f} GiB of weights per GPU{experts}"
        )
    lines += ["", "Why:"] + [f"  {line}" for line in node_plan.explanation]
    if layout.nodes > 1:
        lines.append(
            f"  An InferenceService of gpu.nodesPerReplica {layout.nodes} renders this split as a "
            "LeaderWorkerSet (`kvpilot render`): these flags on every node, with its --node-rank; the "
            "workers --headless."
        )
    engine = "each data-parallel engine" if layout.data_parallel_size > 1 else "the engine"
    lines += ["", f"Plan of {engine} ({plan.gpu_count} GPUs):", ""]
    return "\n".join(lines) + "\n" + format_plan(plan, model, args=node_plan.args, title=False)


def _per_engine(plan: Plan) -> str:
    """What the pod's data-parallel engines hold together, when it runs several."""
    engines = plan.data_parallel_size
    if engines <= 1:
        return ""
    return f" per engine; {engines} engines: {engines * plan.concurrency_at_max_len:.2f} in all"


def plan_as_json(plan: Plan, model: str) -> dict[str, Any]:
    """The ``plan --json`` document: the settings at the top level, then budget, args and verdict."""
    settings, budget = dataclasses.asdict(plan.settings), dataclasses.asdict(plan.budget)
    return {
        "model": model,
        "gpu": plan.gpu,
        "gpu_count": plan.gpu_count,
        "data_parallel_size": plan.data_parallel_size,
        "vllm_version": plan.vllm_version,
        **settings,
        "feasible": plan.feasible,
        "concurrency_at_max_len": round(plan.concurrency_at_max_len, 3),
        "budget": {k: round(v, 4) if isinstance(v, float) else v for k, v in budget.items()},
        "args": list(plan.args),
        "kv_cache_memory_bytes": plan.kv_cache_memory_bytes,
        "warnings": list(plan.warnings),
        "reasons": list(plan.reasons),
    }


def format_plan(plan: Plan, model: str, *, args: tuple[str, ...] | None = None, title: bool = True) -> str:
    """The human-readable ``plan`` table (``args``: the arguments to print instead of the plan's)."""
    s, b = plan.settings, plan.budget
    lines = [f"{model} on {plan.gpu_count} x {plan.gpu} (vLLM {plan.vllm_version})", ""] if title else []
    lines.append("Engine settings")
    for name, value in dataclasses.asdict(s).items():
        lines.append(f"  {name:<26}{'(vLLM default)' if value is None else value}")
    util = s.gpu_memory_utilization
    graphs_label = "- CUDA graphs" if b.cuda_graphs_in_budget else "(CUDA graphs, after it)"
    lines += [
        "",
        "Memory per GPU (GiB)",
        f"  {'GPU total (CUDA)':<26}{b.gpu_total_gib:>9.2f}",
        f"  {f'requested (x {util})' if util else 'requested':<26}{b.requested_gib:>9.2f}",
        f"  {'- weights':<26}{b.weights_gib:>9.2f}",
        *([f"  {'  (of which LoRA buffers)':<26}{b.lora_gib:>9.2f}"] if b.lora_gib else []),
        *([f"  {'  (of which drafter)':<26}{b.speculative_gib:>9.2f}"] if b.speculative_gib else []),
        f"  {'- activation peak':<26}{b.activation_gib:>9.2f}",
        f"  {'- sampler state (V2)':<26}{b.sampler_state_gib:>9.2f}",
        f"  {'- non-torch':<26}{b.non_torch_gib:>9.2f}",
        f"  {graphs_label:<26}{b.cuda_graph_gib:>9.2f}",
        f"  {'= KV cache (pinned)' if plan.kv_cache_memory_bytes else '= KV cache':<26}"
        f"{b.available_kv_cache_gib:>9.2f}",
        *([f"  {'(KV connector, after it)':<26}{b.kv_connector_gib:>9.2f}"] if b.kv_connector_gib else []),
        "",
        f"KV cache: {b.kv_cache_tokens:,} tokens ({b.num_gpu_blocks:,} blocks, "
        f"{b.kv_bytes_per_token:,} B per token per GPU)",
        f"Concurrency: {plan.concurrency_at_max_len:.2f} sequences of {s.max_model_len} tokens"
        + _per_engine(plan),
        f"Starts: {'yes' if b.starts else 'no'}; feasible: {'yes' if plan.feasible else 'NO'}",
    ]
    if plan.kv_cache_memory_bytes is not None:
        lines.append(
            f"KV pool pinned: --kv-cache-memory-bytes {plan.kv_cache_memory_bytes} (vLLM takes it as is; "
            "the utilisation only sets the start-up free-memory check)"
        )
    if b.error:
        lines.append(f"vLLM would say: {b.error}")
    lines += [f"warning: {w}" for w in plan.warnings]
    reasons = [r for r in plan.reasons if r != b.error]
    if reasons:
        lines += ["", "What would fit:"] + [f"  - {r}" for r in reasons]
    shown = plan.args if args is None else args
    lines += ["", "vLLM arguments:", "  " + " ".join(shown) if shown else "  (none)"]
    return "\n".join(lines) + "\n"


# -- catalogues -----------------------------------------------------------------------------------
