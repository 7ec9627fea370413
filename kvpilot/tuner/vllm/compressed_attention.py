"""DeepSeek-V4's compressed sparse attention (vLLM 0.33): the caches each layer keeps and their pages.

A vLLM fact, so it lives here (rule 1). ``DeepseekV4ForCausalLM`` (``vllm/models/deepseek_v4``, the NVIDIA
path on CUDA) reads ``compress_ratios`` (one per decoder layer, the MTP layer last; transformers'
``DeepseekV4Config`` turns it into ``layer_types``) and builds, per decoder layer ``i`` with ratio ``r``
(``max(1, compress_ratios[i])``):

* always a ``DeepseekV4SWACache`` (``v1/attention/backends/mla/sparse_swa.py``): a ``SlidingWindowMLASpec``
  of the config's ``sliding_window`` at its own 64-token block;
* ``r > 1``: the compressed latent (``DeepseekV4Attention.get_kv_cache_spec``), an ``MLAAttentionSpec`` with
  ``tokens_per_state = r`` at the pool's block size (one state per ``r`` tokens), and the compressor's
  ``CompressorStateCache`` (``models/deepseek_v4/compressor.py``): a float32 ``SlidingWindowMLASpec`` of
  ``2 x coff x head_dim`` per token (kv and score states; ``coff`` 2 with ratio 4's overlap, else 1), window
  ``coff x r``, block 4 (ratio 4) or 8 (ratio 128);
* ``r == 4`` (C4A, the only sparse layers): the indexer's ``DeepseekV4IndexerCache``, an ``MLAAttentionSpec``
  of ``index_head_dim + index_head_dim // 128 x 4`` uint8 bytes (fp8 keys, an fp32 scale per 128) with
  ``tokens_per_state = 4``, and the indexer compressor's state cache (``head_dim = index_head_dim``).

Every page is replicated across TP (``max_tp_shards = 1``). On CUDA the default attention class is FlashMLA's
(FlashInfer on SM 12.x keeps the same layout), whose ``fp8_ds_mla`` block format is used whatever
``--kv-cache-dtype`` says (``auto`` and ``fp8`` become ``fp8_ds_mla``; anything else is refused by vLLM):
584 bytes per latent state (448 NoPE + 128 RoPE + 8 scale bytes), every page rounded up to 576 bytes.
The pool's block is 256 tokens (``DeepseekV4IndexerBackend.get_supported_kernel_block_sizes``, the SWA
backend's preferred size), and the mixed page shapes make vLLM pick a block-outermost layout (``BLHNC``:
``DeepseekV4IndexerBackend.supported_kv_cache_layouts``), so the groups are packed
(``kv_cache_planning._get_packed_kv_cache_groups``), not page-equalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.tuner.arith import round_up
from kvpilot.tuner.vllm.indexer import indexer_bytes_per_token

COMPRESSED_ATTENTION_BLOCK_SIZE = 256
"""Tokens per block of the compressed latent and indexer caches: the only size the DSV4 indexer accepts."""
SWA_BLOCK_SIZE = 64
"""``DeepseekV4SWACache``'s own block."""
LATENT_STATE_BYTES = 584
"""``fp8_ds_mla`` bytes of one latent state (448 NoPE fp8 + 64 RoPE bf16 + 8 scale bytes)."""
PAGE_ALIGNMENT = 576
"""Every ``fp8_ds_mla``-layout page is padded to a multiple of this (``_apply_alignment_padding``)."""
COMPRESSOR_STATE_BYTES = 4
"""The compressor states are float32."""
SPARSE_RATIO = 4
"""The compress ratio whose layers build the lightning indexer (C4A)."""
COMPRESSOR_BLOCK_SIZE = {4: 4, 128: 8}
"""``CompressorStateCache.block_size`` per compress ratio."""
COMPRESSED_ATTENTION_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")
"""``--kv-cache-dtype`` values DeepSeek-V4's FlashMLA layout accepts (all become ``fp8_ds_mla``)."""


@dataclass(frozen=True, slots=True)
class CompressedCache:
    """One KV-cache spec a DeepSeek-V4 layer registers: its block, page and sliding window."""

    block_size: int
    page_bytes: int
    window: int | None = None
    """A ``SlidingWindowMLASpec``'s window; None: an ``MLAAttentionSpec`` (a page per block of the
    request)."""


def _page(block_size: int, tokens_per_state: int, state_bytes: int) -> int:
    return round_up(block_size // tokens_per_state * state_bytes, PAGE_ALIGNMENT)


def _compressor(ratio: int, head_dim: int) -> CompressedCache:
    coff = 2 if ratio == SPARSE_RATIO else 1
    block = COMPRESSOR_BLOCK_SIZE[ratio]
    page = _page(block, 1, 2 * coff * head_dim * COMPRESSOR_STATE_BYTES)
    return CompressedCache(block, page, coff * ratio)


def compressed_layer_caches(
    compress_ratio: int, head_dim: int, window: int, index_head_dim: int
) -> tuple[CompressedCache, ...]:
    """The caches of one decoder layer, in the order vLLM registers them (SWA, latent, compressor,
    indexer)."""
    ratio = max(1, compress_ratio)
    caches = [CompressedCache(SWA_BLOCK_SIZE, _page(SWA_BLOCK_SIZE, 1, LATENT_STATE_BYTES), window)]
    if ratio > 1:
        caches.append(
            CompressedCache(
                COMPRESSED_ATTENTION_BLOCK_SIZE,
                _page(COMPRESSED_ATTENTION_BLOCK_SIZE, ratio, LATENT_STATE_BYTES),
            )
        )
        caches.append(_compressor(ratio, head_dim))
    if ratio == SPARSE_RATIO:
        index_page = _page(COMPRESSED_ATTENTION_BLOCK_SIZE, ratio, indexer_bytes_per_token(index_head_dim))
        caches.append(CompressedCache(COMPRESSED_ATTENTION_BLOCK_SIZE, index_page))
        caches.append(_compressor(ratio, index_head_dim))
    return tuple(caches)


def check_compressed_ratios(ratios: Sequence[int]) -> bool:
    """Whether every ratio is one vLLM 0.33's DeepSeek-V4 builds (0 or 1: SWA only; 4; 128)."""
    return all(r in (0, 1, SPARSE_RATIO, 128) for r in ratios)


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """``kv_cache_planning._approximate_gcd``: the repeat count that pads the fewest layers (ties: larger)."""
    low, high = max(1, lower_bound), max(values)
    if low > high:
        return low
    best, best_pad = low, None
    for d in range(low, high + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


__all__ = [
    "COMPRESSOR_BLOCK_SIZE",
    "COMPRESSED_ATTENTION_KV_CACHE_DTYPES",
    "LATENT_STATE_BYTES",
    "PAGE_ALIGNMENT",
    "COMPRESSED_ATTENTION_BLOCK_SIZE",
    "SPARSE_RATIO",
    "SWA_BLOCK_SIZE",
    "CompressedCache",
    "approximate_gcd",
    "check_compressed_ratios",
    "compressed_layer_caches",
]
