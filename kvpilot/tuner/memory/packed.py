"""Packed KV-cache groups: how vLLM 0.33 groups layers of mixed page sizes in a block-outermost layout.

Sits below :mod:`kvpilot.tuner.memory.kv_cache`, which calls it for DeepSeek-V4 (whose caches make vLLM pick
the ``BLHNC`` layout: :mod:`kvpilot.tuner.vllm.compressed_attention`). Mirrors
``v1/core/kv_cache_planning.py::_get_packed_kv_cache_groups`` and ``_get_kv_cache_bytes_per_block``:

1. **Buckets.** Caches of one type (same block size; full attention, or sliding window of one window) share a
   bucket (``UniformTypeKVCacheSpecs``), in the order they come.
2. **Repeats.** A bucket is *balanced* when each of its page sizes has as many layers. The balanced buckets
   with more than one page size must stay whole, so their layer count is the floor of the repeats per
   group; the repeat count is ``_approximate_gcd`` of the balanced buckets' counts (the fewest padded
   layers, ties to the larger). A balanced bucket splits into ``cdiv(count, repeats)`` groups, taking every
   n-th repeat of its pattern; the others stay whole.
3. **Bytes per block** are the largest group's pages summed (the groups are not page-equalised: in a
   block-outermost layout each block is one contiguous stretch the groups share).

Without a balanced mixed-page bucket there is no repeat count: every bucket stays whole but a sliding-window
("state") bucket, which splits until a group fits the widest bucket's block. A single bucket is one group
(vLLM's uniform-type path). A group keeps its place when a pipeline stage holds none of its layers (vLLM
projects the global groups onto each worker): it adds no bytes but still takes its blocks per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.arith import cdiv


@dataclass(frozen=True, slots=True)
class PackedGroup:
    """One packed group on one rank."""

    block_size: int
    window: int | None
    """The sliding window of its caches; None: full attention."""
    layers: int
    """This rank's caches in the group."""
    group_bytes: int
    """This rank's pages of the group, summed (one block)."""
    page_bytes: int
    """The group's largest page."""


@dataclass(slots=True)
class _Bucket:
    block_size: int
    window: int | None
    members: list[tuple[int, int]]
    """(layer index, page bytes) per cache."""

    def by_page(self) -> dict[int, list[int]]:
        pages: dict[int, list[int]] = {}
        for position, (_, page) in enumerate(self.members):
            pages.setdefault(page, []).append(position)
        return pages

    @property
    def balanced(self) -> bool:
        return len({len(v) for v in self.by_page().values()}) == 1

    @property
    def max_per_page(self) -> int:
        return max(len(v) for v in self.by_page().values())


def compute_packed_groups(
    caches: Sequence[tuple[int, vllm.CompressedCache]], stage: range
) -> list[PackedGroup]:
    """vLLM's packed groups of ``caches`` ((layer index, cache) over the whole model), projected onto
    ``stage``."""
    buckets: dict[tuple[int, int | None], _Bucket] = {}
    for layer, cache in caches:
        key = (cache.block_size, cache.window)
        bucket = buckets.setdefault(key, _Bucket(cache.block_size, cache.window, []))
        bucket.members.append((layer, cache.page_bytes))
    pool = list(buckets.values())
    if len(pool) == 1:  # one cache type: vLLM's UniformTypeKVCacheSpecs path, a single group
        return [_group(pool[0], list(range(len(pool[0].members))), stage)]
    if len({cache.page_bytes for _, cache in caches}) == 1:
        raise ValueError("caches of several types but one page size take vLLM's unpacked path: not modelled")
    floor = max((b.max_per_page for b in pool if b.balanced and len(b.by_page()) > 1), default=0)
    repeats = vllm.approximate_gcd([b.max_per_page for b in pool if b.balanced], floor) if floor else None

    def splits(bucket: _Bucket) -> int:
        return cdiv(bucket.max_per_page, repeats) if bucket.balanced and repeats else 1

    def is_state(bucket: _Bucket) -> bool:  # without a repeat pattern a sliding bucket may split freely
        return repeats is None and bucket.window is not None

    def widest(bucket: _Bucket, n: int) -> int:
        return sum(cdiv(len(v), n) * bucket.members[v[0]][1] for v in bucket.by_page().values())

    anchor = max(widest(b, len(b.members) if is_state(b) else splits(b)) for b in pool)
    groups: list[PackedGroup] = []
    for bucket in pool:
        n = splits(bucket)
        if is_state(bucket):  # cap a state group at the states one block already holds
            n = max(n, cdiv(len(bucket.members), max(anchor // bucket.members[0][1], 1)))
        if n == 1:
            parts = [list(range(len(bucket.members)))]
        else:
            pattern = list(zip(*bucket.by_page().values(), strict=False))
            parts = [[position for repeat in pattern[i::n] for position in repeat] for i in range(n)]
        groups.extend(_group(bucket, part, stage) for part in parts)
    return groups


def _group(bucket: _Bucket, part: list[int], stage: range) -> PackedGroup:
    on_rank = [bucket.members[p] for p in part if bucket.members[p][0] in stage]
    page = max(bucket.members[p][1] for p in part)
    return PackedGroup(bucket.block_size, bucket.window, len(on_rank), sum(pg for _, pg in on_rank), page)


__all__ = ["PackedGroup", "compute_packed_groups"]
