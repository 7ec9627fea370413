"""Readers of a config's parts: attention geometry and layer kinds, MLA, linear-attention state,
the MoE layout and the vision tower.

Between :mod:`kvpilot.tuner.model.fields` (typed reads of one value) and
:mod:`kvpilot.tuner.model.spec` (which assembles a :class:`~kvpilot.tuner.model.spec.ModelSpec`
from these). Each reader takes the decoder's :class:`~kvpilot.tuner.model.fields.Fields`, reads
what vLLM 0.33's model files read, and cross-checks it: KV heads divide the heads, ``layer_types``
has one entry per layer, the experts per token are among the experts, ``first_k_dense_replace``
leaves layers to replace... Identical layers share one :class:`LayerSpec`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model import mamba, mimo, towers
from kvpilot.tuner.model.fields import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    Fields,
    Limit,
    refuse,
)
from kvpilot.tuner.model.layers import (
    BLOCK_ATTENTION,
    BLOCK_MIXER,
    BLOCK_MLP,
    BLOCK_MOE,
    CHUNKED,
    FULL,
    GDN,
    LINEAR,
    MAMBA2,
    MLA,
    NO_KV,
    SLIDING,
    LayerSpec,
    LinearStateSpec,
    MlaSpec,
    MoeSpec,
)

_SLIDING_NAMES = frozenset({"sliding_attention", "sliding_window", "local_attention", "sliding"})
_FULL_NAMES = frozenset({"full_attention", "attention", "global"})
_LINEAR_NAMES = frozenset({"linear_attention", "mamba"})
_NO_KV_NAME = "no_kv"
_SHARED_EXPERT_GATE = frozenset({"qwen2_moe", "qwen3_next", "qwen3_5_moe_text"})
"""Model types whose shared experts pass a ``shared_expert_gate`` (:attr:`MoeSpec.shared_expert_gate`)."""
_KNOWN_KINDS = _SLIDING_NAMES | _FULL_NAMES | _LINEAR_NAMES | {"chunked_attention", _NO_KV_NAME}
_NEMOTRON_H_BLOCKS = {"M": BLOCK_MIXER, "*": BLOCK_ATTENTION, "-": BLOCK_MLP, "E": BLOCK_MOE}
_NEMOTRON_H_BLOCK_NAMES = {
    "mamba": BLOCK_MIXER,
    "attention": BLOCK_ATTENTION,
    "full_attention": BLOCK_ATTENTION,
    "mlp": BLOCK_MLP,
    "moe": BLOCK_MOE,
}
"""Nemotron-H's ``hybrid_override_pattern`` / ``layers_block_type``: what each block holds, alone (Mamba2,
attention, MLP, MoE; vLLM ``nemotron_h.py``)."""
_NEMOTRON_H_KINDS = {
    BLOCK_MIXER: "mamba",
    BLOCK_ATTENTION: "full_attention",
    BLOCK_MLP: _NO_KV_NAME,
    BLOCK_MOE: _NO_KV_NAME,
}
"""The layer kind of each Nemotron-H block: only the mixer and attention blocks keep a cache."""
_NO_ROPE_FLAG = Limit(1, "each entry is 0 (no RoPE) or 1")


@dataclass(frozen=True, slots=True)
class Geometry:
    """The attention geometry, read and cross-checked before any layer is built."""

    heads: int
    kv_heads: int
    head_dim: int


def read_geometry(text: Fields, hidden: int, heads: int, mla: bool) -> Geometry:
    """KV heads (GQA, multi-query) and the head size; MLA models size neither from these."""
    kv_names = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
    kv_heads = text.optional_int(*kv_names, limit=MAX_HEADS) or heads
    if text.flag("multi_query") and not text.present("num_key_value_heads"):
        kv_heads = 1
    head_dim = text.optional_int("head_dim", limit=MAX_HEAD_DIM)
    if mla:  # the latent replaces the heads' K and V
        return Geometry(heads, kv_heads, head_dim or hidden // heads)
    if kv_heads > heads or heads % kv_heads:
        kv_name = next((name for name in kv_names if text.present(name)), "num_key_value_heads")
        raise refuse(text.path(kv_name), f"a divisor of num_attention_heads ({heads})", kv_heads)
    if head_dim is None:
        if hidden % heads:
            raise errors.InvalidModelConfig(
                f"config.json: num_attention_heads ({heads}) must divide hidden_size ({hidden}) "
                "when head_dim is not given",
                field=text.path("num_attention_heads"),
            )
        head_dim = hidden // heads
    return Geometry(heads, kv_heads, head_dim)


def read_mla(text: Fields) -> MlaSpec | None:
    """DeepSeek's multi-head latent attention (a ``kv_lora_rank``), or None."""
    rank = text.optional_int("kv_lora_rank", limit=MAX_HIDDEN_SIZE, minimum=0)
    if not rank:
        return None
    return MlaSpec(
        kv_lora_rank=rank,
        qk_rope_head_dim=text.need_int("qk_rope_head_dim", limit=MAX_HEAD_DIM),
        qk_nope_head_dim=text.need_int("qk_nope_head_dim", limit=MAX_HEAD_DIM),
        v_head_dim=text.need_int("v_head_dim", limit=MAX_HEAD_DIM),
        q_lora_rank=text.optional_int("q_lora_rank", limit=MAX_HIDDEN_SIZE, minimum=0) or None,
    )


