"""What SGLang does, at its pinned release: the only home of SGLang facts in kvpilot.

Every default or behaviour of an SGLang release -- which release (:mod:`.release`), the defaults it picks
by GPU memory and the reserve outside ``--mem-fraction-static`` (:mod:`.defaults`), its flags and their
spellings (:mod:`.args`), the texts it prints when it fails and their parsers (:mod:`.messages`), how its
pod serves and the metric series it exposes (:mod:`.serving`), how its scheduler admits requests
(:mod:`.scheduler`) -- lives in this package, read from that
release's own code with file and line. Other modules ask it; they never keep a copy.

SGLang's memory model is its own, not vLLM's: ``--mem-fraction-static`` is (weights + KV pool) / GPU
memory, with activations and CUDA graphs outside it (:mod:`kvpilot.tuner.engines.sglang_budget` sizes
it). The bottom layer of the tuner beside :mod:`kvpilot.tuner.vllm` (``.importlinter``): it imports
nothing of the tuner but its errors.
"""

from kvpilot.tuner.sglang.args import (
    ALIASES,
    ENABLE_METRICS_FLAG,
    FLAGS,
    FP8_KV_CACHE_DTYPE,
    HOST_FLAG,
    KV_CACHE_DTYPE_BYTES,
    MODEL_ALIASES,
    MODEL_FLAG,
    PORT_FLAG,
    REVISION_FLAG,
    SglangSettings,
    build_sglang_args,
    check_kv_cache_dtype,
    check_settings,
    is_fp8_kv_cache_dtype,
    parse_sglang_args,
)
from kvpilot.tuner.sglang.defaults import (
    GPU_TIERS,
    MIN_ACTIVATION_TOKENS,
    GpuTier,
    Reserve,
    compute_reserve,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_max_running_requests,
    default_mem_fraction_static,
    gpu_tier,
)
from kvpilot.tuner.sglang.messages import (
    LOWER,
    RAISE,
    SglangFailure,
    classify_log,
    decode_batch_line,
    kv_pool_full_warning,
    no_kv_pool_error,
    running_before_oom,
    weights_exceed_static_error,
)
from kvpilot.tuner.sglang.release import PINNED_SGLANG_VERSION
from kvpilot.tuner.sglang.scheduler import ADMISSION_TOKEN_USAGE

__all__ = [
    "ADMISSION_TOKEN_USAGE",
    "ALIASES",
    "MODEL_ALIASES",
    "ENABLE_METRICS_FLAG",
    "FLAGS",
    "FP8_KV_CACHE_DTYPE",
    "GPU_TIERS",
    "HOST_FLAG",
    "KV_CACHE_DTYPE_BYTES",
    "LOWER",
    "MIN_ACTIVATION_TOKENS",
    "MODEL_FLAG",
    "PINNED_SGLANG_VERSION",
    "PORT_FLAG",
    "RAISE",
    "REVISION_FLAG",
    "GpuTier",
    "Reserve",
    "SglangFailure",
    "SglangSettings",
    "build_sglang_args",
    "check_kv_cache_dtype",
    "check_settings",
    "classify_log",
    "compute_reserve",
    "decode_batch_line",
    "default_chunked_prefill_size",
    "default_cuda_graph_max_bs",
    "default_max_running_requests",
    "default_mem_fraction_static",
    "gpu_tier",
    "is_fp8_kv_cache_dtype",
    "kv_pool_full_warning",
    "no_kv_pool_error",
    "parse_sglang_args",
    "running_before_oom",
    "weights_exceed_static_error",
]
