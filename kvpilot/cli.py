"""The ``kvpilot`` command: plan vLLM engine arguments, list the catalogues, estimate, render.

The edge for people and scripts, beside the operator: it reads files and argv,
calls the pure tuner, and prints. Subcommands:

* ``plan`` -- engine settings for a model on a GPU type, as a table or ``--json``; with ``--nodes N``
  (or ``auto``), or more ``--gpus`` than ``--gpus-per-node``, a replica over several nodes
  (:func:`kvpilot.tuner.plan.compute_node_plan`); with ``--engine sglang``, SGLang's own budget
  (:func:`kvpilot.tuner.engines.plan_sglang_budget`) explained; with ``--engine tgi``, TGI 3.3.7's warm-up
  budget (:func:`kvpilot.tuner.engines.plan_tgi_budget`) explained;
* ``gpus`` / ``models`` -- the built-in catalogues;
* ``estimate --cases FILE`` -- the memory model over a JSON list of vLLM start-up cases;
* ``render -f isvc.yaml`` -- the Deployment and Service the operator would apply (a LeaderWorkerSet for a
  replica over several nodes, which the operator applies where LeaderWorkerSet is installed);
* ``diagnose [LOG | --pod NAME]`` -- what a vLLM log says happened, and what to change
  (:mod:`kvpilot.tuner.diagnose`); with ``--gpu`` and a catalogue model in the log, kvpilot's plan;
* ``timeline NAME`` -- an SVG of one InferenceService's settings and decisions over time
  (:mod:`kvpilot.observability.timeline`), with KV usage and preemptions from ``--prometheus``.

Exit status: 0 done; 1 ``plan`` found nothing that fits (the plan says why); 2 bad
input (an unknown GPU or model, an unreadable file, a config the memory model cannot
account for). Errors are one message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from kvpilot.tuner import diagnose, engines, errors, gpus, memory, sglang, tgi, vllm
from kvpilot.tuner import model as models
from kvpilot.tuner.model.vision import VisionTower, apply_processor_configs
from kvpilot.tuner.plan import NodePlan, compute_node_plan, compute_plan
from kvpilot.tuner.types import GIB, GpuSpec, Plan, ServingBounds
from kvpilot.tuner.vllm import serving

EXIT_OK, EXIT_INFEASIBLE, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A problem with the command's input, reported as one line on stderr (exit 2)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _read_text(path: str) -> str:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {file}: {exc}") from None


def _read_json(path: str) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{path} is nested too deeply to read") from None


# -- plan ---------------------------------------------------------------------------------------


def _processor_limits(tower: VisionTower, folder: Path) -> VisionTower | None:
    """The tower with the pixel budgets of the folder's ``preprocessor_config.json`` and
    ``video_preprocessor_config.json``, where present (vLLM reads them from the checkpoint)."""
    found = []
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        file = folder / name
        found.append(models.parse_config_json(_read_text(str(file)), str(file)) if file.is_file() else None)
    return apply_processor_configs(tower, found[0], found[1])


def _plan(args: argparse.Namespace, out: TextIO) -> int:

    if args.config:
        # Bounded like the operator's ConfigMaps: at most 1 MiB, nested at most 32 deep, an object.
        config = models.parse_config_json(_read_text(args.config), args.config)
        sidecar = Path(args.config) / models.QUANT_SIDECAR
        if Path(args.config).is_dir() and sidecar.is_file():  # a ModelOpt checkpoint's quantization
            quant = models.parse_config_json(_read_text(str(sidecar)), str(sidecar))
            config = dict(models.build_config_with_quant_sidecar(config, quant))
        model_name, checkpoint = args.config, None
    else:
        config = models.lookup_model_config(args.model)
        model_name = models.lookup_model(args.model).id
        checkpoint = models.lookup_checkpoint_bytes(args.model)
    gpu = gpus.lookup_gpu(args.gpu)
    spec = models.build_model_spec(config)
    if args.config and Path(args.config).is_dir() and spec.vision_tower is not None:
        spec = dataclasses.replace(spec, vision_tower=_processor_limits(spec.vision_tower, Path(args.config)))
    if args.engine == "sglang":
        return _plan_sglang(args, spec, gpus.lookup_gpu(args.gpu), model_name, checkpoint, out)
    if args.engine == "tgi":
        return _plan_tgi(args, spec, gpu, model_name, checkpoint, out)
    bounds = ServingBounds(
        min_context=args.min_context,
        max_context=args.max_context,
        concurrency=args.concurrency,
        allow_fp8_kv=args.allow_fp8_kv,
    )
    engine_args = shlex.split(args.engine_args or "")
    vllm.check_engine_flags(engine_args)
    nodes = _node_count(args)
    if nodes is not None:
        node_plan = compute_node_plan(
            spec,
            gpu,
            args.gpus_per_node,
            bounds,
            nodes=None if nodes == AUTO else int(nodes),
            vllm_version=args.vllm_version,
            weights_total_bytes=args.checkpoint_bytes or checkpoint,
            pin_kv_cache_memory=args.pin_kv_cache_memory,
            engine=vllm.build_engine_flags(engine_args),
        )
        if args.json:
            json.dump(node_plan_as_json(node_plan, model_name), out, indent=2)
            out.write("\n")
        else:
            out.write(format_node_plan(node_plan, model_name))
        return EXIT_OK if node_plan.feasible else EXIT_INFEASIBLE
    plan = compute_plan(
        spec,
        gpu,
        args.gpus or 1,
        bounds,
        vllm_version=args.vllm_version,
        weights_total_bytes=args.checkpoint_bytes or checkpoint,
        pin_kv_cache_memory=args.pin_kv_cache_memory,
        engine=vllm.build_engine_flags(engine_args),
    )
    if args.json:
        json.dump(plan_as_json(plan, model_name), out, indent=2)
        out.write("\n")
    else:
        out.write(format_plan(plan, model_name))
    return EXIT_OK if plan.feasible else EXIT_INFEASIBLE


def _plan_sglang(
    args: argparse.Namespace,
    spec: models.ModelSpec,
    gpu: GpuSpec,
    model: str,
    checkpoint: int | None,
    out: TextIO,
) -> int:
    """``plan --engine sglang``: SGLang's own budget (:mod:`kvpilot.tuner.engines.sglang_budget`), its
    flags and the budget explained."""
    for flag in ("nodes", "min_context", "engine_args", "pin_kv_cache_memory", "allow_fp8_kv"):
        if getattr(args, flag):
            raise CliError(f"--{flag.replace('_', '-')} is not supported with --engine sglang yet")
    settings = sglang.SglangSettings(
        context_length=min(args.max_context, spec.max_model_len) if args.max_context else None,
        max_running_requests=args.concurrency,
        tp_size=args.gpus or 1,
    )
    budget = engines.plan_sglang_budget(
        spec, gpu, settings, weights_total_bytes=args.checkpoint_bytes or checkpoint
    )
    figures = {"max_total_tokens": budget.max_total_tokens}
    return _write_engine_plan(
        args,
        out,
        f"{model} on {args.gpus or 1} x {gpu.name} (SGLang {sglang.PINNED_SGLANG_VERSION})",
        {"model": model, "gpu": gpu.name, "engine": "SGLang", "release": sglang.PINNED_SGLANG_VERSION},
        budget.feasible,
        figures,
        sglang.build_sglang_args(budget.rendered),
        engines.explain_sglang_budget(budget),
    )


def _write_engine_plan(
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


def _plan_tgi(
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
    return _write_engine_plan(
        args,
        out,
        f"{model} on {args.gpus or 1} x {gpu.name} (TGI {tgi.PINNED_TGI_VERSION})",
        {"model": model, "gpu": gpu.name, "engine": "TGI", "release": tgi.PINNED_TGI_VERSION},
        budget.feasible,
        figures,
        tgi.build_tgi_args(budget.rendered),
        engines.explain_tgi_budget(budget),
    )


AUTO = "auto"


def _nodes_arg(text: str) -> str:
    return AUTO if text == AUTO else str(_positive_int(text))


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


def plan_as_json(plan: Plan, model: str) -> dict[str, Any]:
    """The ``plan --json`` document: the settings at the top level, then budget, args and verdict."""
    settings, budget = dataclasses.asdict(plan.settings), dataclasses.asdict(plan.budget)
    return {
        "model": model,
        "gpu": plan.gpu,
        "gpu_count": plan.gpu_count,
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
    lines += [
        "",
        "Memory per GPU (GiB)",
        f"  {'GPU total (CUDA)':<26}{b.gpu_total_gib:>9.2f}",
        f"  {f'requested (x {util})' if util else 'requested':<26}{b.requested_gib:>9.2f}",
        f"  {'- weights':<26}{b.weights_gib:>9.2f}",
        f"  {'- activation peak':<26}{b.activation_gib:>9.2f}",
        f"  {'- sampler state (V2)':<26}{b.sampler_state_gib:>9.2f}",
        f"  {'- non-torch':<26}{b.non_torch_gib:>9.2f}",
        f"  {'- CUDA graphs':<26}{b.cuda_graph_gib:>9.2f}",
        f"  {'= KV cache (pinned)' if plan.kv_cache_memory_bytes else '= KV cache':<26}"
        f"{b.available_kv_cache_gib:>9.2f}",
        "",
        f"KV cache: {b.kv_cache_tokens:,} tokens ({b.num_gpu_blocks:,} blocks, "
        f"{b.kv_bytes_per_token:,} B per token per GPU)",
        f"Concurrency: {plan.concurrency_at_max_len:.2f} sequences of {s.max_model_len} tokens",
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


def _gpus(args: argparse.Namespace, out: TextIO) -> int:
    catalogue = gpus.list_gpus()
    if args.json:
        json.dump([dataclasses.asdict(g) for g in catalogue], out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"{'name':<16}{'CUDA GiB':>9}{'NVML MiB':>10}  {'cc':<5}{'fp8 KV':<8}{'link':<17}GFD product\n")
    for g in catalogue:
        nvml = f"{g.nvml_total_bytes // (1 << 20):,}" if g.nvml_total_bytes else "-"
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        products = ", ".join(g.gfd_products) or "-"
        out.write(
            f"{g.name:<16}{g.total_bytes / GIB:>9.2f}{nvml:>10}  {cc:<5}{'yes' if g.fp8_kv else 'no':<8}"
            f"{g.interconnect:<17}{products}\n"
        )
    return EXIT_OK


def _models(args: argparse.Namespace, out: TextIO) -> int:
    listing = models.list_models()
    if args.json:
        json.dump([{"id": i, "description": d} for i, d in listing], out, indent=2)
        out.write("\n")
        return EXIT_OK
    width = max(len(i) for i, _ in listing) + 2
    for model_id, description in listing:
        out.write(f"{model_id:<{width}}{description}\n")
    return EXIT_OK


# -- estimate and render --------------------------------------------------------------------------


def _case_limits() -> tuple[dict[str, int], dict[str, tuple[float, float]]]:
    """Per numeric case field, its largest value: the InferenceService API's own maxima (tokens,
    sequences, GPUs, checkpoint bytes), so no case asks the memory model for numbers no spec could."""
    from kvpilot.operator import api

    gpus_max = next(m.le for m in api.GpuRequest.model_fields["count"].metadata if hasattr(m, "le"))
    tokens, seqs, weights = api.MAX_TOKENS, api.MAX_SEQS, api.MAX_CHECKPOINT_BYTES
    ints = {
        "max_model_len": tokens,
        "max_num_batched_tokens": tokens,
        "block_size": tokens,
        "max_num_seqs": seqs,
        "tensor_parallel_size": gpus_max,
        "pipeline_parallel_size": gpus_max,
        "weights_total_bytes": weights,
        "weight_bits": 64,
    }
    floats = {"gpu_total_gib": (0.0, float(weights >> 30)), "gpu_memory_utilization": (0.0, 1.0)}
    return ints, floats


_CASE_STRINGS = ("model", "gpu", "dtype", "quantization", "kv_cache_dtype", "vllm_version")
_CASE_BOOLS = ("enforce_eager", "enable_prefix_caching")


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _case_problem(case: dict[str, Any]) -> str | None:
    """The first thing wrong with one case's fields, as ``field must be ..., got ...``; ``None`` if none."""
    ints, floats = _case_limits()
    for field, top in ints.items():
        value = case.get(field)
        if value is not None and not (_is_int(value) and 1 <= value <= top):
            return f"{field} must be an integer in [1, {top}], got {_shown(value)}"
    for field, (low, high) in floats.items():
        value = case.get(field)
        if value is not None and not ((_is_int(value) or isinstance(value, float)) and low < value <= high):
            return f"{field} must be a number in ({low:g}, {high:g}], got {_shown(value)}"
    for field in _CASE_STRINGS:
        if case.get(field) is not None and not isinstance(case[field], str):
            return f"{field} must be a string, got {_shown(case[field])}"
    for field in _CASE_BOOLS:
        if case.get(field) is not None and not isinstance(case[field], bool):
            return f"{field} must be true or false, got {_shown(case[field])}"
    if case.get("hf_config") is not None and not isinstance(case["hf_config"], dict):
        return f"hf_config must be a JSON object (the model's config.json), got {_shown(case['hf_config'])}"
    if case.get("hf_config") is None and case.get("model") is None:
        return "hf_config (the model's config.json) or model (a catalogue id) is missing"
    return None


