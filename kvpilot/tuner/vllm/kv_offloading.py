"""vLLM 0.33's KV offloading tier: the pinned host memory ``--kv-offloading-size`` takes.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). ``--kv-offloading-size`` is "the KV cache
offloading buffer in GiB. When TP > 1, this is the total buffer size summed across all TP ranks"
(``vllm/config/cache.py`` lines 383-387). With the default ``--kv-offloading-backend native`` (line 389)
``VllmConfig._post_init_kv_transfer_config`` turns it into an ``OffloadingConnector`` with
``cpu_bytes_to_use = size x 2**30`` (``vllm/config/vllm.py`` lines 1166-1175): host memory the engine
allocates and registers with CUDA (``vllm/v1/kv_offload/cpu/host_register.py`` line 58,
``cudaHostRegister``), so it counts against the pod's memory limit, not the GPU's. With
``lmcache`` the size is not propagated: the LMCache server process holds the tier (lines 1176-1182).

The GPU budget does not change (the tier holds KV blocks the GPU evicted); what a plan must know is that
the pod can hold the tier at all: :func:`compute_offloading_host_bytes`, which the operator holds against
``spec.engine.resources.limits.memory``. vllm#52656 reports a tier that registers but never finishes
starting above a hardware-dependent size (128-512 GB on the reporters' nodes): not a rule kvpilot can
state, so not one it applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import find_flag_values

KV_OFFLOADING_SIZE_FLAG = "--kv-offloading-size"
KV_OFFLOADING_BACKEND_FLAG = "--kv-offloading-backend"
NATIVE_BACKEND = "native"
"""``CacheConfig.kv_offloading_backend``'s default (``cache.py`` line 389)."""
KV_OFFLOADING_BACKENDS = (NATIVE_BACKEND, "lmcache")
"""``KVOffloadingBackend`` in vLLM 0.33 (``cache.py`` line 178)."""
GIB = 1 << 30


def compute_offloading_host_bytes(args: Sequence[str]) -> int | None:
    """The pinned host bytes the native tier takes for one engine (all its tensor-parallel ranks), from
    ``args`` as vLLM reads them (the last occurrence wins); ``None`` when there is no tier or LMCache's
    server holds it. A size that is not a finite non-negative number is
    :class:`~kvpilot.tuner.errors.InvalidEngineArgs` (vLLM's parser refuses a non-number; a negative or NaN
    size it passes on to a connector that cannot allocate it)."""
    sizes = find_flag_values(args, KV_OFFLOADING_SIZE_FLAG)
    backends = find_flag_values(args, KV_OFFLOADING_BACKEND_FLAG)
    if not sizes or (backends and backends[-1] != NATIVE_BACKEND):
        return None
    size = sizes[-1]
    try:
        gib = float(size)
    except ValueError:
        gib = math.nan
    if not math.isfinite(gib) or gib < 0:
        raise errors.InvalidEngineArgs(
            f"{KV_OFFLOADING_SIZE_FLAG} {size!r} is not a size in GiB", flag=KV_OFFLOADING_SIZE_FLAG
        )
    return math.ceil(gib * GIB)
