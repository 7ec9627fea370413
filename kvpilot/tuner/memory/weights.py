"""Weight bytes per GPU rank: what vLLM logs as "Model loading took X GiB".

Sits above :mod:`kvpilot.tuner.model.spec`; :mod:`kvpilot.tuner.memory.budget` calls it.
Pure arithmetic on a :class:`~kvpilot.tuner.model.spec.ModelSpec`.

The count follows vLLM's layer classes: column/row-parallel linears are split by
tensor parallelism, KV projections are replicated once TP exceeds the KV heads,
the vocabulary is padded to a multiple of 64 and split (``VocabParallelEmbedding``),
norms and MoE routers are replicated, pipeline stages hold their own layers plus
the embedding (first stage) or the LM head (last stage). Quantized linears take
the bytes of their packed format including scales (FP8 1 B; INT8 1 B; 4-bit
AWQ/GPTQ 0.5 B + group scales/zeros; MXFP4 4.25 bits, experts only). The rotary
cos/sin cache vLLM builds at load counts too (it is why Llama-3.1-8B loads as
14.99 GiB from a 14.96 GiB checkpoint).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kvpilot.tuner.arith import round_up
from kvpilot.tuner.model import (
    BLOCK_MLP,
    BLOCK_MOE,
    DENSE,
    DTYPE_BYTES,
    EXPERTS,
    GDN,
    KDA,
    LINEAR,
    MAMBA1,
    MAMBA2,
    MIXER,
    SHARED,
    LinearStateSpec,
    ModelSpec,
    compute_bytes_per_weight,
    compute_component_bytes,
    compute_lm_head_bytes,
)

VOCAB_PADDING = 64
"""vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``."""
TP_LOAD_EXTRA_BYTES = 64 << 20
"""Seen on every tensor-parallel start: ranks load 0.01-0.08 GiB more than their parameter share."""


@dataclass(frozen=True, slots=True)
class WeightBreakdown:
    """Bytes on one rank, split so the checkpoint-size path can rescale the parameters only."""

    params: int
    """Model parameters (after quantization) on this rank."""
    buffers: int
    """Load-time buffers that are not parameters (the rotary cos/sin cache)."""

    @property
    def total(self) -> int:
        return self.params + self.buffers


def pad_vocab(vocab_size: int) -> int:
    """A vocabulary of ``vocab_size`` as ``VocabParallelEmbedding`` / ``ParallelLMHead`` allocate it:
    padded to ``VOCAB_PADDING``."""
    return round_up(vocab_size, VOCAB_PADDING)


def padded_vocab_size(model: ModelSpec) -> int:
    """The model's vocabulary as its embedding allocates it (:func:`pad_vocab`)."""
    return pad_vocab(model.vocab_size)


def _compressed_attention_params(model: ModelSpec, tp: int, ratio: int) -> tuple[int, int]:
    """(TP-split and fused-replicated linears, replicated model-dtype params) of one DeepSeek-V4 attention
    layer (``vllm/models/deepseek_v4/attention.py``, ``compressor.py``); fp32 tensors count twice."""
    c = model.compressed
    assert c is not None
    h, heads = model.hidden_size, model.num_attention_heads
    linears = h * (c.q_lora_rank + c.head_dim)  # fused_wqa_wkv: replicated, quantized
    wq_b = c.q_lora_rank * heads * c.head_dim
    wo_a, wo_b = heads * c.head_dim * c.o_lora_rank, c.o_groups * c.o_lora_rank * h  # grouped low-rank output
    linears += (wq_b + wo_a + wo_b) // tp
    replicated = c.q_lora_rank + c.head_dim + 2 * heads // tp  # q/kv norms, fp32 attention sinks
    mix = (2 + c.hc_mult) * c.hc_mult
    replicated += 2 * 2 * (mix * c.hc_mult * h + mix + 1)  # hyper-connection mixers, fp32
    if ratio > 1:  # the compressor: an unquantized fused_wkv_wgate, fp32 positional table, norm
        coff = 2 if ratio == 4 else 1
        replicated += h * 2 * coff * c.head_dim + 2 * ratio * coff * c.head_dim + c.head_dim
    if ratio == 4:  # the lightning indexer: wq_b (quantized), weights_proj, its own compressor
        linears += c.q_lora_rank * c.index_n_heads * c.index_head_dim
        replicated += h * c.index_n_heads + h * 4 * c.index_head_dim + 2 * 4 * 2 * c.index_head_dim
    return linears, replicated


