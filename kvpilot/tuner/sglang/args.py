"""SGLang's flags that kvpilot renders, and the settings value they render from.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). Spellings are those of SGLang
0.5.23's ``ServerArgs`` fields (``arg_groups/fields/``, one flag per field, ``_`` -> ``-``);
``tests/contract/test_contract_sglang.py`` parses every rendering below with ``ServerArgs.add_cli_args``
and compares the values it reads back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from kvpilot.tuner import errors, flags

FLAGS: Mapping[str, str] = {
    "context_length": "--context-length",
    "mem_fraction_static": "--mem-fraction-static",
    "max_running_requests": "--max-running-requests",
    "max_total_tokens": "--max-total-tokens",
    "chunked_prefill_size": "--chunked-prefill-size",
    "max_prefill_tokens": "--max-prefill-tokens",
    "schedule_conservativeness": "--schedule-conservativeness",
    "kv_cache_dtype": "--kv-cache-dtype",
    "page_size": "--page-size",
    "tp_size": "--tp-size",
    "pp_size": "--pp-size",
}
"""``ServerArgs`` field -> its flag, for every field :class:`SglangSettings` renders."""

MODEL_FLAG = "--model-path"
MODEL_ALIASES = ("--model",)
"""``model_path``'s other spelling (``fields/model.py`` line 55)."""
REVISION_FLAG = "--revision"
"""The checkpoint's branch, tag or commit (``fields/model.py`` line 122)."""
HOST_FLAG = "--host"
PORT_FLAG = "--port"
ENABLE_METRICS_FLAG = "--enable-metrics"
"""Off by default (``fields/observability.py`` line 70): without it SGLang exposes no metrics."""

KV_CACHE_DTYPE_BYTES: Mapping[str, float | None] = {
    "auto": None,
    "bf16": 2,
    "bfloat16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""The ``--kv-cache-dtype`` choices kvpilot sizes (``None``: the model's dtype). SGLang 0.5.23 also
accepts ``mxfp8``, ``nvfp4`` and ``fp4_mx_block16`` (``fields/model.py`` line 197), whose scale buffers
kvpilot does not model: refused."""

FP8_KV_CACHE_DTYPE = "fp8_e4m3"
"""The fp8 ``--kv-cache-dtype`` kvpilot chooses (where ``allowFp8KvCache`` allows it and the GPU supports it).
SGLang 0.5.23 stores it as ``torch.float8_e4m3fn`` on CUDA and as the platform's native e4m3 (``fnuz``) on
ROCm (``mem_cache/kv_cache_dtype.py`` ``configure_kv_cache_dtype``), which is also what ``auto`` becomes for
a checkpoint whose quantization config declares an FP8 KV cache; e4m3 is the variant SGLang's fp8 attention
paths expect (``trtllm_mla`` and DeepSeek's DSA accept only ``fp8_e4m3``; MiniMax-M3 warns that ``fp8_e5m2``
mis-dispatches). No scales are needed to start: without the checkpoint's ``k_scale``/``v_scale`` or
``--quantization-param-path`` SGLang scales by 1.0 (``fields/model.py``'s help of
``quantization_param_path``), as vLLM's ``fp8`` does without calibrated scales."""


def is_fp8_kv_cache_dtype(kv_cache_dtype: str | None) -> bool:
    """Whether ``kv_cache_dtype`` is one of SGLang's fp8 KV caches (``fp8_e4m3``, ``fp8_e5m2``)."""
    return (kv_cache_dtype or "").startswith("fp8_")


@dataclass(frozen=True)
class SglangSettings:
    """The SGLang server arguments kvpilot chooses (``None``: SGLang's own default)."""

    context_length: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    schedule_conservativeness: float | None = None
    kv_cache_dtype: str | None = None
    page_size: int | None = None
    tp_size: int | None = None
    pp_size: int | None = None


def check_kv_cache_dtype(kv_cache_dtype: str | None) -> str:
    """The dtype (``auto`` when unset); one kvpilot cannot size is an error naming those it can."""
    name = kv_cache_dtype or "auto"
    if name not in KV_CACHE_DTYPE_BYTES:
        raise errors.InvalidEngineArgs(
            f"SGLang --kv-cache-dtype {name!r} is not modelled; kvpilot sizes {sorted(KV_CACHE_DTYPE_BYTES)}"
        )
    return name


def check_settings(settings: SglangSettings) -> None:
    """Refuse values SGLang would refuse or kvpilot cannot size, with the flag's name."""
    check_kv_cache_dtype(settings.kv_cache_dtype)
    fraction = settings.mem_fraction_static
    if fraction is not None and not 0 < fraction <= 1:
        raise errors.InvalidEngineArgs(f"--mem-fraction-static must be in (0, 1], got {fraction}")
    for name in (
        "context_length",
        "max_running_requests",
        "max_total_tokens",
        "page_size",
        "tp_size",
        "pp_size",
    ):
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise errors.InvalidEngineArgs(f"{FLAGS[name]} must be at least 1, got {value}")


def build_sglang_args(settings: SglangSettings) -> list[str]:
    """The flags for ``settings``, in :data:`FLAGS`' order; unset fields are left to SGLang."""
    check_settings(settings)
    args: list[str] = []
    for field in fields(settings):
        value = getattr(settings, field.name)
        if value is not None:
            args += [FLAGS[field.name], str(value)]
    return args


ALIASES: Mapping[str, str] = {
    "--tensor-parallel-size": "--tp-size",
    "--pipeline-parallel-size": "--pp-size",
}
"""Other spellings SGLang's parser takes for a flag of :data:`FLAGS` (``fields/parallel.py`` lines 49 and 63:
``tp_size``'s and ``pp_size``'s ``aliases``)."""

_FLOATS = frozenset({"mem_fraction_static", "schedule_conservativeness"})
_STRINGS = frozenset({"kv_cache_dtype"})


def parse_sglang_args(args: Sequence[str]) -> SglangSettings:
    """The :class:`SglangSettings` a container's arguments carry (``--flag value`` or ``--flag=value``; flags
    outside :data:`FLAGS` are ignored; an alias of :data:`ALIASES` reads as its flag): the inverse of
    :func:`build_sglang_args` (:func:`kvpilot.tuner.flags.parse_flag_values`). A value that does not parse
    is an error naming the flag."""
    canonical = flags.canonical_args(args, ALIASES)
    values = flags.parse_flag_values(canonical, FLAGS, floats=_FLOATS, strings=_STRINGS)
    return SglangSettings(**values)  # type: ignore[arg-type]