def check_cases(cases: Any, path: str) -> None:
    """Refuse, in one line naming the case and the field, any case the memory model cannot be asked:
    not an object, a field of the wrong type, a number out of range (NaN, infinite, above the API's
    maxima), or neither a model config nor a model id. What remains is a question the model answers
    per row, with an ``error`` where it cannot: an unknown GPU or model, a case with no GPU at all (the
    calibration data has cases from unnamed GPUs), a config it cannot account for."""
    if not isinstance(cases, list):
        raise CliError(f"{path} must hold a JSON list of cases, found a JSON {type(cases).__name__}")
    for index, case in enumerate(cases):
        if not isinstance(case, dict):
            raise CliError(f"{path}: case #{index} must be a JSON object, got {_shown(case)}")
        case_id = case.get("id", index)
        if not (_is_int(case_id) or isinstance(case_id, str)):
            raise CliError(f"{path}: case #{index}: id must be a string or an integer, got {_shown(case_id)}")
        problem = _case_problem(case)
        if problem is not None:
            raise CliError(f"{path}: case {_shown(case_id)} (#{index}): {problem}")


def _estimate(args: argparse.Namespace, out: TextIO) -> int:
    cases = _read_json(args.cases)
    check_cases(cases, args.cases)
    # A case without an inline hf_config falls back to the built-in catalogue by its model id.
    rows = memory.compute_estimates(cases, gpus.lookup_gpu, models.lookup_model_config)
    json.dump(rows, out, indent=2)
    out.write("\n")
    return EXIT_OK


