"""An EAGLE3 draft checkpoint's ``config.json``, read into what its drafter's memory depends on.

What vLLM 0.33 builds from these fields is in :mod:`kvpilot.tuner.vllm.eagle3` (with citations); this
module only reads the config, type- and range-checked like :func:`.spec.build_model_spec`. The
checkpoint's weights are never read: kvpilot takes the published EAGLE3 checkpoints' layout (no
``embed_tokens``, an ``lm_head`` of ``draft_vocab_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model.fields import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    MAX_VOCAB_SIZE,
    Fields,
)


@dataclass(frozen=True, slots=True)
class Eagle3DraftSpec:
    """An EAGLE3 drafter of Llama's shape (``Eagle3LlamaForCausalLM``), as its config describes it."""

    architecture: str
    """The class vLLM builds for it (:func:`kvpilot.tuner.vllm.eagle3_architecture`)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    """The LM head's vocabulary (``vocab_size`` when the config has none)."""
    target_hidden_size: int
    """The width of each target hidden state ``fc`` reads (``hidden_size`` when absent)."""
    num_aux_hidden_states: int
    """How many target hidden states ``fc`` reads (0: ``use_aux_hidden_state`` false, no ``fc``)."""
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False


def read_eagle3_draft(config: Mapping[str, Any]) -> Eagle3DraftSpec:
    """The :class:`Eagle3DraftSpec` of a draft checkpoint's ``config.json``; raises
    :class:`~kvpilot.tuner.errors.InvalidModelConfig` for a config kvpilot cannot size (another drafter
    class, a quantized draft, a missing field)."""
    top = Fields(config)
    archs = top.strings("architectures") or []
    if not archs:
        raise top.missing("architectures")
    architecture = vllm.eagle3_architecture(archs[0])
    if architecture not in vllm.EAGLE3_LLAMA_ARCHITECTURES:
        known = ", ".join(vllm.EAGLE3_LLAMA_ARCHITECTURES)
        raise errors.InvalidModelConfig(
            f"the draft config's architecture {archs[0]!r} is vLLM's {architecture!r} under eagle3, which "
            f"kvpilot does not model (it models {known}: vLLM's Eagle3LlamaForCausalLM)",
            field="architectures",
        )
    if top.present("quantization_config"):
        raise errors.InvalidModelConfig(
            "the draft config has a quantization_config: kvpilot models unquantized EAGLE3 drafters",
            field="quantization_config",
        )
    hidden = top.need_int("hidden_size", limit=MAX_HIDDEN_SIZE)
    heads = top.need_int("num_attention_heads", limit=MAX_HEADS)
    kv = top.optional_int("num_key_value_heads", limit=MAX_HEADS) or heads
    head_dim = top.optional_int("head_dim", limit=MAX_HEAD_DIM) or hidden // heads
    vocab = top.need_int("vocab_size", limit=MAX_VOCAB_SIZE)
    eagle = top.child("eagle_config") or Fields({}, "eagle_config")
    use_aux = eagle.optional_bool("use_aux_hidden_state")
    aux = 0
    if use_aux is None or use_aux:
        ids = eagle.ints("eagle_aux_hidden_state_layer_ids", limit=MAX_LAYERS)
        aux = top.optional_int("num_aux_hidden_states", limit=MAX_SMALL) or (len(ids) if ids else 3)
    norm_before_fc = eagle.optional_bool("norm_before_fc")
    return Eagle3DraftSpec(
        architecture=architecture,
        num_layers=top.need_int("num_hidden_layers", limit=MAX_LAYERS),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=top.need_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE),
        vocab_size=vocab,
        draft_vocab_size=top.optional_int("draft_vocab_size", limit=MAX_VOCAB_SIZE) or vocab,
        target_hidden_size=top.optional_int("target_hidden_size", limit=MAX_HIDDEN_SIZE) or hidden,
        num_aux_hidden_states=aux,
        attention_bias=top.flag("attention_bias"),
        mlp_bias=top.flag("mlp_bias"),
        norm_before_fc=norm_before_fc if norm_before_fc is not None else top.flag("norm_before_fc"),
        fc_norm=top.flag("fc_norm"),
    )
