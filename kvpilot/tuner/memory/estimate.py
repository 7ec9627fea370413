"""The pure core of ``kvpilot estimate --cases FILE``: one memory budget per case.

Sits above :mod:`kvpilot.tuner.memory.budget`; the CLI reads the file and prints the
result, ``bench/memory_accuracy.py`` compares it with real vLLM logs. A case is a
mapping in the schema of ``shared/data/vllm_memory_cases.json`` (``hf_config``
inline, ``gpu`` name and/or ``gpu_total_gib``, parallel sizes, ``dtype``,
``quantization`` / ``weight_bits``, ``kv_cache_dtype``, ``gpu_memory_utilization``,
``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``,
``enforce_eager``, ``enable_prefix_caching`` (unset: vLLM's default), ``vllm_version``, optional
``weights_total_bytes`` and ``kv_cache_memory_bytes``: vLLM's ``--kv-cache-memory-bytes``, the KV pool per
GPU, exactly); for a multimodal model, optional ``preprocessor_config`` and ``video_preprocessor_config``: the
checkpoint's processor files (their pixel budgets size vLLM's dummy encoder batch, as ``kvpilot plan --config
FOLDER`` reads them; absent: transformers' class defaults); optional ``quantization_config``: a stand-in for
the checkpoint's own when ``hf_config`` has none (else ``quantization`` / ``weight_bits`` stand in); optional
``engine_args``: the run's other vLLM arguments, of which the budget reads ``--moe-backend``
(:mod:`kvpilot.tuner.memory.moe_kernels`).

Each row holds the budget's terms and what vLLM would report: ``num_gpu_blocks``,
``kv_cache_tokens``, ``max_concurrency``, ``starts``, ``estimated_max_model_len`` (the length vLLM's
"max seq len" error would name, or null) and ``error``.

A case that cannot be estimated (no config, an architecture the model cannot
account for, an unknown GPU, a bad value) gets ``error`` set; the batch goes on.
The GPU and config lookups are injected so this module does not depend on the catalogues.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory import budget as memory
from kvpilot.tuner.model import ModelSpec, build_model_spec, build_quant_spec
from kvpilot.tuner.model.vision import apply_processor_configs
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, MemoryBudget
from kvpilot.tuner.vllm import messages

GpuLookup = Callable[[str], GpuSpec]
ConfigLookup = Callable[[str], Mapping[str, Any]]

OUTPUT_KEYS = (
    "id",
    "weights_gib",
    "activation_gib",
    "non_torch_gib",
    "cuda_graph_gib",
    "cuda_graphs_in_budget",
    "available_kv_cache_gib",
    "num_gpu_blocks",
    "kv_cache_tokens",
    "max_concurrency",
    "starts",
    "estimated_max_model_len",
    "error",
)

_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


class CaseError(ValueError):
    """A case that cannot be estimated; the message goes into the case's ``error``."""


def _gpu(case: Mapping[str, Any], gpu_lookup: GpuLookup | None) -> GpuSpec:
    name = case.get("gpu")
    total_gib = case.get("gpu_total_gib")
    found: GpuSpec | None = None
    lookup_error = None
    if name and gpu_lookup is not None:
        try:
            found = gpu_lookup(str(name))
        except errors.TunerError as exc:
            lookup_error = exc.message
    if total_gib is not None:
        total_gib = float(total_gib)
        if total_gib <= 0:
            raise CaseError(f"gpu_total_gib must be positive, got {total_gib}")
        total = round(total_gib * GIB)
        if found is not None:
            nvml = found.nvml_total_bytes
            if nvml is not None and abs(nvml - total) > 8 * GIB:
                nvml = None  # a different SKU than the catalogue's: trust the logged total
            return dataclasses.replace(found, total_bytes=total, nvml_total_bytes=nvml)
        return GpuSpec(
            name=str(name or f"{total_gib:g}GiB"),
            total_bytes=total,
            compute_capability=(9, 0) if total_gib > 70 else (8, 0),
            fp8_kv=total_gib > 70,
            # a link not named: charge the NVLink-class TP term, the conservative side (less KV cache)
            interconnect="nvlink",
        )
    if found is not None:
        return found
    if lookup_error:
        raise CaseError(lookup_error)
    raise CaseError("the case names no GPU ('gpu') and no 'gpu_total_gib'")


def _int(case: Mapping[str, Any], key: str) -> int | None:
    value = case.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
        raise CaseError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def build_case_model(case: Mapping[str, Any], config_lookup: ConfigLookup | None = None) -> ModelSpec:
    """The model of one case: its ``hf_config`` (or the catalogue's, by ``model``), the quantization stand-in
    when the config has none, and the processor files; raises :class:`CaseError` or a
    :class:`~kvpilot.tuner.errors.TunerError`."""
    config = case.get("hf_config")
    if not isinstance(config, Mapping) and config_lookup is not None and case.get("model"):
        try:
            config = config_lookup(str(case["model"]))
        except errors.TunerError:
            config = None
    if not isinstance(config, Mapping):
        where = f" and {case.get('model')!r} is not in the built-in catalogue" if config_lookup else ""
        raise CaseError(f"the case has no hf_config (the model's config.json){where}: add it inline")
    spec = build_model_spec(config)
    method = case.get("quantization")
    stand_in = case.get("quantization_config")
    if spec.quantization is None and isinstance(stand_in, Mapping):
        spec = dataclasses.replace(spec, quantization=build_quant_spec(stand_in))
    elif spec.quantization is None and method:
        qc: dict[str, Any] = {"quant_method": method}
        if case.get("weight_bits"):
            qc["bits"] = int(case["weight_bits"])
        spec = dataclasses.replace(spec, quantization=build_quant_spec(qc))
    processors = [case.get(key) for key in ("preprocessor_config", "video_preprocessor_config")]
    for key, value in zip(("preprocessor_config", "video_preprocessor_config"), processors, strict=True):
        if value is not None and not isinstance(value, Mapping):
            raise CaseError(f"{key} must be a mapping (the checkpoint's {key}.json), got {value!r}")
    if any(processors):
        image, video = (p if isinstance(p, Mapping) else None for p in processors)
        spec = dataclasses.replace(
            spec, vision_tower=apply_processor_configs(spec.vision_tower, image, video)
        )
    return spec


