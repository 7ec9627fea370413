"""Xiaomi MiMo-V2-Flash: its layers as vLLM 0.33's ``mimo_v2`` model class builds them.

``model_executor/models/mimo_v2.py::MiMoV2FlashDecoderLayer``: a layer whose
``hybrid_layer_pattern`` entry is 1 is a sliding-window ("compressed softmax") layer with its own
geometry (``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``, window
``sliding_window_size``, attention sinks, which add no KV bytes); a 0 is full attention with
``num_key_value_heads``, ``head_dim`` and ``v_head_dim``. The class clears the model-wide
``cache_config.sliding_window``, so the full layers are not windowed. Called by
:func:`kvpilot.tuner.model.readers.read_layers`.
"""

from __future__ import annotations

from kvpilot.tuner.model.fields import MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, Fields, Limit, refuse
from kvpilot.tuner.model.layers import FULL, SLIDING, LayerSpec

MODEL_TYPES = frozenset({"mimo_v2_flash", "mimo_v2"})
_PATTERN = Limit(1, "hybrid_layer_pattern holds 0 (full attention) or 1 (sliding window)")


def read_mimo_v2_layers(text: Fields, num_layers: int) -> list[LayerSpec]:
    """Every decoder layer: sliding where ``hybrid_layer_pattern`` says 1, full attention elsewhere."""
    pattern = text.ints("hybrid_layer_pattern", limit=_PATTERN) or [0] * num_layers
    if len(pattern) != num_layers:
        raise refuse(
            text.path("hybrid_layer_pattern"), f"{num_layers} entries (num_hidden_layers)", len(pattern)
        )
    heads = text.need_int("num_attention_heads", limit=MAX_HEADS)
    head_dim = (
        text.optional_int("head_dim", limit=MAX_HEAD_DIM)
        or text.need_int("hidden_size", limit=Limit(1 << 20, "hidden sizes")) // heads
    )
    full = LayerSpec(
        FULL,
        text.need_int("num_key_value_heads", limit=MAX_HEADS),
        head_dim,
        text.optional_int("v_head_dim", limit=MAX_HEAD_DIM) or head_dim,
    )
    if 1 not in pattern:
        return [full] * num_layers
    swa_head_dim = text.need_int("swa_head_dim", limit=MAX_HEAD_DIM)
    sliding = LayerSpec(
        SLIDING,
        text.need_int("swa_num_key_value_heads", limit=MAX_HEADS),
        swa_head_dim,
        text.optional_int("swa_v_head_dim", limit=MAX_HEAD_DIM) or swa_head_dim,
        text.need_int("sliding_window_size", limit=MAX_CONTEXT),
    )
    return [sliding if kind == 1 else full for kind in pattern]
