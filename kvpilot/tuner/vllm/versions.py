"""vLLM's releases: which one is pinned, how to read a version, and each release's defaults and
behaviour switches.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there): the memory model, the planner and
the closed loop ask it "what does release X do?". Data and small pure functions only. Source:
the released wheels 0.8.5 ... 0.33.0 as ``docs/memory-model.md`` cites them, and the pinned
wheel's ``vllm/engine/arg_utils.py::get_batch_defaults``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpilot.tuner.types import GIB, GpuSpec

PINNED_VLLM_VERSION = "0.33.0"
"""The vLLM release kvpilot renders arguments for and models by default (``pyproject.toml``'s ``vllm``
extra pins the same release; ``tests/test_versions.py`` ties the two and the default image's tag)."""

AUTO_MAX_MODEL_LEN = -1
"""``--max-model-len -1`` / ``auto``: vLLM fits the length to the KV cache at start-up (0.14+)."""

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


PINNED_VERSION: Version = parse_version(PINNED_VLLM_VERSION)
""":data:`PINNED_VLLM_VERSION` as a tuple, the default of every ``vllm_version`` argument."""


def multiplies_yarn_max_len(version: Version) -> bool:
    """Whether the default ``max_model_len`` of a YaRN-scaled model is multiplied by the rope factor
    (up to 0.29; 0.30+ takes ``max_position_embeddings`` as it is)."""
    return version < (0, 30)


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
