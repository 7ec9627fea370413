"""What vLLM does, release by release: the only home of vLLM facts in kvpilot.

Rule 1: every default or behaviour of a vLLM release -- its defaults (:mod:`.versions`), the
settings it effectively runs (:mod:`.effective`), its flags and their spellings (:mod:`.args`),
its KV-cache dtypes (:mod:`.kv_dtypes`), the texts it prints when it fails and their parsers
(:mod:`.messages`) -- lives in this package. Other modules ask it; they never keep a copy.
A copy is a defect waiting to drift: three did (the closed loop's own batch-default table,
the KV-dtype list, a hard-coded block size).

The bottom layer of the tuner (``.importlinter``: ``plan | loop`` -> ``memory`` -> ``model`` ->
``vllm``): it imports nothing of the tuner but its value objects and errors.
"""

from kvpilot.tuner.vllm.architectures import PREVIOUSLY_SUPPORTED_ARCHITECTURES, check_architecture_served
from kvpilot.tuner.vllm.args import (
    FLAG_ALIASES,
    FLAGS,
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
from kvpilot.tuner.vllm.hybrid import (
    ATTENTION_KERNEL_BLOCK,
    FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
    MLA_HYBRID_BLOCK_ALIGNMENT,
    hybrid_manager_for_chunked_local,
    state_pages_per_request,
    uses_flashinfer_gdn,
    uses_mamba_align_mode,
)
from kvpilot.tuner.vllm.kv_dtypes import (
    FP8_DS_MLA_BYTES_PER_TOKEN,
    FP8_KV_DTYPES,
    KV_CACHE_DTYPES,
    MODELLED_KV_CACHE_DTYPES,
    check_modelled,
    is_fp8,
    is_per_token_head,
    kv_element_bytes,
    kv_head_token_bytes,
)
from kvpilot.tuner.vllm.messages import (
    auto_fit_error,
    free_memory_error,
    long_max_len_error,
    mamba_cache_blocks_error,
    max_len_error,
    no_memory_error,
    sampler_warmup_oom_error,
)
from kvpilot.tuner.vllm.versions import (
    AUTO_MAX_MODEL_LEN,
    PINNED_VERSION,
    PINNED_VLLM_VERSION,
    BatchDefaults,
    Version,
    default_batch_limits,
    default_block_size,
    default_gpu_memory_utilization,
    in_flight_batches,
    multiplies_yarn_max_len,
    parse_version,
    reports_tokens_per_group,
    reserves_null_block_in_check,
    resolve_batch_limits,
    subtracts_cuda_graphs,
)

__all__ = [
    "ATTENTION_KERNEL_BLOCK",
    "AUTO_MAX_MODEL_LEN",
    "BatchDefaults",
    "FLAGS",
    "FLAG_ALIASES",
    "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT",
    "FP8_DS_MLA_BYTES_PER_TOKEN",
    "FP8_KV_DTYPES",
    "KV_CACHE_DTYPES",
    "MLA_HYBRID_BLOCK_ALIGNMENT",
    "MODELLED_KV_CACHE_DTYPES",
    "PINNED_VERSION",
    "PINNED_VLLM_VERSION",
    "PREVIOUSLY_SUPPORTED_ARCHITECTURES",
    "SIZING_OVERRIDE_FLAGS",
    "UNSUPPORTED_FLAGS",
    "Version",
    "auto_fit_error",
    "build_vllm_args",
    "check_architecture_served",
    "check_modelled",
    "check_settings",
    "compute_effective_settings",
    "default_batch_limits",
    "default_block_size",
    "default_gpu_memory_utilization",
    "describe_change",
    "describe_settings",
    "free_memory_error",
    "hybrid_manager_for_chunked_local",
    "in_flight_batches",
    "is_fp8",
    "is_per_token_head",
    "kv_element_bytes",
    "kv_head_token_bytes",
    "long_max_len_error",
    "mamba_cache_blocks_error",
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
    "state_pages_per_request",
    "subtracts_cuda_graphs",
    "uses_flashinfer_gdn",
    "uses_mamba_align_mode",
    "validate_extra_args",
]