def read_mla_layers(text: Fields, num_layers: int, latent: int) -> list[LayerSpec]:
    """The MLA layers, each with its sparse-attention indexer when vLLM builds one (``index_topk``)."""
    if not text.present("index_topk"):
        return [LayerSpec(MLA, 1, latent, 0)] * num_layers
    index_head_dim = text.need_int("index_head_dim", limit=MAX_HEAD_DIM)
    pattern: str | list[str] | None = (
        text.strings("index_topk_pattern")
        if not isinstance(text.raw("index_topk_pattern"), str)
        else text.string("index_topk_pattern")
    )
    has = vllm.indexer_layers(
        num_layers,
        text.optional_int("index_topk_freq", limit=MAX_LAYERS),
        pattern,
        text.optional_int("index_skip_topk_offset", limit=MAX_LAYERS, minimum=0),
    )
    return [LayerSpec(MLA, 1, latent, 0, indexer_head_dim=index_head_dim if on else 0) for on in has]


def _every(period: int, num_layers: int, on: str, off: str) -> list[str]:
    """``on`` for every ``period``-th layer (1-based), ``off`` for the others."""
    return [on if (i + 1) % period == 0 else off for i in range(num_layers)]


def _layer_types(text: Fields, model_type: str, num_layers: int, window: int | None) -> list[str]:
    """Per-layer attention kind names, as the model file decides them."""
    if model_type == "nemotron_h":
        return [_NEMOTRON_H_KINDS[block] for block in _nemotron_h_blocks(text, num_layers)]
    if model_type in mamba.MAMBA_FAMILIES:
        return mamba.layer_kinds(text, model_type, num_layers)
    declared = text.strings("layer_types")
    if model_type == "gemma4_text":
        # transformers' Gemma4TextConfig: 5 sliding : 1 full by default, and the last layer is full.
        kinds = list(declared) if declared else _every(6, num_layers, "full_attention", "sliding_attention")
        if kinds and len(kinds) == num_layers:
            kinds[-1] = "full_attention"
        declared = kinds
    if declared:
        if len(declared) != num_layers:  # transformers' validate_layer_type refuses it too
            raise errors.InvalidModelConfig(
                f"config.json's layer_types lists {len(declared)} layers, "
                f"num_hidden_layers says {num_layers}",
                field=text.path("layer_types"),
            )
        return declared
    alternate = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if model_type == "gemma2":
        return alternate
    gemma3 = model_type in ("gemma3_text", "gemma3")
    pattern = text.optional_int("sliding_window_pattern", limit=MAX_LAYERS) if gemma3 or window else None
    if gemma3 or (window and pattern):
        return _every(pattern or 6, num_layers, "full_attention", "sliding_attention")
    if model_type == "gpt_oss":
        return alternate
    if model_type == "llama4_text" and text.optional_int("attention_chunk_size", limit=MAX_CONTEXT):
        no_rope = text.ints("no_rope_layers", limit=_NO_ROPE_FLAG)
        if not no_rope:
            interval = text.optional_int("no_rope_layer_interval", limit=MAX_LAYERS) or 4
            no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
        elif len(no_rope) < num_layers:
            raise errors.InvalidModelConfig(
                f"config.json's no_rope_layers lists {len(no_rope)} layers, "
                f"num_hidden_layers says {num_layers}",
                field=text.path("no_rope_layers"),
            )
        return ["chunked_attention" if no_rope[i] else "full_attention" for i in range(num_layers)]
    if model_type == "qwen3_next":
        interval = text.need_int("full_attention_interval", limit=MAX_LAYERS)
        if interval > num_layers:  # no full-attention layer at all: not a hybrid vLLM can page
            raise refuse(
                text.path("full_attention_interval"), f"at most num_hidden_layers ({num_layers})", interval
            )
        return _every(interval, num_layers, "full_attention", "linear_attention")
    if model_type.startswith(("qwen2", "qwen3")) or "use_sliding_window" in text.data:
        # transformers sets sliding_window to None unless use_sliding_window is true (Qwen families).
        if text.flag("use_sliding_window") and window:
            raise errors.InvalidModelConfig(
                "config.json sets use_sliding_window with max_window_layers; this layout is not modelled",
                field=text.path("use_sliding_window"),
            )
        return ["full_attention"] * num_layers
    if window:
        # vLLM's model-level sliding window (``cache_config.sliding_window``) applies to every layer.
        return ["sliding_attention"] * num_layers
    return ["full_attention"] * num_layers


