"""The GPU bytes vLLM 0.33 preallocates for LoRA (``--enable-lora``) on one rank.

vLLM wraps the LoRA-capable layers at load, inside "Model loading took X GiB", and each wrapper holds
stacked A/B buffers for ``--max-loras`` adapters at ``--max-lora-rank`` whether or not an adapter is ever
loaded (:mod:`kvpilot.tuner.vllm.lora` holds the shapes and cites vLLM). The term is counted with the
weights (:func:`kvpilot.tuner.memory.compute_budget`); the plan names it apart.

Counted: each decoder layer's ``qkv_proj`` (three slices), ``o_proj``, ``gate_up_proj`` (two slices, or
an unpacked up projection) and ``down_proj``; in a MoE layer the routed experts (``FusedMoEWithLoRA``,
every expert of the rank: experts get LoRA buffers in 0.33), the router (``GateLinear`` is a
``ReplicatedLinear``), the shared experts and their gate; the input embedding and the LM head where the
architecture lists them; the Punica wrapper's index buffers. Not counted: layers other than grouped-query
attention and (gated) MLP/MoE (:func:`lora_unbudgeted_reason` says so, and the plan warns), the vision
and audio towers (vLLM wraps them only with ``--enable-tower-connector-lora``).
"""

from __future__ import annotations

from kvpilot.tuner import vllm
from kvpilot.tuner.memory.weights import padded_vocab_size
from kvpilot.tuner.model import CHUNKED, DTYPE_BYTES, FULL, SLIDING, ModelSpec
from kvpilot.tuner.vllm import LoraFlags

_ATTENTION = (FULL, SLIDING, CHUNKED)
_INDEX, _META = 8, 4
"""``torch.long`` Punica indices, ``torch.int32`` kernel metadata and ``adapter_enabled``."""


def lora_unbudgeted_reason(model: ModelSpec) -> str | None:
    """Why :func:`compute_lora_bytes` cannot count this model's LoRA buffers, or ``None`` when it can."""
    moe = model.moe
    if model.mla is not None or model.compressed is not None:
        return "its multi-head latent attention"
    if model.linear_state is not None or any(layer.with_state for layer in model.layers):
        return "its state-space / linear-attention layers"
    if any(layer.block or layer.kind not in _ATTENTION for layer in model.layers):
        return "its non-attention blocks"
    if model.attention_output_gate:
        return "its gated attention output"
    if model.per_layer_input_params:
        return "its per-layer inputs"
    if moe is not None and (moe.expert_hidden_size or moe.parallel_dense_intermediate_size):
        return "its latent or parallel-dense MoE"
    return None


def _pair(loras: int, rank_a: int, cols_a: int, rows_b: int, rank: int) -> int:
    """Elements of one A slice ``(loras, 1, rank_a, cols_a)`` and one B slice ``(loras, 1, rows_b, rank)``."""
    return loras * (rank_a * cols_a + rows_b * rank)


