"""``--kv-cache-dtype``: every value vLLM accepts, and which of them kvpilot can size.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). This is the one list of
KV-cache dtypes: the CRD's enum and the pydantic API accept :data:`MODELLED_KV_CACHE_DTYPES`
(``tests/operator/test_api_drift.py`` ties them), the flag parser accepts
:data:`KV_CACHE_DTYPES` (vLLM 0.33's ``CacheDType`` literal, contract-tested against the
wheel), and the memory model sizes a page with :func:`kv_element_bytes`. A dtype vLLM has
but kvpilot cannot size is refused with :class:`~kvpilot.tuner.errors.InvalidEngineArgs`
naming it (:func:`check_modelled`), never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvpilot.tuner import errors

KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
"""``--kv-cache-dtype`` values vLLM 0.33.0 accepts (its ``CacheDType`` literal, in order)."""

_ELEMENT_BYTES: Mapping[str, float] = {
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "int8_per_token_head": 1,
    "fp8_per_token_head": 1,
    "int4_per_token_head": 0.5,
    "nvfp4": 0.5 + 1 / 16,
    "nvfp4_4over6": 0.5 + 1 / 16,
}
"""Bytes per cached K or V element of every modelled dtype but ``auto`` (nvfp4: its block scales
included; the per-token-head dtypes' scales are per head, :data:`PER_TOKEN_HEAD_SCALE_BYTES`)."""

PER_TOKEN_HEAD_SCALE_BYTES = 2 * 4
"""``int8/fp8/int4_per_token_head``: the Triton backend packs two fp32 scales (K and V) after each
head's data, per token (``v1/attention/backends/triton_attn.py::TritonAttentionBackend.customize_spec``)."""

MODELLED_KV_CACHE_DTYPES: tuple[str, ...] = tuple(
    d for d in KV_CACHE_DTYPES if d == "auto" or d in _ELEMENT_BYTES
)
"""The dtypes kvpilot can size, in vLLM's order: what the InferenceService API accepts."""

FP8_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"})
"""The plain fp8 caches (one byte per element, per-tensor scales): what ``allowFp8KvCache`` lets
the planner and the closed loop choose."""

FP8_DS_MLA_BYTES_PER_TOKEN = 656
"""``fp8_ds_mla``: DeepSeek's packed MLA cache, 656 bytes per token per layer (512 fp8 latent, 4
fp32 scales, 64 bf16 rope dims)."""


def is_fp8(kv_cache_dtype: str | None) -> bool:
    """Whether the dtype stores one byte per element (the fp8 family): it holds about twice the tokens
    of a 16-bit cache, and the API asks for ``allowFp8KvCache`` before the planner or loop use it."""
    return kv_cache_dtype is not None and kv_cache_dtype.startswith("fp8")


def check_modelled(kv_cache_dtype: str | None) -> None:
    """Raise :class:`~kvpilot.tuner.errors.InvalidEngineArgs` for a dtype kvpilot cannot size."""
    name = kv_cache_dtype or "auto"
    if name in MODELLED_KV_CACHE_DTYPES:
        return
    if name in KV_CACHE_DTYPES:
        raise errors.InvalidEngineArgs(
            f"--kv-cache-dtype {name}: vLLM 0.33 has this KV-cache dtype, but kvpilot's memory model "
            f"cannot size it yet, so it cannot plan or retune it; use one of "
            f"{', '.join(MODELLED_KV_CACHE_DTYPES)}",
            flag="--kv-cache-dtype",
        )
    raise errors.InvalidEngineArgs(
        f"--kv-cache-dtype {name!r} is not a vLLM 0.33 KV-cache dtype; valid values are: "
        f"{', '.join(KV_CACHE_DTYPES)}",
        flag="--kv-cache-dtype",
    )


def kv_element_bytes(kv_cache_dtype: str | None, model_dtype_bytes: float) -> float:
    """Bytes per cached K or V element for ``--kv-cache-dtype`` (``auto``: the model's dtype)."""
    name = kv_cache_dtype or "auto"
    if name == "auto":
        return model_dtype_bytes
    check_modelled(name)
    return _ELEMENT_BYTES[name]


def is_per_token_head(kv_cache_dtype: str | None) -> bool:
    return (kv_cache_dtype or "").endswith("_per_token_head")


def kv_head_token_bytes(
    kv_cache_dtype: str | None, model_dtype_bytes: float, head_dim: int, head_dim_v: int
) -> float:
    """Bytes one token of one KV head takes in a page: K and V data, plus per-head scales.

    vLLM: ``block x heads x (head + head_v) x dtype`` (``AttentionSpec.page_size_bytes``); the
    per-token-head dtypes instead ``(head/2 + head_v/2 for int4, else head + head_v) x 1 + 8``.
    """
    if is_per_token_head(kv_cache_dtype):
        k, v = (
            (head_dim // 2, head_dim_v // 2)
            if kv_cache_dtype == "int4_per_token_head"
            else (head_dim, head_dim_v)
        )
        return k + v + PER_TOKEN_HEAD_SCALE_BYTES
    return (head_dim + head_dim_v) * kv_element_bytes(kv_cache_dtype, model_dtype_bytes)


MODELOPT_KV_CACHE_ALGOS: Mapping[str, str] = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
"""ModelOpt's ``kv_cache_quant_algo`` names and the cache dtype vLLM 0.33 runs for each
(``vllm/utils/torch_utils.py::MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP``)."""


@dataclass(frozen=True, slots=True)
class KvCacheDeclaration:
    """What a checkpoint's ``quantization_config`` says of its KV cache (read by
    :mod:`kvpilot.tuner.model.quantization`): its ``quant_method``, and the ``kv_cache_scheme`` or
    ``kv_cache_quant_algo`` it names (a string, or a scheme's ``num_bits``/``type``/``dynamic``)."""

    quant_method: str
    algo: str | None = None
    num_bits: int | None = None
    type: str | None = None
    dynamic: bool | None = None


def declared_kv_cache_dtype(declared: KvCacheDeclaration | None) -> str | None:
    """The cache dtype vLLM 0.33 runs for ``--kv-cache-dtype auto`` on a checkpoint declaring
    ``declared``; ``None`` when it declares nothing (``auto`` stays the model's dtype).

    ModelOpt (``quant_method`` ``modelopt*``): ``vllm/utils/torch_utils.py::get_kv_cache_quant_algo_string``
    (via ``resolve_kv_cache_dtype_string``, ``EngineArgs.create_engine_config``): a static 8-bit float
    scheme is ``fp8`` and a 4-bit float one ``nvfp4``, named through :data:`MODELOPT_KV_CACHE_ALGOS`
    (``fp8`` runs ``fp8_e4m3``); anything else ``auto``. compressed-tensors: any ``kv_cache_scheme``
    makes ``auto`` ``fp8`` in the attention layer (``model_executor/layers/attention/attention.py``: the
    layer's ``kv_cache_dtype``, which its ``get_kv_cache_spec`` sizes). A ModelOpt sidecar
    (``hf_quant_config.json``, no ``quant_method``) is not resolved there: ``auto`` stays the model's
    dtype."""
    if declared is None:
        return None
    method = declared.quant_method
    if method.startswith("modelopt"):
        algo = declared.algo
        if algo is None and declared.num_bits == 8 and declared.type == "float" and declared.dynamic is False:
            algo = "fp8"
        elif algo is None and declared.num_bits == 4 and declared.type == "float":
            algo = "nvfp4"
        return MODELOPT_KV_CACHE_ALGOS.get((algo or "").lower(), "auto")
    if method == "compressed-tensors":
        return "fp8"
    return None


def resolve_kv_cache_dtype(kv_cache_dtype: str | None, declared: KvCacheDeclaration | None) -> str:
    """``--kv-cache-dtype`` as vLLM 0.33 runs it: an explicit dtype wins; ``auto`` (or unset) is the
    checkpoint's declared KV cache (:func:`declared_kv_cache_dtype`), else ``auto`` (the model's dtype)."""
    name = kv_cache_dtype or "auto"
    if name != "auto":
        return name
    return declared_kv_cache_dtype(declared) or "auto"