def _nemotron_h_blocks(text: Fields, num_layers: int) -> list[str]:
    """Nemotron-H's blocks (``BLOCK_*``): ``layers_block_type`` (a list of names), else
    ``hybrid_override_pattern``."""
    names = text.strings("layers_block_type")
    if names is not None:
        field = "layers_block_type"
        unknown = next((n for n in names if n not in _NEMOTRON_H_BLOCK_NAMES), None)
        blocks = [_NEMOTRON_H_BLOCK_NAMES.get(n, "") for n in names]
        known = ", ".join(_NEMOTRON_H_BLOCK_NAMES)
    else:
        pattern = text.string("hybrid_override_pattern")
        if pattern is None:
            raise text.missing("hybrid_override_pattern", "layers_block_type")
        field = "hybrid_override_pattern"
        unknown = next((c for c in pattern if c not in _NEMOTRON_H_BLOCKS), None)
        blocks = [_NEMOTRON_H_BLOCKS.get(c, "") for c in pattern]
        known = "M Mamba2, * attention, - MLP, E MoE"
    if unknown is not None:
        raise errors.InvalidModelConfig(
            f"NemotronHForCausalLM: config.json's {field} has an unknown block {unknown[:40]!r} "
            f"(known: {known})",
            field=text.path(field),
        )
    if len(blocks) != num_layers:
        raise errors.InvalidModelConfig(
            f"config.json's {field} has {len(blocks)} blocks, num_hidden_layers says {num_layers}",
            field=text.path(field),
        )
    return blocks


def nemotron_h_num_layers(text: Fields) -> int | None:
    """transformers' NemotronHConfig takes the layer count from ``layers_block_type`` when it is given."""
    names = text.strings("layers_block_type")
    return len(names) if names else None


def nemotron_h_moe_layers(text: Fields) -> int | None:
    names = text.strings("layers_block_type")
    if names is not None:
        return sum(1 for n in names if n == "moe")
    pattern = text.string("hybrid_override_pattern")
    return pattern.count("E") if pattern is not None else None