def _render(args: argparse.Namespace, out: TextIO) -> int:
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(_read_text(args.file)) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{args.file} is not valid YAML: {exc}") from None
    if not documents or not all(isinstance(d, dict) for d in documents):
        raise CliError(f"{args.file} must hold one or more InferenceService manifests")
    from kvpilot.operator.inferenceservice import render

    manifests: list[dict[str, Any]] = []
    for document in documents:
        try:
            manifests += render.build_manifests(document, gpu_product=args.gpu)
        except render.RenderError as exc:
            raise CliError(f"{exc.reason}: {exc.message}") from None

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # shared label dicts print in full, not as &id001
            return True

    if any(m.get("kind") == "LeaderWorkerSet" for m in manifests):
        out.write(
            "# gpu.nodesPerReplica > 1: the operator applies this LeaderWorkerSet where the cluster serves\n"
            "# leaderworkerset.x-k8s.io/v1 (else Ready=False, LeaderWorkerSetNotInstalled).\n"
        )
    yaml.dump_all(manifests, out, Dumper=NoAliases, sort_keys=False)
    return EXIT_OK


# -- diagnose -------------------------------------------------------------------------------------


def _read_log(args: argparse.Namespace) -> str:
    if args.pod:  # the previous container's log, as the closed loop reads it
        from kvpilot.operator.pods.pod_status import ClusterPods

        pods, container = ClusterPods(), serving.CONTAINER_NAME
        text = pods.read_previous_log(args.namespace, args.pod, container, 100_000)
        if text is None:
            raise CliError(f"pod {args.namespace}/{args.pod} has no previous {serving.CONTAINER_NAME} log")
        if not isinstance(text, str):  # why it could not be read, and what to do
            raise CliError(f"pod {args.namespace}/{args.pod}: {text.detail}")
        return text
    if args.log == "-":
        return sys.stdin.read()
    try:
        return Path(args.log).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CliError(f"cannot read {args.log}: {exc}") from None


