"""The Mamba families' layers and state: Mamba, FalconMamba, Mamba2, Jamba, Falcon-H1, Granite-4.0-H
(GraniteMoeHybrid) and LFM2's short convolution.

Sits beside :mod:`kvpilot.tuner.model.readers` (which asks it for these model types' layer kinds and
state) and below :mod:`kvpilot.tuner.model.spec`. What it reads is what the pinned vLLM 0.33 model files
read (``vllm/model_executor/models/``), through transformers' config classes where vLLM does:

* ``mamba.py`` (``MambaForCausalLM``, ``FalconMambaForCausalLM``) and ``mamba2.py``: attention-free, every
  layer a Mamba / Mamba2 mixer. Mamba: ``mamba1_state_shape(intermediate_size, state_size,
  conv_kernel)``; Mamba2: ``mamba2_state_shape(expand x hidden_size, n_groups, num_heads, head_dim,
  state_size, conv_kernel)``;
* ``jamba.py``: ``config.layers_block_type`` (transformers' ``JambaConfig``: attention where ``i %
  attn_layer_period == attn_layer_offset``, else Mamba), Mamba state ``mamba1_state_shape(mamba_expand x
  hidden_size, mamba_d_state, mamba_d_conv)``; MoE where ``i % expert_layer_period ==
  expert_layer_offset`` (``layers_num_experts``);
* ``falcon_h1.py``: a parallel hybrid, every decoder layer holds an attention layer and a Mamba2 mixer
  (``mamba_d_ssm``, else ``int(mamba_expand x hidden_size)``; ``mamba_n_groups``, ``mamba_n_heads``,
  ``mamba_d_head``, ``mamba_d_state``, ``mamba_d_conv``);
* ``granitemoehybrid.py``: ``config.layer_types`` ("mamba" / "attention", transformers' legacy names, or
  "linear_attention" / "full_attention"), Mamba2 state from ``mamba_expand x hidden_size`` and the
  ``mamba_*`` fields (``mamba_d_head`` "auto": the intermediate size over the heads);
* ``lfm2.py`` / ``lfm2_moe.py``: ``config.layer_types`` ("conv" / "full_attention"; transformers'
  ``Lfm2Config`` builds it from ``full_attn_idxs``), short-conv state ``short_conv_state_shape(conv_dim,
  conv_L_cache)`` (LFM2-MoE: ``hidden_size``).

The state dtypes are ``MambaStateDtypeCalculator``'s with ``--mamba-cache-dtype auto`` and
``--mamba-ssm-cache-dtype auto``: both the model's dtype (no config hook of these families changes them;
Nemotron-H's float32 default is its own, in :mod:`.readers`).
"""

from __future__ import annotations

from kvpilot.tuner import errors
from kvpilot.tuner.model.fields import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    Fields,
    Limit,
    refuse,
)
from kvpilot.tuner.model.layers import MAMBA1, MAMBA2, SHORT_CONV, LinearStateSpec

ATTENTION_FREE = frozenset({"mamba", "falcon_mamba", "mamba2"})
"""Model types with no attention layer at all (vLLM's ``IsAttentionFree``)."""
HYBRID = frozenset({"jamba", "falcon_h1", "granitemoehybrid", "lfm2", "lfm2_moe"})
"""Model types with attention beside Mamba or short-conv layers (vLLM's ``IsHybrid``)."""
MAMBA_FAMILIES = ATTENTION_FREE | HYBRID

_LINEAR, _FULL = "linear_attention", "full_attention"
_NAMES = {
    "mamba": _LINEAR,
    "linear_attention": _LINEAR,
    "conv": _LINEAR,
    "attention": _FULL,
    "full_attention": _FULL,
}
_STATE_SIZE = Limit(65_536, "transformers' Falcon-H1 and Granite-4.0-H defaults are 256")
_STEP_RANK = Limit(1 << 20, "transformers' Jamba default is 256")


