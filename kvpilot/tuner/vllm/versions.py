"""vLLM's releases: which one is pinned, how to read a version, and each release's defaults and
behaviour switches.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there): the memory model, the planner and
the closed loop ask it "what does release X do?". Data and small pure functions only. Source:
the released wheels 0.8.5 ... 0.33.0 as ``docs/memory-model.md`` cites them, and the pinned
wheel's ``vllm/engine/arg_utils.py::get_batch_defaults``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpilot.tuner import errors
from kvpilot.tuner.types import GIB, GpuSpec
from kvpilot.tuner.vllm.block_sizes import DEFAULT_BLOCK_SIZE
from kvpilot.tuner.vllm.runner_defaults import V2_BY_DEFAULT_SINCE, RunnerModel, default_runner_is_v2

PINNED_VLLM_VERSION = "0.33.0"
"""The vLLM release kvpilot renders arguments for and models by default (``pyproject.toml``'s ``vllm``
extra pins the same release; ``tests/test_versions.py`` ties the two and the default image's tag)."""

AUTO_MAX_MODEL_LEN = -1
"""``--max-model-len -1`` / ``auto``: vLLM fits the length to the KV cache at start-up (0.14+)."""

Version = tuple[int, ...]

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> Version:
    """``"0.19.0"`` -> ``(0, 19, 0)``; free text such as ``"~v0.7.1 (V1)"`` takes its first version.

    ``None`` or text without a version means the pinned release.
    """
    if text:
        match = _VERSION_RE.search(str(text))
        if match:
            return tuple(int(g) for g in match.groups() if g is not None)
    return parse_version(PINNED_VLLM_VERSION)


PINNED_VERSION: Version = parse_version(PINNED_VLLM_VERSION)
""":data:`PINNED_VLLM_VERSION` as a tuple, the default of every ``vllm_version`` argument."""

NEWEST_MODELLED: Version = PINNED_VERSION[:2]
"""The newest minor release kvpilot has read the code of (the pinned one)."""


def check_release(text: str | None) -> tuple[Version, str | None]:
    """The release a plan is for, and a warning when it is newer than :data:`NEWEST_MODELLED`.

    ``None`` or empty: the pinned release. Text without a version (``"latest"``, ``"nightly"``) is
    refused by name (:class:`~kvpilot.tuner.errors.InvalidEngineArgs`): kvpilot cannot tell which
    release's facts to plan with. A newer release is planned as the newest modelled one (every
    switch is "since X"), and the warning names both.
    """
    if text is None or not str(text).strip():
        return PINNED_VERSION, None
    if not _VERSION_RE.search(str(text)):
        raise errors.InvalidEngineArgs(
            f"vLLM version {text!r} is not a release number (such as {PINNED_VLLM_VERSION}): kvpilot plans "
            "with a release's own facts, so name the release the pods run",
            flag="vllm_version",
        )
    version = parse_version(text)
    if version[:2] <= NEWEST_MODELLED:
        return version, None
    return version, (
        f"vLLM {text} is newer than the newest release kvpilot models ({PINNED_VLLM_VERSION}): planned with "
        f"{PINNED_VLLM_VERSION}'s facts; check the start-up log's KV-cache size against the plan"
    )


def multiplies_yarn_max_len(version: Version) -> bool:
    """Whether the default ``max_model_len`` of a YaRN-scaled model is multiplied by the rope factor
    (up to 0.29; 0.30+ takes ``max_position_embeddings`` as it is)."""
    return version < (0, 30)


def default_gpu_memory_utilization(version: Version) -> float:
    """``--gpu-memory-utilization`` default: 0.92 from 0.20, 0.90 before."""
    return 0.92 if version >= (0, 20) else 0.90


@dataclass(frozen=True, slots=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


PERFORMANCE_MODES = ("balanced", "throughput", "interactivity")
"""``--performance-mode`` values (``vllm/config/vllm.py``; ``balanced`` is the default)."""

GB10_COMPUTE_CAPABILITY = (12, 1)
"""DGX Spark's GB10: kept on the small batch tier despite its memory (0.33
``engine/arg_utils.py::EngineArgs.get_batch_defaults``, ``is_device_capability((12, 1))``)."""

GB10_EXCLUDED_SINCE: Version = (0, 33)
"""The first release with the GB10 exclusion in ``get_batch_defaults`` (0.19-0.32 lack it)."""

PERFORMANCE_MODE_SINCE: Version = (0, 19)
"""The oldest release whose code kvpilot read with ``--performance-mode throughput`` doubling the batch
defaults (``engine/arg_utils.py``, ``self.performance_mode == "throughput"``: in every wheel 0.19-0.33)."""


def default_batch_limits(
    version: Version, gpu: GpuSpec, performance_mode: str | None = None
) -> BatchDefaults:
    """``vllm serve``'s defaults for ``max_num_batched_tokens`` / ``max_num_seqs`` on this GPU.

    ``get_batch_defaults``: >= 160 GiB device memory (0.28+) 16384 / 1024; >= 70 GiB and not
    an A100 (0.9+; 0.8.x had no A100 exclusion) and not a GB10 (0.33+) 8192 / 1024; otherwise
    2048 / 256. ``--performance-mode throughput`` doubles both
    (``_set_default_max_num_seqs_and_batched_tokens_args``, 0.33). The V0 engine (<= 0.10 with
    ``VLLM_USE_V1=0``) is not modelled here: V1 is the default since 0.8.
    """
    defaults = _tier_defaults(version, gpu)
    if performance_mode == "throughput" and version >= PERFORMANCE_MODE_SINCE:
        return BatchDefaults(2 * defaults.max_num_batched_tokens, 2 * defaults.max_num_seqs)
    return defaults


def _tier_defaults(version: Version, gpu: GpuSpec) -> BatchDefaults:
    device = gpu.nvml_total_bytes or gpu.total_bytes
    is_a100 = "a100" in gpu.name.lower()
    is_gb10 = gpu.compute_capability == GB10_COMPUTE_CAPABILITY and version >= GB10_EXCLUDED_SINCE
    if version >= (0, 28) and device >= 160 * GIB:
        return BatchDefaults(16384, 1024)
    if device >= 70 * GIB and (not is_a100 or version < (0, 9)) and not is_gb10:
        return BatchDefaults(8192, 1024)
    if version < (0, 9):
        return BatchDefaults(2048, 1024)  # 0.8.x: 1024 sequences on every GPU class
    return BatchDefaults(2048, 256)


MM_PREFIX_FLOOR_SINCE: Version = (0, 33)
"""``_get_min_mm_batched_tokens``: a multimodal prefix-LM's default batch holds one whole item."""
GEMMA4_VIDEO_MAX_FRAMES = 32
"""``gemma4_mm.py::_VIDEO_MAX_FRAMES``: frames sampled from one video."""
GEMMA4_VIDEO_FRAME_TOKENS = 70 + 2 + 6
"""``_VIDEO_MAX_SOFT_TOKENS`` per frame, plus its boi/eoi and about 6 timestamp tokens."""


def gemma4_mm_item_tokens(tokens_per_image: int) -> int:
    """``Gemma4ProcessingInfo.get_mm_max_tokens_per_item``'s largest entry without audio: an image's soft
    tokens (``vision_config.default_output_length``) or a 32-frame video's, whichever is more."""
    return max(tokens_per_image, GEMMA4_VIDEO_MAX_FRAMES * GEMMA4_VIDEO_FRAME_TOKENS)


def resolve_batch_limits(
    version: Version,
    gpu: GpuSpec,
    max_model_len: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    performance_mode: str | None = None,
    mm_prefix_item_tokens: int = 0,
) -> BatchDefaults:
    """Apply vLLM's adjustments to the values the user did not set (reference §2.2).

    ``mm_prefix_item_tokens``: a multimodal prefix-LM's (Gemma 4 with bidirectional vision attention)
    largest item; from 0.33 an unset ``max_num_batched_tokens`` is raised to it (chunked MM input is off
    for these models, so one item must fit a batch), before the ``max_num_seqs x max_model_len`` cap."""
    defaults = default_batch_limits(version, gpu, performance_mode)
    tokens = max_num_batched_tokens
    seqs = max_num_seqs
    if tokens is None:
        tokens = defaults.max_num_batched_tokens
        if version >= MM_PREFIX_FLOOR_SINCE and mm_prefix_item_tokens > tokens:
            tokens = mm_prefix_item_tokens
        if version >= (0, 12):
            tokens = min((seqs or defaults.max_num_seqs) * max_model_len, tokens)
    if seqs is None:
        seqs = defaults.max_num_seqs
        if version >= (0, 12):
            seqs = min(seqs, tokens)
    return BatchDefaults(tokens, seqs)


def default_block_size(version: Version) -> int:
    """Tokens per KV block on CUDA (``DEFAULT_BLOCK_SIZE``) before the attention backend asks for its own
    (:func:`kvpilot.tuner.vllm.block_sizes.default_kv_block_size`)."""
    return DEFAULT_BLOCK_SIZE


V2_GRAPH_ESTIMATE_SINCE: Version = (0, 29)
"""The first release whose Model Runner V2 estimates its CUDA graphs before the KV cache is sized:
0.22-0.28's ``v1/worker/gpu/model_runner.py::GPUModelRunner.profile_cudagraph_memory`` returns 0 ("It is
TBD whether we keep this API or not"), so a V2 engine of those releases captures its graphs outside the
budget, as releases before 0.20 do. Established from each wheel (``bench/vllm_release_facts.py``,
``cuda_graphs.v2_estimates``)."""


def subtracts_cuda_graphs(version: Version, model_runner_v2: bool = False) -> bool:
    """Whether the KV budget subtracts the CUDA-graph estimate (env default on from 0.20; under Model
    Runner V2 from :data:`V2_GRAPH_ESTIMATE_SINCE`).

    0.33: ``v1/worker/gpu_worker.py::Worker.determine_available_memory`` subtracts
    ``model_runner.profile_cudagraph_memory()`` when ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
    (default 1); under Model Runner V2 that is ``v1/worker/gpu/cudagraph_utils.py``'s estimate,
    which captures the PIECEWISE graphs and the largest FULL graphs into a throw-away pool and
    extrapolates."""
    if model_runner_v2 and version < V2_GRAPH_ESTIMATE_SINCE:
        return False
    return version >= (0, 20)


TOTAL_CONSUMED_ACCOUNTING_SINCE: Version = (0, 27)
"""``utils/mem_utils.py::memory_profiling``: ``non_kv = total_consumed + transient_peak_headroom``,
where ``total_consumed`` is the drop of ``cudaMemGetInfo``'s free memory since the init snapshot
(weights, persistent buffers such as V2's sampler state, non-torch memory, allocator segments the
``empty_cache()`` cannot release) and the headroom is ``peak_allocated - allocated`` after the
profile run. Before (0.19): ``weights + torch_peak_increase + non_torch_increase``. The release is
the first logged with the "consumed memory (weights + non-torch)" line (``vllm_memory_cases.json``,
0.27.1)."""


def charges_total_consumed(version: Version) -> bool:
    """Whether the profiler charges everything the free memory lost (:data:`TOTAL_CONSUMED_ACCOUNTING_SINCE`).

    kvpilot's terms map onto both formulas the same way (weights + persistent buffers + non-torch
    = consumed, activation = transient headroom); the difference, allocator segments pinned past
    ``empty_cache()``, is bounded by the 20 MiB split limit 0.33 profiles with
    (``gpu_worker.py::_scoped_allocator_max_split``) and is not modelled."""
    return version >= TOTAL_CONSUMED_ACCOUNTING_SINCE


ACTIVATION_LOG_INCLUDES_GRAPH_ESTIMATE_SINCE: Version = (0, 27)
"""From this release the "peak activation" of the start-up summary line ("Actual usage is X GiB for consumed
memory (weights + non-torch), Y GiB for peak activation, and Z GiB for CUDAGraph memory") is the transient
headroom plus the applied CUDA-graph estimate (``v1/worker/gpu_worker.py:528`` in 0.27.1:
``peak_activation_memory = transient_peak_headroom + cudagraph_memory_estimate_applied``); 0.19-0.26 log the
torch peak increase alone (0.26.0 ``gpu_worker.py:526``). The "CUDAGraph memory" of that line is the pool
``capture_model`` measured afterwards, not the estimate the budget subtracted. Read from every wheel by
``bench/vllm_release_facts.py`` (``profiler`` in ``tests/data/vllm_release_facts.json``)."""


def logs_graph_estimate_in_activation(version: Version) -> bool:
    """Whether the release's logged peak activation holds the CUDA-graph estimate
    (:data:`ACTIVATION_LOG_INCLUDES_GRAPH_ESTIMATE_SINCE`): compare it with activation + graphs."""
    return version >= ACTIVATION_LOG_INCLUDES_GRAPH_ESTIMATE_SINCE


COMMUNICATORS_BEFORE_SNAPSHOT_SINCE: Version = (0, 19)
"""Every modelled release (0.19-0.33) takes the init snapshot, the free memory every budget term is measured
from, after ``init_worker_distributed_environment`` (``v1/worker/gpu_worker.py::Worker.init_device``: lines
263 and 282 in 0.19.1, 376 and 395 in 0.27.1, 504 and 541 in 0.33.0): the buffers of vLLM's own
communicators (pynccl, custom all-reduce, symmetric memory) are never charged. What tensor parallelism adds
to non-torch memory is created after it, lazily: NCCL's channels as collectives first run, and the FlashInfer
all-reduce fusion workspace, built while compiling on the capabilities of
:data:`ALLREDUCE_FUSION_CAPABILITIES` only. Custom all-reduce itself refuses more than
:data:`CUSTOM_ALLREDUCE_MAX_PCIE_GPUS` PCIe-only GPUs
(``distributed/device_communicators/custom_all_reduce.py``)."""

ALLREDUCE_FUSION_CAPABILITIES: tuple[int, ...] = (90,)
"""``config/vllm.py::enable_allreduce_rms_fusion`` (0.19-0.33): ``is_device_capability(90)`` exactly, or a
family of :data:`ALLREDUCE_FUSION_CAPABILITY_FAMILIES`; never the RTX (12.x), Ada (8.9) or Ampere (8.0)
parts, nor tensor parallelism beside pipeline or data parallelism."""

ALLREDUCE_FUSION_CAPABILITY_FAMILIES: tuple[int, ...] = (100,)
"""``is_device_capability_family(100)``: the 10.x Blackwell data-centre parts."""

CUSTOM_ALLREDUCE_MAX_PCIE_GPUS = 2
"""Custom all-reduce is disabled "on more than two PCIe-only GPUs" in every modelled release."""


MODEL_RUNNER_V2_SINCE: Version = V2_BY_DEFAULT_SINCE
"""The first release that runs Model Runner V2 (``vllm/v1/worker/gpu/``) for every generate model by
default; 0.22-0.28 choose by model (:mod:`kvpilot.tuner.vllm.runner_defaults`), 0.19-0.21 run V1."""

ASYNC_SCHEDULING_SINCE: Version = (0, 30)
"""Async scheduling on by default (``config/vllm.py``, ``SchedulerConfig.async_scheduling``)."""


V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""The environment variable that chooses the model runner (``envs.py``: ``maybe_convert_bool``)."""


def parse_v2_runner_env(value: str | None) -> bool | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` as vLLM reads it (``bool(int(value))``); ``None`` when unset or
    not an integer (vLLM itself would fail to start on the latter)."""
    if value is None:
        return None
    try:
        return bool(int(value.strip()))
    except ValueError:
        return None


def uses_model_runner_v2(
    version: Version, override: bool | None = None, model: RunnerModel | None = None
) -> bool:
    """Whether the engine runs Model Runner V2: ``override`` is ``VLLM_USE_V2_MODEL_RUNNER``
    (``False`` for ``=0``; ``None`` when unset), else the release's default for ``model``
    (:func:`~kvpilot.tuner.vllm.runner_defaults.default_runner_is_v2`)."""
    if override is not None:
        return override
    return default_runner_is_v2(version, model)


def in_flight_batches(
    version: Version, pipeline_parallel_size: int, model_runner_v2: bool | None = None
) -> int:
    """Concurrent batches a sliding-window (or chunked-local) request may hold blocks for.

    ``config/vllm.py::VllmConfig.max_concurrent_batches`` (0.33): with async scheduling (on by
    default from 0.30) ``PP + 1`` under Model Runner V2, 2 under the V1 runner at PP 1, else PP;
    before 0.30, one batch of ``max_num_batched_tokens``. Times ``max_num_batched_tokens`` it is
    ``max_in_flight_tokens``, the reservation ``kv_cache_interface.py`` adds to a window.
    """
    if version < ASYNC_SCHEDULING_SINCE:
        return 1
    if uses_model_runner_v2(version, model_runner_v2):
        return pipeline_parallel_size + 1
    return 2 if pipeline_parallel_size == 1 else pipeline_parallel_size


TOKENS_AS_CONCURRENCY_SINCE: Version = (0, 20, 1)
"""The first release whose "GPU KV cache size: N tokens" is ``int(max_concurrency x max_model_len)``
(``v1/core/kv_cache_utils.py``); before it, ``num_blocks // num_groups x block_size``. A patch-release
change: 0.20.0 logs per group, 0.20.1 and 0.20.2 by concurrency (``bench/vllm_release_facts.py``,
``kv_tokens_report``)."""


def reports_tokens_per_group(version: Version) -> bool:
    """Whether the release logs ``num_blocks // num_groups * block_size`` tokens (before
    :data:`TOKENS_AS_CONCURRENCY_SINCE`); later, concurrency x length. A bare minor (``(0, 20)``) is its
    ``.0``."""
    return version < TOKENS_AS_CONCURRENCY_SINCE


NULL_BLOCK_IN_CHECK_SINCE: Version = (0, 29)
"""The first release whose ``check_enough_kv_cache_memory`` (``v1/core/kv_cache_utils.py``; 0.33:
``kv_cache_planning.py``) reserves the null block before the fit check (0.19-0.28 do not)."""


def reserves_null_block_in_check(version: Version) -> bool:
    """Whether the release subtracts one block (the null block) before the max-model-len fit check."""
    return version >= NULL_BLOCK_IN_CHECK_SINCE


KV_CACHE_PLANNING_SINCE: Version = (0, 33)
"""The first release whose KV fit check lives in ``v1/core/kv_cache_planning.py`` (0.19-0.32:
``kv_cache_utils.py``)."""


def kv_fit_error_raised_in(version: Version) -> str:
    """``file::function`` that raises the max-model-len ValueError ("To serve at least one request ..."):
    a start-up traceback's last frame before the error (the real 0.32 engine: ``kv_cache_utils.py`` line
    1030)."""
    module = "kv_cache_planning" if version >= KV_CACHE_PLANNING_SINCE else "kv_cache_utils"
    return f"vllm/v1/core/{module}.py::_check_enough_kv_cache_memory"
