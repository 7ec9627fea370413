"""What vLLM actually runs: engine settings with the release's defaults filled in where unset.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). The memory model budgets the
effective settings and the closed loop steps from them, so both ask this one function:
``--max-num-seqs`` and ``--max-num-batched-tokens`` from ``get_batch_defaults`` for the GPU
(:func:`~kvpilot.tuner.vllm.versions.resolve_batch_limits`), ``--gpu-memory-utilization``'s
default for the release, ``auto`` for the KV dtype, one GPU per tensor-parallel group.
"""

from __future__ import annotations

from kvpilot.tuner.types import EngineSettings, GpuSpec
from kvpilot.tuner.vllm.versions import (
    AUTO_MAX_MODEL_LEN,
    Version,
    default_gpu_memory_utilization,
    in_flight_batches,
    resolve_batch_limits,
)


def compute_effective_settings(
    settings: EngineSettings,
    gpu: GpuSpec,
    version: Version,
    default_max_model_len: int,
    *,
    performance_mode: str | None = None,
    mm_prefix_item_tokens: int = 0,
) -> EngineSettings:
    """``settings`` as vLLM runs them on ``gpu``: every field set.

    ``default_max_model_len`` is the model's own maximum for this release (what vLLM derives
    from the config); it stands for an unset ``max_model_len`` and for ``-1`` (auto), whose
    batch defaults vLLM derives from the model's maximum before it auto-fits the context.
    ``performance_mode`` is ``--performance-mode`` (``throughput`` doubles the batch defaults, 0.33);
    ``mm_prefix_item_tokens`` a multimodal prefix-LM's largest item (``ModelSpec.mm_prefix_item_tokens``).
    """
    length = settings.max_model_len
    if length is None or length == AUTO_MAX_MODEL_LEN:
        length = default_max_model_len
    batch = resolve_batch_limits(
        version,
        gpu,
        length,
        settings.max_num_batched_tokens,
        settings.max_num_seqs,
        performance_mode,
        mm_prefix_item_tokens,
    )
    util = settings.gpu_memory_utilization
    return EngineSettings(
        max_model_len=settings.max_model_len or default_max_model_len,
        max_num_seqs=batch.max_num_seqs,
        gpu_memory_utilization=util if util is not None else default_gpu_memory_utilization(version),
        kv_cache_dtype=settings.kv_cache_dtype or "auto",
        tensor_parallel_size=settings.tensor_parallel_size or 1,
        max_num_batched_tokens=batch.max_num_batched_tokens,
    )


def compute_in_flight_tokens(
    effective: EngineSettings,
    version: Version,
    pipeline_parallel_size: int = 1,
    model_runner_v2: bool | None = None,
) -> int:
    """``VllmConfig.max_in_flight_tokens`` (0.33 ``config/vllm.py``): the tokens scheduled but not yet
    settled, which every sliding-window and chunked-local reservation adds to its window:
    :func:`~kvpilot.tuner.vllm.versions.in_flight_batches` (``PP + 1`` under Model Runner V2 with
    async scheduling) x ``max_num_batched_tokens`` of the ``effective`` settings
    (:func:`compute_effective_settings`)."""
    assert effective.max_num_batched_tokens is not None, "pass the effective settings"
    batches = in_flight_batches(version, pipeline_parallel_size, model_runner_v2)
    return batches * effective.max_num_batched_tokens
