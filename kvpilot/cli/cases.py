"""``kvpilot estimate --cases FILE``: the memory model over a JSON list of vLLM start-up cases, each case
checked against the InferenceService API's own limits first (:func:`check_cases`)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from kvpilot.cli.inputs import EXIT_OK, CliError, read_json
from kvpilot.tuner import gpus, memory
from kvpilot.tuner import model as models


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


def run_estimate(args: argparse.Namespace, out: TextIO) -> int:
    cases = read_json(args.cases)
    check_cases(cases, args.cases)
    # A case without an inline hf_config falls back to the built-in catalogue by its model id.
    rows = memory.compute_estimates(cases, gpus.lookup_gpu, models.lookup_model_config)
    json.dump(rows, out, indent=2)
    out.write("\n")
    return EXIT_OK