def _diagnose(args: argparse.Namespace, out: TextIO) -> int:
    reading = diagnose.read_log(_read_log(args))
    out.write(diagnose.format_diagnosis(diagnose.compute_diagnosis(reading)))
    if args.gpu and reading.model:
        try:
            config = models.lookup_model_config(reading.model)
        except errors.UnknownModel:
            out.write(f"\nno plan: {reading.model} is not in the catalogue (see `kvpilot plan --config`)\n")
            return EXIT_OK
        spec = models.build_model_spec(config)
        bounds = ServingBounds(max_context=reading.max_model_len)
        version = reading.version or vllm.PINNED_VLLM_VERSION
        gpu, count = gpus.lookup_gpu(args.gpu), reading.tensor_parallel_size or 1
        plan = compute_plan(spec, gpu, count, bounds, vllm_version=version)
        out.write("\nkvpilot's plan for this model and GPU:\n" + format_plan(plan, reading.model))
    return EXIT_OK


# -- timeline -------------------------------------------------------------------------------------


def _timeline(args: argparse.Namespace, out: TextIO) -> int:
    from kvpilot.observability import fetch, timeline

    try:
        if args.file:
            service = fetch.read_service(args.file)
        else:
            service = fetch.fetch_service(args.namespace, args.name)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    meta = service["metadata"]
    history = (service.get("status") or {}).get("history") or []
    ranges = {}
    if args.prometheus and history:
        times = [timeline.parse_time(h["time"]) for h in history]
        try:
            ranges = fetch.fetch_ranges(
                args.prometheus,
                meta.get("namespace") or args.namespace,
                meta["name"],
                min(times) - 600,
                max(times) + 600,
            )
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"kvpilot: warning: no Prometheus ranges ({exc})\n")
    try:
        svg = timeline.build_timeline_svg(service, ranges)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    target = Path(args.output or f"{meta['name']}-timeline.svg")
    target.write_text(svg, encoding="utf-8")
    out.write(f"wrote {target} ({len(history)} decisions)\n")
    return EXIT_OK