def _ssm_dtype(text: Fields, model_type: str) -> str | None:
    """The recurrent state's dtype vLLM 0.33 picks with ``--mamba-ssm-cache-dtype auto``.

    Qwen3.5 takes the config's ``mamba_ssm_dtype``; Nemotron-H its ``mamba_ssm_cache_dtype``, float32
    when absent (``vllm/model_executor/models/config.py``); others the model's dtype.
    """
    if model_type.startswith("qwen3_5"):
        name = text.string("mamba_ssm_dtype")
    elif model_type == "nemotron_h":
        name = text.string("mamba_ssm_cache_dtype") or "float32"
    else:
        return None
    if name is not None and name not in ("float32", "float16", "bfloat16"):
        field = "mamba_ssm_dtype" if model_type.startswith("qwen3_5") else "mamba_ssm_cache_dtype"
        raise refuse(text.path(field), "float32, float16 or bfloat16", name)
    return name


def _linear_state(text: Fields, model_type: str) -> LinearStateSpec:
    if model_type in mamba.MAMBA_FAMILIES:
        return mamba.read_state(text, model_type, text.need_int("hidden_size", limit=MAX_HIDDEN_SIZE))
    if model_type == "nemotron_h":
        heads = text.need_int("mamba_num_heads", limit=MAX_HEADS)
        head_dim = text.need_int("mamba_head_dim", limit=MAX_HEAD_DIM)
        state = text.need_int("ssm_state_size", limit=MAX_HEAD_DIM)
        groups = text.need_int("n_groups", limit=MAX_HEADS)
        kernel = text.need_int("conv_kernel", limit=MAX_SMALL)
        return LinearStateSpec(
            heads * head_dim,
            kernel,
            heads,
            head_dim,
            state,
            MAMBA2,
            _ssm_dtype(text, model_type),
            groups,
            mixer_norms=True,
        )
    k_heads = text.need_int("linear_num_key_heads", limit=MAX_HEADS)
    v_heads = text.need_int("linear_num_value_heads", limit=MAX_HEADS)
    k_dim = text.need_int("linear_key_head_dim", limit=MAX_HEAD_DIM)
    v_dim = text.need_int("linear_value_head_dim", limit=MAX_HEAD_DIM)
    kernel = text.need_int("linear_conv_kernel_dim", limit=MAX_SMALL)
    return LinearStateSpec(
        2 * k_heads * k_dim + v_heads * v_dim,
        kernel,
        v_heads,
        k_dim,
        v_dim,
        GDN,
        _ssm_dtype(text, model_type),
    )


def _decilm_layers(text: Fields, num_layers: int, geometry: Geometry) -> list[LayerSpec] | None:
    """DeciLM / Nemotron-NAS ``block_configs``: per-layer attention (GQA group size, or none at all) and
    MLP width (``ffn_mult``, or none), as vLLM's ``nemotron_nas.py`` builds them."""
    blocks = text.raw("block_configs")
    if blocks is None:
        return None
    if not isinstance(blocks, list) or len(blocks) != num_layers:
        raise refuse(text.path("block_configs"), f"a list of {num_layers} block configs", blocks)
    hidden = text.need_int("hidden_size", limit=MAX_HIDDEN_SIZE)
    layers: list[LayerSpec] = []
    for index, block in enumerate(blocks):
        where = f"block_configs[{index}].attention"
        attention = block.get("attention") if isinstance(block, dict) else None
        if not isinstance(attention, dict):
            raise refuse(text.path(where), "an object", attention)
        mlp = _decilm_mlp(text, block, index, hidden)
        node = Fields(attention, text.path(where))
        if node.flag("no_op") or node.flag("replace_with_linear"):
            layers.append(LayerSpec(NO_KV, block=BLOCK_MLP, mlp_intermediate=mlp))
            continue
        if node.present("window_length") or node.present("num_sink_tokens"):
            raise errors.InvalidModelConfig(
                f"DeciLMForCausalLM: config.json's {where} sets a window or sink tokens; not modelled",
                field=text.path(where),
            )
        group = node.need_int("n_heads_in_group", limit=MAX_HEADS)
        if geometry.heads % group:
            raise refuse(node.path("n_heads_in_group"), f"a divisor of {geometry.heads}", group)
        kv = geometry.heads // group
        alone = BLOCK_ATTENTION if mlp == 0 else ""
        spec = LayerSpec(FULL, kv, geometry.head_dim, geometry.head_dim, block=alone, mlp_intermediate=mlp)
        layers.append(spec)
    return layers


