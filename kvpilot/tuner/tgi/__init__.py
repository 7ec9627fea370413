"""What TGI (text-generation-inference) does, at its last release: the only home of TGI facts in kvpilot.

TGI went into maintenance in December 2025 and its repository was archived read-only in March 2026; its
last release is 3.3.7 (tag ``v3.3.7``, commit ``dfb3fbe7``). kvpilot keeps a profile to read the legacy
deployments that still run it. Its launcher's flags and defaults (:mod:`.args`, from
``launcher/src/main.rs``), the texts it prints when it fails and their parser (:mod:`.messages`), how it
serves and the metric series it exposes (:mod:`.serving`), how its warm-up sizes the KV cache and the
launcher's defaults before it (:mod:`.warmup`), which models and quantizations it serves with its own code
(:mod:`.models`) live here, read from that tag with file and
line. Other modules ask it; they never keep a copy. The bottom layer of the tuner beside
:mod:`kvpilot.tuner.vllm` and :mod:`kvpilot.tuner.sglang` (``.importlinter``).
"""

from kvpilot.tuner.tgi.args import (
    CUDA_MEMORY_FRACTION_DEFAULT,
    ENV_FLAGS,
    FLAGS,
    HOSTNAME_FLAG,
    KV_CACHE_DTYPE_FLAG,
    MAX_CONCURRENT_REQUESTS_DEFAULT,
    MODEL_FLAG,
    MODEL_ID_DEFAULT,
    PINNED_TGI_VERSION,
    PORT_FLAG,
    REVISION_FLAG,
    TgiSettings,
    build_env_args,
    build_tgi_args,
    check_settings,
    env_name,
    parse_tgi_args,
)
from kvpilot.tuner.tgi.messages import (
    CUDA_OOM,
    OVERLOADED,
    TgiFailure,
    batch_oom_error_line,
    classify_log,
    max_total_tokens_error,
    prefill_tokens_error,
)

__all__ = [
    "batch_oom_error_line",
    "CUDA_OOM",
    "OVERLOADED",
    "CUDA_MEMORY_FRACTION_DEFAULT",
    "ENV_FLAGS",
    "FLAGS",
    "HOSTNAME_FLAG",
    "KV_CACHE_DTYPE_FLAG",
    "MAX_CONCURRENT_REQUESTS_DEFAULT",
    "MODEL_FLAG",
    "MODEL_ID_DEFAULT",
    "PINNED_TGI_VERSION",
    "PORT_FLAG",
    "REVISION_FLAG",
    "TgiFailure",
    "TgiSettings",
    "build_env_args",
    "build_tgi_args",
    "check_settings",
    "env_name",
    "parse_tgi_args",
    "classify_log",
    "max_total_tokens_error",
    "prefill_tokens_error",
]