def compute_case_budget(
    case: Mapping[str, Any], gpu_lookup: GpuLookup | None = None, config_lookup: ConfigLookup | None = None
) -> MemoryBudget:
    """The budget of one case; raises :class:`CaseError` or a :class:`~kvpilot.tuner.errors.TunerError`."""
    model = build_case_model(case, config_lookup)
    gpu = _gpu(case, gpu_lookup)
    util = case.get("gpu_memory_utilization")
    if util is not None and not (isinstance(util, (int, float)) and 0 < float(util) <= 1):
        raise CaseError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    dtype = case.get("dtype")
    if dtype is not None and str(dtype) != "auto":
        if str(dtype) not in _DTYPES:
            raise CaseError(f"dtype {dtype!r} is not modelled")
        dtype = _DTYPES[str(dtype)]
    else:
        dtype = None
    for key in ("kv_cache_dtype", "quantization", "gpu", "dtype"):
        if case.get(key) is not None and not isinstance(case.get(key), str):
            raise CaseError(f"{key} must be a string, got {case.get(key)!r}")
    args = case.get("engine_args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise CaseError(f"engine_args must be a list of strings, got {args!r}"[:200])
    vllm.check_moe_backend(args)
    settings = EngineSettings(
        max_model_len=_int(case, "max_model_len"),
        max_num_seqs=_int(case, "max_num_seqs"),
        gpu_memory_utilization=float(util) if util is not None else None,
        kv_cache_dtype=case.get("kv_cache_dtype") or None,
        tensor_parallel_size=_int(case, "tensor_parallel_size"),
        max_num_batched_tokens=_int(case, "max_num_batched_tokens"),
    )
    return memory.compute_budget(
        model,
        gpu,
        settings,
        pipeline_parallel_size=_int(case, "pipeline_parallel_size") or 1,
        vllm_version=str(case.get("vllm_version") or vllm.PINNED_VLLM_VERSION),
        weights_total_bytes=_int(case, "weights_total_bytes"),
        enforce_eager=bool(case.get("enforce_eager")),
        block_size=_int(case, "block_size"),
        dtype=dtype,
        kv_cache_memory_bytes=_int(case, "kv_cache_memory_bytes"),
        enable_prefix_caching=case["enable_prefix_caching"]
        if isinstance(case.get("enable_prefix_caching"), bool)
        else None,
        moe_backend=vllm.read_moe_backend(args),
    )


def _row(case_id: Any, budget: MemoryBudget | None, error: str | None) -> dict[str, Any]:
    if budget is None:
        row: dict[str, Any] = dict.fromkeys(OUTPUT_KEYS)
        row.update(id=case_id, starts=False, error=error)
        return row
    return {
        "id": case_id,
        "weights_gib": round(budget.weights_gib, 4),
        "activation_gib": round(budget.activation_gib, 4),
        "non_torch_gib": round(budget.non_torch_gib, 4),
        "cuda_graph_gib": round(budget.cuda_graph_gib, 4),
        "cuda_graphs_in_budget": budget.cuda_graphs_in_budget,
        "available_kv_cache_gib": round(budget.available_kv_cache_gib, 4),
        "num_gpu_blocks": budget.num_gpu_blocks,
        "kv_cache_tokens": budget.kv_cache_tokens,
        "max_concurrency": round(budget.max_concurrency, 2),
        "starts": budget.starts,
        "estimated_max_model_len": _estimated_max_model_len(budget),
        "error": budget.error,
    }


def _estimated_max_model_len(budget: MemoryBudget) -> int | None:
    """The length vLLM's "max seq len" error names ("the estimated maximum model length is E"), or None:
    no other error names one, and vLLM leaves it out when not even one token fits."""
    found = messages.V1_ESTIMATE.search(budget.error or "")
    return int(found.group(1)) if found else None


def compute_estimates(
    cases: Sequence[Any], gpu_lookup: GpuLookup | None = None, config_lookup: ConfigLookup | None = None
) -> list[dict[str, Any]]:
    """One output row per case, in order; a failing case carries its ``error``.

    ``gpu_lookup`` resolves a ``gpu`` name (e.g. :func:`kvpilot.tuner.gpus.lookup_gpu`);
    ``config_lookup`` supplies a config for a case whose ``hf_config`` is null, by its
    ``model`` id (e.g. :func:`kvpilot.tuner.model.catalogue.lookup_model_config`).
    """
    rows = []
    for index, case in enumerate(cases):
        if not isinstance(case, Mapping):
            rows.append(_row(None, None, f"case #{index} is not a JSON object"))
            continue
        case_id = case.get("id", index)
        try:
            budget = compute_case_budget(case, gpu_lookup, config_lookup)
        except (
            CaseError,
            errors.TunerError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            ArithmeticError,
        ) as exc:
            message = exc.message if isinstance(exc, errors.TunerError) else str(exc)
            rows.append(_row(case_id, None, f"{type(exc).__name__}: {message}"))
            continue
        rows.append(_row(case_id, budget, None))
    return rows