def _decilm_mlp(text: Fields, block: dict[str, object], index: int, hidden: int) -> int:
    """One DeciLM layer's MLP width: 0 for a no-op FFN, else ``ffn_mult``'s (:func:`decilm_ffn_width`)
    or the block's own ``intermediate_size``."""
    where = f"block_configs[{index}].ffn"
    ffn = block.get("ffn")
    if not isinstance(ffn, dict):
        raise refuse(text.path(where), "an object", ffn)
    node = Fields(ffn, text.path(where))
    if node.flag("no_op"):
        return 0
    mult = ffn.get("ffn_mult")
    if mult is None:
        return node.need_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE)
    if isinstance(mult, bool) or not isinstance(mult, int | float) or not 0 < mult <= 64:
        raise refuse(node.path("ffn_mult"), "a number in (0, 64]", mult)
    return decilm_ffn_width(mult, hidden)


def decilm_ffn_width(ffn_mult: float, hidden: int) -> int:
    """vLLM's ``_ffn_mult_to_intermediate_size``: ``2 x ffn_mult x hidden / 3`` up to a multiple of 256."""
    size = int(2 * ffn_mult * hidden / 3)
    return -(-size // 256) * 256


def read_layers(
    text: Fields, model_type: str, num_layers: int, geometry: Geometry, window: int | None
) -> tuple[list[LayerSpec], LinearStateSpec | None]:
    """Every decoder layer of a (non-MLA) model, and the linear-attention state if it has such layers."""
    decilm = _decilm_layers(text, num_layers, geometry)
    if decilm is not None:
        return decilm, None
    if model_type in mimo.MODEL_TYPES:
        return mimo.read_mimo_v2_layers(text, num_layers), None
    kinds = _layer_types(text, model_type, num_layers, window)
    shared = text.optional_int("num_kv_shared_layers", limit=MAX_LAYERS, minimum=0) or 0
    if shared >= num_layers:
        raise refuse(text.path("num_kv_shared_layers"), f"below num_hidden_layers ({num_layers})", shared)
    unknown = next((name for name in kinds if name not in _KNOWN_KINDS), None)
    if unknown is not None:
        raise errors.InvalidModelConfig(
            f"config.json's layer_types has an unknown kind {unknown[:40]!r}", text.path("layer_types")
        )
    kv_heads, head_dim = geometry.kv_heads, geometry.head_dim
    global_kv = text.optional_int("num_global_key_value_heads", limit=MAX_HEADS) or kv_heads
    if model_type == "gemma4_text" and not text.flag("attention_k_eq_v"):
        global_kv = kv_heads  # transformers applies num_global_key_value_heads only with attention_k_eq_v
    if global_kv > geometry.heads:
        expected = f"at most num_attention_heads ({geometry.heads})"
        raise refuse(text.path("num_global_key_value_heads"), expected, global_kv)
    # Gemma 4's full layers default to 512-wide heads (transformers' ``global_head_dim``).
    default_global_hd = 512 if model_type == "gemma4_text" else head_dim
    global_hd = text.optional_int("global_head_dim", limit=MAX_HEAD_DIM) or default_global_hd
    by_name: dict[str, LayerSpec] = {}
    if any(name in _SLIDING_NAMES for name in kinds):
        if not window:
            raise errors.InvalidModelConfig(
                "config.json has sliding-attention layers but no 'sliding_window'",
                field=text.path("sliding_window"),
            )
        sliding = LayerSpec(SLIDING, kv_heads, head_dim, head_dim, window)
        by_name.update(dict.fromkeys(_SLIDING_NAMES, sliding))
    if "chunked_attention" in kinds:
        chunk = text.need_int("attention_chunk_size", limit=MAX_CONTEXT)
        by_name["chunked_attention"] = LayerSpec(CHUNKED, kv_heads, head_dim, head_dim, chunk)
    by_name.update(dict.fromkeys(_LINEAR_NAMES, LayerSpec(LINEAR)))
    by_name[_NO_KV_NAME] = LayerSpec(NO_KV)
    by_name.update(dict.fromkeys(_FULL_NAMES, LayerSpec(FULL, global_kv, global_hd, global_hd)))
    linear_state = None
    if model_type == "falcon_h1":  # the parallel hybrid: a Mamba2 mixer beside every attention layer
        with_state = LayerSpec(FULL, global_kv, global_hd, global_hd, with_state=True)
        return [with_state if name in _FULL_NAMES else by_name[name] for name in kinds], _linear_state(
            text, model_type
        )
    if any(name in _LINEAR_NAMES for name in kinds):
        if all(name in _LINEAR_NAMES for name in kinds):
            raise errors.InvalidModelConfig(
                "config.json has linear-attention layers only: vLLM pages its state beside attention "
                "layers, and a model without any is not modelled",
                field=text.path("layer_types" if "layer_types" in text.data else "full_attention_interval"),
            )
        linear_state = _linear_state(text, model_type)
    layers = [by_name[name] for name in kinds]
    if shared:
        # Gemma 3n / 4: the last ``num_kv_shared_layers`` layers read an earlier layer's cache and get no
        # KV spec of their own (vLLM ``gemma4.py``: ``kv_sharing_target_layer_name``); they build a
        # ``q_proj`` only, with the head size of their own layer type. Gemma 4's ``use_double_wide_mlp``
        # (E2B's config) doubles their MLP's width (vLLM 0.33 ``Gemma4DecoderLayer``: ``intermediate_size *
        # (2 if use_double_wide_mlp and is_kv_shared_layer else 1)``).
        wide = None
        if model_type == "gemma4_text" and text.flag("use_double_wide_mlp"):
            wide = 2 * text.need_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE)
        layers[num_layers - shared :] = [
            LayerSpec(NO_KV, head_dim=la.head_dim, mlp_intermediate=wide) for la in layers[-shared:]
        ]
    if model_type == "nemotron_h":  # one component per block: the weights count it alone
        blocks = _nemotron_h_blocks(text, num_layers)
        layers = [dataclasses.replace(la, block=b) for la, b in zip(layers, blocks, strict=True)]
    return layers, linear_state


