"""The GPU memory of vLLM 0.33's EAGLE3 drafter (``Eagle3LlamaForCausalLM``) on one TP rank.

:mod:`kvpilot.tuner.vllm.eagle3` holds vLLM's facts and cites them; :mod:`kvpilot.tuner.model.eagle3`
reads the draft's ``config.json``; this is the arithmetic: the drafter's weights once loaded (its decoder
layers, ``fc`` and norms, its ``lm_head`` over ``draft_vocab_size`` and the ``int64`` ``d2t`` mapping; not
the embedding, which the proposer replaces with the target's) and its attention layers, appended to the
target's in the KV pool. The proposer's buffers are the MTP path's
(:func:`.speculative.compute_proposer_buffer_bytes`).

Not budgeted: ``mask_hidden`` (``parallel_drafting`` only, ``fc``'s input width), a draft checkpoint
that holds its own ``embed_tokens`` different from the target's (kvpilot reads no weights: it takes the
published EAGLE3 layout), a ``draft_vocab_size`` head identical to the target's (counted as the draft's).
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory.draft_model import describe_missing_draft_config
from kvpilot.tuner.memory.weights import pad_vocab
from kvpilot.tuner.model import DTYPE_BYTES, FULL, Eagle3DraftSpec, LayerSpec, ModelSpec, read_eagle3_draft

_INT64 = 8


def compute_eagle3_weight_bytes(
    draft: Eagle3DraftSpec, target: ModelSpec, *, tensor_parallel_size: int = 1, dtype: str | None = None
) -> int:
    """Bytes of the EAGLE3 drafter's weights on one TP rank once loaded, in the target's dtype (the
    draft's ``ModelConfig`` takes it)."""
    tp = tensor_parallel_size
    b = DTYPE_BYTES[dtype or target.dtype]
    h, hd = draft.hidden_size, draft.head_dim
    q = (draft.num_attention_heads // tp) * hd
    kv = max(1, draft.num_kv_heads // tp) * hd
    inter = draft.intermediate_size // tp
    params = 0
    for i in range(draft.num_layers):
        width = 2 * h if i == 0 else h  # the first layer reads the embedding and the hidden state
        params += width * (q + 2 * kv) + q * h  # qkv_proj, o_proj
        if draft.attention_bias:
            params += q + 2 * kv + h  # o_proj's bias is whole on every rank
        params += 3 * h * inter  # gate_up_proj, down_proj
        if draft.mlp_bias:
            params += 2 * inter + h
        params += 3 * h  # input_layernorm, post_attention_layernorm, hidden_norm
    fc_in = draft.target_hidden_size * draft.num_aux_hidden_states
    if draft.num_aux_hidden_states:
        params += fc_in * h  # fc: a ReplicatedLinear, whole on every rank
        params += fc_in if draft.norm_before_fc else 0
        params += fc_in if draft.fc_norm else 0
    params += h  # norm
    params += pad_vocab(draft.draft_vocab_size) // tp * h  # lm_head (ParallelLMHead)
    d2t = _INT64 * draft.draft_vocab_size if draft.draft_vocab_size != target.vocab_size else 0
    return params * b + d2t


def with_eagle3_layers(model: ModelSpec, draft: Eagle3DraftSpec) -> ModelSpec:
    """``model`` with the drafter's attention layers appended (full attention with the draft's KV heads
    and head size): the model the KV layout is computed for."""
    layer = LayerSpec(
        FULL, num_kv_heads=draft.num_kv_heads, head_dim=draft.head_dim, head_dim_v=draft.head_dim
    )
    return dataclasses.replace(
        model,
        num_layers=model.num_layers + draft.num_layers,
        layers=model.layers + (layer,) * draft.num_layers,
    )


def eagle3_unbudgeted_reason(spec: vllm.SpeculativeFlags, pp: int = 1) -> str | None:
    """Why kvpilot cannot budget the EAGLE3 drafter of ``spec``, or ``None`` when it does."""
    if spec.draft_config is None:
        return describe_missing_draft_config(spec, "the draft checkpoint")
    try:
        read_eagle3_draft(spec.draft_config)
    except errors.InvalidModelConfig as exc:
        return f"method 'eagle3': {exc}"
    if pp > 1:
        return "with pipeline parallelism the drafter's embedding is not shared; kvpilot models one stage"
    return None


def budgeted_eagle3_draft(spec: vllm.SpeculativeFlags | None, pp: int = 1) -> Eagle3DraftSpec | None:
    """The EAGLE3 drafter the budget counts for ``spec``; ``None``: none (or one kvpilot cannot size)."""
    if spec is None or spec.method != vllm.EAGLE3 or spec.draft_config is None:
        return None
    try:  # read once, then :func:`eagle3_unbudgeted_reason`'s layout check
        draft = read_eagle3_draft(spec.draft_config)
    except errors.InvalidModelConfig:
        return None
    return None if pp > 1 else draft