def _mixer_params(state: LinearStateSpec, h: int, tp: int) -> int:
    """TP-split params of one Mamba / Mamba2 / short-conv mixer (``mamba_mixer.py``, ``mamba_mixer2.py``,
    ``short_conv.py``), biases and the per-channel A, D, dt terms included."""
    inter, k = state.conv_dim, state.conv_kernel
    if state.family == MAMBA1:  # in_proj (x, z), conv1d, x_proj (dt, B, C), dt_proj, A, D, out_proj
        r, n = state.time_step_rank, state.head_v_dim
        return inter * (2 * h + k + 1 + (r + 2 * n) + r + 1 + n + 1 + h) // tp
    if state.family == MAMBA2:  # in_proj (z, x, B, C, dt), conv1d over x B C, dt_bias, A, D, norm, out_proj
        heads, bc = state.num_heads, 2 * state.n_groups * state.head_v_dim
        norm = inter if state.mixer_norms else 0
        # dt_bias, D and the fp32 A (``mamba_mixer2.py``: twice a 16-bit param), split by heads
        return (h * (2 * inter + bc + heads) + (inter + bc) * (k + 1) + 4 * heads + norm + inter * h) // tp
    return state.conv_dim * (4 * h + k) // tp  # SHORT_CONV: in_proj (B, C, x), conv, out_proj


@dataclass(frozen=True, slots=True)
class LayerParams:
    """One decoder layer's params on one rank, by the component a checkpoint quantizes apart."""

    mixer: int
    """The token mixer's linears: attention, linear attention, a Mamba mixer (beside attention too)."""
    dense: int
    """The dense MLP's linears (a MoE layer's parallel dense MLP too)."""
    shared: int
    """The shared experts' linears."""
    experts: int
    """The routed experts' linears."""
    replicated: int
    """Norms, routers and the other tensors kept in the model dtype."""


