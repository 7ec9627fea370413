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
counted for its weights. Every value is read through :mod:`kvpilot.tuner.model.fields`
(types, ranges and documented limits checked before any arithmetic); the layers, MLA,
MoE and vision parts through :mod:`kvpilot.tuner.model.readers`, which cross-check the
geometry. A config it cannot account for raises
:class:`~kvpilot.tuner.errors.InvalidModelConfig` naming the field: it never guesses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model import mamba, towers
from kvpilot.tuner.model.compressed import read_compressed_layers
from kvpilot.tuner.model.fields import (
    MAX_CONTEXT,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_ROPE_FACTOR,
    MAX_VOCAB_SIZE,
    Fields,
    describe,
    refuse,
)
from kvpilot.tuner.model.kda import read_kda_layers
from kvpilot.tuner.model.layers import (  # re-exported: callers name them model_spec.FULL etc.
    CHUNKED,
    COMPRESSED,
    DTYPE_BYTES,
    FULL,
    LINEAR,
    MLA,
    NO_KV,
    SLIDING,
    CompressedAttentionSpec,
    LayerSpec,
    LinearStateSpec,
    MlaSpec,
    MoeSpec,
)
from kvpilot.tuner.model.quantization import QuantSpec, build_quant_spec
from kvpilot.tuner.model.readers import (
    decilm_ffn_width,
    nemotron_h_num_layers,
    read_geometry,
    read_layers,
    read_mla,
    read_mla_layers,
    read_moe,
    read_vision_params,
)
from kvpilot.tuner.model.vision import VisionTower, read_vision_tower

