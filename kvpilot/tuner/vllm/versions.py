"""vLLM's version-dependent defaults and behaviours, as the memory model needs them.

Sits at the bottom of the memory model: :mod:`kvpilot.tuner.memory.kv_cache`,
:mod:`kvpilot.tuner.memory.budget` and the planner ask it "what does release X do?".
Data and small pure functions only. Source: ``shared/research/vllm_reference.md``
§1.2, §2 (read from the released wheels 0.8.5 ... 0.33.0) and the pinned wheel's
``vllm/engine/arg_utils.py::get_batch_defaults``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpilot.tuner.types import GIB, GpuSpec

PINNED_VLLM_VERSION = "0.33.0"
"""The vLLM release kvpilot renders arguments for and models by default."""

Version = tuple[int, ...]

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> Version:
    """``"0.19.0"`` -> ``(0, 19, 0)``; free text such as ``"~v0.7.1 (V1)"`` takes its first version.

    ``None`` or text without a version means the pinned release.
    """
    if text:
        match = _VERSION_RE.search(str(text))
        if match:
            return tuple(int(g) for g in match.groups() if g is not None)
    return parse_version(PINNED_VLLM_VERSION)


def default_gpu_memory_utilization(version: Version) -> float:
    """``--gpu-memory-utilization`` default: 0.92 from 0.20, 0.90 before."""
    return 0.92 if version >= (0, 20) else 0.90


@dataclass(frozen=True, slots=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


def default_batch_limits(version: Version, gpu: GpuSpec) -> BatchDefaults:
    """``vllm serve``'s defaults for ``max_num_batched_tokens`` / ``max_num_seqs`` on this GPU.

    ``get_batch_defaults``: >= 160 GiB device memory (0.28+) 16384 / 1024; >= 70 GiB and not
    an A100 8192 / 1024 (0.9+; 0.8.x had no A100 exclusion); otherwise 2048 / 256. The V0
    engine (<= 0.10 with ``VLLM_USE_V1=0``) is not modelled here: V1 is the default since 0.8.
    """
    device = gpu.nvml_total_bytes or gpu.total_bytes
    is_a100 = "a100" in gpu.name.lower()
    if version >= (0, 28) and device >= 160 * GIB:
        return BatchDefaults(16384, 1024)
    if device >= 70 * GIB and (not is_a100 or version < (0, 9)):
        return BatchDefaults(8192, 1024)
    if version < (0, 9):
        return BatchDefaults(2048, 1024)  # 0.8.x: 1024 sequences on every GPU class
    return BatchDefaults(2048, 256)


def resolve_batch_limits(
    version: Version,
    gpu: GpuSpec,
    max_model_len: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
) -> BatchDefaults:
    """Apply vLLM's adjustments to the values the user did not set (reference §2.2)."""
    defaults = default_batch_limits(version, gpu)
    tokens = max_num_batched_tokens
    seqs = max_num_seqs
    if tokens is None:
        tokens = defaults.max_num_batched_tokens
        if version >= (0, 12):
            tokens = min((seqs or defaults.max_num_seqs) * max_model_len, tokens)
    if seqs is None:
        seqs = defaults.max_num_seqs
        if version >= (0, 12):
            seqs = min(seqs, tokens)
    return BatchDefaults(tokens, seqs)


def default_block_size(version: Version) -> int:
    """Tokens per KV block on CUDA (``DEFAULT_BLOCK_SIZE``)."""
    return 16


def subtracts_cuda_graphs(version: Version) -> bool:
    """Whether the KV budget subtracts the CUDA-graph estimate (env default on from 0.20)."""
    return version >= (0, 20)


def hybrid_manager_for_chunked_local(version: Version) -> bool:
    """Whether chunked-local (Llama 4) layers get their own KV groups.

    0.19 logs show four groups for Llama 4 Scout; 0.33 disables the hybrid manager for
    chunked-local attention unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``,
    so those layers are then sized as full attention. The switch lies between the two
    checked releases; 0.20 is assumed.
    """
    return version < (0, 20)


def in_flight_batches(version: Version, pipeline_parallel_size: int) -> int:
    """Concurrent batches a sliding-window request may hold blocks for.

    0.30+: ``max_concurrent_batches`` (2 with async scheduling at PP=1, else PP);
    before: one batch of ``max_num_batched_tokens``.
    """
    if version >= (0, 30):
        return 2 if pipeline_parallel_size == 1 else pipeline_parallel_size
    return 1


def reports_tokens_per_group(version: Version) -> bool:
    """<= 0.20 logs ``num_blocks // num_groups * block_size`` tokens; later, concurrency x length."""
    return version < (0, 21)


def reserves_null_block_in_check(version: Version) -> bool:
    """0.33 subtracts one block (the null block) before the max-model-len fit check."""
    return version >= (0, 33)


def no_memory_error(version: Version) -> str:
    """vLLM's text when nothing is left for KV blocks (reference §1.6)."""
    text = (
        "No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine"
    )
    if version >= (0, 25):
        text += " (this flag also controls CPU memory reservation on the CPU backend, despite its name)"
    text += "."
    if version >= (0, 13):
        text += " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    return text


def long_max_len_error(max_model_len: int, key: str | None, derived: float) -> str:
    """vLLM's text when ``--max-model-len`` exceeds the config's maximum (``_get_and_verify_max_len``)."""
    return (
        f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
        f"({key}={derived} or model_max_length=None in model's config.json). "
        "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. "
        "If the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len "
        "lead to nan. If the model uses absolute position encoding, positions exceeding "
        "derived_max_model_len will cause a CUDA array out-of-bounds error."
    )


def max_len_error(
    version: Version, max_model_len: int, needed_gib: float, available_gib: float, estimate: int
) -> str:
    """vLLM's text when one ``max_model_len`` request does not fit (reference §1.6)."""
    model = "model's" if version >= (0, 25) else "models's"
    gib = (lambda x: f"{round(x, 2)}") if version >= (0, 15) else (lambda x: f"{x:.2f}")
    text = (
        f"To serve at least one request with the {model} max seq len ({max_model_len}), "
        f"({gib(needed_gib)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({gib(available_gib)} GiB). "
    )
    if estimate > 0:
        text += f"Based on the available memory, the estimated maximum model length is {estimate}. "
    if version >= (0, 25):
        text += (
            "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
            "or decreasing `max_model_len` when initializing the engine."
        )
    else:
        text += (
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine."
        )
    if version >= (0, 13):
        text += " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    return text
