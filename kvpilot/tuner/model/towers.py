"""Encoder towers counted parameter for parameter as vLLM 0.33 builds them: Gemma 4's vision and audio
towers, and the Qwen3-VL / Qwen3.5 vision transformer.

Gemma 4: vLLM 0.33's ``gemma4_mm.py`` builds transformers' ``Gemma4VisionModel`` and ``Gemma4AudioModel``
(``transformers/models/gemma4/modeling_gemma4.py``) and its own ``Gemma4MultimodalEmbedder``
projections into the text width. A published ``vision_config`` / ``audio_config`` often names only a
few fields (Gemma-4-31B's names five); the rest are the config classes' defaults
(``configuration_gemma4.py``: :data:`VISION_DEFAULTS`, :data:`AUDIO_DEFAULTS`), which is how the
towers get 12 KV heads of 64 under 16 query heads, and a 2 x 10240-row position table.

Qwen3-VL / Qwen3.5: ``qwen3_vl.py``'s ``Qwen3_VisionTransformer`` (LayerNorms and linears with biases, a
non-gated MLP, a learned position table, the patch merger and one "deepstack" merger per
``deepstack_visual_indexes`` entry).

Held to vLLM's own classes on the meta device by ``tests/contract/test_contract_model_classes.py``
(Gemma 4 E2B, E4B, 26B-A4B, 31B; Qwen3-VL-2B, Qwen3.5-9B: exact to the byte; Gemma 4 E2B and Qwen3.5-9B
also at TP 2, rank by rank).
"""

from __future__ import annotations

from kvpilot.tuner.model.fields import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    Fields,
    Limit,
)

GEMMA4_VISION = "gemma4_vision"
GEMMA4_AUDIO = "gemma4_audio"
QWEN3_VISION = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"})
"""``vision_config.model_type`` of the towers vLLM builds as ``Qwen3_VisionTransformer``."""

VISION_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
}
"""``Gemma4VisionConfig``'s defaults (transformers 5.x)."""

AUDIO_DEFAULTS = {
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "conv_kernel_size": 5,
    "output_proj_dims": 1536,
}
"""``Gemma4AudioConfig``'s defaults (transformers 5.x); ``subsampling_conv_channels`` is (128, 32)."""

AUDIO_CONV_CHANNELS = (128, 32)
IMAGE_CHANNELS = 3


def _int(fields: Fields, name: str, defaults: dict[str, int], limit: Limit) -> int:
    value = fields.optional_int(name, limit=limit)
    return value if value is not None else defaults[name]


def compute_gemma4_vision_params(vc: Fields, text_hidden: int) -> int:
    """``Gemma4VisionModel`` (patch embedder, encoder layers) plus ``embed_vision``'s projection."""
    d = VISION_DEFAULTS
    h = _int(vc, "hidden_size", d, MAX_HIDDEN_SIZE)
    inter = _int(vc, "intermediate_size", d, MAX_INTERMEDIATE_SIZE)
    heads = _int(vc, "num_attention_heads", d, MAX_HEADS)
    kv_heads = _int(vc, "num_key_value_heads", d, MAX_HEADS)
    head_dim = _int(vc, "head_dim", d, MAX_HEAD_DIM)
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim  # q, o; k, v
    norms = 4 * h + 2 * head_dim  # input, post-attention, pre/post-feedforward; q/k norms
    per_layer = attention + 3 * h * inter + norms  # gated MLP
    patch = _int(vc, "patch_size", d, MAX_SMALL)
    embedder = (
        IMAGE_CHANNELS * patch * patch * h + 2 * _int(vc, "position_embedding_size", d, MAX_HIDDEN_SIZE) * h
    )
    return _int(vc, "num_hidden_layers", d, MAX_LAYERS) * per_layer + embedder + h * text_hidden


