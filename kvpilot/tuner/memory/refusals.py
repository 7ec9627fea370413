"""What makes vLLM refuse to start, checked in vLLM's own order on the accounting of :mod:`.budget`.

Two kinds of refusal:

* a parallel layout vLLM will not build (:func:`check_parallel_sizes`), before any memory is looked at;
* the start-up checks (:data:`STARTUP_CHECKS`) on a finished accounting (:class:`Startup`): each check returns
  vLLM's error text or ``None``, and the first that has something to say decides, as the policy chain of
  :mod:`kvpilot.tuner.loop.policy` does. Their order is the order in which vLLM would fail: the fit of the KV
  cache when the pool is sized, the warm-up after graph capture, then the allocation itself.

Every text comes from :mod:`kvpilot.tuner.vllm` (one home per fact); this module only decides which applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import kv_cache, weights
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.types import GIB, GpuSpec

CUDA_CONTEXT_GIB = 0.5
"""CUDA context + cuBLAS handles created before vLLM's memory snapshot (0.51 GiB on an H100, vLLM 0.19)."""
NCCL_GIB = 1.5
"""NCCL communicators with TP > 1, created before the snapshot since 0.11 (1.5 GiB at TP 2, vLLM 0.19)."""
POST_CAPTURE_MARGIN = 0.0133
"""Caching-allocator slack needed after graph capture, besides one fp32 logits buffer, as a share of
the GPU's memory: 1.05 GiB on an 80 GB H100, where the gpt-oss-20b failures at utilisation 0.95 left
1.6-1.7 GiB reserved but unallocated. Taken proportional to the memory the allocator manages, so a
24 GB card is not held to an H100's absolute slack (no small-GPU start in the logs to fit it on)."""


class Stage(NamedTuple):
    """The budget of one pipeline stage (its first TP rank), in bytes."""

    weights: int
    activation: int
    sampler_state: int
    available: int
    """Left for the KV cache (may be negative)."""
    layout: kv_cache.KvLayout
    lora: int = 0
    """vLLM's LoRA buffers (``--enable-lora``), part of ``weights``."""


