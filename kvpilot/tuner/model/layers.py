"""The kinds of decoder layer the KV cache distinguishes, and their geometry.

Sits below :mod:`kvpilot.tuner.model.spec` (which builds these from a ``config.json``)
and :mod:`kvpilot.tuner.memory.kv_cache` (which turns them into pages and blocks). Frozen
value objects only; nothing here reads a config.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL = "full"
SLIDING = "sliding_window"
CHUNKED = "chunked_local"
MLA = "mla"
LINEAR = "linear_attention"
NO_KV = "no_kv"
COMPRESSED = "compressed_sparse"
"""Layer kinds. ``LINEAR`` covers Mamba / Mamba2 / GatedDeltaNet / KDA layers: a fixed state per
request. ``NO_KV`` is a decoder layer that keeps no cache of its own: an MLP- or MoE-only block
(Nemotron-H's ``-`` and ``E``), a no-op attention (DeciLM's ``block_configs``), or a layer that
reads an earlier layer's cache (Gemma 3n/4 ``num_kv_shared_layers``: vLLM gives it no KV spec).
``COMPRESSED`` is a DeepSeek-V4 layer: a sliding-window latent cache plus, by its ``compress_ratio``, a
compressed latent, compressor states and an indexer cache (:mod:`kvpilot.tuner.vllm.compressed_attention`)."""

GDN = "gdn"
MAMBA1 = "mamba1"
MAMBA2 = "mamba2"
SHORT_CONV = "short_conv"
KDA = "kda"
"""Linear-attention state families (vLLM's ``MambaStateShapeCalculator``): gated DeltaNet, Mamba
(``mamba1_state_shape``: Mamba, FalconMamba, Jamba), Mamba2 (Nemotron-H, Mamba2, Falcon-H1,
Granite-4.0-H), LFM2's short convolution (conv state only) and Kimi Delta Attention."""

BLOCK_MIXER, BLOCK_ATTENTION, BLOCK_MLP, BLOCK_MOE = "mixer", "attention", "mlp", "moe"
"""Nemotron-H's blocks (vLLM ``nemotron_h.py``: ``NemotronHMambaDecoderLayer``, ``...AttentionDecoderLayer``,
``...MLPDecoderLayer``, ``...MoEDecoderLayer``): each holds one norm and one of a Mamba2 mixer, attention,
an MLP or a MoE, where other families' decoder layers hold a token mixer *and* an MLP or MoE."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1}


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One text-decoder layer as the KV cache sees it."""

    kind: str
    """``FULL``, ``SLIDING``, ``CHUNKED``, ``MLA``, ``LINEAR`` or ``NO_KV``."""
    num_kv_heads: int = 0
    """Total KV heads (MLA: 1 latent; LINEAR: 0)."""
    head_dim: int = 0
    """Key head size (MLA: kv_lora_rank + qk_rope_head_dim)."""
    head_dim_v: int = 0
    """Value head size (MLA: 0, no separate V)."""
    window: int | None = None
    """Sliding window or attention chunk, in tokens."""
    indexer_head_dim: int = 0
    """MLA layers of a sparse-attention model (DeepSeek-V3.2, GLM-5): the config's ``index_head_dim``
    when vLLM builds this layer's indexer cache (:mod:`kvpilot.tuner.vllm.indexer`); 0: none.
    ``COMPRESSED`` layers: the index head size of the model (used when ``compress_ratio`` is 4)."""
    compress_ratio: int = 0
    """``COMPRESSED`` layers: the config's ``compress_ratios`` entry (0: sliding window only; 4; 128)."""
    with_state: bool = False
    """An attention layer that also runs a state mixer beside it (Falcon-H1's parallel hybrid: every
    decoder layer holds ``self_attn.attn`` and a Mamba2 ``mamba.mixer``, each with its own KV spec)."""
    block: str = ""
    """What a Nemotron-H block holds, alone (``BLOCK_*``), or a DeciLM layer whose attention or FFN is a
    no-op; "": a decoder layer with its token mixer and its MLP or MoE (every other family)."""
    mlp_intermediate: int | None = None
    """DeciLM / Nemotron-NAS: this layer's MLP width (its ``ffn_mult``; 0: a no-op FFN); ``None``: the
    model's ``intermediate_size``."""


@dataclass(frozen=True, slots=True)
class MoeSpec:
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    num_moe_layers: int
    shared_intermediate_size: int = 0
    """Summed intermediate size of the shared experts of one MoE layer (0: none)."""
    parallel_dense_intermediate_size: int = 0
    """A dense MLP that runs beside the experts in every MoE layer (Gemma 4)."""
    expert_hidden_size: int = 0
    """The routed experts' hidden size when it differs from the model's (Kimi-K3's latent MoE); 0: the
    same."""
    shared_expert_gate: bool = False
    """The shared experts' output passes a ``shared_expert_gate`` (``Linear(hidden, 1)``): Qwen2-MoE,
    Qwen3-Next and Qwen3.5's MoE (vLLM 0.33's ``qwen2_moe.py``, ``qwen3_next.py``)."""
    fp32_router: bool = False
    """vLLM keeps the router weight in fp32 (:data:`kvpilot.tuner.vllm.FP32_ROUTER_MODEL_TYPES`: GLM-4.5)."""


@dataclass(frozen=True, slots=True)
class MlaSpec:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True, slots=True)
class CompressedAttentionSpec:
    """DeepSeek-V4's attention geometry (``vllm/models/deepseek_v4/attention.py``), for its weights."""

    head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    index_n_heads: int
    index_head_dim: int
    hc_mult: int
    """Hyper-connection streams (``hc_mult``): each layer keeps two ``(2 + hc) hc x hc hidden`` fp32
    mixers."""
    expert_bytes_per_weight: float = 0.0
    """Bytes per routed-expert weight when the checkpoint stores them apart (``expert_dtype: fp4``: MXFP4,
    a ModelOpt ``moe_quant_algo: NVFP4``); 0: the quantization config's."""


