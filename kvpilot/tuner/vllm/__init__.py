"""What vLLM does, release by release: the only home of vLLM facts in kvpilot.

Rule 1: every default or behaviour of a vLLM release -- its defaults (:mod:`.versions`), its Model
Runner V2's buffers and graph sizes (:mod:`.runner`), the settings it effectively runs
(:mod:`.effective`), its flags and their spellings (:mod:`.args`),
its KV-cache dtypes (:mod:`.kv_dtypes`), the texts it prints when it fails and their parsers
(:mod:`.messages`) -- lives in this package. Other modules ask it; they never keep a copy.
A copy is a defect waiting to drift: three did (the closed loop's own batch-default table,
the KV-dtype list, a hard-coded block size).

The bottom layer of the tuner (``.importlinter``: ``plan | loop`` -> ``memory`` -> ``model`` ->
``vllm``): it imports nothing of the tuner but its value objects and errors.
"""

from kvpilot.tuner.vllm.args import (
    FLAG_ALIASES,
    FLAGS,
    KV_CACHE_MEMORY_FLAG,
    SIZING_OVERRIDE_FLAGS,
    UNSUPPORTED_FLAGS,
    build_vllm_args,
    check_settings,
    describe_change,
    describe_settings,
    parse_human_int,
    parse_vllm_args,
    validate_extra_args,
)
from kvpilot.tuner.vllm.effective import compute_effective_settings
from kvpilot.tuner.vllm.kv_dtypes import (
    FP8_DS_MLA_BYTES_PER_TOKEN,
    FP8_KV_DTYPES,
    KV_CACHE_DTYPES,
    MODELLED_KV_CACHE_DTYPES,
    check_modelled,
    is_fp8,
    kv_element_bytes,
)
from kvpilot.tuner.vllm.messages import (
    auto_fit_error,
    free_memory_error,
    kv_cache_memory_oom_error,
    long_max_len_error,
    max_len_error,
    no_memory_error,
    sampler_warmup_oom_error,
)
from kvpilot.tuner.vllm.runner import (
    SAMPLER_WARMUP_V2_BYTES_PER_LOGIT,
    compute_sampler_state_bytes,
    cuda_graph_capture_sizes,
)
from kvpilot.tuner.vllm.versions import (
    ASYNC_SCHEDULING_SINCE,
    AUTO_MAX_MODEL_LEN,
    MODEL_RUNNER_V2_SINCE,
    PERFORMANCE_MODES,
    PINNED_VERSION,
    PINNED_VLLM_VERSION,
    TOTAL_CONSUMED_ACCOUNTING_SINCE,
    BatchDefaults,
    Version,
    charges_total_consumed,
    default_batch_limits,
    default_block_size,
    default_gpu_memory_utilization,
    hybrid_manager_for_chunked_local,
    in_flight_batches,
    multiplies_yarn_max_len,
    parse_version,
    reports_tokens_per_group,
    reserves_null_block_in_check,
    resolve_batch_limits,
    subtracts_cuda_graphs,
    uses_model_runner_v2,
)

__all__ = [
    "ASYNC_SCHEDULING_SINCE",
    "AUTO_MAX_MODEL_LEN",
    "BatchDefaults",
    "FLAGS",
    "FLAG_ALIASES",
    "FP8_DS_MLA_BYTES_PER_TOKEN",
    "FP8_KV_DTYPES",
    "KV_CACHE_DTYPES",
    "KV_CACHE_MEMORY_FLAG",
    "MODELLED_KV_CACHE_DTYPES",
    "MODEL_RUNNER_V2_SINCE",
    "PERFORMANCE_MODES",
    "PINNED_VERSION",
    "PINNED_VLLM_VERSION",
    "SAMPLER_WARMUP_V2_BYTES_PER_LOGIT",
    "SIZING_OVERRIDE_FLAGS",
    "TOTAL_CONSUMED_ACCOUNTING_SINCE",
    "UNSUPPORTED_FLAGS",
    "Version",
    "auto_fit_error",
    "build_vllm_args",
    "charges_total_consumed",
    "check_modelled",
    "check_settings",
    "compute_effective_settings",
    "compute_sampler_state_bytes",
    "cuda_graph_capture_sizes",
    "default_batch_limits",
    "default_block_size",
    "default_gpu_memory_utilization",
    "describe_change",
    "describe_settings",
    "free_memory_error",
    "hybrid_manager_for_chunked_local",
    "in_flight_batches",
    "is_fp8",
    "kv_cache_memory_oom_error",
    "kv_element_bytes",
    "long_max_len_error",
    "max_len_error",
    "multiplies_yarn_max_len",
    "no_memory_error",
    "parse_human_int",
    "parse_version",
    "parse_vllm_args",
    "reports_tokens_per_group",
    "reserves_null_block_in_check",
    "resolve_batch_limits",
    "sampler_warmup_oom_error",
    "subtracts_cuda_graphs",
    "uses_model_runner_v2",
    "validate_extra_args",
]
