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
"""Layer kinds. ``LINEAR`` covers Mamba / GatedDeltaNet layers: a fixed state per request."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1}


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One text-decoder layer as the KV cache sees it."""

    kind: str
    """``FULL``, ``SLIDING``, ``CHUNKED``, ``MLA`` or ``LINEAR``."""
    num_kv_heads: int = 0
    """Total KV heads (MLA: 1 latent; LINEAR: 0)."""
    head_dim: int = 0
    """Key head size (MLA: kv_lora_rank + qk_rope_head_dim)."""
    head_dim_v: int = 0
    """Value head size (MLA: 0, no separate V)."""
    window: int | None = None
    """Sliding window or attention chunk, in tokens."""


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


@dataclass(frozen=True, slots=True)
class MlaSpec:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True, slots=True)
class LinearStateSpec:
    """A GatedDeltaNet / Mamba-2 layer: conv state + recurrent state per request."""

    conv_dim: int
    conv_kernel: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int

    def state_elements(self, tp: int) -> int:
        """Elements of one request's state on one TP rank (conv + recurrent)."""
        conv = (self.conv_dim // tp) * (self.conv_kernel - 1)
        ssm = max(1, self.num_heads // tp) * self.head_k_dim * self.head_v_dim
        return conv + ssm