def layer_kinds(text: Fields, model_type: str, num_layers: int) -> list[str]:
    """Per-layer kind names ("linear_attention" for a Mamba / short-conv layer, "full_attention"), as
    each family's vLLM model file decides them. Falcon-H1's layers are all "full_attention": each also
    runs a Mamba2 mixer (:func:`parallel_state`)."""
    if model_type in ATTENTION_FREE:
        return [_LINEAR] * num_layers
    if model_type == "falcon_h1":
        return [_FULL] * num_layers
    declared = text.strings("layer_types")
    if declared is None and model_type == "jamba":
        period = text.optional_int("attn_layer_period", limit=MAX_LAYERS) or 8  # JambaConfig's defaults
        offset = text.optional_int("attn_layer_offset", limit=MAX_LAYERS, minimum=0)
        offset = 4 if offset is None else offset
        if offset >= period:
            raise refuse(text.path("attn_layer_offset"), f"below attn_layer_period ({period})", offset)
        return [_FULL if i % period == offset else _LINEAR for i in range(num_layers)]
    if declared is None and model_type == "lfm2":
        full = text.ints("full_attn_idxs", limit=MAX_LAYERS, minimum=0)
        if full is None:  # Lfm2Config: every layer attention when neither is given
            return [_FULL] * num_layers
        return [_FULL if i in set(full) else _LINEAR for i in range(num_layers)]
    if declared is None:
        raise text.missing("layer_types")
    if len(declared) != num_layers:
        raise errors.InvalidModelConfig(
            f"config.json's layer_types lists {len(declared)} layers, num_hidden_layers says {num_layers}",
            field=text.path("layer_types"),
        )
    unknown = next((name for name in declared if name not in _NAMES), None)
    if unknown is not None:
        raise errors.InvalidModelConfig(
            f"config.json's layer_types has an unknown kind {unknown[:40]!r} for {model_type} "
            f"(known: {', '.join(_NAMES)})",
            text.path("layer_types"),
        )
    return [_NAMES[name] for name in declared]


def read_state(text: Fields, model_type: str, hidden: int) -> LinearStateSpec:
    """One Mamba / Mamba2 / short-conv layer's per-request state (both dtypes the model's)."""
    if model_type in ("mamba", "falcon_mamba", "jamba"):
        return _mamba1(text, model_type, hidden)
    if model_type in ("lfm2", "lfm2_moe"):
        name = "conv_dim" if model_type == "lfm2" else "hidden_size"  # what each model file reads
        dim = text.need_int(name, limit=MAX_INTERMEDIATE_SIZE)
        kernel = text.need_int("conv_L_cache", limit=MAX_SMALL)
        return LinearStateSpec(dim, kernel, 0, 0, 0, SHORT_CONV)
    return _mamba2(text, model_type, hidden)


def _mamba1(text: Fields, model_type: str, hidden: int) -> LinearStateSpec:
    if model_type == "jamba":
        expand = text.optional_int("mamba_expand", limit=MAX_SMALL) or 2
        inter = expand * hidden
        names = ("mamba_d_state", "mamba_d_conv", "mamba_dt_rank")
    else:  # MambaConfig: intermediate_size defaults to expand x hidden_size
        expand = text.optional_int("expand", limit=MAX_SMALL) or 2
        inter = text.optional_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE) or expand * hidden
        names = ("state_size", "conv_kernel", "time_step_rank")
    state = text.need_int(names[0], limit=_STATE_SIZE)
    kernel = text.need_int(names[1], limit=MAX_SMALL)
    rank = _time_step_rank(text, names[2], hidden)
    jamba = model_type == "jamba"  # JambaMambaDecoderLayer: MambaMixer(use_rms_norm=True)
    return LinearStateSpec(inter, kernel, 0, 0, state, MAMBA1, time_step_rank=rank, mixer_norms=jamba)


