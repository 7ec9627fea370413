"""DeepSeek-V4's decoder layers, read from its ``config.json`` (``compress_ratios``).

Sits beside :mod:`kvpilot.tuner.model.readers` and below :mod:`kvpilot.tuner.model.spec`, which calls it for
a config with ``compress_ratios``. The caches each layer keeps are vLLM facts
(:mod:`kvpilot.tuner.vllm.compressed_attention`); this module only reads the geometry and checks it:
``compress_ratios`` holds one entry per decoder layer (a trailing entry per MTP layer is allowed, as
published), each 0 (sliding window only), 4 (compressed sparse attention, with the lightning indexer) or
128 (heavily compressed attention). Every value goes through :mod:`kvpilot.tuner.model.fields`.
"""

from __future__ import annotations

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model.fields import (
    MAX_CONTEXT,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    Fields,
    refuse,
)
from kvpilot.tuner.model.layers import COMPRESSED, CompressedAttentionSpec, LayerSpec
from kvpilot.tuner.model.quantization import QuantSpec, compute_bytes_per_weight

_MXFP4 = QuantSpec("mxfp4", 4, 32, experts_only=True)
_NVFP4 = QuantSpec("nvfp4", 4, 16)


def _expert_bytes(text: Fields) -> float:
    """Bytes per routed-expert weight when DeepSeek-V4's checkpoint stores the experts apart.

    vLLM's ``DeepseekV4FP8Config``: ``expert_dtype`` "fp4" (the default) loads MXFP4 experts, "fp8" the
    FP8 blocks of the rest; a ModelOpt config whose ``moe_quant_algo`` is NVFP4 loads NVFP4 experts.
    """
    quant = text.child("quantization_config")
    if quant is not None and quant.string("moe_quant_algo") == "NVFP4":
        return compute_bytes_per_weight(_NVFP4)
    dtype = text.string("expert_dtype") or "fp4"
    if dtype == "fp4":
        return compute_bytes_per_weight(_MXFP4)
    if dtype == "fp8":
        return 0.0
    raise refuse(text.path("expert_dtype"), '"fp4" or "fp8" (vLLM\'s DeepSeek-V4 expert dtypes)', dtype)


def read_compressed_layers(text: Fields, num_layers: int) -> tuple[list[LayerSpec], CompressedAttentionSpec]:
    """DeepSeek-V4's layers (each with its compress ratio) and its attention geometry."""
    ratios = text.ints("compress_ratios", limit=MAX_CONTEXT) or []
    if len(ratios) < num_layers:
        raise refuse(text.path("compress_ratios"), f"one entry per decoder layer ({num_layers})", len(ratios))
    ratios = ratios[:num_layers]  # the trailing entries are the MTP layers', not built without drafting
    if not vllm.check_compressed_ratios(ratios):
        raise errors.InvalidModelConfig(
            f"config.json: compress_ratios holds {sorted(set(ratios))}; vLLM 0.33's DeepSeek-V4 builds "
            "ratios 0, 1, 4 and 128 only",
            field=text.path("compress_ratios"),
        )
    head_dim = text.need_int("head_dim", limit=MAX_HEAD_DIM)
    window = text.need_int("sliding_window", limit=MAX_CONTEXT)
    index_head_dim = text.need_int("index_head_dim", limit=MAX_HEAD_DIM)
    spec = CompressedAttentionSpec(
        head_dim=head_dim,
        q_lora_rank=text.need_int("q_lora_rank", limit=MAX_HIDDEN_SIZE),
        o_lora_rank=text.need_int("o_lora_rank", limit=MAX_HIDDEN_SIZE),
        o_groups=text.need_int("o_groups", limit=MAX_HEADS),
        index_n_heads=text.need_int("index_n_heads", limit=MAX_HEADS),
        index_head_dim=index_head_dim,
        hc_mult=text.optional_int("hc_mult", limit=MAX_SMALL) or 1,
        expert_bytes_per_weight=_expert_bytes(text),
    )
    layers = [
        LayerSpec(COMPRESSED, 1, head_dim, 0, window, index_head_dim, max(1, ratio)) for ratio in ratios
    ]
    if len(layers) > MAX_LAYERS.maximum:
        raise refuse(text.path("compress_ratios"), f"at most {MAX_LAYERS.maximum} layers", len(layers))
    return layers, spec


__all__ = ["read_compressed_layers"]