def compute_gemma4_audio_params(ac: Fields, text_hidden: int) -> int:
    """``Gemma4AudioModel`` (sub-sampling convolutions, conformer layers, output projection) plus
    ``embed_audio``'s projection."""
    d = AUDIO_DEFAULTS
    h = _int(ac, "hidden_size", d, MAX_HIDDEN_SIZE)
    head_dim = h // _int(ac, "num_attention_heads", d, MAX_HEADS)
    c0, c1 = AUDIO_CONV_CHANNELS
    subsample = (
        (9 * c0 + c0) + (9 * c0 * c1 + c1) + (c0 // 4) * c1 * h
    )  # two 3x3 convs with norms; input proj
    feed_forward = 2 * (2 * 4 * h * h + 2 * h)  # two macaron blocks: h -> 4h -> h, pre/post norms
    light_conv = 2 * h * h + h * h + _int(ac, "conv_kernel_size", d, MAX_SMALL) * h + 2 * h
    attention = 5 * h * h + head_dim  # q, k, v, post, relative_k; per-dim scale
    per_layer = feed_forward + light_conv + attention + 3 * h  # pre/post-attention and output norms
    out = _int(ac, "output_proj_dims", d, MAX_HIDDEN_SIZE)
    layers = _int(ac, "num_hidden_layers", d, MAX_LAYERS)
    return subsample + layers * per_layer + (h * out + out) + out * text_hidden


def read_audio_params(top: Fields, text_hidden: int) -> int:
    """Parameters of the audio tower and its projector (0 without a Gemma 4 ``audio_config``)."""
    ac = top.child("audio_config")
    if ac is None or ac.string("model_type") != GEMMA4_AUDIO:
        return 0
    return compute_gemma4_audio_params(ac, text_hidden)


def compute_qwen3_vision_params(vc: Fields, text_hidden: int) -> int:
    """``Qwen3_VisionTransformer``: patch embedding, position table, blocks, the merger and the deepstack
    mergers into ``out_hidden_size`` (the text width when absent)."""
    h = vc.need_int("hidden_size", limit=MAX_HIDDEN_SIZE)
    inter = vc.need_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE)
    patch = vc.need_int("patch_size", limit=MAX_SMALL)
    temporal = vc.optional_int("temporal_patch_size", limit=MAX_SMALL) or 2
    channels = vc.optional_int("in_channels", limit=MAX_SMALL) or IMAGE_CHANNELS
    positions = vc.need_int("num_position_embeddings", limit=MAX_HIDDEN_SIZE)
    merged = h * (vc.optional_int("spatial_merge_size", limit=MAX_SMALL) or 2) ** 2
    out = vc.optional_int("out_hidden_size", limit=MAX_HIDDEN_SIZE) or text_hidden
    block = (
        (4 * h * h + 4 * h) + (2 * h * inter + inter + h) + 4 * h
    )  # qkv and proj; fc1, fc2; two LayerNorms
    projection = (merged * merged + merged) + (merged * out + out)  # fc1, fc2 (with biases)
    merger = 2 * h + projection  # LayerNorm over the patch width before the shuffle
    deepstack = len(vc.ints("deepstack_visual_indexes", limit=MAX_LAYERS) or ())
    deepstack_merger = 2 * merged + projection  # LayerNorm after the shuffle
    embed = channels * temporal * patch * patch * h + h + positions * h
    depth = vc.need_int("depth", limit=MAX_LAYERS)
    return embed + depth * block + merger + deepstack * deepstack_merger


def compute_qwen3_vision_whole_params(vc: Fields, text_hidden: int) -> int:
    """The part of ``Qwen3_VisionTransformer`` every TP rank holds whole (vLLM 0.33 ``qwen3_vl.py``): the
    patch embedding (``Conv3dLayer``, line 392) and the position table (``nn.Embedding``, line 617), each
    block's two LayerNorms (lines 469-470) and the biases of its row-parallel ``proj`` and ``linear_fc2``
    (a ``RowParallelLinear`` keeps its bias whole), and in every merger its LayerNorm (line 530) and its
    ``linear_fc2`` bias. The rest (``qkv``, the ``proj`` and ``fc2`` weights, ``fc1``) is split by TP."""
    h = vc.need_int("hidden_size", limit=MAX_HIDDEN_SIZE)
    patch = vc.need_int("patch_size", limit=MAX_SMALL)
    temporal = vc.optional_int("temporal_patch_size", limit=MAX_SMALL) or 2
    channels = vc.optional_int("in_channels", limit=MAX_SMALL) or IMAGE_CHANNELS
    positions = vc.need_int("num_position_embeddings", limit=MAX_HIDDEN_SIZE)
    merged = h * (vc.optional_int("spatial_merge_size", limit=MAX_SMALL) or 2) ** 2
    out = vc.optional_int("out_hidden_size", limit=MAX_HIDDEN_SIZE) or text_hidden
    depth = vc.need_int("depth", limit=MAX_LAYERS)
    deepstack = len(vc.ints("deepstack_visual_indexes", limit=MAX_LAYERS) or ())
    embed = channels * temporal * patch * patch * h + h + positions * h
    block = 4 * h + h + h  # two LayerNorms; the proj and fc2 biases
    return embed + depth * block + (2 * h + out) + deepstack * (2 * merged + out)


def read_tower_whole_params(top: Fields, text_hidden: int) -> int:
    """The towers' parameters every TP rank holds whole when the rest is split: the Qwen3 vision tower's
    (:func:`compute_qwen3_vision_whole_params`); 0 for the others (all split, or all whole:
    :func:`replicated`)."""
    vc = top.child("vision_config")
    if vc is None or vc.string("model_type") not in QWEN3_VISION:
        return 0
    return compute_qwen3_vision_whole_params(vc, text_hidden)


def read_tower_params(vc: Fields, text_hidden: int) -> int | None:
    """The vision tower's parameters where vLLM's class is modelled exactly (:data:`GEMMA4_VISION`,
    :data:`QWEN3_VISION`); ``None`` for the others (the generic estimate applies)."""
    kind = vc.string("model_type")
    if kind == GEMMA4_VISION:
        return compute_gemma4_vision_params(vc, text_hidden)
    if kind in QWEN3_VISION:
        return compute_qwen3_vision_params(vc, text_hidden)
    return None


def replicated(top: Fields) -> bool:
    """Whether vLLM keeps the towers whole on every TP rank: Gemma 4's are transformers' own modules (plain
    ``nn.Linear``), not vLLM's parallel layers (held at TP 2 by the model-class contract)."""
    vc = top.child("vision_config")
    return vc is not None and vc.string("model_type") == GEMMA4_VISION
