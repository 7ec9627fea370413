"""Quantized checkpoints: what a ``quantization_config`` says, and what a weight then costs.

Sits at the bottom of the memory model beside :mod:`kvpilot.tuner.types`;
:mod:`kvpilot.tuner.model.spec` parses a config's ``quantization_config`` with
:func:`build_quant_spec`, :mod:`kvpilot.tuner.memory.weights` sizes the quantized linears
with :func:`compute_bytes_per_weight`. Methods follow vLLM 0.33's names
(``vllm/model_executor/layers/quantization/``): FP8, compressed-tensors (W8A8,
W4A16), AWQ, GPTQ (and their Marlin variants), MXFP4 (MoE experts only, as
``modules_to_not_convert`` says), NVFP4, bitsandbytes, and NVIDIA ModelOpt's FP8, NVFP4, MXFP8 and mixed
precision (:mod:`kvpilot.tuner.model.modelopt`). A method it does not know
raises :class:`~kvpilot.tuner.errors.InvalidModelConfig`: never a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model import modelopt
from kvpilot.tuner.model.fields import Fields, Limit
from kvpilot.tuner.model.modelopt import ModelOptSpec

MAX_BITS = Limit(32, "quantized checkpoints store 4 or 8 bits")
MAX_GROUP_SIZE = Limit(1 << 20, "published checkpoints group 16 to 128 weights")


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """A parsed ``quantization_config``."""

    method: str
    """vLLM's name: ``fp8``, ``compressed-tensors``, ``awq``, ``gptq``, ``mxfp4``, ``bitsandbytes``..."""
    weight_bits: int
    group_size: int | None = None
    experts_only: bool = False
    """MXFP4: only the MoE experts are quantized (``modules_to_not_convert``)."""
    quantize_lm_head: bool = False
    modelopt: ModelOptSpec | None = None
    """A ModelOpt checkpoint's algorithm, unquantized modules and per-layer precision
    (:mod:`kvpilot.tuner.model.modelopt`)."""
    kv_cache: vllm.KvCacheDeclaration | None = None
    """The KV cache the checkpoint declares (``kv_cache_scheme`` / ``kv_cache_quant_algo``): what
    ``--kv-cache-dtype auto`` runs (:func:`kvpilot.tuner.vllm.resolve_kv_cache_dtype`)."""
    nvfp4: bool = False
    """compressed-tensors weights in NVFP4 (vLLM's ``CompressedTensorsConfig._is_nvfp4_format``: float, 4
    bits, groups of 16): e2m1 pairs in uint8 and one fp8 scale per 16
    (``schemes/compressed_tensors_w4a4_nvfp4.py:52-77``, 0.33)."""
    nvfp4_activations: bool = False
    """compressed-tensors input activations in NVFP4 too (W4A4; ``None`` activations are NVFP4A16): the MoE
    experts then choose a kernel by ``--moe-backend`` (:mod:`kvpilot.tuner.vllm.moe_backends`)."""


def build_quant_spec(qc: Mapping[str, Any], where: str = "quantization_config") -> QuantSpec:
    """Parse a ``quantization_config`` (at ``where`` in the config): the bits weights are stored with,
    and the KV cache it declares."""
    spec = _build_quant_spec(qc, where)
    declared = _kv_cache_declaration(Fields(qc, where))
    return spec if declared is None else dataclasses.replace(spec, kv_cache=declared)


def _kv_cache_declaration(q: Fields) -> vllm.KvCacheDeclaration | None:
    """``kv_cache_scheme`` or ``kv_cache_quant_algo``, at the top or in ModelOpt's ``quantization``
    (vLLM 0.33 looks in both: ``get_kv_cache_quant_algo_string``); a sidecar without ``quant_method``
    declares nothing to vLLM's resolution."""
    method = (q.string("quant_method") or "").lower()
    inner = q.child("quantization") or q
    for name in ("kv_cache_scheme", "kv_cache_quant_algo"):
        for where in (inner, q):
            if not where.present(name):
                continue
            if isinstance(where.raw(name), str):
                return vllm.KvCacheDeclaration(method, algo=where.string(name))
            scheme = where.child(name)
            assert scheme is not None
            dynamic = scheme.raw("dynamic") if scheme.present("dynamic") else None
            return vllm.KvCacheDeclaration(
                method,
                num_bits=scheme.optional_int("num_bits", limit=MAX_BITS),
                type=scheme.string("type"),
                dynamic=dynamic if isinstance(dynamic, bool) else None,
            )
    return None


