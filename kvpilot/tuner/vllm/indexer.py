"""The sparse-attention indexer cache of DeepSeek-V3.2 / GLM-5 (vLLM 0.33): its page and its layers.

A vLLM fact, so it lives here (rule 1). A model whose config has ``index_topk`` is a "V3.2" model in
vLLM (``model_executor/models/deepseek_v2.py``: ``is_v32 = hasattr(config, "index_topk")``; GLM-5's
``GlmMoeDsaForCausalLM`` is ``vllm/models/deepseek_v32``, the same code). Each of its MLA layers that
builds an ``Indexer`` keeps, besides the MLA latent, a ``DeepseekV32IndexerCache``: an
``MLAAttentionSpec`` with one head of ``index_head_dim + index_head_dim // 128 * 4`` bytes in
``torch.uint8`` (fp8 keys plus one fp32 scale per 128-element quantisation block), whatever
``--kv-cache-dtype`` says, with ``cache_role=INDEXER``. It is a full-attention spec of the same block
size, so vLLM puts it in the MLA layers' single group (``UniformTypeKVCacheSpecs``): a block then holds
both pages of every layer.

Which layers build one (``DeepseekV2DecoderLayer`` / ``deepseek_v32/attention.py``, "IndexCache"):
with ``index_topk_pattern`` the layers whose letter is not ``"S"``; otherwise layer ``i`` is skipped
when ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (defaults: freq 1, offset 2,
so every layer has one).
"""

from __future__ import annotations

from collections.abc import Sequence

INDEXER_QUANT_BLOCK = 128
"""``Indexer.quant_block_size``: elements per fp32 scale in the indexer's fp8 key cache."""
INDEXER_SCALE_BYTES = 4
"""One fp32 scale per quantisation block."""
DEFAULT_INDEX_TOPK_FREQ = 1
DEFAULT_INDEX_SKIP_TOPK_OFFSET = 2


def indexer_bytes_per_token(index_head_dim: int) -> int:
    """Bytes one token of one layer's indexer cache takes (``head_size`` of its spec, ``uint8``)."""
    return index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES


def indexer_layers(
    num_layers: int,
    index_topk_freq: int | None = None,
    index_topk_pattern: Sequence[str] | str | None = None,
    index_skip_topk_offset: int | None = None,
) -> tuple[bool, ...]:
    """For each decoder layer, whether vLLM 0.33 builds its indexer (and so its indexer cache)."""
    freq = index_topk_freq or DEFAULT_INDEX_TOPK_FREQ
    offset = DEFAULT_INDEX_SKIP_TOPK_OFFSET if index_skip_topk_offset is None else index_skip_topk_offset
    flags = []
    for layer in range(num_layers):
        if index_topk_pattern is None:
            skip = max(layer - offset + 1, 0) % freq != 0
        else:
            skip = layer < len(index_topk_pattern) and index_topk_pattern[layer] == "S"
        flags.append(not skip)
    return tuple(flags)


__all__ = [
    "DEFAULT_INDEX_SKIP_TOPK_OFFSET",
    "DEFAULT_INDEX_TOPK_FREQ",
    "INDEXER_QUANT_BLOCK",
    "INDEXER_SCALE_BYTES",
    "indexer_bytes_per_token",
    "indexer_layers",
]
