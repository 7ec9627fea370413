"""vLLM 0.33's separate draft model (``--speculative-config '{"model": "Qwen/Qwen3-0.6B", ...}'``).

The method (``config/speculative.py``): ``draft_model`` is what ``SpeculativeConfig.__post_init__`` takes
when a ``model`` is given without a method (and is neither ``ngram`` nor a ``module.Class`` path,
``:1236``-``:1244``). The draft checkpoint's ``ModelConfig`` is then built (``:1406``) and the method
detected again from it (``:1432``-``:1497``), even when ``draft_model`` was given by name: a
``model`` whose name holds ``eagle-`` is ``eagle``, ``eagle3`` is ``eagle3``, ``dflash`` is ``dflash``,
``dspark`` is ``dspark`` (:func:`.speculative.draft_method_by_name`), and a draft config whose
``model_type`` is an MTP type is ``mtp`` (or whose architectures are DFlash's or DSpark's drafters,
:func:`draft_method_by_config`).

What the draft's ``ModelConfig`` takes (``:1406``-``:1430``): the target's ``dtype`` and tokenizer; its
own ``hf_config``, ``max_model_len`` (then ``min`` of its own and the target's,
``_maybe_override_draft_max_model_len``, ``:1763``) and quantization (``quantization`` in the speculative
config, else its own checkpoint's ``quantization_config``: the draft's ``VllmConfig`` is built with
``quant_config=None``, ``v1/worker/gpu/spec_decode/standalone_ar/speculator.py:115``, which
``VllmConfig.__post_init__`` fills from the draft's ``ModelConfig``, ``config/vllm.py:1607``). Its
``max_position_embeddings`` is not raised to the target's (only for drafters that share the target's
positions, ``:1503``); Model Runner V2 lowers the target's ``max_model_len`` to the draft's when that is
shorter (``VllmConfig._limit_max_model_len_to_draft``, ``config/vllm.py:3025``: not modelled).

Its parallel config (``_verify_and_get_draft_tp``, ``:1849``): ``draft_tensor_parallel_size`` defaults to
the target's TP and may otherwise only be 1 or the target's (:func:`check_draft_tensor_parallel`); one
pipeline stage (``create_draft_parallel_config``, ``:1890``); vLLM then checks the draft's attention heads
divide its TP (``ModelConfig.verify_with_parallel_config``, ``config/model.py:1559``, from ``_verify_args``,
``config/speculative.py:1991``). The V1 runner's ``DraftModelProposer`` further refuses a draft TP other
than the target's (``v1/spec_decode/draft_model.py:64``-``:79``); Model Runner V2 does not.

The vocabularies: unless ``use_heterogeneous_vocab``, ``verify_equal_vocab_size_if_draft_model``
(``config/speculative.py:2040``) refuses a draft whose ``vocab_size`` differs from the target's
(:func:`check_draft_vocab`).

Loading (Model Runner V2, 0.33's default: ``init_speculator``, ``v1/worker/gpu/spec_decode/__init__.py:81``,
builds ``StandaloneARSpeculator``): ``load_draft_model`` (``standalone_ar/speculator.py:101``) has
``get_model`` build the registry's class for the draft's own architectures (``Qwen3ForCausalLM`` for
Qwen3-0.6B) under a ``VllmConfig`` of the draft's model and parallel configs, prefix ``draft_model``: a
whole model, its own ``embed_tokens`` and ``lm_head`` (tied as its config says), nothing shared with the
target (V1: ``DraftModelProposer._maybe_share_embeddings`` / ``_maybe_share_lm_head`` do nothing,
``draft_model.py:115``-``:122``). Its attention layers join the target's in one KV cache config
(``DraftModelSpeculator.load_model``, ``speculator.py:225``-``:242``: the layers registered past the
target's are the draft's; ``SpeculativeConfig.uses_draft_kv_cache``, ``config/speculative.py:2172``),
each declaring the draft's KV heads and head size in the target's KV cache dtype unless the speculative
config names one (``kv_cache_dtype``, ``standalone_ar/speculator.py:109``). The rotary cache is
``get_rope``'s, shared with the target's when its parameters are the same
(``model_executor/layers/rotary_embedding/__init__.py:74``-``:85``).

Its buffers (``DraftModelSpeculator.__init__``, ``speculator.py:106``; ``StandaloneARSpeculator.__init__``,
``standalone_ar/speculator.py:40``-``:63``): the speculator's input buffers and per-request tensors, and
``last_token_indices`` (``int64``), ``arange`` (``int32``, ``max_num_seqs + 1``), ``expanded_input_ids``
(``int32``) and ``expanded_positions`` (``int64``) of ``max_num_batched_tokens + max_num_seqs``; no
target hidden states. ``expanded_slot_mappings`` comes later, in ``set_attn`` (``:94``), once the KV cache
is sized. The draft runs without CUDA graphs (``capture``, ``:70``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.speculative import DRAFT_MODEL, MTP, MTP_METHODS, SPECULATIVE_CONFIG_FLAG

DFLASH_DRAFT_ARCHITECTURES = ("MuseGlimmerAssistantModel",)
"""Draft architectures vLLM takes as ``dflash`` whatever the name (``:1451``)."""
DSPARK_DRAFT_ARCHITECTURES = (
    "Qwen3DSparkModel",
    "Qwen3OmniDSparkModel",
    "MuseSparkDSparkModel",
    "Gemma4DSparkModel",
)
"""Draft architectures vLLM takes as ``dspark`` (``:1457``-``:1466``; ``DSparkDraftModel`` too when its
``model_type`` is ``qwen3``)."""


def draft_method_by_config(config: Mapping[str, Any]) -> str:
    """The method vLLM detects from the draft's ``config.json`` under ``draft_model`` (``:1450``-``:1496``):
    ``dflash``, ``dspark``, ``mtp`` (an MTP ``model_type``), else ``draft_model``."""
    raw = config.get("architectures")
    archs = [a for a in raw if isinstance(a, str)] if isinstance(raw, list) else []
    model_type = config.get("model_type")
    if any(a in DFLASH_DRAFT_ARCHITECTURES for a in archs):
        return "dflash"
    if any(a in DSPARK_DRAFT_ARCHITECTURES for a in archs) or (
        "DSparkDraftModel" in archs and model_type == "qwen3"
    ):
        return "dspark"
    if model_type in MTP_METHODS:
        return MTP
    return DRAFT_MODEL


def check_draft_tensor_parallel(draft_tensor_parallel_size: int | None, tensor_parallel_size: int) -> None:
    """Refuse a ``draft_tensor_parallel_size`` other than 1 or the target's (``_verify_and_get_draft_tp``,
    ``config/speculative.py:1849``)."""
    draft = draft_tensor_parallel_size
    if draft is not None and draft not in (1, tensor_parallel_size):
        raise errors.InvalidEngineArgs(
            f"{SPECULATIVE_CONFIG_FLAG}: draft_tensor_parallel_size {draft} cannot be other than 1 or the "
            f"target's tensor_parallel_size ({tensor_parallel_size}); vLLM refuses it",
            flag=SPECULATIVE_CONFIG_FLAG,
        )


def check_draft_vocab(target_vocab_size: int, draft_vocab_size: int, heterogeneous: bool) -> None:
    """Refuse a draft whose vocabulary differs from the target's without ``use_heterogeneous_vocab``
    (``verify_equal_vocab_size_if_draft_model``, ``config/speculative.py:2040``)."""
    if not heterogeneous and target_vocab_size != draft_vocab_size:
        raise errors.InvalidEngineArgs(
            f"{SPECULATIVE_CONFIG_FLAG}: the target and the draft model should have the same vocabulary "
            f"size (target vocab_size {target_vocab_size:,}, draft vocab_size {draft_vocab_size:,}); vLLM "
            'refuses it unless "use_heterogeneous_vocab": true',
            flag=SPECULATIVE_CONFIG_FLAG,
        )