@dataclass(frozen=True, slots=True)
class LinearStateSpec:
    """One linear-attention layer's per-request state: a conv state and a recurrent (SSM) state.

    Mirrors ``vllm/model_executor/layers/mamba/mamba_utils.py`` (``MambaStateShapeCalculator``):

    * ``gdn`` (Qwen3-Next, Qwen3.5): conv ``(2 k_heads k_dim + v_heads v_dim) / tp x (kernel - 1)``,
      recurrent ``v_heads / tp x v_dim x k_dim``;
    * ``mamba1`` (Mamba, FalconMamba, Jamba): conv ``intermediate / tp x (kernel - 1)``, recurrent
      ``intermediate / tp x state`` (``conv_dim`` the intermediate size, ``head_v_dim`` the state size);
    * ``mamba2`` (Nemotron-H, Mamba2, Falcon-H1, Granite-4.0-H): conv
      ``(intermediate + 2 (groups + extra) state) / tp x (kernel - 1)`` (groups extended to the TP size
      when they do not divide it), recurrent ``heads / tp x head_dim x state``;
    * ``short_conv`` (LFM2): conv ``dim / tp x (L_cache - 1)`` only;
    * ``kda`` (Kimi-Linear): conv ``(heads head_dim + 2 k_heads k_dim) / tp x (kernel - 1)``, recurrent
      ``heads / tp x head_dim x head_dim``.

    The conv state is in the model's dtype (``--mamba-cache-dtype auto``); the recurrent state in
    ``ssm_dtype`` (None: the model's dtype).
    """

    conv_dim: int
    """Conv channels before TP (Mamba2: the intermediate size, the groups' part excluded)."""
    conv_kernel: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    family: str = GDN
    ssm_dtype: str | None = None
    n_groups: int = 0
    """Mamba2 only: B/C groups (each adds ``2 x head_k_dim`` conv channels)."""
    bounded_gate: bool = False
    """KDA only: the config bounds the gate (``gate_lower_bound``), one condition of FlashKDA's prefill."""
    time_step_rank: int = 0
    """Mamba only: the rank of the time-step projection (``time_step_rank`` / ``mamba_dt_rank``), for the
    weights."""
    mixer_norms: bool = False
    """For the weights. Mamba: the mixer normalises dt, B and C with weighted RMS norms (Jamba); Mamba2: the
    gated RMS norm before ``out_proj`` (Falcon-H1 only with ``mamba_rms_norm``)."""

    def conv_channels(self, tp: int) -> int:
        """Conv channels before TP; Mamba2's groups extended to the TP size when they do not divide it."""
        if self.family != MAMBA2:
            return self.conv_dim
        groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
        return self.conv_dim + 2 * groups * self.head_v_dim

    def conv_elements(self, tp: int, extra_positions: int = 0) -> int:
        """The conv state's elements on one TP rank; ``extra_positions``: the positions speculative
        decoding adds (:func:`kvpilot.tuner.vllm.speculative_conv_positions`)."""
        return (self.conv_channels(tp) // tp) * (self.conv_kernel - 1 + extra_positions)

    def shards_over(self, tp: int) -> bool:
        """Whether vLLM's ``divide`` accepts this state at TP ``tp``: the conv channels and the heads split
        evenly (``MambaStateShapeCalculator``)."""
        return self.conv_channels(tp) % tp == 0 and self.num_heads % tp == 0

    def ssm_elements(self, tp: int) -> int:
        if self.family == SHORT_CONV:
            return 0
        if self.family == MAMBA1:
            return (self.conv_dim // tp) * self.head_v_dim
        return max(1, self.num_heads // tp) * self.head_k_dim * self.head_v_dim

    def state_elements(self, tp: int) -> int:
        """Elements of one request's state on one TP rank (conv + recurrent)."""
        return self.conv_elements(tp) + self.ssm_elements(tp)

    def state_bytes(self, tp: int, model_dtype_bytes: int, extra_conv_positions: int = 0) -> int:
        """Bytes of one request's state on one TP rank (vLLM's ``MambaSpec.page_size_bytes`` unpadded)."""
        ssm_bytes = _STATE_DTYPE_BYTES[self.ssm_dtype] if self.ssm_dtype else model_dtype_bytes
        conv = self.conv_elements(tp, extra_conv_positions)
        return conv * model_dtype_bytes + self.ssm_elements(tp) * ssm_bytes


_STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
