"""KV-cache geometry: bytes per page, block grouping, block counts, capacity, fit.

Sits above :mod:`kvpilot.tuner.model` and asks :mod:`kvpilot.tuner.vllm` what each release does;
:mod:`kvpilot.tuner.memory.budget` hands it the bytes left for the cache. Mirrors
``vllm/v1/kv_cache_interface.py`` (page sizes, per-request block needs) and
``vllm/v1/core/kv_cache_planning.py`` (grouping of hybrid models, bytes per block,
``num_blocks = available // bytes_per_block``, the max-model-len check).

One *page* is ``block_size`` tokens of one layer. Layers of one kind form groups of
equal size (the smallest kind's count, or the largest when ``max < 1.5 x min``);
all groups share a block pool whose block is as large as the largest group's
pages, so a hybrid model's block holds ``group_size`` layers, not all of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.arith import cdiv
from kvpilot.tuner.memory.packed import compute_packed_groups
from kvpilot.tuner.model import (
    CHUNKED,
    COMPRESSED,
    DTYPE_BYTES,
    FULL,
    GDN,
    KDA,
    LINEAR,
    MAMBA2,
    MLA,
    NO_KV,
    SLIDING,
    LinearStateSpec,
    ModelSpec,
)


@dataclass(frozen=True, slots=True)
class KvGroup:
    """One KV-cache group on one rank."""

    kind: str
    layers: int
    """Real layers of this group on this rank (padding excluded)."""
    page_bytes: int
    """Bytes of one page of one layer (a group of one kind but several shapes: the largest)."""
    window: int | None = None
    block_size: int = 0
    """Tokens per block of this group (page-size equalisation may raise it); 0: the pool's."""
    group_bytes: int = 0
    """Bytes of one block of this group (its layers' pages summed); 0: ``layers x page_bytes``."""
    state_pages: int = 1
    """``LINEAR`` groups: pages one request holds (2 or 3 in vLLM's align mode; plus one per speculative
    token)."""

    @property
    def bytes_per_block(self) -> int:
        return self.group_bytes or self.layers * self.page_bytes

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int, pool_block: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes in this group (vLLM's
        ``max_memory_usage_bytes // page_size_bytes``, ``kv_cache_interface.py``)."""
        block = self.block_size or pool_block
        if self.kind in (FULL, MLA):
            return cdiv(max_model_len, block)
        if self.kind == SLIDING:
            tokens = min((self.window or 0) - 1 + in_flight_tokens, max_model_len)
            return cdiv(tokens, block) + 1
        if self.kind == CHUNKED:
            tokens = min((self.window or 0) + in_flight_tokens, max_model_len)
            return cdiv(tokens, block)
        if self.kind == LINEAR:
            return self.state_pages
        return 0


@dataclass(frozen=True, slots=True)
class KvLayout:
    """The KV cache of one rank: its groups and the pool's block size in bytes."""

    block_size: int
    groups: tuple[KvGroup, ...]
    bytes_per_block: int
    bytes_per_token: int
    """Bytes one token costs summed over this rank's attention layers (full-attention view)."""
    state_groups: int = 0
    """Groups of linear-attention state (each holds ``state_pages`` per running request)."""

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes from the pool (all groups)."""
        return sum(
            g.blocks_per_request(max_model_len, in_flight_tokens, self.block_size) for g in self.groups
        )

    def state_blocks_per_request(self) -> int:
        """Blocks of linear-attention state one running request holds (0 without state layers)."""
        return sum(g.state_pages for g in self.groups if g.kind == LINEAR)


_LayerKey = tuple[str, int, int, int, int | None]
"""A layer as the pool groups it: (kind, KV heads, head_dim, head_dim_v, window)."""


def _page_per_token(key: _LayerKey, tp: int, model_bytes: int, kv_cache_dtype: str | None) -> float:
    """Bytes one token of one attention layer takes on one rank (``page_size_bytes / block_size``)."""
    kind, kv_heads, head_dim, head_dim_v, _ = key
    if kind == MLA:
        if (kv_cache_dtype or "") == "fp8_ds_mla":
            return vllm.FP8_DS_MLA_BYTES_PER_TOKEN
        return head_dim * vllm.kv_element_bytes(kv_cache_dtype, model_bytes)
    heads = max(1, kv_heads // tp)
    return heads * vllm.kv_head_token_bytes(kv_cache_dtype, model_bytes, head_dim, head_dim_v)


def _hybrid_block_size(
    model: ModelSpec,
    per_token: float,
    block_size: int,
    state_bytes: int,
    checkpoint_alignment: int,
) -> int:
    """vLLM's ``Platform._align_hybrid_block_size``: the attention block that holds one state
    (``checkpoint_alignment``: the prefill checkpoints' token grid in align mode, 0: none)."""
    kernel = max(vllm.ATTENTION_KERNEL_BLOCK, block_size)
    if model.mla is not None:
        kernel = max(kernel, vllm.MLA_HYBRID_BLOCK_ALIGNMENT)
    if checkpoint_alignment:
        kernel = math.lcm(kernel, checkpoint_alignment)
    attn_block = kernel * cdiv(state_bytes, int(kernel * per_token))
    attn_block = vllm.ATTENTION_KERNEL_BLOCK * cdiv(attn_block, vllm.ATTENTION_KERNEL_BLOCK)
    return max(block_size, attn_block)


@functools.lru_cache(maxsize=1024)
def compute_kv_layout(
    model: ModelSpec,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    kv_cache_dtype: str | None = None,
    dtype: str | None = None,
    block_size: int | None = None,
    vllm_version: vllm.Version = vllm.PINNED_VERSION,
    compute_capability: tuple[int, int] | None = (9, 0),
    enable_prefix_caching: bool | None = None,
    num_speculative_tokens: int = 0,
) -> KvLayout:
    """Group this rank's layers the way vLLM does and size one block of the shared pool.

    ``compute_capability`` picks the GPU's kernels (FlashInfer GDN on Hopper and later: a 64-token
    alignment and a checkpoint page); ``enable_prefix_caching`` (None: vLLM's default, on except for
    attention-free models) puts state layers in align mode. ``num_speculative_tokens`` (speculative
    decoding with a drafter kvpilot budgets; 0: none) grows a gated DeltaNet's conv state and the state
    pages each request holds (:func:`kvpilot.tuner.vllm.speculative_conv_positions`,
    :func:`kvpilot.tuner.vllm.state_pages_per_request`).
    """
    if model.compressed is not None:
        return _compressed_layout(model, pipeline_parallel_size, pp_rank, kv_cache_dtype)
    tp = tensor_parallel_size
    model_bytes = DTYPE_BYTES[dtype or model.dtype]
    hybrid_chunked = vllm.hybrid_manager_for_chunked_local(vllm_version)
    # (layer index, spec key) for every KV spec: a NO_KV layer has none (vLLM leaves it out of every
    # group), a Falcon-H1 layer two (its attention and its Mamba2 mixer).
    kinds: list[tuple[int, _LayerKey]] = []
    for index, layer in enumerate(model.layers):
        kind, window = layer.kind, layer.window
        if kind == NO_KV:
            continue
        if kind == CHUNKED and not hybrid_chunked:
            kind, window = FULL, None  # hybrid manager off: local layers allocate for every token
        kinds.append((index, (kind, layer.num_kv_heads, layer.head_dim, layer.head_dim_v, window)))
        if layer.with_state:
            kinds.append((index, (LINEAR, 0, 0, 0, None)))
    present = [k for _, k in kinds]
    if not present:
        raise ValueError(f"{model.architecture}: no layer keeps a KV cache")

    if block_size is None:  # the attention backend's preferred block on this GPU (Blackwell MLA: 32)
        block_size = vllm.default_kv_block_size(
            vllm_version,
            compute_capability,
            mla=model.mla is not None,
            qk_nope_head_dim=model.mla.qk_nope_head_dim if model.mla else 0,
            sparse=any(layer.indexer_head_dim for layer in model.layers),
            kv_cache_dtype=kv_cache_dtype,
            heads_per_gpu=model.num_attention_heads // tp,
        )
    attention = {key for key in present if key[0] != LINEAR}
    per_token = {key: _page_per_token(key, tp, model_bytes, kv_cache_dtype) for key in attention}
    blocks = dict.fromkeys(attention, block_size)
    state_pages = 1
    state = model.linear_state
    has_state = any(k[0] == LINEAR for k in present)
    if enable_prefix_caching is None:
        enable_prefix_caching = vllm.prefix_caching_by_default(attention_free=not attention)
    spec = num_speculative_tokens
    extra_conv = vllm.speculative_conv_positions(state is not None and state.family == GDN, spec)
    if has_state and not attention:  # attention-free (Mamba, Mamba2): one unpadded page per state
        assert state is not None
        align = vllm.uses_mamba_align_mode(vllm_version, enable_prefix_caching)
        checkpoints = _mixer_checkpoints(state, align, vllm_version)
        state_pages = vllm.state_pages_per_request(align, checkpoints, spec)
        model_per_token = 0.0
        state_bytes = state.state_bytes(tp, model_bytes, extra_conv)
    elif has_state:
        assert state is not None and per_token
        align = vllm.uses_mamba_align_mode(vllm_version, enable_prefix_caching)
        checkpoint = 0
        if align and state.family == GDN and vllm.uses_flashinfer_gdn(compute_capability, state.head_k_dim):
            checkpoint = vllm.FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
        bf16 = (dtype or model.dtype) == "bfloat16"
        if (
            align
            and state.family == KDA
            and vllm.uses_flashkda(compute_capability, state.head_k_dim, bf16, state.bounded_gate)
        ):
            checkpoint = vllm.FLASHKDA_CHECKPOINT_ALIGNMENT
        state_bytes = state.state_bytes(tp, model_bytes, extra_conv)
        # vLLM sizes the attention page from the model's (full-attention) geometry.
        full = [k for k in attention if k[0] in (FULL, MLA)] or list(attention)
        model_per_token = per_token[max(full, key=lambda k: per_token[k])]
        block_size = _hybrid_block_size(model, model_per_token, block_size, state_bytes, checkpoint)
        blocks = dict.fromkeys(attention, block_size)
        checkpoints = (1 if checkpoint else 0) + _mixer_checkpoints(state, align, vllm_version)
        state_pages = vllm.state_pages_per_request(align, checkpoints, spec)
    pages = {key: int(blocks[key] * per_token[key]) for key in attention}
    if has_state:
        state_page = max(int(block_size * model_per_token), state_bytes)
        pages.update({k: state_page for k in present if k[0] == LINEAR})

    by_type: dict[_LayerKey, list[int]] = {}
    for idx, key in kinds:
        by_type.setdefault(key, []).append(idx)
    stage = set(model.layer_range(pipeline_parallel_size, pp_rank))
    # Sparse-attention indexer caches (DeepSeek-V3.2, GLM-5): a uint8 page beside each MLA page.
    indexer = {
        i: vllm.indexer_bytes_per_token(layer.indexer_head_dim)
        for i, layer in enumerate(model.layers)
        if layer.indexer_head_dim and i in stage
    }
    bytes_per_token = int(sum(per_token[k] for i, k in kinds if k[0] != LINEAR and i in stage)) + sum(
        indexer.values()
    )

    one_kind = len({(k[0], k[4]) for k in by_type}) == 1
    groups: list[KvGroup] = []
    if one_kind:
        # vLLM's uniform-type path: every layer in one group (its block: their pages summed).
        members = [(i, k) for i, k in kinds if i in stage]
        kind, window = next(iter(by_type))[0], next(iter(by_type))[4]
        # vLLM's UniformTypeKVCacheSpecs: the indexer specs are full attention too, same group.
        group_bytes = sum(pages[k] for _, k in members) + block_size * sum(indexer.values())
        page = max(pages.values())
        groups.append(KvGroup(kind, len(members), page, window, block_size, group_bytes, state_pages))
    else:
        if indexer:
            raise ValueError(f"{model.architecture}: an indexer cache with mixed layers is not modelled")
        # unify_kv_cache_spec_page_size: smaller pages take a larger block (by the integer ratio),
        # or are padded to the largest (state pages, and attention pages that do not divide it).
        largest = max(pages.values())
        for key in by_type:
            if pages[key] == largest:
                continue
            if key[0] != LINEAR and largest % pages[key] == 0:
                blocks[key] = blocks[key] * (largest // pages[key])
            pages[key] = largest
        sizes = [len(v) for v in by_type.values()]
        group_size = min(sizes)
        if max(sizes) < group_size * 1.5:
            group_size = max(sizes)
        for key, idxs in by_type.items():
            n_groups = cdiv(len(idxs), group_size)
            for g in range(n_groups):
                on_rank = sum(1 for i in idxs[g::n_groups] if i in stage)
                block = blocks.get(key, block_size)
                groups.append(KvGroup(key[0], on_rank, pages[key], key[4], block, 0, state_pages))
    bytes_per_block = max(g.bytes_per_block for g in groups)
    state_groups = sum(1 for g in groups if g.kind == LINEAR)
    return KvLayout(block_size, tuple(groups), bytes_per_block, bytes_per_token, state_groups)


def _mixer_checkpoints(state: LinearStateSpec, align: bool, version: vllm.Version) -> int:
    """Prefill-checkpoint pages the state mixer itself declares in align mode (``MambaMixer2``)."""
    return vllm.mamba2_checkpoint_blocks(version) if align and state.family == MAMBA2 else 0


def _compressed_layout(model: ModelSpec, pp: int, pp_rank: int, kv_cache_dtype: str | None) -> KvLayout:
    """DeepSeek-V4: every layer's caches (:mod:`kvpilot.tuner.vllm.compressed_attention`), packed the way
    vLLM's block-outermost layout packs them (:mod:`kvpilot.tuner.memory.packed`). Replicated over TP, the
    same whatever ``--kv-cache-dtype`` (vLLM stores them as ``fp8_ds_mla``)."""
    if (kv_cache_dtype or "auto") not in vllm.COMPRESSED_ATTENTION_KV_CACHE_DTYPES:
        raise ValueError(
            f"{model.architecture}: vLLM's DeepSeek-V4 cache takes --kv-cache-dtype "
            f"{'/'.join(vllm.COMPRESSED_ATTENTION_KV_CACHE_DTYPES)}, not {kv_cache_dtype}"
        )
    caches = [
        (index, cache)
        for index, layer in enumerate(model.layers)
        if layer.kind == COMPRESSED
        for cache in vllm.compressed_layer_caches(
            layer.compress_ratio, layer.head_dim, layer.window or 0, layer.indexer_head_dim
        )
    ]
    stage = model.layer_range(pp, pp_rank)
    groups = tuple(
        KvGroup(
            FULL if g.window is None else SLIDING,
            g.layers,
            g.page_bytes,
            g.window,
            g.block_size,
            g.group_bytes,
        )
        for g in compute_packed_groups(caches, stage)
    )
    per_token = sum(c.page_bytes / c.block_size for i, c in caches if c.window is None and i in stage)
    return KvLayout(
        vllm.COMPRESSED_ATTENTION_BLOCK_SIZE, groups, max(g.group_bytes for g in groups), int(per_token)
    )


@dataclass(frozen=True, slots=True)
class KvCapacity:
    num_blocks: int
    tokens: int
    """What vLLM logs as "GPU KV cache size: N tokens"."""
    max_concurrency: float
    """What vLLM logs as "Maximum concurrency for L tokens per request"."""
    blocks_per_request: int
    fits: bool
    """One ``max_model_len`` request fits (vLLM's start-up check)."""
    needed_bytes: int
    longest_fitting_len: int


def compute_num_blocks(available_bytes: int, layout: KvLayout) -> int:
    if available_bytes <= 0 or layout.bytes_per_block <= 0:
        return 0
    return available_bytes // layout.bytes_per_block


def compute_capacity(
    layout: KvLayout,
    available_bytes: int,
    max_model_len: int,
    in_flight_tokens: int,
    vllm_version: vllm.Version = vllm.PINNED_VERSION,
    num_blocks: int | None = None,
) -> KvCapacity:
    """Blocks, logged token capacity and concurrency, and whether ``max_model_len`` fits."""
    blocks = compute_num_blocks(available_bytes, layout) if num_blocks is None else num_blocks
    per_request = max(1, layout.blocks_per_request(max_model_len, in_flight_tokens))
    concurrency = blocks / per_request
    if vllm.reports_tokens_per_group(vllm_version):
        tokens = blocks // layout.num_groups * layout.block_size
    else:
        tokens = int(concurrency * max_model_len)
    check = available_bytes
    if vllm.reserves_null_block_in_check(vllm_version):
        check -= layout.bytes_per_block
    needed = per_request * layout.bytes_per_block
    fits = available_bytes > 0 and needed <= check
    longest = (
        compute_longest_fitting_len(layout, check, max_model_len, in_flight_tokens)
        if not fits
        else max_model_len
    )
    return KvCapacity(blocks, tokens, concurrency, per_request, fits, needed, longest)


def compute_stage_capacity(
    layouts: Sequence[KvLayout],
    available: Sequence[int],
    max_model_len: int,
    in_flight_tokens: int,
    vllm_version: vllm.Version = vllm.PINNED_VERSION,
) -> tuple[KvCapacity, int]:
    """The capacity of a pipeline of stages, and the stage vLLM reports on.

    vLLM (``get_kv_cache_configs``) allocates the smallest stage's block count on every stage, and checks
    the stages in rank order: the first that cannot hold one ``max_model_len`` request raises, with its
    own estimated maximum length. Stages without KV layers are not checked.
    """
    blocks = min(compute_num_blocks(a, layout) for a, layout in zip(available, layouts, strict=True))
    checked = [i for i, layout in enumerate(layouts) if layout.bytes_per_block > 0] or [0]
    for index in checked:
        capacity = compute_capacity(
            layouts[index], available[index], max_model_len, in_flight_tokens, vllm_version, num_blocks=blocks
        )
        if not capacity.fits:
            return capacity, index
    first = checked[0]
    capacity = compute_capacity(
        layouts[first], available[first], max_model_len, in_flight_tokens, vllm_version, num_blocks=blocks
    )
    return capacity, first


def compute_longest_fitting_len(layout: KvLayout, check_bytes: int, upper: int, in_flight_tokens: int) -> int:
    """vLLM's ``estimate_max_model_len``: the longest length whose blocks fit (0 if none)."""
    if layout.bytes_per_block <= 0 or check_bytes <= 0:
        return 0

    def fits(length: int) -> bool:
        return layout.blocks_per_request(length, in_flight_tokens) * layout.bytes_per_block <= check_bytes

    if not fits(1):
        return 0
    lo, hi = 1, max(1, upper)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