def _time_step_rank(text: Fields, name: str, hidden: int) -> int:
    """``time_step_rank`` / ``mamba_dt_rank``: an integer, or "auto" (``ceil(hidden / 16)``, transformers)."""
    if text.raw(name) == "auto" or not text.present(name):
        return -(-hidden // 16)
    return text.need_int(name, limit=_STEP_RANK)


def _mamba2(text: Fields, model_type: str, hidden: int) -> LinearStateSpec:
    """Mamba2, Falcon-H1 and Granite-4.0-H: the mixer's intermediate size, groups, heads and state."""
    if model_type == "mamba2":
        names = ("n_groups", "num_heads", "head_dim", "state_size", "conv_kernel")
        expand = text.optional_int("expand", limit=MAX_SMALL) or 2
        inter = expand * hidden
    else:
        names = ("mamba_n_groups", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_d_conv")
        expand = text.optional_int("mamba_expand", limit=MAX_SMALL) or 2
        inter = expand * hidden
        if model_type == "falcon_h1":
            inter = text.optional_int("mamba_d_ssm", limit=MAX_INTERMEDIATE_SIZE) or inter
    groups = text.need_int(names[0], limit=MAX_HEADS)
    heads = text.need_int(names[1], limit=MAX_HEADS)
    # GraniteMoeHybridConfig's "auto": the intermediate size over the heads.
    auto = text.raw(names[2]) == "auto"
    head_dim = inter // heads if auto else text.need_int(names[2], limit=MAX_HEAD_DIM)
    state = text.need_int(names[3], limit=_STATE_SIZE)
    kernel = text.need_int(names[4], limit=MAX_SMALL)
    norm = model_type != "falcon_h1" or text.flag("mamba_rms_norm")  # MambaMixer2(use_rms_norm=...)
    return LinearStateSpec(inter, kernel, heads, head_dim, state, MAMBA2, None, groups, mixer_norms=norm)


def moe_layers(text: Fields, model_type: str, num_layers: int) -> int | None:
    """Jamba's MoE layers (``layers_num_experts``: ``i % expert_layer_period == expert_layer_offset``),
    LFM2-MoE's (all but the first ``num_dense_layers``); None for the other families (the shared rules
    apply)."""
    if model_type == "lfm2_moe":
        dense = text.optional_int("num_dense_layers", limit=MAX_LAYERS, minimum=0) or 0
        if dense > num_layers:
            raise refuse(text.path("num_dense_layers"), f"at most num_hidden_layers ({num_layers})", dense)
        return num_layers - dense
    if model_type != "jamba":
        return None
    period = text.optional_int("expert_layer_period", limit=MAX_LAYERS) or 2
    offset = text.optional_int("expert_layer_offset", limit=MAX_LAYERS, minimum=0)
    offset = 1 if offset is None else offset
    return sum(1 for i in range(num_layers) if i % period == offset)


def dense_intermediate(text: Fields, model_type: str, intermediate: int) -> int:
    """The dense MLP's size where the family's model file derives it: LFM2's ``Lfm2MLP`` (``2/3`` of
    ``intermediate_size`` times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of`` when
    ``block_auto_adjust_ff_dim``), Granite-4.0-H's ``shared_mlp`` (``shared_intermediate_size``: its only MLP
    without experts)."""
    if model_type == "lfm2" and text.raw("block_auto_adjust_ff_dim") is not False:
        size = int(2 * intermediate / 3)
        multiplier = text.optional_float("block_ffn_dim_multiplier", maximum=64.0)
        if multiplier is not None:
            size = int(multiplier * size)
        multiple = text.optional_int("block_multiple_of", limit=MAX_INTERMEDIATE_SIZE) or 256
        return multiple * -(-size // multiple)
    if model_type == "granitemoehybrid":
        shared = text.optional_int("shared_intermediate_size", limit=MAX_INTERMEDIATE_SIZE, minimum=0)
        return shared or intermediate
    return intermediate


__all__ = [
    "ATTENTION_FREE",
    "HYBRID",
    "MAMBA_FAMILIES",
    "dense_intermediate",
    "layer_kinds",
    "moe_layers",
    "read_state",
]
