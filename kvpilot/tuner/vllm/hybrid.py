"""How vLLM pages hybrid models: linear-attention (Mamba, Mamba2, gated DeltaNet) state beside
attention, the chunked-local groups of Llama 4, and the block alignments each backend asks for.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there); :mod:`kvpilot.tuner.memory.kv_cache`
asks it. Sources, in the pinned 0.33.0 wheel:

* ``model_executor/models/config.py::MambaModelConfig``: with prefix caching on (the default for
  hybrid generative models; off by default for attention-free ones) ``mamba_cache_mode`` becomes
  ``"align"``; Mamba, Mamba2 and short-conv mixers export no prefill checkpoint
  (``MambaBase.get_prefill_checkpoint_alignment`` is None): 2 pages per request;
* ``v1/kv_cache_interface.py::MambaSpec.max_memory_usage_bytes``: a state group holds
  ``2 + spec + checkpoint`` pages per request in align mode, ``1 + spec`` otherwise;
* ``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py::_resolve_gdn_prefill_backend``:
  FlashInfer's GDN prefill on Hopper (SM 9.0), and on Blackwell (SM 10.x, 12.x) when
  ``linear_key_head_dim == 128`` with CUDA 13 (the pinned wheel's torch is built for CUDA 13.0);
  Triton elsewhere. FlashInfer GDN exports prefill checkpoints: one more page per request and a
  64-token alignment (``v1/attention/backends/gdn_attn.py::FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``);
* ``platforms/interface.py::_align_hybrid_block_size``: the attention block is raised to a multiple
  of ``lcm(max(kernel block, --block-size), checkpoint alignment)`` until one attention page holds a
  state (MLA hybrids: at least 128), rounded to the backends' kernel block, and the state page is
  padded to the attention page;
* ``models/kimi_k3/nvidia/kda.py::resolve_kda_prefill_backend``: Kimi-K3's KDA prefill runs FlashKDA on
  SM 9.x, 10.x and 12.x when ``head_dim == 128``, the model is bf16 and the gate is bounded
  (``gate_lower_bound``); Triton elsewhere. FlashKDA exports prefill checkpoints every 16 tokens
  (``model_executor/layers/mamba/kda_checkpoint.py``): one more page per request and a 16-token alignment;
* ``envs.py``: ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` defaults to ``1``, so Llama 4's
  chunked-local layers keep groups of their own (``config/vllm.py``).
"""

from __future__ import annotations

from kvpilot.tuner.vllm.versions import Version

FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
"""Tokens: FlashInfer's GDN prefill emits states every multiple of its 64-token chunk."""

FLASHKDA_CHECKPOINT_ALIGNMENT = 16
"""Tokens: FlashKDA's prefill checkpoints (``kda_prefill_checkpoint_alignment("flashkda")``)."""

_FLASHKDA_HEAD_DIM = 128
_FLASHKDA_MAJORS = (9, 10, 12)

ATTENTION_KERNEL_BLOCK = 16
"""The smallest kernel block of FlashAttention and FlashInfer (``MultipleOf(16)``)."""

MLA_HYBRID_BLOCK_ALIGNMENT = 128
"""An MLA + state hybrid aligns its attention block to at least 128 tokens."""

_FLASHINFER_GDN_HEAD_K_DIM = 128
"""Blackwell's FlashInfer GDN prefill needs ``linear_key_head_dim == 128``."""


def prefix_caching_by_default(attention_free: bool) -> bool:
    """vLLM's default ``--enable-prefix-caching`` for a generative model: on, except for attention-free
    models (Mamba, Mamba2, FalconMamba), where "the feature is still experimental"
    (``config/model.py::ModelConfig.is_prefix_caching_supported``,
    ``engine/arg_utils.py::_set_default_chunked_prefill_and_prefix_caching_args``)."""
    return not attention_free


MAMBA_ALIGN_SINCE: Version = (0, 19)
"""The oldest release whose code kvpilot read with align mode on under prefix caching
(``model_executor/models/config.py::MambaModelConfig.verify_and_update_config`` sets
``mamba_cache_mode = "align"`` in every wheel 0.19-0.33; 0.21 and 0.24 start-up logs show it)."""