def _build_quant_spec(qc: Mapping[str, Any], where: str) -> QuantSpec:
    q = Fields(qc, where)
    if modelopt.is_legacy_sidecar(q):  # hf_quant_config.json: vLLM names the method from the algorithm
        modelopt.compute_legacy_method(q)
        return _modelopt(modelopt.build_modelopt_spec(q))
    method = (q.string("quant_method", "quantization") or "").lower()
    if not method:
        raise errors.InvalidModelConfig(
            "quantization_config has no 'quant_method'", field=q.path("quant_method")
        )
    inner = q.child("quantization") or q
    if method.startswith("modelopt") and inner.present("quant_algo"):
        return _modelopt(modelopt.build_modelopt_spec(q))
    if method in ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8", "fp8_per_tensor", "fp8_per_block"):
        return QuantSpec("fp8", 8)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return QuantSpec("mxfp4", 4, 32, experts_only=True)
    if method in ("awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq", "moe_wna16"):
        bits = q.optional_int("bits", "w_bit", "weight_bits", limit=MAX_BITS) or 4
        group = _group_size(q, "group_size", "q_group_size")
        return QuantSpec(method.replace("_marlin", "").replace("auto_", ""), bits, group or 128)
    if method == "bitsandbytes":
        bits = 8 if q.flag("load_in_8bit") else 4
        return QuantSpec("bitsandbytes", bits, 64)
    if method == "compressed-tensors" and q.string("format") == "mxfp4-pack-quantized":
        # Kimi-K3: vLLM 0.33's config hook rewrites it to ``mxfp4``
        # (``KimiK3ForConditionalGenerationConfig``);
        # its ignore list keeps attention, shared experts and the dense MLPs in bf16.
        return QuantSpec("mxfp4", 4, 32, experts_only=True)
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method in ("modelopt_fp4", "nvfp4", "nvfp4_per_token"):
        return QuantSpec("nvfp4", 4, 16)
    if method in ("experts_int8",):
        return QuantSpec("experts_int8", 8, None, experts_only=True)
    raise errors.InvalidModelConfig(
        f"quantization_config.quant_method {method[:40]!r} is not modelled",
        field=q.path("quant_method"),
    )


def _modelopt(spec: ModelOptSpec) -> QuantSpec:
    """vLLM's method for a ModelOpt algorithm: ``modelopt`` (FP8), ``modelopt_fp4``, ``modelopt_mxfp8`` or
    ``modelopt_mixed``; the bytes are the :class:`ModelOptSpec`'s."""
    ours = {"modelopt": "fp8", "modelopt_fp4": "nvfp4", "modelopt_mxfp8": "mxfp8"}
    method = ours.get(spec.method, spec.method)
    bits = 4 if spec.bytes_per_weight < 1 else 8
    return QuantSpec(method, bits, 16 if bits == 4 else None, modelopt=spec)


def _group_size(q: Fields, *names: str) -> int | None:
    """A group size; ``-1`` (one group per channel) and null are None (sized as the default 128)."""
    name = next((n for n in names if q.present(n)), None)
    if name is None or q.raw(name) == -1:
        return None
    return q.check_int(name, q.raw(name), limit=MAX_GROUP_SIZE)


def _is_nvfp4_format(args: Fields | None) -> bool:
    """vLLM's ``_is_nvfp4_format`` on one quantization-args block (``compressed_tensors.py:369-386``, 0.20.0):
    float, 4 bits, groups of 16 (the strategy, ``tensor_group``, and symmetry are taken as published)."""
    if args is None:
        return False
    return (
        args.string("type") == "float"
        and args.optional_int("num_bits", limit=MAX_BITS) == 4
        and args.optional_int("group_size", limit=MAX_GROUP_SIZE) == 16
    )


def _compressed_tensors(q: Fields) -> QuantSpec:
    bits, group = 8, None
    nvfp4 = nvfp4_activations = False
    groups = q.child("config_groups")
    for name in groups.data if groups is not None else ():
        scheme = groups.child(name) if groups is not None else None
        weights = scheme.child("weights") if scheme is not None else None
        if weights is None:
            continue
        found = weights.optional_int("num_bits", limit=MAX_BITS)
        if found:
            bits, group = found, _group_size(weights, "group_size")
            nvfp4 = _is_nvfp4_format(weights)
            nvfp4_activations = (
                nvfp4 and scheme is not None and _is_nvfp4_format(scheme.child("input_activations"))
            )
            break
    explicit = q.optional_int("bits", limit=MAX_BITS)
    if explicit is not None:
        bits = explicit
    ignore = q.strings("ignore") or []
    has_groups = groups is not None and bool(groups.data)
    lm_head = "lm_head" not in ignore and has_groups
    return QuantSpec(
        "compressed-tensors",
        bits,
        group,
        quantize_lm_head=lm_head,
        nvfp4=nvfp4,
        nvfp4_activations=nvfp4_activations,
    )


def compute_bytes_per_weight(quant: QuantSpec) -> float:
    """Bytes per weight element of a quantized linear, scales and zero points included."""
    if quant.modelopt is not None:
        return quant.modelopt.bytes_per_weight
    if quant.method == "mxfp4":
        return 0.5 + 1 / 32  # e2m1 + one e8m0 scale per 32
    if quant.method == "nvfp4" or quant.nvfp4:
        return 0.5 + 1 / 16
    if quant.method == "bitsandbytes":
        return 1.0 if quant.weight_bits == 8 else 0.5 + 1 / 64
    if quant.weight_bits >= 8:
        return 1.0
    group = quant.group_size or 128
    per = quant.weight_bits / 8
    if quant.method in ("awq", "gptq"):
        return per + (2 + quant.weight_bits / 8) / group  # fp16 scale + packed zero per group
    return per + 2 / group
