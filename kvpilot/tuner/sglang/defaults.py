"""SGLang's defaults that depend on the GPU: chunked prefill, decode CUDA-graph batch, static memory.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). SGLang 0.5.23 picks
``--chunked-prefill-size`` and the decode CUDA graph's largest batch (``--cuda-graph-max-bs``) from the
GPU's memory as ``nvidia-smi`` reports it (MiB), then sets ``--mem-fraction-static`` to
``(gpu_mem - reserved) / gpu_mem`` where ``reserved`` stands for what sits outside the static pool:
activations (1.5 MiB per prefill token) and CUDA graphs (2 MiB per decode batch slot). The fraction is
(weights + KV pool) / GPU memory: a start that leaves no KV pool asks to *raise* it, an out-of-memory
at run time to *lower* it. Source: ``handle_gpu_memory_settings`` and ``reserve_for_graph_mb`` in
``arg_groups/memory_hook.py`` (:data:`~kvpilot.tuner.sglang.release.SOURCE_MEMORY_HOOK`), for the
configuration kvpilot plans: one node, no DP attention, no speculative decoding, no disaggregation, the
prefill CUDA graph off (its default), no DeepEP, CUDA (not XPU), not a vision-language model, and
post-capture KV sizing off (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GpuTier:
    """One row of SGLang's GPU-memory table: below ``below_mib``, these defaults."""

    below_mib: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    cuda_graph_max_bs_tp4: int
    """The decode graph's batch at TP >= 4."""
    examples: str


GPU_TIERS: tuple[GpuTier, ...] = (
    GpuTier(20 * 1024, 2048, 8, 8, "T4, RTX 4080"),
    GpuTier(35 * 1024, 4096, 48, 160, "A10, RTX 4090, RTX 5090"),
    GpuTier(60 * 1024, 4096, 32, 160, "A100 40GB, L40"),
    GpuTier(90 * 1024, 8192, 256, 512, "H100, A100 80GB"),
    GpuTier(160 * 1024, 8192, 256, 512, "H20, H200"),
    GpuTier(float("inf"), 16384, 512, 512, "B200, MI300"),
)
"""``handle_gpu_memory_settings``'s capacity table (``memory_hook.py`` lines 88-166). The anchors'
older copy (0.5.x) had 2048 / 24 below 35 GiB; 0.5.23 has 4096 / 48."""

FLOOR_MIB = 512
"""Constant metadata (attention backends) in the reserve (line 309)."""
ACTIVATION_MIB_PER_TOKEN = 1.5
"""Activation slack per prefill token (line 310); at least :data:`MIN_ACTIVATION_TOKENS` tokens."""
MIN_ACTIVATION_TOKENS = 2048
PARALLEL_MIB_PER_8_RANKS = 1024
"""``tp_size * pp_size / 8 * 1024`` MiB (line 312)."""
DECODE_GRAPH_MIB_PER_BS = 2
"""The decode CUDA graph: 2 MiB per batch slot (``reserve_for_graph_mb``, line 363)."""
LARGE_GPU_MIB = 60 * 1024
LARGE_GPU_MIN_RESERVE_MIB = 10 * 1024
"""On GPUs over 60 GiB the reserve is at least 10 GiB (lines 314-315)."""
UNKNOWN_GPU_FRACTION = 0.95
"""``mem_fraction_static`` when the GPU's memory is unknown (line 326)."""


def gpu_tier(gpu_mib: float) -> GpuTier:
    """The row of :data:`GPU_TIERS` for a GPU of ``gpu_mib`` MiB (``nvidia-smi``'s ``memory.total``)."""
    if gpu_mib <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_mib} MiB")
    return next(tier for tier in GPU_TIERS if gpu_mib < tier.below_mib)


def default_chunked_prefill_size(gpu_mib: float) -> int:
    return gpu_tier(gpu_mib).chunked_prefill_size