def uses_mamba_align_mode(version: Version, enable_prefix_caching: bool = True) -> bool:
    """Whether state layers run in ``mamba_cache_mode="align"`` (prefix caching on, the default for
    hybrids)."""
    return enable_prefix_caching and version >= MAMBA_ALIGN_SINCE


def uses_flashinfer_gdn(compute_capability: tuple[int, int] | None, head_k_dim: int) -> bool:
    """Whether the gated-DeltaNet prefill runs FlashInfer's kernel on this GPU (else Triton)."""
    if compute_capability is None:
        return False
    major, _ = compute_capability
    if compute_capability == (9, 0):
        return True
    return major in (10, 12) and head_k_dim == _FLASHINFER_GDN_HEAD_K_DIM


def uses_flashkda(
    compute_capability: tuple[int, int] | None, head_dim: int, bf16: bool, bounded_gate: bool
) -> bool:
    """Whether Kimi Delta Attention's prefill runs FlashKDA on this GPU (``auto`` backend; else Triton)."""
    if compute_capability is None:
        return False
    return (
        compute_capability[0] in _FLASHKDA_MAJORS and head_dim == _FLASHKDA_HEAD_DIM and bf16 and bounded_gate
    )


def state_pages_per_request(align: bool, checkpoint_blocks: int, speculative_blocks: int = 0) -> int:
    """Pages one request's state takes in one state group: ``MambaSpec.max_memory_usage_bytes``
    (``v1/kv_cache_interface.py:1135``), ``2 + speculative + checkpoint`` pages in align mode, ``1 +
    speculative`` otherwise; ``speculative_blocks`` is ``num_speculative_tokens`` with speculative decoding
    (``MambaBase.get_kv_cache_spec``, ``model_executor/layers/mamba/abstract.py:86``: ``num_speculative_blocks
    = vllm_config.num_speculative_tokens`` unless ``--use-replayssm``), 0 without."""
    return (2 + checkpoint_blocks if align else 1) + speculative_blocks


def speculative_conv_positions(gated_delta_net: bool, num_speculative_tokens: int) -> int:
    """Conv-state positions a state layer adds with speculative decoding: a gated DeltaNet's conv state
    holds ``conv_kernel - 1 + num_speculative_tokens`` (``MambaStateShapeCalculator
    .gated_delta_net_state_shape``, ``model_executor/layers/mamba/mamba_utils.py:272``-``:293``, given
    ``num_spec`` by ``QwenGatedDeltaNetAttention.get_state_shape``,
    ``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:545``, and by Qwen3-Next's / Qwen3.5's
    ``get_mamba_state_shape_from_config``, which sizes the hybrid block, ``models/qwen3_next.py:893``).
    Other mixers: 0 (kvpilot budgets a drafter only for gated-DeltaNet hybrids)."""
    return num_speculative_tokens if gated_delta_net else 0


def mamba2_checkpoint_blocks(version: Version) -> int:
    """Prefill-checkpoint pages a ``MambaMixer2`` state group holds per request in align mode.

    0.33's ``MambaMixer2.get_kv_cache_spec`` (``model_executor/layers/mamba/mamba_mixer2.py``) declares
    ``num_prefill_checkpoint_blocks=1`` with ``prefill_checkpoint_alignment=1`` (the block-boundary state
    is exported from inside one forward pass; no block alignment follows from it), so
    ``MambaSpec.max_memory_usage_bytes`` counts ``2 + 1`` pages: Nemotron-H, Granite 4 hybrids,
    Falcon-H1, Zamba2, Mamba2. Earlier releases are modelled with one state page, as fitted."""
    return 1 if version >= (0, 33) else 0


def hybrid_manager_for_chunked_local(version: Version) -> bool:
    """Whether chunked-local (Llama 4) layers get their own KV groups.

    0.19 logs show four groups for Llama 4 Scout, and 0.33 keeps them:
    ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` defaults to 1, so the branch that would
    disable the hybrid manager is not taken (audit of the 0.33.0 wheel, item 3).
    """
    return True
