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
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.model import CHUNKED, DTYPE_BYTES, FULL, LINEAR, MLA, SLIDING, ModelSpec

HYBRID_MAMBA_BLOCK_ALIGN = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class KvGroup:
    """One KV-cache group on one rank."""

    kind: str
    layers: int
    """Real layers of this group on this rank (padding excluded)."""
    page_bytes: int
    """Bytes of one page of one layer."""
    window: int | None = None


@dataclass(frozen=True, slots=True)
class KvLayout:
    """The KV cache of one rank: its groups and the pool's block size in bytes."""

    block_size: int
    groups: tuple[KvGroup, ...]
    bytes_per_block: int
    bytes_per_token: int
    """Bytes one token costs summed over this rank's attention layers (full-attention view)."""

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes from the pool (all groups)."""
        total = 0
        for group in self.groups:
            if group.kind in (FULL, MLA):
                total += cdiv(max_model_len, self.block_size)
            elif group.kind == SLIDING:
                tokens = min((group.window or 0) - 1 + in_flight_tokens, max_model_len)
                total += cdiv(tokens, self.block_size) + 1
            elif group.kind == CHUNKED:
                tokens = min((group.window or 0) + in_flight_tokens, max_model_len)
                total += cdiv(tokens, self.block_size)
            elif group.kind == LINEAR:
                total += 1
        return total


_LayerKey = tuple[str, int, int, int, int | None]
"""A layer as the pool groups it: (kind, KV heads, head_dim, head_dim_v, window)."""


def _page_bytes(key: _LayerKey, tp: int, block_size: int, elem: float, kv_cache_dtype: str | None) -> int:
    """Bytes of one page (``block_size`` tokens) of one attention layer on one rank."""
    kind, kv_heads, head_dim, head_dim_v, _ = key
    if kind == MLA:
        if (kv_cache_dtype or "") == "fp8_ds_mla":
            return block_size * vllm.FP8_DS_MLA_BYTES_PER_TOKEN
        return int(block_size * head_dim * elem)
    heads = max(1, kv_heads // tp)
    return int(block_size * heads * (head_dim + head_dim_v) * elem)


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
) -> KvLayout:
    """Group this rank's layers the way vLLM does and size one block of the shared pool."""
    tp = tensor_parallel_size
    model_dtype = dtype or model.dtype
    elem = vllm.kv_element_bytes(kv_cache_dtype, DTYPE_BYTES[model_dtype])
    hybrid_chunked = vllm.hybrid_manager_for_chunked_local(vllm_version)
    kinds: list[_LayerKey] = []
    for layer in model.layers:
        kind, window = layer.kind, layer.window
        if kind == CHUNKED and not hybrid_chunked:
            kind, window = FULL, None  # hybrid manager off: local layers allocate for every token
        kinds.append((kind, layer.num_kv_heads, layer.head_dim, layer.head_dim_v, window))

    if block_size is None:
        block_size = vllm.default_block_size(vllm_version)
    attention = {key for key in kinds if key[0] != LINEAR}
    pages = {key: _page_bytes(key, tp, block_size, elem, kv_cache_dtype) for key in attention}
    if any(k[0] == LINEAR for k in kinds):
        # Hybrid attention + state models: vLLM raises the attention block size until one
        # attention page holds a whole state, then pads the state page to the attention page.
        state = model.linear_state
        assert state is not None and pages
        state_bytes = state.state_elements(tp) * DTYPE_BYTES[model_dtype]
        per_token = max(pages.values()) // block_size
        block_size = max(
            block_size, HYBRID_MAMBA_BLOCK_ALIGN * cdiv(state_bytes, HYBRID_MAMBA_BLOCK_ALIGN * per_token)
        )
        pages = {key: _page_bytes(key, tp, block_size, elem, kv_cache_dtype) for key in attention}
        state_page = max(max(pages.values()), state_bytes)
        pages.update(dict.fromkeys(set(kinds) - attention, state_page))

    by_type: dict[_LayerKey, list[int]] = {}
    for idx, key in enumerate(kinds):
        by_type.setdefault(key, []).append(idx)
    stage = set(model.layer_range(pipeline_parallel_size, pp_rank))
    bytes_per_token = (
        sum(pages[k] for i, k in enumerate(kinds) if k[0] != LINEAR and i in stage) // block_size
    )

    # A model with one kind of layer gets a single group of all of them (group_size = their count).
    sizes = [len(v) for v in by_type.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups: list[KvGroup] = []
    for key, idxs in by_type.items():
        n_groups = cdiv(len(idxs), group_size)
        for g in range(n_groups):
            members = [i for i in idxs[g::n_groups] if i in stage]
            groups.append(KvGroup(key[0], len(members), pages[key], key[4]))
    bytes_per_block = max(g.layers * g.page_bytes for g in groups)
    return KvLayout(block_size, tuple(groups), bytes_per_block, bytes_per_token)


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