# -- argv -----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvpilot", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="plan engine arguments (vLLM; SGLang or TGI with --engine) for a model on a GPU type",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="ID", help="a catalogue model (see `kvpilot models`)")
    source.add_argument(
        "--config",
        metavar="PATH",
        help="a Hugging Face config.json, or its folder (its preprocessor configs size the vision profile)",
    )
    plan.add_argument("--gpu", required=True, metavar="NAME", help="a catalogue GPU (see `kvpilot gpus`)")
    plan.add_argument("--gpus", type=_positive_int, metavar="N", help="GPUs per replica (1)")
    plan.add_argument(
        "--gpus-per-node",
        type=_positive_int,
        default=8,
        metavar="N",
        help="GPUs in one node (%(default)s): more --gpus than this span nodes",
    )
    plan.add_argument(
        "--nodes",
        type=_nodes_arg,
        metavar="N|auto",
        help="nodes per replica, of --gpus-per-node GPUs each; auto: the fewest that fit",
    )
    plan.add_argument("--max-context", type=_positive_int, metavar="N", help="longest max_model_len wanted")
    plan.add_argument("--min-context", type=_positive_int, metavar="N", help="shortest max_model_len allowed")
    plan.add_argument("--concurrency", type=_positive_int, metavar="N", help="expected concurrent sequences")
    plan.add_argument("--allow-fp8-kv", action="store_true", help="let the planner choose an fp8 KV cache")
    plan.add_argument("--checkpoint-bytes", type=_positive_int, metavar="N", help="checkpoint size, if known")
    pinned = vllm.PINNED_VLLM_VERSION
    plan.add_argument("--vllm-version", default=pinned, metavar="V", help="vLLM release (%(default)s)")
    plan.add_argument(
        "--pin-kv-cache-memory",
        action="store_true",
        help="render --kv-cache-memory-bytes (the planned KV pool) instead of --gpu-memory-utilization",
    )
    plan.add_argument(
        "--engine-args",
        metavar="ARGS",
        help="the pods' untuned vllm serve flags that change memory, quoted: '--enforce-eager', "
        "'--performance-mode interactivity', '--no-enable-prefix-caching'",
    )
    plan.add_argument(
        "--engine",
        choices=("vllm", "sglang", "tgi"),
        default="vllm",
        help="the engine to plan: vllm (%(default)s), sglang (its own memory model, release "
        f"{sglang.PINNED_SGLANG_VERSION}) or tgi (legacy, release {tgi.PINNED_TGI_VERSION}: --gpus is "
        "--num-shard, --max-context caps --max-total-tokens, --concurrency is --max-concurrent-requests)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(run=_plan)

    for name, run, what in (("gpus", _gpus, "the GPU catalogue"), ("models", _models, "the model catalogue")):
        sub = commands.add_parser(name, help=f"list {what}")
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
        sub.set_defaults(run=run)

    est = commands.add_parser("estimate", help="estimate vLLM's start-up memory for a JSON list of cases")
    est.add_argument("--cases", required=True, metavar="FILE", help="cases as in vllm_memory_cases.json")
    est.set_defaults(run=_estimate)

    ren = commands.add_parser("render", help="print the Deployment and Service the operator would apply")
    ren.add_argument("-f", "--file", required=True, metavar="FILE", help="InferenceService manifest (YAML)")
    ren.add_argument("--gpu", metavar="NAME", help="GPU to assume when the spec leaves it to node labels")
    ren.set_defaults(run=_render)

    diag = commands.add_parser("diagnose", help="say what a vLLM log shows happened, and what to change")
    diag.add_argument("log", nargs="?", default="-", help="a vLLM log file; - or nothing: stdin")
    diag.add_argument("--pod", metavar="NAME", help="read this pod's previous vllm container log instead")
    diag.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default)")
    diag.add_argument("--gpu", metavar="NAME", help="a catalogue GPU: add kvpilot's plan for the log's model")
    diag.set_defaults(run=_diagnose)

    line = commands.add_parser("timeline", help="draw one InferenceService's settings and decisions (SVG)")
    line.add_argument("name", help="the InferenceService")
    line.add_argument("-n", "--namespace", default="default", help="its namespace (default)")
    line.add_argument("-f", "--file", metavar="FILE", help="read it from kubectl get -o yaml output instead")
    line.add_argument("--prometheus", metavar="URL", help="add KV usage and preemptions from this Prometheus")
    line.add_argument("-o", "--output", metavar="FILE", help="the SVG to write (NAME-timeline.svg)")
    line.set_defaults(run=_timeline)
    return parser


def _fail(message: str, err: TextIO) -> int:
    err.write(f"kvpilot: error: {message}\n")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command in ``argv`` (``sys.argv[1:]`` by default) and return the exit status.

    Usage errors exit through argparse (status 2); every other failure is a message on
    ``err`` and status 2.
    """
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args, out))
    except (errors.TunerError, CliError) as exc:
        return _fail(str(exc), err)
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # last resort: a message, not a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc} (please report this)", err)


if __name__ == "__main__":
    sys.exit(main())
