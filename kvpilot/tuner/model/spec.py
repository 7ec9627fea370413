"""What the memory model needs to know about a model, read from its ``config.json``.

Sits just above :mod:`kvpilot.tuner.model.layers` (the layer kinds it builds, re-exported
here) and :mod:`kvpilot.tuner.model.quantization`; the weight, KV-cache and memory
modules and the planner take a :class:`ModelSpec`, never a raw config.
Pure: a mapping in, a frozen dataclass out (the caller reads the file).

It reads the fields vLLM 0.33 reads (``vllm/config/model.py``,
``vllm/transformers_utils/model_arch_config_convertor.py``, the model files under
``vllm/model_executor/models/``): the text decoder's geometry, the kind of every
decoder layer (full attention, sliding window, chunked-local, MLA, linear-attention
state), the MoE layout, the quantization config and the default ``max_model_len``.
The ``quantization_config`` is parsed by :mod:`kvpilot.tuner.model.quantization`.
Multimodal configs nest the decoder in ``text_config``; the vision tower is only
counted for its weights. A config it cannot account for raises
:class:`~kvpilot.tuner.errors.InvalidModelConfig` naming the field: it never guesses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model.layers import (  # re-exported: callers name them model_spec.FULL etc.
    CHUNKED,
    DTYPE_BYTES,
    FULL,
    LINEAR,
    MLA,
    SLIDING,
    LayerSpec,
    LinearStateSpec,
    MlaSpec,
    MoeSpec,
)
from kvpilot.tuner.model.quantization import QuantSpec, build_quant_spec

__all__ = [
    "CHUNKED",
    "DTYPE_BYTES",
    "FULL",
    "LINEAR",
    "MLA",
    "SLIDING",
    "LayerSpec",
    "LinearStateSpec",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "build_model_spec",
]


_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
"""vLLM's ``derive_max_model_len_and_key`` keys, in its order."""

_ROPE_NOT_SCALED_033 = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)

_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"})
"""Model types whose transformers config class defaults ``tie_word_embeddings`` to True."""

_NON_GATED_MLP = frozenset(
    {"phi", "gpt2", "gpt_bigcode", "starcoder2", "opt", "falcon", "gpt_neox", "bloom", "mpt", "gptj"}
)
"""Model types whose MLP is up/down only (two matrices, no gate)."""