def _layer_elements(model: ModelSpec, idx: int, lora: LoraFlags, tp: int) -> int:
    """LoRA elements of decoder layer ``idx`` on one TP rank (shapes: :mod:`kvpilot.tuner.vllm.lora`)."""
    n, r, h = lora.max_loras, lora.max_lora_rank, model.hidden_size
    fs = lora.fully_sharded
    r_col = r // tp if fs else r  # column-parallel A: split only when fully sharded
    h_row = h // tp if fs else h  # row-parallel B: split only when fully sharded
    layer = model.layers[idx]
    hd = layer.head_dim or model.head_dim
    q = model.num_attention_heads // tp * hd
    kv = max(1, layer.num_kv_heads // tp) * hd  # replicated once TP exceeds the KV heads
    qkv_slices = 1 if model.architecture in vllm.LORA_FUSED_QKV_ARCHITECTURES else 3
    total = qkv_slices * n * r_col * h + n * (q + 2 * kv) * r  # MergedQKVParallelLinearWithLoRA
    total += _pair(n, r, q, h_row, r)  # o_proj: RowParallelLinearWithLoRA
    moe = model.moe
    if moe is not None and idx >= model.num_layers - moe.num_moe_layers:
        experts, inter = moe.num_experts, moe.moe_intermediate_size // tp
        w13_slices = 2 if model.mlp_gated else 1
        if model.architecture in vllm.LORA_3D_MOE_ARCHITECTURES:
            total += experts * _pair(n, r_col, h, w13_slices * inter, r)  # one fused w13 slice
        else:
            total += w13_slices * experts * _pair(n, r_col, h, inter, r)
        total += experts * _pair(n, r, inter, h_row, r)  # w2
        total += _pair(n, r, h, moe.num_experts, r)  # the router: ReplicatedLinearWithLoRA
        if moe.shared_intermediate_size:
            total += _mlp_elements(model, moe.shared_intermediate_size, lora, tp)
        if moe.shared_expert_gate:
            total += _pair(n, r, h, 1, r)
        return total  # adapter_enabled: added in bytes by the caller
    own = layer.mlp_intermediate
    width = model.intermediate_size if own is None else own
    return total + (_mlp_elements(model, width, lora, tp) if width else 0)


def _mlp_elements(model: ModelSpec, width: int, lora: LoraFlags, tp: int) -> int:
    """A (gated) MLP: ``gate_up_proj`` (two column slices, one where the class fuses it) or an up
    projection, then ``down_proj``."""
    n, r, h = lora.max_loras, lora.max_lora_rank, model.hidden_size
    r_col = r // tp if lora.fully_sharded else r
    h_row = h // tp if lora.fully_sharded else h
    outputs = 2 if model.mlp_gated else 1
    a_slices = 1 if model.architecture in vllm.LORA_FUSED_GATE_UP_ARCHITECTURES else outputs
    up = a_slices * n * r_col * h + n * outputs * (width // tp) * r
    return up + _pair(n, r, width // tp, h_row, r)


def compute_punica_bytes(lora: LoraFlags, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """The language model's Punica wrapper: four ``int64`` token and three ``int64`` sequence buffers
    (``punica_base.py:133``), two ``LoRAKernelMeta`` of two ``int32`` token buffers and three small ones
    (``punica_gpu.py:57``, ``lora_kernel_metadata.py:54``)."""
    slots = lora.max_loras
    meta = 2 * max_num_batched_tokens + 2 * (slots + 1) + (slots + 2)
    return _INDEX * (4 * max_num_batched_tokens + 3 * max_num_seqs) + _META * 2 * meta


def compute_lora_bytes(
    model: ModelSpec,
    lora: LoraFlags,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    dtype: str | None = None,
    max_num_batched_tokens: int = 0,
    max_num_seqs: int = 0,
) -> int:
    """Bytes of vLLM's LoRA buffers on one (TP, PP) rank, in the LoRA dtype (``auto``: the model's
    ``dtype``); 0 for a model :func:`lora_unbudgeted_reason` refuses."""
    if lora_unbudgeted_reason(model) is not None:
        return 0
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    element = DTYPE_BYTES[lora.lora_dtype or dtype or model.dtype]
    n, r, h = lora.max_loras, lora.max_lora_rank, model.hidden_size
    layers = model.layer_range(pp, pp_rank)
    elements = sum(_layer_elements(model, idx, lora, tp) for idx in layers)
    extra = 0
    moe = model.moe
    if moe is not None:  # FusedMoEWithLoRA.adapter_enabled: int32, max_loras + 1, per MoE layer
        extra += _META * (n + 1) * sum(1 for idx in layers if idx >= model.num_layers - moe.num_moe_layers)
    if pp_rank == 0 and model.architecture in vllm.LORA_EMBEDDING_ARCHITECTURES:
        elements += n * model.vocab_size * r + n * h * r  # VocabParallelEmbeddingWithLoRA: whole vocab
    if pp_rank == pp - 1 and model.architecture in vllm.LORA_LM_HEAD_ARCHITECTURES:
        elements += n * r * h + n * model.vocab_size * r  # LogitsProcessorWithLoRA
        if tp > 1:  # sharded_to_full_mapping_gpu: int64 over the padded vocabulary
            extra += _INDEX * padded_vocab_size(model)
    return elements * element + extra + compute_punica_bytes(lora, max_num_batched_tokens, max_num_seqs)
