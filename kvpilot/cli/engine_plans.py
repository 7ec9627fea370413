"""``kvpilot plan --engine sglang|tgi``: another engine's own budget, its flags and the budget explained."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any, TextIO

from kvpilot.cli.inputs import EXIT_INFEASIBLE, EXIT_OK, CliError
from kvpilot.tuner import engines, sglang, tgi
from kvpilot.tuner import model as models
from kvpilot.tuner.types import GpuSpec


def plan_sglang(
    args: argparse.Namespace,
    spec: models.ModelSpec,
    gpu: GpuSpec,
    model: str,
    checkpoint: int | None,
    out: TextIO,
) -> int:
    """``plan --engine sglang``: SGLang's own budget (:mod:`kvpilot.tuner.engines.sglang_budget`, with an
    fp8 KV cache where ``--allow-fp8-kv`` and the GPU allow one and it helps), its flags and the budget
    explained."""
    for flag in ("min_context", "engine_args", "pin_kv_cache_memory"):
        if getattr(args, flag):
            raise CliError(f"--{flag.replace('_', '-')} is not supported with --engine sglang yet")
    gpu_count = _sglang_gpus(args)
    settings = sglang.SglangSettings(
        context_length=min(args.max_context, spec.max_model_len) if args.max_context else None,
        max_running_requests=args.concurrency,
        tp_size=gpu_count,
    )
    budget = engines.plan_sglang_kv(
        spec,
        gpu,
        settings,
        allow_fp8_kv=bool(args.allow_fp8_kv),
        weights_total_bytes=args.checkpoint_bytes or checkpoint,
    )
    figures = {"max_total_tokens": budget.max_total_tokens}
    return write_engine_plan(
        args,
        out,
        f"{model} on {gpu_count} x {gpu.name} (SGLang {sglang.PINNED_SGLANG_VERSION}"
        + (f", over {args.nodes} nodes" if args.nodes else "")
        + ")",
        {"model": model, "gpu": gpu.name, "engine": "SGLang", "release": sglang.PINNED_SGLANG_VERSION},
        budget.feasible,
        figures,
        sglang.build_sglang_args(budget.rendered),
        engines.explain_sglang_budget(budget),
    )


def _sglang_gpus(args: argparse.Namespace) -> int:
    """The GPUs of one SGLang engine: ``--gpus``, or ``--nodes`` x ``--gpus-per-node`` (its tensor parallelism
    spans a group's nodes, as an InferenceService's gpu.nodesPerReplica renders it)."""
    if args.nodes is None:
        return int(args.gpus or 1)
    if args.nodes == "auto":
        raise CliError("--nodes auto is not supported with --engine sglang; give the number of nodes")
    total = int(args.nodes) * int(args.gpus_per_node)
    if args.gpus is not None and args.gpus != total:
        raise CliError(
            f"--gpus {args.gpus} is not --nodes {args.nodes} x --gpus-per-node {args.gpus_per_node}: give "
            "one of them"
        )
    return total


def write_engine_plan(
    args: argparse.Namespace,
    out: TextIO,
    title: str,
    view: dict[str, Any],
    feasible: bool,
    figures: dict[str, Any],
    flags: list[str],
    explanation: list[str],
) -> int:
    """Another engine's plan as ``plan --engine`` prints it (``--json``: ``view``, ``feasible``, the budget's
    ``figures``, the flags and the explanation); the exit code says whether it starts."""
    if args.json:
        body = {**view, "feasible": feasible, **figures, "args": flags, "explanation": explanation}
        json.dump(body, out, indent=2)
        out.write("\n")
    else:
        lines = [
            title,
            "",
            "Args",
            f"  {shlex.join(flags)}",
            "",
            "Why:",
            *[f"  {line}" for line in explanation],
        ]
        out.write("\n".join(lines) + "\n")
    return EXIT_OK if feasible else EXIT_INFEASIBLE


def plan_tgi(
    args: argparse.Namespace,
    spec: models.ModelSpec,
    gpu: GpuSpec,
    model: str,
    checkpoint: int | None,
    out: TextIO,
) -> int:
    """``plan --engine tgi``: TGI 3.3.7's warm-up budget (:mod:`kvpilot.tuner.engines.tgi_budget`), the
    launcher flags it renders and the budget explained."""
    for flag in ("nodes", "min_context", "engine_args", "pin_kv_cache_memory", "allow_fp8_kv"):
        if getattr(args, flag):
            raise CliError(f"--{flag.replace('_', '-')} is not supported with --engine tgi")
    limit = spec.max_len_base or spec.max_model_len
    settings = tgi.TgiSettings(
        max_total_tokens=min(args.max_context, limit) if args.max_context else None,
        max_concurrent_requests=args.concurrency,
        num_shard=args.gpus or 1,
    )
    budget = engines.plan_tgi_budget(
        spec, gpu, settings, weights_total_bytes=args.checkpoint_bytes or checkpoint
    )
    figures = {
        "max_batch_total_tokens": budget.max_batch_total_tokens,
        "max_total_tokens": budget.max_total_tokens,
        "concurrency": budget.concurrency,
    }
    return write_engine_plan(
        args,
        out,
        f"{model} on {args.gpus or 1} x {gpu.name} (TGI {tgi.PINNED_TGI_VERSION})",
        {"model": model, "gpu": gpu.name, "engine": "TGI", "release": tgi.PINNED_TGI_VERSION},
        budget.feasible,
        figures,
        tgi.build_tgi_args(budget.rendered),
        engines.explain_tgi_budget(budget),
    )
