"""The KV block size vLLM 0.33 settles on when ``--block-size`` is not given: per attention backend and GPU.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there); :mod:`kvpilot.tuner.memory.kv_cache` asks
it. Sources, in the pinned 0.33.0 wheel:

* ``platforms/interface.py::Platform.update_block_size_for_backend``: without ``--block-size`` the block is
  the attention backend's ``get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)``
  (``v1/attention/backend.py``): 16 when the backend accepts 16, else the smallest size it lists in
  ``get_supported_kernel_block_sizes``;
* ``platforms/cuda.py::_get_backend_priorities``: the MLA backends tried in order. Blackwell (SM 10.x):
  ``FLASHINFER_MLA`` (sizes 32, 64; it refuses a ``qk_nope_head_dim`` outside 64 / 128 / 192 in its
  ``supports_combination``), then ``TOKENSPEED_MLA`` (R1's dimensions with fp8 only: reached only when
  FlashInfer accepted them), ``CUTLASS_MLA`` (128), ``FLASH_ATTN_MLA`` (SM 9.x only), ``FLASHMLA`` (64),
  ``TRITON_MLA`` (multiples of 16). Hopper (SM 9.x): ``FLASH_ATTN_MLA`` (multiples of 16). SM 12.x and
  others: ``TRITON_MLA`` (multiples of 16). A sparse-attention MLA model (an indexer: DeepSeek-V3.2,
  GLM-5) skips the dense backends (``is_sparse``): on Hopper ``FLASH_ATTN_MLA_SPARSE`` (multiples of 64);
  on Blackwell with an fp8 cache ``FLASHINFER_MLA_SPARSE`` (multiples of 32), with a 16-bit cache
  ``FLASH_ATTN_MLA_SPARSE_FA4`` (its TRT-LLM base: multiples of 32) at 16 heads per GPU or fewer, else
  ``FLASHMLA_SPARSE`` (multiples of 64); SM 12.x ``FLASHINFER_MLA_SPARSE_SM120`` (multiples of 64).
  Every backend's sizes are the wheel's (``tests/contract/test_contract_block_sizes.py`` asks the classes
  that import on CPU: FlashInfer MLA, FlashMLA, Triton MLA and the sparse ones; CUTLASS MLA and
  FlashAttention MLA allocate CUDA memory or import CUDA kernels when imported, so their sizes are read
  from the source); the priority list itself is ``platforms/cuda.py``, which needs ``libcuda`` to import,
  so the order is derived from the code, not called.

Attention without MLA keeps 16 on every GPU kvpilot models: FlashAttention (Hopper, Ampere: multiples of
16) and FlashInfer (Blackwell's first choice: 16, 32, 64...) accept it. FlashAttention 4's own sizes
(``v1/attention/backends/flash_attn.py``: 128 for its Blackwell head-256 kernel, ``FA4_HD256_PAGE_SIZE``;
64 for Hopper's fp8 cache with 512-wide heads) apply only where FlashAttention is the backend and FA4 the
version the wheel's kernels support at run time (``fa_utils.get_flash_attn_version`` asks
``is_fa_version_supported``); on Blackwell FlashInfer comes first, and on Hopper the one model family
with 512-wide heads (Gemma 4) is a multimodal prefix LM that routes to Triton. Not modelled: the block stays
16 there (docs/memory-model.md says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpilot.tuner.vllm.kv_dtypes import is_fp8

if TYPE_CHECKING:
    from kvpilot.tuner.vllm.versions import Version

DEFAULT_BLOCK_SIZE = 16
"""``CacheConfig.DEFAULT_BLOCK_SIZE``."""

FLASHINFER_MLA_BLOCK = 32
"""``FlashInferMLABackend.get_supported_kernel_block_sizes()``: 32 and 64; the preferred is the smallest."""
FLASHINFER_MLA_QK_NOPE_HEAD_DIMS = (64, 128, 192)
"""``FlashInferMLABackend.supports_combination``: the ``qk_nope_head_dim`` its kernel takes."""
CUTLASS_MLA_BLOCK = 128
"""``CutlassMLABackend.get_supported_kernel_block_sizes()``."""
SPARSE_MLA_BLOCK = 64
"""``FlashAttnMLASparseBackend``, ``FlashMLASparseBackend``, ``FlashInferMLASparseSM120Backend``:
multiples of 64."""
FLASHINFER_SPARSE_MLA_BLOCK = 32
"""``FlashInferMLASparseTRTLLMBackend`` (and FA4's sparse backend built on it): multiples of 32."""
FA4_SPARSE_MAX_HEADS = 16
"""``_get_backend_priorities``: Blackwell's 16-bit sparse MLA prefers FA4 at this many heads or fewer."""

_BACKEND_SELECTION_SINCE: Version = (0, 33)
"""The release whose backend table this is; earlier releases keep the default block (their MLA
calibration starts ran on Hopper)."""


def default_kv_block_size(
    version: Version,
    compute_capability: tuple[int, int] | None,
    *,
    mla: bool = False,
    qk_nope_head_dim: int = 0,
    sparse: bool = False,
    kv_cache_dtype: str | None = None,
    heads_per_gpu: int = 0,
) -> int:
    """Tokens per block when ``--block-size`` is not given (before any hybrid-state alignment)."""
    if not mla or compute_capability is None or version < _BACKEND_SELECTION_SINCE:
        return DEFAULT_BLOCK_SIZE
    major = compute_capability[0]
    if sparse:
        if major == 9 or major == 12:
            return SPARSE_MLA_BLOCK
        if major == 10:
            if is_fp8(kv_cache_dtype) or heads_per_gpu <= FA4_SPARSE_MAX_HEADS:
                return FLASHINFER_SPARSE_MLA_BLOCK
            return SPARSE_MLA_BLOCK
        return DEFAULT_BLOCK_SIZE
    if major == 10:
        if qk_nope_head_dim in FLASHINFER_MLA_QK_NOPE_HEAD_DIMS:
            return FLASHINFER_MLA_BLOCK
        return CUTLASS_MLA_BLOCK
    return DEFAULT_BLOCK_SIZE


__all__ = [
    "CUTLASS_MLA_BLOCK",
    "DEFAULT_BLOCK_SIZE",
    "FA4_SPARSE_MAX_HEADS",
    "FLASHINFER_MLA_BLOCK",
    "FLASHINFER_MLA_QK_NOPE_HEAD_DIMS",
    "FLASHINFER_SPARSE_MLA_BLOCK",
    "SPARSE_MLA_BLOCK",
    "default_kv_block_size",
]