_TEXT_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    # transformers' Gemma3TextConfig defaults (Gemma 3 configs often omit them).
    "gemma3_text": {
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "head_dim": 256,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
    },
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The text decoder of one model, as vLLM 0.33 sizes it."""

    architecture: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    """Total KV heads of the full-attention layers (GQA-aware; MLA = 1 latent)."""
    head_dim: int
    hidden_size: int
    intermediate_size: int
    """Dense MLP intermediate size (for MoE models: of the dense layers, if any)."""
    vocab_size: int
    max_model_len: int
    """vLLM 0.33's default ``max_model_len`` (rope-scaling rules applied)."""
    dtype: str
    tie_word_embeddings: bool
    layers: tuple[LayerSpec, ...]
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    linear_state: LinearStateSpec | None = None
    quantization: QuantSpec | None = None
    mlp_gated: bool = True
    attention_bias: bool = False
    rotary_dim: int = 0
    rope_cache_positions: int = 0
    """Rows of the rotary cos/sin cache vLLM allocates (weights memory)."""
    vision_params: int = 0
    """Parameters of the vision tower and projector (0 for text-only models)."""
    max_len_key: str | None = None
    max_len_base: int = 0
    """The config's own maximum before rope scaling."""
    rope_type: str | None = None
    rope_factor: float | None = None
    rope_original_max: int | None = None

    @property
    def is_multimodal(self) -> bool:
        return self.vision_params > 0

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The kind of every text-decoder layer, in order."""
        return tuple(layer.kind for layer in self.layers)

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        return self.moe.num_experts if self.moe else 0

    @property
    def experts_per_token(self) -> int:
        return self.moe.experts_per_token if self.moe else 0

    @property
    def moe_intermediate_size(self) -> int | None:
        return self.moe.moe_intermediate_size if self.moe else None

    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM's ``get_num_kv_heads``: ``max(1, total // tp)``; MLA's latent is replicated."""
        if self.mla is not None:
            return 1
        return max(1, self.num_kv_heads // tp)

    def num_layers_per_rank(self, pp: int, rank: int = 0) -> int:
        """Text-decoder layers on pipeline stage ``rank``."""
        return len(self.layer_range(pp, rank))

    def layer_range(self, pp: int, rank: int) -> range:
        """vLLM's ``get_pp_indices``: an even split, the remainder to the stages before the last."""
        sizes = [self.num_layers // pp] * pp
        for i in range(2, self.num_layers % pp + 2):
            sizes[-i] += 1
        start = sum(sizes[:rank])
        return range(start, start + sizes[rank])

    def default_max_model_len(self, vllm_version: vllm.Version = vllm.PINNED_VERSION) -> int:
        """The default ``max_model_len`` of a given vLLM release (YaRN multiplied up to 0.29)."""
        if not vllm.multiplies_yarn_max_len(vllm_version) or self.rope_type != "yarn" or not self.rope_factor:
            return self.max_model_len
        if self.rope_original_max:
            return int(self.rope_original_max * self.rope_factor)
        return int(self.max_len_base * self.rope_factor)


def _need(cfg: Mapping[str, Any], *names: str, where: str = "") -> Any:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return value
    field = names[0]
    raise errors.InvalidModelConfig(
        f"config.json{where} has no {field!r}: the memory model cannot size this model without it"
        + (f" (also looked for {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""),
        field=field,
    )


def _text_config(hf_config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The decoder's config: ``text_config`` (or ``language_config``) merged over defaults."""
    for key in ("text_config", "language_config", "llm_config"):
        nested = hf_config.get(key)
        if isinstance(nested, Mapping):
            text = dict(nested)
            for inherited in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
                if inherited not in text and inherited in hf_config:
                    text[inherited] = hf_config[inherited]
            if "model_type" not in text and hf_config.get("model_type") == "gemma3":
                text["model_type"] = "gemma3_text"
            break
    else:
        text, key = dict(hf_config), ""
    defaults = _TEXT_DEFAULTS.get(str(text.get("model_type", "")), {})
    for name, value in defaults.items():
        text.setdefault(name, value)
    return text, (f".{key}" if key else "")


def _dtype(text: Mapping[str, Any], hf_config: Mapping[str, Any]) -> str:
    raw = (
        text.get("torch_dtype") or text.get("dtype") or hf_config.get("torch_dtype") or hf_config.get("dtype")
    )
    if raw is None:
        return "bfloat16"  # vLLM: a config without a dtype is float32, served as bf16 ("auto")
    name = str(raw).replace("torch.", "")
    if name == "float32":
        return "bfloat16"  # vLLM's "auto" downcasts float32 checkpoints to 16 bits
    if name not in DTYPE_BYTES:
        raise errors.InvalidModelConfig(
            f"config.json has an unsupported torch_dtype {raw!r}", field="torch_dtype"
        )
    return name


def _rope(text: Mapping[str, Any]) -> tuple[str | None, float | None, int | None]:
    rope = text.get("rope_scaling") or {}
    if not rope:
        params = text.get("rope_parameters")
        if isinstance(params, Mapping) and "rope_type" in params:
            rope = params
    if not isinstance(rope, Mapping):
        return None, None, None
    rope_type = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    original = rope.get("original_max_position_embeddings") or text.get("original_max_position_embeddings")
    return (str(rope_type) if rope_type else None), (float(factor) if factor else None), original


def _max_model_len(
    text: Mapping[str, Any],
    model_type: str,
    rope_type: str | None,
    factor: float | None,
    original: int | None,
) -> tuple[int, str | None, int]:
    """(vLLM 0.33's default ``max_model_len``, the key it came from, the length before rope scaling)."""
    derived: float = math.inf
    key = None
    for name in _MAX_LEN_KEYS:
        value = text.get(name)
        if value is not None and value < derived:
            derived, key = value, name
    if text.get("model_max_length"):
        derived, key = text["model_max_length"], "model_max_length"
    if derived == math.inf:
        derived, key = 2048, None  # vLLM's documented fallback (it logs a warning)
    base = int(derived)
    if rope_type and factor and "gemma3" not in model_type and rope_type not in _ROPE_NOT_SCALED_033:
        derived = derived * factor
    if rope_type == "longrope" and original:
        derived = original
    return int(derived), key, base


def _layer_types(text: Mapping[str, Any], model_type: str, num_layers: int) -> list[str]:
    """Per-layer attention kind names, as the model file decides them."""
    declared = text.get("layer_types")
    if isinstance(declared, list) and declared:
        if len(declared) < num_layers:
            raise errors.InvalidModelConfig(
                f"config.json's layer_types lists {len(declared)} layers, "
                f"num_hidden_layers says {num_layers}",
                field="layer_types",
            )
        return [str(t) for t in declared[:num_layers]]
    window = text.get("sliding_window")
    if model_type == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if model_type in ("gemma3_text", "gemma3") or (window and text.get("sliding_window_pattern")):
        pattern = int(text.get("sliding_window_pattern") or 6)
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)
        ]
    if model_type == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if model_type == "llama4_text" and text.get("attention_chunk_size"):
        no_rope = text.get("no_rope_layers") or [
            int((i + 1) % int(text.get("no_rope_layer_interval", 4)) != 0) for i in range(num_layers)
        ]
        return ["chunked_attention" if no_rope[i] else "full_attention" for i in range(num_layers)]
    if model_type == "qwen3_next":
        interval = int(_need(text, "full_attention_interval"))
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
        ]
    if model_type.startswith(("qwen2", "qwen3")) or "use_sliding_window" in text:
        # transformers sets sliding_window to None unless use_sliding_window is true (Qwen families).
        if text.get("use_sliding_window") and window:
            raise errors.InvalidModelConfig(
                "config.json sets use_sliding_window with max_window_layers; this layout is not modelled",
                field="use_sliding_window",
            )
        return ["full_attention"] * num_layers
    if window:
        # vLLM's model-level sliding window (``cache_config.sliding_window``) applies to every layer.
        return ["sliding_attention"] * num_layers
    return ["full_attention"] * num_layers


def _moe(
    text: Mapping[str, Any], model_type: str, num_layers: int, hidden_intermediate: int
) -> MoeSpec | None:
    num_experts = text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts")
    if not num_experts or model_type == "gemma4_text" and not text.get("enable_moe_block"):
        return None
    top_k = (
        text.get("num_experts_per_tok")
        or text.get("experts_per_token")
        or text.get("top_k_experts")
        or text.get("moe_topk")
    )
    if not top_k:
        raise errors.InvalidModelConfig(
            "config.json declares experts but no 'num_experts_per_tok'", field="num_experts_per_tok"
        )
    moe_inter = int(text.get("moe_intermediate_size") or _need(text, "intermediate_size"))
    moe_layers = num_layers
    if text.get("first_k_dense_replace") is not None:
        moe_layers = num_layers - int(text["first_k_dense_replace"])
    elif text.get("decoder_sparse_step") or text.get("mlp_only_layers"):
        step = int(text.get("decoder_sparse_step") or 1)
        dense = set(text.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    elif text.get("interleave_moe_layer_step"):
        step = int(text["interleave_moe_layer_step"])
        moe_layers = sum(1 for i in range(num_layers) if (i + 1) % step == 0)
    shared = 0
    if text.get("n_shared_experts"):
        shared = int(text["n_shared_experts"]) * moe_inter
    elif text.get("shared_expert_intermediate_size"):
        shared = int(text["shared_expert_intermediate_size"])
    elif model_type == "llama4_text":
        shared = moe_inter
    parallel_dense = hidden_intermediate if model_type == "gemma4_text" else 0
    return MoeSpec(int(num_experts), int(top_k), moe_inter, moe_layers, shared, parallel_dense)


def _quant(text: Mapping[str, Any]) -> QuantSpec | None:
    qc = text.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    return build_quant_spec(qc)


def _vision_params(hf_config: Mapping[str, Any], text_hidden: int) -> int:
    vc = hf_config.get("vision_config")
    if not isinstance(vc, Mapping):
        return 0
    h = int(_need(vc, "hidden_size", "embed_dim", "width", where=".vision_config"))
    layers = int(_need(vc, "num_hidden_layers", "depth", "num_layers", where=".vision_config"))
    inter = int(vc.get("intermediate_size") or 4 * h)
    gated = str(vc.get("hidden_act", "")) in ("silu", "swiglu")
    per_layer = 4 * h * h + (3 if gated else 2) * h * inter
    patch = int(vc.get("patch_size") or 14)
    channels = int(vc.get("num_channels") or 3)
    out_dim = int(vc.get("vision_output_dim") or vc.get("projector_input_dim") or h)
    projector = out_dim * text_hidden + text_hidden * text_hidden
    return layers * per_layer + channels * patch * patch * h + projector


def _linear_state(text: Mapping[str, Any]) -> LinearStateSpec:
    k_heads = int(_need(text, "linear_num_key_heads"))
    v_heads = int(_need(text, "linear_num_value_heads"))
    k_dim = int(_need(text, "linear_key_head_dim"))
    v_dim = int(_need(text, "linear_value_head_dim"))
    kernel = int(_need(text, "linear_conv_kernel_dim"))
    return LinearStateSpec(2 * k_heads * k_dim + v_heads * v_dim, kernel, v_heads, k_dim, v_dim)


def build_model_spec(hf_config: Mapping[str, Any]) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (as a mapping) into a :class:`ModelSpec`."""
    if not isinstance(hf_config, Mapping):
        raise errors.InvalidModelConfig("config.json is not a JSON object", field=None)
    text, where = _text_config(hf_config)
    archs = hf_config.get("architectures") or text.get("architectures") or []
    architecture = str(archs[0]) if archs else str(hf_config.get("model_type") or "")
    model_type = str(text.get("model_type") or hf_config.get("model_type") or "")
    if not architecture and not model_type:
        raise errors.InvalidModelConfig(
            "config.json names neither 'architectures' nor 'model_type'", "architectures"
        )
    if model_type in ("mamba", "mamba2", "falcon_mamba", "jamba", "nemotron_h", "bamba", "granitemoehybrid"):
        raise errors.InvalidModelConfig(
            f"model_type {model_type!r}: Mamba-state layers of this family are not modelled yet "
            "(supported hybrid: qwen3_next)",
            field="model_type",
        )

    num_layers = int(_need(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers", where=where))
    hidden = int(_need(text, "hidden_size", "n_embd", "d_model", where=where))
    heads = int(_need(text, "num_attention_heads", "n_head", "num_heads", where=where))
    kv_heads = int(
        text.get("num_key_value_heads") or text.get("num_kv_heads") or text.get("n_head_kv") or heads
    )
    if text.get("multi_query") and not text.get("num_key_value_heads"):
        kv_heads = 1
    head_dim = int(text.get("head_dim") or hidden // heads)
    vocab = int(_need(text, "vocab_size", "padded_vocab_size", where=where))
    inter = int(_need(text, "intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", where=where))
    if model_type == "llama4_text" and text.get("intermediate_size_mlp"):
        dense_inter = int(text["intermediate_size_mlp"])
    else:
        dense_inter = inter

    rope_type, factor, original = _rope(text)
    max_len, key, base = _max_model_len(text, model_type, rope_type, factor, original)
    window = text.get("sliding_window")
    mla = None
    if text.get("kv_lora_rank"):
        mla = MlaSpec(
            kv_lora_rank=int(text["kv_lora_rank"]),
            qk_rope_head_dim=int(_need(text, "qk_rope_head_dim", where=where)),
            qk_nope_head_dim=int(_need(text, "qk_nope_head_dim", where=where)),
            v_head_dim=int(_need(text, "v_head_dim", where=where)),
            q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None,
        )
    linear_state = None
    layers: list[LayerSpec] = []
    if mla is not None:
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        layers = [LayerSpec(MLA, 1, latent, 0)] * num_layers
        kv_heads, head_dim_kv = 1, latent
    else:
        head_dim_kv = head_dim
        kinds = _layer_types(text, model_type, num_layers)
        if "linear_attention" in kinds:
            linear_state = _linear_state(text)
        global_kv = int(text.get("num_global_key_value_heads") or kv_heads)
        global_hd = int(text.get("global_head_dim") or head_dim)
        for name in kinds:
            if name in ("sliding_attention", "sliding_window", "local_attention", "sliding"):
                if not window:
                    raise errors.InvalidModelConfig(
                        "config.json has sliding-attention layers but no 'sliding_window'",
                        field="sliding_window",
                    )
                layers.append(LayerSpec(SLIDING, kv_heads, head_dim, head_dim, int(window)))
            elif name == "chunked_attention":
                chunk = int(_need(text, "attention_chunk_size", where=where))
                layers.append(LayerSpec(CHUNKED, kv_heads, head_dim, head_dim, chunk))
            elif name in ("linear_attention", "mamba"):
                layers.append(LayerSpec(LINEAR))
            elif name in ("full_attention", "attention", "global"):
                layers.append(LayerSpec(FULL, global_kv, global_hd, global_hd))
            else:
                raise errors.InvalidModelConfig(
                    f"config.json's layer_types has an unknown kind {name!r}", "layer_types"
                )
        if model_type == "gemma4_text" and text.get("num_kv_shared_layers"):
            raise errors.InvalidModelConfig(
                "Gemma 4 KV-sharing layers (num_kv_shared_layers > 0) are not modelled",
                field="num_kv_shared_layers",
            )
    tie = text.get("tie_word_embeddings")
    if tie is None:
        tie = hf_config.get("tie_word_embeddings")
    if tie is None:
        tie = model_type in _TIED_BY_DEFAULT or hf_config.get("model_type") in _TIED_BY_DEFAULT
    gated = model_type not in _NON_GATED_MLP
    partial = float(text.get("partial_rotary_factor") or 1.0)
    # vLLM's rotary cos/sin cache rows: scaled variants (linear, dynamic, YaRN) cache the scaled
    # length; Gemma 3 keeps a second, unscaled cache for its sliding-window layers.
    rope_rows = base
    if rope_type == "yarn" and factor and original:
        rope_rows = int(original * factor)
    elif rope_type in ("linear", "dynamic") and factor:
        rope_rows = int(base * factor)
    if model_type == "gemma3_text" and rope_type:
        rope_rows += base
    rotary_dim = int((mla.qk_rope_head_dim if mla else head_dim) * partial)
    return ModelSpec(
        architecture=architecture,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim_kv,
        hidden_size=hidden,
        intermediate_size=dense_inter,
        vocab_size=vocab,
        max_model_len=max_len,
        dtype=_dtype(text, hf_config),
        tie_word_embeddings=bool(tie),
        layers=tuple(layers),
        moe=_moe(text, model_type, num_layers, inter),
        mla=mla,
        linear_state=linear_state,
        quantization=_quant(text),
        mlp_gated=gated,
        attention_bias=bool(text.get("attention_bias") or model_type in ("qwen2", "qwen2_moe")),
        rotary_dim=rotary_dim,
        rope_cache_positions=rope_rows,
        vision_params=_vision_params(hf_config, hidden),
        max_len_key=key,
        max_len_base=base,
        rope_type=rope_type,
        rope_factor=factor,
        rope_original_max=original,
    )