def _moe_layers(text: Fields, model_type: str, num_layers: int) -> int:
    """How many decoder layers are MoE layers (the others are dense)."""
    first_dense = text.optional_int("first_k_dense_replace", limit=MAX_LAYERS, minimum=0)
    if first_dense is not None:
        if first_dense > num_layers:
            expected = f"at most num_hidden_layers ({num_layers})"
            raise refuse(text.path("first_k_dense_replace"), expected, first_dense)
        return num_layers - first_dense
    jamba = mamba.moe_layers(text, model_type, num_layers)
    if jamba is not None:
        return jamba
    nemotron = nemotron_h_moe_layers(text)
    if nemotron is not None:  # Nemotron-H: the MoE blocks
        return nemotron
    sparse_step = text.optional_int("decoder_sparse_step", limit=MAX_LAYERS)
    dense = text.ints("mlp_only_layers", limit=MAX_LAYERS)
    if sparse_step or dense:
        step, skip = sparse_step or 1, set(dense or ())
        return sum(1 for i in range(num_layers) if i not in skip and (i + 1) % step == 0)
    interleave = text.optional_int("interleave_moe_layer_step", limit=MAX_LAYERS)
    if interleave:
        return sum(1 for i in range(num_layers) if (i + 1) % interleave == 0)
    return num_layers