__all__ = [
    "CHUNKED",
    "COMPRESSED",
    "CompressedAttentionSpec",
    "DTYPE_BYTES",
    "FULL",
    "LINEAR",
    "LayerSpec",
    "LinearStateSpec",
    "MLA",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "NO_KV",
    "SLIDING",
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

_INHERITED = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings")
"""Keys a nested ``text_config`` takes from the top level when it lacks them."""

_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"})
"""Model types whose transformers config class defaults ``tie_word_embeddings`` to True."""

_QK_NORM = frozenset(
    {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_vl_text"}
    | {"qwen3_vl_moe_text", "gemma3", "gemma3_text", "gemma4_text"}
)
"""Model types whose attention layers normalise queries and keys per head (``q_norm``, ``k_norm``:
head_dim weights each) in vLLM 0.33's model files."""
_SANDWICH_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text", "gemma4_text"})
"""Model types with pre- and post-feed-forward norms beside the two usual ones (four per layer)."""
_NON_GATED_MLP = frozenset(
    {"phi", "gpt2", "gpt_bigcode", "starcoder2", "opt", "falcon", "gpt_neox", "bloom", "mpt", "gptj"}
    | {"nemotron_h"}
)
"""Model types whose MLP is up/down only (two matrices, no gate); Nemotron-H's experts too (relu2)."""

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
    compressed: CompressedAttentionSpec | None = None
    """DeepSeek-V4's compressed sparse attention (its layers are ``COMPRESSED``)."""
    quantization: QuantSpec | None = None
    mlp_gated: bool = True
    attention_bias: bool = False
    qk_norm: bool = False
    """Per-head ``q_norm`` and ``k_norm`` in every attention layer (:data:`_QK_NORM`)."""
    sandwich_norms: bool = False
    """Gemma 2-4: ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` in every layer too."""
    attention_output_gate: bool = False
    """Qwen3-Next / Qwen3.5: ``q_proj`` also emits a per-head output gate (``attn_output_gate``; vLLM 0.33's
    ``Qwen3NextAttention`` defaults it to true), doubling the query rows of every attention layer."""
    rotary_dim: int = 0
    rope_cache_positions: int = 0
    """Rows of the rotary cos/sin cache vLLM allocates (weights memory)."""
    vision_params: int = 0
    """Parameters of the vision tower and projector (0 for text-only models)."""
    audio_params: int = 0
    """Parameters of the audio tower and projector (Gemma 4 E2B / E4B; 0 otherwise)."""
    per_layer_input_replicated: int = 0
    """The part of the per-layer inputs every TP rank holds whole (norms, each layer's gate and projection);
    :attr:`per_layer_input_params` is the part split by TP (the embedding and the model projection)."""
    towers_replicated: bool = False
    """The vision / audio towers are whole on every TP rank (Gemma 4: transformers' modules), not split."""
    towers_whole_params: int = 0
    """Of towers split by TP, the parameters every rank still holds whole (Qwen3-VL / Qwen3.5: the patch
    embedding, the position table, LayerNorms and row-parallel biases)."""
    per_layer_input_params: int = 0
    """Gemma 4 (E2B / E4B) per-layer inputs (``hidden_size_per_layer_input``), the part split by TP:
    ``embed_tokens_per_layer`` (vocab x layers x that width) and its model projection, as vLLM 0.33's
    ``gemma4.py`` builds them (0 for other models)."""
    vision_tower: VisionTower | None = None
    """The vision tower whose profile-run forward kvpilot models (:mod:`.vision`; ``None`` otherwise)."""
    mm_prefix_item_tokens: int = 0
    """A multimodal prefix-LM's largest item in tokens (Gemma 4 with ``use_bidirectional_attention``
    "vision"): vLLM 0.33 raises the default batch to hold it (``vllm.resolve_batch_limits``)."""
    max_len_key: str | None = None
    max_len_base: int = 0
    """The config's own maximum before rope scaling."""
    rope_type: str | None = None
    rope_factor: float | None = None
    rope_original_max: int | None = None
    num_mtp_layers: int = 0
    """The MTP layers the checkpoint ships for vLLM's MTP drafter (the drafter's ``layers_key``,
    ``num_nextn_predict_layers`` or Qwen3.5's ``mtp_num_hidden_layers``, of a ``model_type`` in
    :data:`kvpilot.tuner.vllm.MTP_DRAFTERS`; 0 otherwise). Not decoder layers: vLLM
    builds them only with ``--speculative-config`` method ``mtp``
    (:mod:`kvpilot.tuner.memory.speculative`)."""

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
        if self.mla is not None or self.compressed is not None:
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


def _fallback_intermediate(text: Fields, hidden: int, names: tuple[str, ...]) -> int:
    """The dense MLP size when the config gives none: an all-MoE model's expert size (Qwen3.5 MoE:
    every layer is MoE), or DeciLM's largest ``ffn_mult`` block (vLLM ``nemotron_nas.py``)."""
    blocks = text.raw("block_configs")
    if isinstance(blocks, list) and blocks:
        mults = [
            b["ffn"]["ffn_mult"]
            for b in blocks
            if isinstance(b, dict)
            and isinstance(b.get("ffn"), dict)
            and isinstance(b["ffn"].get("ffn_mult"), int | float)
            and not isinstance(b["ffn"]["ffn_mult"], bool)
        ]
        if mults and all(0 < m <= 64 for m in mults):
            return decilm_ffn_width(max(mults), hidden)
    moe = text.optional_int("moe_intermediate_size", limit=MAX_INTERMEDIATE_SIZE)
    dense = text.ints("mlp_only_layers", limit=MAX_LAYERS) or []
    if moe and not dense and not text.optional_int("first_k_dense_replace", limit=MAX_LAYERS, minimum=0):
        return moe
    raise text.missing(*names)


def _text_config(top: Fields) -> Fields:
    """The decoder's config: ``text_config`` (or ``language_config``) merged over defaults.

    One level only: a ``text_config`` nested in the ``text_config`` is not followed.
    """
    text: dict[str, Any] = dict(top.data)
    key, inherited = "", frozenset[str]()
    for name in ("text_config", "language_config", "llm_config"):
        nested = top.child(name)
        if nested is not None:
            text, key = dict(nested.data), name
            copied = [k for k in _INHERITED if k not in text and k in top.data]
            for inherited_key in copied:
                text[inherited_key] = top.data[inherited_key]
            inherited = frozenset(copied)
            if "model_type" not in text and top.raw("model_type") == "gemma3":
                text["model_type"] = "gemma3_text"
            break
    fields = Fields(text, key, inherited)
    for name, value in _TEXT_DEFAULTS.get(fields.string("model_type") or "", {}).items():
        text.setdefault(name, value)
    return fields


def _architecture(top: Fields, text: Fields) -> str:
    for fields in (top, text):
        archs = fields.raw("architectures")
        if not archs:
            continue
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise refuse(fields.path("architectures"), "a list of class names", archs)
        return archs[0]
    return top.string("model_type") or ""


def _dtype(text: Fields, top: Fields) -> str:
    raw = text.string("torch_dtype", "dtype") or top.string("torch_dtype", "dtype")
    if raw is None:
        return "bfloat16"  # vLLM: a config without a dtype is float32, served as bf16 ("auto")
    name = raw.replace("torch.", "")
    if name == "float32":
        return "bfloat16"  # vLLM's "auto" downcasts float32 checkpoints to 16 bits
    if name not in DTYPE_BYTES:
        raise errors.InvalidModelConfig(
            f"config.json has an unsupported torch_dtype {describe(raw)}", field="torch_dtype"
        )
    return name


@dataclass(frozen=True, slots=True)
class _Rope:
    """The config's rope scaling, as far as lengths are concerned."""

    type: str | None = None
    factor: float | None = None
    original: int | None = None
    factor_field: str = "rope_scaling.factor"


def _rope(text: Fields) -> _Rope:
    rope = text.child("rope_scaling")
    if rope is None or not rope.data:
        params = text.child("rope_parameters")
        rope = params if params is not None and "rope_type" in params.data else None
    own = rope.optional_int("original_max_position_embeddings", limit=MAX_CONTEXT) if rope else None
    original = own or text.optional_int("original_max_position_embeddings", limit=MAX_CONTEXT)
    if rope is None:
        return _Rope(original=original)
    return _Rope(
        rope.string("rope_type", "type"),
        rope.optional_float("factor", maximum=MAX_ROPE_FACTOR),
        original,
        rope.path("factor"),
    )


def _scaled_len(length: float, field: str) -> int:
    """A rope-scaled length, within :data:`~kvpilot.tuner.model.fields.MAX_CONTEXT`."""
    if length > MAX_CONTEXT.maximum:
        raise errors.InvalidModelConfig(
            f"config.json: {field} scales the context to {int(length)} tokens; at most "
            f"{MAX_CONTEXT.maximum} (kvpilot's limit; {MAX_CONTEXT.published})",
            field=field,
        )
    return int(length)


def _max_model_len(text: Fields, model_type: str, rope: _Rope) -> tuple[int, str | None, int]:
    """(vLLM 0.33's default ``max_model_len``, the key it came from, the length before rope scaling)."""
    derived: float = math.inf
    key = None
    for name in _MAX_LEN_KEYS:
        value = text.optional_int(name, limit=MAX_CONTEXT)
        if value is not None and value < derived:
            derived, key = value, name
    explicit = text.optional_int("model_max_length", limit=MAX_CONTEXT)
    if explicit:
        derived, key = explicit, "model_max_length"
    if derived == math.inf:
        derived, key = 2048, None  # vLLM's documented fallback (it logs a warning)
    base = int(derived)
    if rope.type and rope.factor and "gemma3" not in model_type and rope.type not in _ROPE_NOT_SCALED_033:
        derived = _scaled_len(derived * rope.factor, rope.factor_field)
    if rope.type == "longrope" and rope.original:
        derived = rope.original
    return int(derived), key, base


def _rope_rows(base: int, model_type: str, rope: _Rope) -> int:
    """Rows of vLLM's rotary cos/sin cache: scaled variants (linear, dynamic, YaRN) cache the scaled
    length; Gemma 3 keeps a second, unscaled cache for its sliding-window layers."""
    rows = base
    if rope.type == "yarn" and rope.factor and rope.original:
        rows = _scaled_len(rope.original * rope.factor, rope.factor_field)
    elif rope.type in ("linear", "dynamic") and rope.factor:
        rows = _scaled_len(base * rope.factor, rope.factor_field)
    if model_type == "gemma3_text" and rope.type:
        rows += base
    return rows


def _mm_prefix_item_tokens(top: Fields, text: Fields, model_type: str) -> int:
    """Gemma 4's largest multimodal item when vLLM treats it as a prefix LM
    (``Gemma4ModelArchConfigConvertor.is_mm_prefix_lm``: a vision tower and ``use_bidirectional_attention``
    "vision"); 0 otherwise. vLLM reads ``vision_config.default_output_length``, which transformers does not
    default: without it the lookup fails, vLLM logs a warning and keeps its default batch (0 here). With an
    audio tower the audio item's length is the processor's, not in the config: the image/video bound is
    what kvpilot can read."""
    vision = top.child("vision_config")
    bidirectional = text.string("use_bidirectional_attention")
    if model_type != "gemma4_text" or vision is None or bidirectional != "vision":
        return 0
    per_image = vision.optional_int("default_output_length", limit=MAX_CONTEXT)
    return vllm.gemma4_mm_item_tokens(per_image) if per_image else 0


def _per_layer_input_params(text: Fields, hidden: int, vocab: int, num_layers: int) -> tuple[int, int]:
    """(split by TP, replicated) parameters of Gemma 4's per-layer inputs: vLLM 0.33 shards the
    ``VocabParallelEmbedding`` and the column-parallel model projection; the norms and each layer's gate
    and projection are whole on every rank (held to vLLM's classes at TP 2 by the model-class contract)."""
    width = text.optional_int("hidden_size_per_layer_input", limit=MAX_HIDDEN_SIZE, minimum=0)
    if not width:
        return 0, 0
    per_layer_vocab = text.optional_int("vocab_size_per_layer_input", limit=MAX_VOCAB_SIZE) or vocab
    stacked = num_layers * width
    split = per_layer_vocab * stacked + stacked * hidden  # the embedding, the model projection
    replicated = width + num_layers * (
        2 * width * hidden + hidden
    )  # its norm; each layer's gate, projection, norm
    return split, replicated


_OUTPUT_GATED_ATTENTION = ("qwen3_next", "qwen3_5")
"""model_type prefixes whose vLLM attention is ``Qwen3NextAttention`` (``qwen3_next.py``, ``qwen3_5.py``)."""


def _attention_output_gate(text: Fields, model_type: str) -> bool:
    if not model_type.startswith(_OUTPUT_GATED_ATTENTION):
        return False
    declared = text.optional_bool("attn_output_gate")
    return True if declared is None else declared


def _quant(text: Fields) -> QuantSpec | None:
    qc = text.child("quantization_config")
    return build_quant_spec(qc.data, qc.prefix) if qc is not None else None


def _attention_free_spec(
    top: Fields, text: Fields, architecture: str, model_type: str, num_layers: int, hidden: int
) -> ModelSpec:
    """Mamba, FalconMamba, Mamba2: every layer a state mixer, no attention, no rotary embedding.

    ``num_attention_heads`` stands for the dimension tensor parallelism splits (vLLM's ``divide`` asserts
    on it): Mamba2's heads, Mamba's intermediate size; there are no KV heads.
    """
    state = mamba.read_state(text, model_type, hidden)
    rope = _rope(text)
    max_len, key, base = _max_model_len(text, model_type, rope)
    tie = text.optional_bool("tie_word_embeddings")
    return ModelSpec(
        architecture=architecture,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=state.num_heads or state.conv_dim,
        num_kv_heads=0,
        head_dim=0,
        hidden_size=hidden,
        intermediate_size=0,  # a Mamba block is its mixer and one norm: no MLP
        vocab_size=text.need_int("vocab_size", limit=MAX_VOCAB_SIZE),
        max_model_len=max_len,
        dtype=_dtype(text, top),
        tie_word_embeddings=(model_type != "mamba2") if tie is None else tie,  # transformers' defaults
        layers=(LayerSpec(LINEAR),) * num_layers,
        linear_state=state,
        quantization=_quant(text),
        max_len_key=key,
        max_len_base=base,
    )


def _mtp_layers(text: Fields, model_type: str) -> int:
    """The MTP layer count vLLM's drafter for this ``model_type`` builds (0: no drafter kvpilot models)."""
    drafter = vllm.MTP_DRAFTERS.get(model_type)
    if drafter is None:
        return 0
    layers = text.optional_int(drafter.layers_key, limit=MAX_LAYERS, minimum=0)
    return drafter.default_layers if layers is None else layers


def build_model_spec(hf_config: Mapping[str, Any]) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (as a mapping) into a :class:`ModelSpec`.

    Every value is type- and range-checked (:mod:`kvpilot.tuner.model.fields`) before it is used;
    a config it cannot account for raises :class:`~kvpilot.tuner.errors.InvalidModelConfig`.
    """
    if not isinstance(hf_config, Mapping):
        raise errors.InvalidModelConfig("config.json is not a JSON object", field=None)
    top = Fields(hf_config)
    text = _text_config(top)
    architecture = _architecture(top, text)
    model_type = text.string("model_type") or top.string("model_type") or ""
    if not architecture and not model_type:
        raise errors.InvalidModelConfig(
            "config.json names neither 'architectures' nor 'model_type'", "architectures"
        )
    vllm.check_architecture_served(architecture)
    if model_type == "zamba2":  # shared attention blocks over Mamba2 layers: no reader for them yet
        raise errors.InvalidModelConfig(
            f"{architecture} (model_type 'zamba2'): Zamba2's shared attention blocks are not modelled "
            "(modelled Mamba families: Mamba, Mamba2, FalconMamba, Jamba, Falcon-H1, Granite-4.0-H, "
            "Nemotron-H, LFM2)",
            field="model_type",
        )

    num_layers = (nemotron_h_num_layers(text) if model_type == "nemotron_h" else None) or text.need_int(
        "num_hidden_layers", "n_layer", "num_layers", "n_layers", limit=MAX_LAYERS
    )
    if num_layers > MAX_LAYERS.maximum:
        raise refuse(text.path("layers_block_type"), f"at most {MAX_LAYERS.maximum} blocks", num_layers)
    hidden = text.need_int("hidden_size", "n_embd", "d_model", limit=MAX_HIDDEN_SIZE)
    if model_type in mamba.ATTENTION_FREE:
        return _attention_free_spec(top, text, architecture, model_type, num_layers, hidden)
    heads = text.need_int("num_attention_heads", "n_head", "num_heads", limit=MAX_HEADS)
    vocab = text.need_int("vocab_size", "padded_vocab_size", limit=MAX_VOCAB_SIZE)
    inter_names = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")
    inter = text.optional_int(*inter_names, limit=MAX_INTERMEDIATE_SIZE) or _fallback_intermediate(
        text, hidden, inter_names
    )
    dense_inter = mamba.dense_intermediate(text, model_type, inter)
    if model_type == "llama4_text":
        dense_inter = text.optional_int("intermediate_size_mlp", limit=MAX_INTERMEDIATE_SIZE) or inter
    mla = read_mla(text)
    geometry = read_geometry(text, hidden, heads, mla is not None)
    rope = _rope(text)
    max_len, key, base = _max_model_len(text, model_type, rope)
    window = text.optional_int("sliding_window", limit=MAX_CONTEXT)
    linear_state = None
    compressed = None
    kv_heads = geometry.kv_heads
    if text.present("compress_ratios"):  # DeepSeek-V4: a replicated 512-wide latent per layer
        layers, compressed = read_compressed_layers(text, num_layers)
        kv_heads, head_dim_kv = 1, compressed.head_dim
    elif mla is not None:
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        if text.present("linear_attn_config"):  # Kimi-K3: MLA beside Kimi Delta Attention
            layers, linear_state = read_kda_layers(text, num_layers, latent)
        else:
            layers = read_mla_layers(text, num_layers, latent)
        kv_heads, head_dim_kv = 1, latent
    else:
        head_dim_kv = geometry.head_dim
        layers, linear_state = read_layers(text, model_type, num_layers, geometry, window)
        if model_type == "gemma4_text":  # vLLM's get_head_size: the full layers' (global) head size
            head_dim_kv = max((layer.head_dim for layer in layers if layer.kind == FULL), default=head_dim_kv)
    tie = text.optional_bool("tie_word_embeddings")
    if tie is None:
        tie = top.optional_bool("tie_word_embeddings")
    if tie is None:
        tie = model_type in _TIED_BY_DEFAULT or top.string("model_type") in _TIED_BY_DEFAULT
    partial = text.optional_float("partial_rotary_factor", maximum=1.0) or 1.0
    rope_dim = mla.qk_rope_head_dim if mla else geometry.head_dim
    if compressed is not None:
        rope_dim = text.need_int("qk_rope_head_dim", limit=MAX_HEADS)
    rotary_dim = int(rope_dim * partial)
    per_layer_split, per_layer_replicated = _per_layer_input_params(text, hidden, vocab, num_layers)
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
        dtype=_dtype(text, top),
        tie_word_embeddings=tie,
        layers=tuple(layers),
        moe=read_moe(text, model_type, num_layers, inter),
        mla=mla,
        linear_state=linear_state,
        compressed=compressed,
        quantization=_quant(text),
        mlp_gated=model_type not in _NON_GATED_MLP,
        attention_bias=text.flag("attention_bias") or model_type in ("qwen2", "qwen2_moe"),
        qk_norm=model_type in _QK_NORM
        or (model_type in vllm.QK_NORM_FLAG_MODEL_TYPES and text.flag("use_qk_norm")),
        sandwich_norms=model_type in _SANDWICH_NORMS,
        attention_output_gate=_attention_output_gate(text, model_type),
        rotary_dim=rotary_dim,
        rope_cache_positions=_rope_rows(base, model_type, rope),
        vision_params=read_vision_params(top, hidden),
        audio_params=towers.read_audio_params(top, hidden),
        per_layer_input_params=per_layer_split,
        per_layer_input_replicated=per_layer_replicated,
        towers_replicated=towers.replicated(top),
        towers_whole_params=towers.read_tower_whole_params(top, hidden),
        vision_tower=read_vision_tower(top, hidden),
        mm_prefix_item_tokens=_mm_prefix_item_tokens(top, text, model_type),
        max_len_key=key,
        max_len_base=base,
        rope_type=rope.type,
        rope_factor=rope.factor,
        rope_original_max=rope.original,
        num_mtp_layers=_mtp_layers(text, model_type),
    )