def default_cuda_graph_max_bs(gpu_mib: float, tp_size: int, max_running_requests: int | None = None) -> int:
    """The decode graph's largest batch; capped by ``--max-running-requests`` when that is set (line 185)."""
    tier = gpu_tier(gpu_mib)
    max_bs = tier.cuda_graph_max_bs_tp4 if tp_size >= 4 else tier.cuda_graph_max_bs
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    return max_bs


@dataclass(frozen=True)
class Reserve:
    """What SGLang keeps outside ``mem_fraction_static``, term by term (MiB)."""

    floor_mib: float
    activation_mib: float
    parallel_mib: float
    graph_mib: float
    large_gpu_floor_mib: float
    """The 10 GiB floor's top-up on GPUs over 60 GiB (0 when the sum already exceeds it)."""

    @property
    def total_mib(self) -> float:
        return (
            self.floor_mib
            + self.activation_mib
            + self.parallel_mib
            + self.graph_mib
            + self.large_gpu_floor_mib
        )


def compute_reserve(
    gpu_mib: float, *, chunked_prefill_size: int, cuda_graph_max_bs: int, tp_size: int = 1, pp_size: int = 1
) -> Reserve:
    """The reserve of ``handle_gpu_memory_settings`` (lines 304-316) for kvpilot's configuration."""
    activation_tokens = max(chunked_prefill_size, MIN_ACTIVATION_TOKENS) if chunked_prefill_size > 0 else None
    if activation_tokens is None:
        raise ValueError("kvpilot plans SGLang with chunked prefill on (--chunked-prefill-size > 0)")
    floor = float(FLOOR_MIB)
    activation = activation_tokens * ACTIVATION_MIB_PER_TOKEN
    parallel = tp_size * pp_size / 8 * PARALLEL_MIB_PER_8_RANKS
    graph = float(cuda_graph_max_bs * DECODE_GRAPH_MIB_PER_BS)
    subtotal = floor + activation + parallel + graph
    top_up = max(0.0, LARGE_GPU_MIN_RESERVE_MIB - subtotal) if gpu_mib > LARGE_GPU_MIB else 0.0
    return Reserve(floor, activation, parallel, graph, top_up)


def default_mem_fraction_static(gpu_mib: float, reserve: Reserve) -> float:
    """``round((gpu_mem - reserved) / gpu_mem, 3)`` (line 325)."""
    return round((gpu_mib - reserve.total_mib) / gpu_mib, 3)


MAX_RUNNING_PER_CONTEXT = 512
"""Running requests per context's worth of pool tokens in SGLang's estimate (``resolve_max_num_reqs``,
``kv_cache_configurator.py`` line 3123: :data:`.release.SOURCE_KV_CACHE_CONFIGURATOR`)."""
MAX_RUNNING_ESTIMATE_BOUNDS = (2048, 4096)
"""The estimate is clamped to these (line 3124)."""


def default_max_running_requests(pool_tokens: int, context_length: int, given: int | None = None) -> int:
    """The running-request limit SGLang 0.5.23 serves with for a pool of ``pool_tokens`` and a context of
    ``context_length`` (one node, no DP attention, no Mamba state cap): ``given`` (``--max-running-requests``)
    capped at ``pool_tokens // 2``, or, unset, ``pool_tokens / context x 512`` clamped to 2048..4096 and
    capped alike (``resolve_max_num_reqs``, ``kv_cache_configurator.py`` lines 3119-3132)."""
    if pool_tokens <= 0 or context_length <= 0:
        raise ValueError(f"pool tokens and context must be positive, got {pool_tokens}, {context_length}")
    cap = pool_tokens // 2
    if given is not None:
        return max(1, min(max(1, given), cap))
    low, high = MAX_RUNNING_ESTIMATE_BOUNDS
    estimated = max(min(int(pool_tokens / context_length * MAX_RUNNING_PER_CONTEXT), high), low)
    return max(1, min(estimated, cap))