def read_moe(text: Fields, model_type: str, num_layers: int, hidden_intermediate: int) -> MoeSpec | None:
    """The MoE layout (routed and shared experts, which layers), or None for a dense model."""
    num_experts = text.optional_int(
        "num_local_experts", "num_experts", "n_routed_experts", limit=MAX_EXPERTS, minimum=0
    )
    if not num_experts or model_type == "gemma4_text" and not text.flag("enable_moe_block"):
        return None
    if model_type == "jamba" and num_experts == 1:  # JambaMoE only where layers_num_experts > 1
        return None
    top_k = text.optional_int(
        "num_experts_per_tok",
        "experts_per_token",
        "num_experts_per_token",
        "top_k_experts",
        "moe_topk",
        limit=MAX_EXPERTS,
    )
    if not top_k:
        raise errors.InvalidModelConfig(
            "config.json declares experts but no 'num_experts_per_tok'",
            field=text.path("num_experts_per_tok"),
        )
    if top_k > num_experts:
        raise refuse(text.path("num_experts_per_tok"), f"at most the {num_experts} experts", top_k)
    moe_inter = text.optional_int("moe_intermediate_size", limit=MAX_INTERMEDIATE_SIZE) or text.need_int(
        "intermediate_size", limit=MAX_INTERMEDIATE_SIZE
    )
    shared = 0
    n_shared = text.optional_int("n_shared_experts", "num_shared_experts", limit=MAX_EXPERTS, minimum=0)
    shared_size = text.optional_int(
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_intermediate_size",  # Granite-4.0-H's shared_mlp
        limit=MAX_INTERMEDIATE_SIZE,
        minimum=0,
    )
    if model_type == "nemotron_h" and shared_size:
        n_shared = 0  # moe_shared_expert_intermediate_size is the shared experts' total size
    if n_shared:
        shared = n_shared * moe_inter
    elif shared_size:
        shared = shared_size
    elif model_type == "llama4_text":
        shared = moe_inter
    parallel_dense = hidden_intermediate if model_type == "gemma4_text" else 0
    # The latent MoE of Kimi-K3 (vLLM ``KimiMoE``) and Nemotron 3 Super/Ultra (``fc1_latent_proj``): the
    # routed experts work in a narrower hidden size, with a projection into it and one out.
    latent = text.optional_int("routed_expert_hidden_size", "moe_latent_size", limit=MAX_HIDDEN_SIZE) or 0
    moe_layers = _moe_layers(text, model_type, num_layers)
    gated = bool(shared) and model_type in _SHARED_EXPERT_GATE
    fp32_router = model_type in vllm.FP32_ROUTER_MODEL_TYPES
    return MoeSpec(
        num_experts, top_k, moe_inter, moe_layers, shared, parallel_dense, latent, gated, fp32_router
    )


def read_vision_params(top: Fields, text_hidden: int) -> int:
    """Parameters of the vision tower and its projector (0 without a ``vision_config``)."""
    vc = top.child("vision_config")
    if vc is None:
        return 0
    exact = towers.read_tower_params(vc, text_hidden)
    if exact is not None:
        return exact
    h = vc.need_int("hidden_size", "embed_dim", "width", "vt_hidden_size", limit=MAX_HIDDEN_SIZE)
    layers = vc.need_int("num_hidden_layers", "depth", "num_layers", "vt_num_hidden_layers", limit=MAX_LAYERS)
    inter = vc.optional_int("intermediate_size", "vt_intermediate_size", limit=MAX_INTERMEDIATE_SIZE) or 4 * h
    gated = vc.string("hidden_act") in ("silu", "swiglu")
    per_layer = 4 * h * h + (3 if gated else 2) * h * inter
    patch = vc.optional_int("patch_size", limit=MAX_SMALL) or 14
    channels = vc.optional_int("num_channels", limit=MAX_SMALL) or 3
    out_dim = vc.optional_int("vision_output_dim", "projector_input_dim", limit=MAX_HIDDEN_SIZE) or h
    projector = out_dim * text_hidden + text_hidden * text_hidden
    return layers * per_layer + channels * patch * patch * h + projector
