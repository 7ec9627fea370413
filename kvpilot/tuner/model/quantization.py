"""Quantized checkpoints: what a ``quantization_config`` says, and what a weight then costs.

Sits at the bottom of the memory model beside :mod:`kvpilot.tuner.types`;
:mod:`kvpilot.tuner.model.spec` parses a config's ``quantization_config`` with
:func:`build_quant_spec`, :mod:`kvpilot.tuner.memory.weights` sizes the quantized linears
with :func:`compute_bytes_per_weight`. Methods follow vLLM 0.33's names
(``vllm/model_executor/layers/quantization/``): FP8, compressed-tensors (W8A8,
W4A16), AWQ, GPTQ (and their Marlin variants), MXFP4 (MoE experts only, as
``modules_to_not_convert`` says), NVFP4, bitsandbytes. A method it does not know
raises :class:`~kvpilot.tuner.errors.InvalidModelConfig`: never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors


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


def build_quant_spec(qc: Mapping[str, Any]) -> QuantSpec:
    """Parse a ``quantization_config`` into the bits the weights are stored with."""
    method = str(qc.get("quant_method") or qc.get("quantization") or "").lower()
    if not method:
        raise errors.InvalidModelConfig("quantization_config has no 'quant_method'", field="quant_method")
    if method in ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8", "fp8_per_tensor", "fp8_per_block"):
        return QuantSpec("fp8", 8)
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return QuantSpec("mxfp4", 4, 32, experts_only=True)
    if method in ("awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq", "moe_wna16"):
        bits = int(qc.get("bits") or qc.get("w_bit") or qc.get("weight_bits") or 4)
        group = qc.get("group_size") or qc.get("q_group_size") or 128
        return QuantSpec(method.replace("_marlin", "").replace("auto_", ""), bits, int(group))
    if method == "bitsandbytes":
        bits = 8 if qc.get("load_in_8bit") else 4
        return QuantSpec("bitsandbytes", bits, 64)
    if method == "compressed-tensors":
        bits, group = 8, None
        groups = qc.get("config_groups") or {}
        for scheme in groups.values() if isinstance(groups, Mapping) else ():
            weights = (scheme or {}).get("weights") or {}
            if weights.get("num_bits"):
                bits = int(weights["num_bits"])
                group = weights.get("group_size")
                break
        if "bits" in qc:
            bits = int(qc["bits"])
        ignore = [str(x) for x in qc.get("ignore") or []]
        return QuantSpec(
            "compressed-tensors", bits, group, quantize_lm_head="lm_head" not in ignore and bool(groups)
        )
    if method in ("modelopt_fp4", "nvfp4", "nvfp4_per_token"):
        return QuantSpec("nvfp4", 4, 16)
    if method in ("experts_int8",):
        return QuantSpec("experts_int8", 8, None, experts_only=True)
    raise errors.InvalidModelConfig(
        f"quantization_config.quant_method {method!r} is not modelled",
        field="quantization_config.quant_method",
    )


def compute_bytes_per_weight(quant: QuantSpec) -> float:
    """Bytes per weight element of a quantized linear, scales and zero points included."""
    if quant.method == "mxfp4":
        return 0.5 + 1 / 32  # e2m1 + one e8m0 scale per 32
    if quant.method == "nvfp4":
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