def check_parallel_sizes(model: ModelSpec, tp: int, pp: int) -> str | None:
    """vLLM's refusals of a parallel layout, before any memory is looked at."""
    if tp < 1 or pp < 1:
        return f"tensor_parallel_size ({tp}) and pipeline_parallel_size ({pp}) must be at least 1."
    if model.num_attention_heads % tp:
        return (
            f"Total number of attention heads ({model.num_attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    if pp > model.num_layers:
        return f"pipeline_parallel_size ({pp}) exceeds the model's {model.num_layers} layers."
    state = model.linear_state
    if state is not None and not state.shards_over(tp):
        # MambaStateShapeCalculator: divide(conv channels, tp) and divide(heads, tp) assert.
        bad = state.conv_channels(tp) if state.conv_channels(tp) % tp else state.num_heads
        return f"AssertionError: {bad} is not divisible by {tp}"
    padded_vocab = weights.padded_vocab_size(model)
    if padded_vocab % tp:
        # VocabParallelEmbedding: divide(num_embeddings_padded, tp_size) asserts.
        return f"AssertionError: {padded_vocab} is not divisible by {tp}"
    return None


@dataclass(frozen=True, slots=True)
class Startup:
    """A finished start-up accounting, as the checks read it (bytes, unless named otherwise)."""

    model: ModelSpec
    gpu: GpuSpec
    version: vllm.Version
    requested: int
    """``ceil(total x gpu_memory_utilization)``."""
    stages: tuple[Stage, ...]
    asked_max_model_len: int | None
    """``--max-model-len`` as given (``None``: the model's own)."""
    max_model_len: int
    """The length the KV cache was checked for (the model's maximum under ``-1``, until auto-fitted)."""
    auto_max_model_len: bool
    max_num_seqs: int
    sampler_rows: int
    util: float
    tp: int
    blocks: int
    capacity: kv_cache.KvCapacity
    checked: int
    """The stage vLLM reports on: the first that fails its check."""
    graphs: int
    subtract_graphs: bool
    non_torch: int
    warmup_logits: int
    """The fp32 logits buffer the sampler warm-up allocates after graph capture."""
    enforce_eager: bool
    kv_cache_memory_bytes: int | None

    @property
    def outside(self) -> int:
        """Memory vLLM's snapshot never sees: the CUDA context, and NCCL with TP > 1 (0.11+)."""
        nccl = NCCL_GIB * GIB if self.tp > 1 and self.version >= (0, 11) else 0
        return int(CUDA_CONTEXT_GIB * GIB + nccl)

    @property
    def out_of_memory(self) -> bool:
        """Some stage has nothing left for the KV cache."""
        return any(s.available <= 0 for s in self.stages)


def _auto_fit_failed(s: Startup) -> str | None:
    if s.auto_max_model_len and not s.capacity.fits and not s.out_of_memory:
        return vllm.auto_fit_error()
    return None


def _longer_than_the_model(s: Startup) -> str | None:
    derived = s.model.default_max_model_len(s.version)
    if s.asked_max_model_len and s.asked_max_model_len > derived:
        shown: float = float(derived) if s.model.rotary_dim else derived  # RoPE models: scaled, so a float
        return vllm.long_max_len_error(s.asked_max_model_len, s.model.max_len_key, shown)
    return None


def _no_memory_left(s: Startup) -> str | None:
    return vllm.no_memory_error(s.version) if s.out_of_memory else None


def _context_does_not_fit(s: Startup) -> str | None:
    if s.capacity.fits:
        return None
    worst = s.stages[s.checked]
    return vllm.max_len_error(
        s.version,
        s.max_model_len,
        s.capacity.needed_bytes / GIB,
        worst.available / GIB,
        s.capacity.longest_fitting_len,
    )


def _too_few_state_blocks(s: Startup) -> str | None:
    # full CUDA graphs need a block each for the state layers' requests
    has_state = any(stage.layout.state_groups for stage in s.stages)
    if not s.enforce_eager and has_state and s.max_num_seqs > s.blocks:
        return vllm.mamba_cache_blocks_error(s.max_num_seqs, s.blocks)
    return None


def _sampler_warmup_oom(s: Startup) -> str | None:
    # Graphs are captured after the KV cache is allocated, outside the budget; the sampler
    # warm-up that follows needs a fresh fp32 logits buffer (max_num_seqs x vocab) on top.
    if s.subtract_graphs or not s.graphs:
        return None
    headroom = s.gpu.total_bytes - s.requested - CUDA_CONTEXT_GIB * GIB
    if s.graphs + s.warmup_logits + POST_CAPTURE_MARGIN * s.gpu.total_bytes <= headroom:
        return None
    return vllm.sampler_warmup_oom_error(
        s.version, s.sampler_rows, s.graphs / GIB, s.util, max(0.0, headroom / GIB)
    )


def _pinned_pool_oom(s: Startup) -> str | None:
    # --kv-cache-memory-bytes: the pool is allocated as asked, whatever the utilisation, so everything
    # must fit the GPU itself.
    if s.kv_cache_memory_bytes is None:
        return None
    used = max(st.weights + st.activation + st.sampler_state + st.available for st in s.stages)
    needed = used + s.non_torch + s.graphs + s.outside
    if needed <= s.gpu.total_bytes:
        return None
    return vllm.kv_cache_memory_oom_error(
        s.kv_cache_memory_bytes / GIB, needed / GIB, s.gpu.total_bytes / GIB
    )


def _utilisation_above_free(s: Startup) -> str | None:
    free = s.gpu.total_bytes - s.outside
    if s.requested > free and s.version >= (0, 9):
        return vllm.free_memory_error(
            s.version, free / GIB, s.gpu.total_bytes / GIB, s.util, s.requested / GIB
        )
    return None


STARTUP_CHECKS: tuple[Callable[[Startup], str | None], ...] = (
    _auto_fit_failed,
    _longer_than_the_model,
    _no_memory_left,
    _context_does_not_fit,
    _too_few_state_blocks,
    _sampler_warmup_oom,
    _pinned_pool_oom,
    _utilisation_above_free,
)
"""vLLM's start-up refusals in the order it meets them; the first with something to say decides."""


def compute_start_error(startup: Startup) -> str | None:
    """vLLM's error for this start-up, or ``None`` when it starts."""
    for check in STARTUP_CHECKS:
        error = check(startup)
        if error is not None:
            return error
    return None
