"""``kvpilot plan``: engine settings for a model on a GPU type, on one node or across nodes (vLLM), or
another engine's budget (``--engine``: :mod:`kvpilot.cli.engine_plans`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any, TextIO

from kvpilot.cli.engine_plans import plan_sglang, plan_tgi
from kvpilot.cli.inputs import EXIT_INFEASIBLE, EXIT_OK, CliError, positive_int, read_text
from kvpilot.cli.plan_text import format_node_plan, format_plan, node_plan_as_json, plan_as_json
from kvpilot.tuner import gpus, memory, vllm
from kvpilot.tuner import model as models
from kvpilot.tuner.plan import compute_node_plan, compute_plan
from kvpilot.tuner.types import ServingBounds

AUTO = "auto"


def _processor_files(folder: Path) -> dict[str, dict[str, Any]]:
    """The folder's ``preprocessor_config.json`` and ``video_preprocessor_config.json``, where present (vLLM
    sizes a multimodal model's dummy encoder batch from them; the operator reads the same files from a
    ConfigMap or the Hub)."""
    files = (folder / name for name in models.PROCESSOR_FILES)
    return {f.name: models.parse_config_json(read_text(str(f)), str(f)) for f in files if f.is_file()}


def run_plan(args: argparse.Namespace, out: TextIO) -> int:

    if args.config:
        # Bounded like the operator's ConfigMaps: at most 1 MiB, nested at most 32 deep, an object.
        config = models.parse_config_json(read_text(args.config), args.config)
        sidecar = Path(args.config) / models.QUANT_SIDECAR
        if Path(args.config).is_dir() and sidecar.is_file():  # a ModelOpt checkpoint's quantization
            quant = models.parse_config_json(read_text(str(sidecar)), str(sidecar))
            config = dict(models.build_config_with_quant_sidecar(config, quant))
        model_name, checkpoint = args.config, None
    else:
        config = models.lookup_model_config(args.model)
        model_name = models.lookup_model(args.model).id
        checkpoint = models.lookup_checkpoint_bytes(args.model)
    gpu = gpus.lookup_gpu(args.gpu)
    spec = models.build_model_spec(config)
    if args.config and Path(args.config).is_dir() and models.reads_processor_files(config):
        spec = models.apply_processor_files(spec, _processor_files(Path(args.config)))
    if args.draft_config and args.engine != "vllm":
        raise CliError(
            f"{vllm.DRAFT_CONFIG_FLAG} budgets vLLM's EAGLE3 drafter or draft model: it plans --engine vllm "
            "only"
        )
    if args.engine == "sglang":
        return plan_sglang(args, spec, gpus.lookup_gpu(args.gpu), model_name, checkpoint, out)
    if args.engine == "tgi":
        return plan_tgi(args, spec, gpu, model_name, checkpoint, out)
    bounds = ServingBounds(
        min_context=args.min_context,
        max_context=args.max_context,
        concurrency=args.concurrency,
        allow_fp8_kv=args.allow_fp8_kv,
    )
    engine_args = shlex.split(args.engine_args or "")
    vllm.check_engine_flags(engine_args)
    nodes = _node_count(args)
    weights, flags = args.checkpoint_bytes or checkpoint, vllm.build_engine_flags(engine_args)
    if args.draft_config:
        flags = _with_draft_config(flags, args.draft_config)
    if nodes is not None:
        node_plan = compute_node_plan(
            spec,
            gpu,
            args.gpus_per_node,
            bounds,
            nodes=None if nodes == AUTO else int(nodes),
            vllm_version=args.vllm_version,
            weights_total_bytes=weights,
            pin_kv_cache_memory=args.pin_kv_cache_memory,
            engine=flags,
        )
        doc, text = node_plan_as_json(node_plan, model_name), format_node_plan(node_plan, model_name)
        return _write(out, args.json, doc, text, node_plan.feasible)
    plan = compute_plan(
        spec,
        gpu,
        args.gpus or 1,
        bounds,
        vllm_version=args.vllm_version,
        weights_total_bytes=weights,
        pin_kv_cache_memory=args.pin_kv_cache_memory,
        engine=flags,
    )
    return _write(
        out, args.json, plan_as_json(plan, model_name), format_plan(plan, model_name), plan.feasible
    )


def _with_draft_config(flags: vllm.EngineFlags, path: str) -> vllm.EngineFlags:
    """``flags`` carrying the draft checkpoint's ``config.json`` (bounded like ``--config``) for an EAGLE3
    or draft-model ``--speculative-config``; any other method (or none) is an input error."""
    spec = flags.speculative
    if spec is None or spec.method not in (vllm.EAGLE3, vllm.DRAFT_MODEL):
        given = f"method {spec.given_method!r}" if spec is not None else "no --speculative-config"
        raise CliError(
            f"{vllm.DRAFT_CONFIG_FLAG} gives a draft checkpoint's config.json, for --engine-args "
            f'\'--speculative-config {{"method": "eagle3", "model": ..., "num_speculative_tokens": N}}\' '
            f'or a draft model\'s \'{{"model": ..., "num_speculative_tokens": N}}\' (got {given})'
        )
    config = models.parse_config_json(read_text(path), path)
    with_config = dataclasses.replace(spec, draft_config=config)
    # refuse a draft kvpilot cannot size here, naming its field
    if spec.method == vllm.EAGLE3:
        models.read_eagle3_draft(config)
    else:
        memory.read_draft_model(with_config)
    return dataclasses.replace(flags, speculative=with_config)


def _write(out: TextIO, as_json: bool, doc: object, text: str, feasible: bool) -> int:
    """The plan as JSON or as text, and the exit code its verdict makes."""
    if as_json:
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        out.write(text)
    return EXIT_OK if feasible else EXIT_INFEASIBLE


def nodes_arg(text: str) -> str:
    return AUTO if text == AUTO else str(positive_int(text))


def _node_count(args: argparse.Namespace) -> str | None:
    """``--nodes`` (a count or ``auto``), else the nodes ``--gpus`` fills when above ``--gpus-per-node``;
    ``None``: one node, the single-node plan."""
    per_node, count = args.gpus_per_node, args.gpus
    if args.nodes is not None:
        if count is not None and args.nodes != AUTO and count != int(args.nodes) * per_node:
            raise CliError(
                f"--gpus {count} is not --nodes {args.nodes} x --gpus-per-node {per_node}: give one of them"
            )
        return str(args.nodes)
    if count is None or count <= per_node:
        return None
    if count % per_node:
        raise CliError(
            f"--gpus {count} spans nodes of {per_node} GPUs (--gpus-per-node) unevenly: give a multiple "
            f"of {per_node}, or --nodes"
        )
    return str(count // per_node)