@dataclass(frozen=True, slots=True)
class ExpertShards:
    """How the routed experts of a data-parallel group split (``FusedMoEParallelConfig.make``, 0.33):
    over ``ranks`` = DP x TP ranks, each expert's intermediate size split (no expert parallelism), or
    whole experts per rank, the first ``num_experts % ranks`` ranks one more
    (``expert_map_manager.determine_expert_map``)."""

    ranks: int = 1
    expert_parallel: bool = False

    def split(self, num_experts: int, intermediate: int, tp: int) -> tuple[int, int]:
        """(experts, intermediate size) on the busiest rank (rank 0); TP alone for one engine."""
        if self.ranks <= 1 and not self.expert_parallel:
            return num_experts, intermediate // tp
        ranks = max(self.ranks, tp)
        if self.expert_parallel:
            return -(-num_experts // ranks), intermediate
        return num_experts, intermediate // ranks


ONE_ENGINE = ExpertShards()
"""The routed experts split by tensor parallelism only (no data parallelism, no expert parallelism)."""


def _layer_linear_params(
    model: ModelSpec, tp: int, idx: int, loaded: bool, shards: ExpertShards = ONE_ENGINE
) -> LayerParams:
    """One layer's params on one rank (:class:`LayerParams`)."""
    h = model.hidden_size
    layer = model.layers[idx] if idx < len(model.layers) else None
    attn = 0
    state = model.linear_state
    block = layer.block if layer is not None else ""
    if block in (BLOCK_MLP, BLOCK_MOE):  # a Nemotron-H MLP or MoE block: no token mixer
        replicated = 0
    elif model.compressed is not None and layer is not None:
        attn, replicated = _compressed_attention_params(model, tp, layer.compress_ratio)
    elif layer is not None and layer.kind == LINEAR and state is not None and state.family == KDA:
        # KimiK3DeltaAttention: in_proj (q, k, v, g at H x D each; f_a at D, beta at H), f_b, o_proj, conv.
        hd = state.num_heads * state.head_v_dim
        attn = (h * 4 * hd + state.head_v_dim * hd + hd * h) // tp + h * (state.head_v_dim + state.num_heads)
        replicated = 2 * (3 * hd * state.conv_kernel + hd) // tp + state.num_heads  # fp32 conv, dt_bias
    elif model.mla is not None and (layer is None or layer.kind != LINEAR):
        m = model.mla
        heads = model.num_attention_heads // tp
        q_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            replicated_a = h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
            attn += m.q_lora_rank * heads * q_head
        else:
            replicated_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
            attn += h * heads * q_head
        attn += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        attn += heads * m.v_head_dim * h
        attn += replicated_a  # fused_qkv_a_proj is a replicated (but quantized) linear
        replicated = m.kv_lora_rank + (m.q_lora_rank or 0)  # the latent norms
    elif layer is not None and layer.kind == LINEAR and state is not None and state.family != GDN:
        attn = _mixer_params(state, h, tp)
        jamba_norms = state.family == MAMBA1 and state.mixer_norms  # dt, B and C norms
        replicated = state.time_step_rank + 2 * state.head_v_dim if jamba_norms else 0
    elif layer is not None and layer.kind == LINEAR and state is not None:
        s = state
        key_dim = (s.conv_dim - s.num_heads * s.head_v_dim) // 2
        value_dim = s.num_heads * s.head_v_dim
        attn = (
            h * (2 * key_dim + 2 * value_dim)
            + h * 2 * s.num_heads
            + value_dim * h
            + s.conv_dim * s.conv_kernel
        ) // tp
        # the gated RMSNorm (head_v_dim, replicated), dt_bias and the fp32 A_log (twice a 16-bit param)
        replicated = s.head_v_dim + 3 * s.num_heads // tp
    else:
        kv = layer.num_kv_heads if layer is not None else model.num_kv_heads
        hd = layer.head_dim if layer is not None and layer.head_dim else model.head_dim
        q = (model.num_attention_heads // tp) * hd
        kvr = max(1, kv // tp) * hd if kv else 0  # a KV-sharing layer (Gemma 4) projects queries only
        gate = q if model.attention_output_gate else 0  # Qwen3-Next: q_proj also emits the output gate
        attn = h * (q + gate + 2 * kvr) + q * h
        if model.attention_bias:
            attn += q + 2 * kvr
        replicated = (hd + (hd if kvr else 0)) if model.qk_norm else 0
        if layer is not None and layer.with_state and state is not None:  # Falcon-H1: a Mamba2 mixer beside
            attn += _mixer_params(state, h, tp)
    mlp_mats = 3 if model.mlp_gated else 2
    experts = 0
    moe = model.moe
    dense_first = model.num_layers - moe.num_moe_layers if moe else model.num_layers
    if block:  # a Nemotron-H block holds one component, and its MoE blocks are where its pattern says
        mlp_here, moe_here = block == BLOCK_MLP, block == BLOCK_MOE
    else:
        moe_here = idx >= dense_first
        mlp_here = not moe_here
    dense = shared = 0
    if moe is not None and moe_here:
        local, inter = shards.split(moe.num_experts, moe.moe_intermediate_size, tp)
        if moe.expert_hidden_size:  # Kimi-K3's latent MoE: experts in a narrower space, two projections
            experts = local * mlp_mats * moe.expert_hidden_size * inter
            replicated += 2 * h * moe.expert_hidden_size
        elif loaded and model.quantization is not None and model.quantization.method == "mxfp4":
            # vLLM's MXFP4 MoE kernels (Marlin / triton matmul_ogs) pad the hidden size to 256 and
            # the per-rank intermediate size to 128 (mxfp4_round_up_hidden_size_and_intermediate_size).
            experts = local * mlp_mats * round_up(h, 256) * round_up(inter, 128)
        else:
            experts = local * mlp_mats * h * inter  # Nemotron-H's relu2 experts: up and down only
        shared = mlp_mats * h * moe.shared_intermediate_size // tp
        dense = mlp_mats * h * moe.parallel_dense_intermediate_size // tp
        # the router (fp32 in GLM-4.5's vLLM class: twice a 16-bit param)
        replicated += h * moe.num_experts * (2 if moe.fp32_router else 1)
        if moe.shared_expert_gate:  # Qwen2-MoE / Qwen3-Next: a one-output gate on the shared experts
            replicated += h
        if moe.parallel_dense_intermediate_size:  # Gemma 4: three more norms, the router's scales
            replicated += 3 * h + h + moe.num_experts
    elif mlp_here:
        own = layer.mlp_intermediate if layer is not None else None  # DeciLM: each layer's own width
        width = model.intermediate_size if own is None else own
        dense = mlp_mats * h * width // tp
    replicated += 2 * h if model.intermediate_size and not block else h  # the norms (a Mamba block: one)
    if model.sandwich_norms:
        replicated += 2 * h
    return LayerParams(attn, dense, shared, experts, replicated)


@functools.lru_cache(maxsize=512)
def compute_weight_breakdown(
    model: ModelSpec,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    dtype: str | None = None,
    loaded: bool = True,
    expert_shards: ExpertShards = ONE_ENGINE,
) -> WeightBreakdown:
    """Weight bytes vLLM loads on one (TP, PP) rank (``loaded=False``: as stored, before kernel padding);
    ``expert_shards``: how the routed experts split over a data-parallel group (:class:`ExpertShards`)."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    dbytes = DTYPE_BYTES[dtype or model.dtype]
    quant = model.quantization
    qbytes = compute_bytes_per_weight(quant) if quant else float(dbytes)
    dense_bytes = float(dbytes) if quant is None or quant.experts_only else qbytes
    expert_bytes = qbytes if quant is not None else float(dbytes)
    if model.compressed is not None and model.compressed.expert_bytes_per_weight:
        expert_bytes = model.compressed.expert_bytes_per_weight  # DeepSeek-V4's MXFP4 / NVFP4 experts
    modelopt = quant.modelopt if quant is not None else None
    total = 0.0
    for idx in model.layer_range(pp, pp_rank):
        p = _layer_linear_params(model, tp, idx, loaded, expert_shards)
        if modelopt is not None:  # each component as the checkpoint stores it in this layer
            total += sum(
                params * compute_component_bytes(modelopt, idx, component, dbytes)
                for params, component in (
                    (p.mixer, MIXER),
                    (p.dense, DENSE),
                    (p.shared, SHARED),
                    (p.experts, EXPERTS),
                )
            )
        else:
            total += (p.mixer + p.dense + p.shared) * dense_bytes + p.experts * expert_bytes
        total += p.replicated * dbytes
    vocab_rank = padded_vocab_size(model) // tp
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        total += vocab_rank * model.hidden_size * dbytes
        towers = model.vision_params + model.audio_params
        whole = towers if model.towers_replicated else model.towers_whole_params
        total += ((towers - whole) // tp + whole) * dbytes
        total += (model.per_layer_input_params // tp + model.per_layer_input_replicated) * dbytes  # Gemma 4
    if last:
        if not model.tie_word_embeddings or pp > 1:
            head_bytes = qbytes if quant is not None and quant.quantize_lm_head else float(dbytes)
            if modelopt is not None:
                head_bytes = compute_lm_head_bytes(modelopt, dbytes)
            total += vocab_rank * model.hidden_size * head_bytes
        total += model.hidden_size * dbytes  # final norm
    rope = model.rope_cache_positions * model.rotary_dim * dbytes if model.rotary_dim else 0
    extra = TP_LOAD_EXTRA_BYTES if tp > 1 else 0
    return WeightBreakdown(params=int(total), buffers=int(rope) + extra)


def compute_weight_bytes(
    model: ModelSpec,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    dtype: str | None = None,
    weights_total_bytes: int | None = None,
    expert_shards: ExpertShards = ONE_ENGINE,
) -> int:
    """Bytes of weights on one rank; from the checkpoint size when it is known.

    With ``weights_total_bytes`` (the checkpoint's size on disk, all shards), the
    parameter count is only used to split it: this rank gets the same share of
    the checkpoint as of the counted parameters.
    """
    rank = compute_weight_breakdown(
        model,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        pp_rank=pp_rank,
        dtype=dtype,
        expert_shards=expert_shards,
    )
    if weights_total_bytes is None:
        return rank.total
    ckpt_whole = compute_weight_breakdown(model, loaded=False)
    ckpt_rank = compute_weight_breakdown(
        model,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        pp_rank=pp_rank,
        loaded=False,
        expert_shards=expert_shards,
    )
    if ckpt_whole.params <= 0 or ckpt_rank.params <= 0:
        return rank.total
    share = ckpt_rank.params / ckpt_whole.params
    cast = rank.params / ckpt_rank.params  # bf16 served as float32, kernel padding at load
    return int(weights_total_bytes * share * cast) + rank.buffers
