"""The GPU memory of vLLM 0.33's separate draft model (``method: draft_model``) on one TP rank.

:mod:`kvpilot.tuner.vllm.draft_model` holds vLLM's facts and cites them; the draft's ``config.json`` is
read by :func:`kvpilot.tuner.model.build_model_spec` like any model's (the draft is an ordinary causal
LM); this is the arithmetic, through the functions that size any model:

* the draft's weights once loaded: the whole model (:func:`.weights.compute_weight_breakdown`: its
  embedding and ``lm_head`` too, which it shares with nothing), in the target's dtype, quantized as its
  own config says, split over the target's TP. Not its rotary cache: ``get_rope`` hands it the target's
  when their parameters match (a draft of the target's family);
* its attention layers, appended to the target's in the KV pool (:func:`with_draft_model_layers`);
* the proposer's buffers (:func:`.speculative.compute_proposer_buffer_bytes` with the draft: the
  standalone speculator's, no target hidden states).

Not budgeted (:func:`draft_model_unbudgeted_reason` names what; the plan warns): a draft with pipeline
parallelism (kvpilot models one stage), a draft TP other than the target's (1 under Model Runner V2), a
draft whose layers are not plain attention (MLA, linear attention, compressed attention: their pages are
the target's model-wide facts in kvpilot's KV layout), a multimodal draft, the speculative config's own
``kv_cache_dtype`` or ``quantization`` for the draft; and, not named: Model Runner V2's lowering of
``max_model_len`` to a shorter draft's, ``expanded_slot_mappings`` (allocated once the KV cache is sized).
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory.weights import compute_weight_breakdown
from kvpilot.tuner.model import FULL, SLIDING, ModelSpec, build_model_spec

_PLAIN_ATTENTION = (FULL, SLIDING)


def read_draft_model(spec: vllm.SpeculativeFlags) -> ModelSpec:
    """The draft's :class:`ModelSpec` from ``spec.draft_config``; raises
    :class:`~kvpilot.tuner.errors.InvalidModelConfig` for a config kvpilot cannot size, or one vLLM reads
    as another method (an MTP ``model_type``, a DFlash or DSpark drafter)."""
    config = spec.draft_config
    if config is None:
        raise errors.InvalidModelConfig("no draft config.json was given", field=None)
    method = vllm.draft_method_by_config(config)
    if method != vllm.DRAFT_MODEL:
        raise errors.InvalidModelConfig(
            f"vLLM takes this draft config (model_type {config.get('model_type')!r}, architectures "
            f"{config.get('architectures')!r}) as method {method!r}, not 'draft_model'",
            field="model_type",
        )
    draft = build_model_spec(config)
    odd = sorted({layer.kind for layer in draft.layers} - set(_PLAIN_ATTENTION))
    if odd or draft.linear_state is not None:
        raise errors.InvalidModelConfig(
            f"the draft model {draft.architecture} has {', '.join(odd) or 'state'} layers: kvpilot models "
            "draft models of full or sliding-window attention",
            field="architectures",
        )
    if draft.is_multimodal:
        raise errors.InvalidModelConfig(
            f"the draft model {draft.architecture} is multimodal: kvpilot models text draft models",
            field="architectures",
        )
    return draft


DRAFT_CONFIG_FLAG_HINT = (
    f"kvpilot plan {vllm.DRAFT_CONFIG_FLAG} PATH gives it: a config.json or a folder holding one"
)
"""How ``kvpilot plan`` gives a draft's ``config.json`` (the default of
:attr:`~kvpilot.tuner.vllm.SpeculativeFlags.draft_config_hint`)."""


def describe_missing_draft_config(spec: vllm.SpeculativeFlags, checkpoint: str) -> str:
    """Why a drafter with a checkpoint of its own (``checkpoint``: what it is called, "the draft model") is
    not budgeted when its ``config.json`` was not given, and how to give it: the caller's
    ``spec.draft_config_hint`` (the operator's), else ``kvpilot plan``'s flag."""
    where = f"{checkpoint} {spec.draft_model!r}" if spec.draft_model else checkpoint.replace("the ", "a ", 1)
    hint = spec.draft_config_hint or DRAFT_CONFIG_FLAG_HINT
    return f"method {spec.given_method!r} loads {where}, whose config.json kvpilot was not given ({hint})"


def draft_model_unbudgeted_reason(
    spec: vllm.SpeculativeFlags, pp: int = 1, tp: int | None = None
) -> str | None:
    """Why kvpilot cannot budget the draft model of ``spec`` (``tp``: the target's, when known), or
    ``None`` when it does."""
    if spec.draft_config is None:
        return describe_missing_draft_config(spec, "the draft model")
    try:
        read_draft_model(spec)
    except errors.InvalidModelConfig as exc:
        return f"method 'draft_model': {exc}"
    return _draft_layout_reason(spec, pp, tp)


def _draft_layout_reason(spec: vllm.SpeculativeFlags, pp: int, tp: int | None) -> str | None:
    """Why a draft model kvpilot has read is still not budgeted in this layout (``pp``, the target's ``tp``)
    or under the speculative config's overrides; ``None`` when it is."""
    if pp > 1:
        return "with pipeline parallelism the draft model runs on one stage; kvpilot models one stage"
    if spec.draft_overrides:
        keys = ", ".join(spec.draft_overrides)
        return f"the speculative config's {keys} for the draft, which kvpilot does not read"
    draft_tp = spec.draft_tensor_parallel_size
    if tp is not None and draft_tp is not None and draft_tp != tp:
        return (
            f"draft_tensor_parallel_size {draft_tp} with tensor_parallel_size {tp} (the V1 runner refuses "
            "it; kvpilot models a draft split like the target)"
        )
    return None


def budgeted_draft_model(
    spec: vllm.SpeculativeFlags | None, pp: int = 1, tp: int | None = None
) -> ModelSpec | None:
    """The draft model the budget counts for ``spec``; ``None``: none (or one kvpilot cannot size). Its
    config is read once (:func:`draft_model_unbudgeted_reason`'s checks, in its order)."""
    if spec is None or spec.method != vllm.DRAFT_MODEL or spec.draft_config is None:
        return None
    try:
        draft = read_draft_model(spec)
    except errors.InvalidModelConfig:
        return None
    return draft if _draft_layout_reason(spec, pp, tp) is None else None


def check_draft_model(
    target: ModelSpec, spec: vllm.SpeculativeFlags, tensor_parallel_size: int | None
) -> None:
    """Refuse what vLLM 0.33 refuses of a draft model whose config is given: a vocabulary other than the
    target's (without ``use_heterogeneous_vocab``), a ``draft_tensor_parallel_size`` neither 1 nor the
    target's (``tensor_parallel_size``, when known)."""
    if spec.method != vllm.DRAFT_MODEL:
        return
    if tensor_parallel_size is not None:
        vllm.check_draft_tensor_parallel(spec.draft_tensor_parallel_size, tensor_parallel_size)
    if spec.draft_config is None:
        return
    try:
        draft = read_draft_model(spec)
    except errors.InvalidModelConfig:
        return  # named as not budgeted (draft_model_unbudgeted_reason)
    vllm.check_draft_vocab(target.vocab_size, draft.vocab_size, spec.heterogeneous_vocab)


def compute_draft_model_weight_bytes(
    draft: ModelSpec, target: ModelSpec, *, tensor_parallel_size: int = 1, dtype: str | None = None
) -> int:
    """Bytes of the draft model's parameters on one TP rank once loaded: the whole model, in the target's
    dtype (the draft's ``ModelConfig`` takes it), its embedding and LM head its own."""
    return compute_weight_breakdown(
        draft, tensor_parallel_size=tensor_parallel_size, dtype=dtype or target.dtype
    ).params


def with_draft_model_layers(model: ModelSpec, draft: ModelSpec) -> ModelSpec:
    """``model`` with the draft's attention layers appended (each with the draft's KV heads, head size
    and window): the model the KV layout is computed for."""
    return dataclasses.replace(
        model, num_layers=model.num_layers + draft.num_layers, layers=model.layers + draft.layers
    )
