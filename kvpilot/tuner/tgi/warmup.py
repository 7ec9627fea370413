"""How TGI sizes its KV cache at warm-up, and the defaults its launcher derives before it: ported from v3.3.7.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). Each constant and rule below is read from tag
``v3.3.7`` (commit ``dfb3fbe7``), with file and line:

* **The launcher** (``launcher/src/main.rs``) reads ``config.json`` into its ``Config`` (lines 241-258,
  ``From<RawConfig>`` lines 354-400: ``max_position_embeddings`` falls back to ``max_seq_len`` then
  ``n_positions``; ``head_dim`` to ``hidden_size / num_attention_heads``; ``num_kv_heads`` to
  ``num_attention_heads``; experts default to 1). It defaults ``--max-batch-prefill-tokens`` (lines
  2114-2152) to the *compute-optimal* size ``f16_flop(card) x num_shard / flop(model)`` when that is over 100
  (``compute_optimal``, lines 28-46; the card's flops, lines 1754-1785; the card from ``nvidia-smi``'s
  name, spaces to ``-``, lower-cased, lines 1712-1731 and 1819-1829), else 4096 (10 000 for Qwen2-VL and
  Qwen2.5-VL, 8000 for Gemma 3: lines 2122-2128); then capped by ``max_position_embeddings`` (line 2138)
  and by ``vram_maximum`` (lines 62-89: ``(nvidia-smi total MiB x 2^20 x num_shard x cuda_memory_fraction
  x 0.95 - model_vram) / token_vram``, the launcher's own wiggle room 0.95 at line 1806).
  ``--max-input-tokens`` and ``--max-total-tokens`` it leaves to the warm-up.
* **The attention backend** (``resolve_attention``, lines 131-199): ``flashinfer`` unless the head size is
  not 64, 128 or 256, or the model is Falcon or DeepSeek-V2 (line 161): then ``flashdecoding`` on compute
  capability 8 and above, ``paged`` below (lines 146-152). It fixes the KV block size
  (``server/text_generation_server/models/globals.py`` lines 38-46: flashdecoding 256, flashinfer 1,
  flashdecoding-ipex 64, paged 16) and whether prefill is chunked (``models/model.py`` lines 73-90: only
  with flashinfer or flashdecoding, and without speculation).
* **The warm-up batch** (``backends/v3/src/client/grpc_client.rs`` lines 109-194): requests of
  ``min(--max-input-tokens, what is left)`` prompt tokens until ``--max-batch-prefill-tokens`` are used, each
  asking ``--max-total-tokens - prompt`` new tokens (1 when unset); each reserves
  ``ceil((prompt + new - 1) / BLOCK_SIZE)`` KV blocks (``flash_causal_lm.py`` lines 341-350).
* **The KV sizing** (``server/text_generation_server/models/flash_causal_lm.py`` ``warmup``, lines
  1507-1684): a block is ``BLOCK_SIZE x kv_heads_per_shard x head_size x layers x 2 x dtype bytes`` (lines
  1519-1521); the warm-up batch's blocks are allocated and its prefill run (lines 1523-1548; an
  out-of-memory there is "Not enough memory to handle N prefill tokens", lines 1549-1553); then
  ``num_blocks = free // block + batch_blocks`` (lines 1556-1563), with
  ``free = max(0, free_now - (1 - CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM) x total)``
  (``utils/import_utils.py`` lines 13-17; ``TGI_WIGGLE_ROOM`` 0.90 at
  ``models/globals.py`` line 32, ``CUDA_MEMORY_FRACTION`` 1.0 at ``utils/dist.py`` line 13). The server
  answers ``num_blocks x BLOCK_SIZE`` as the max batch total tokens (line 1684), and, when unset,
  ``--max-total-tokens = min(that, tokenizer max length, max_position_embeddings)`` and
  ``--max-input-tokens = max_total - 1`` (lines 1566-1579).
* **The router's checks** (``backends/v3/src/lib.rs`` lines 98-100: ``max_total_tokens`` above the inferred
  total is "Not enough memory to handle `max_total_tokens=N`"; ``backends/v3/src/main.rs`` lines 182-196:
  ``max_input_tokens < max_total_tokens``, ``max_batch_prefill_tokens >= max_input_tokens`` without
  chunking, ``max_batch_prefill_tokens <= max_batch_total_tokens``).
* **KV dtype** (``server/text_generation_server/models/__init__.py`` lines 493-515): the model's dtype
  unless ``--kv-cache-dtype`` is ``fp8_e4m3fn`` or ``fp8_e5m2``; flash models load in bfloat16 or float16
  when none is given (``flash_causal_lm.py`` line 1220, ``models/__init__.py`` lines 464-472): 2 bytes.

Only primitives here (the bottom layer imports nothing of the tuner but its errors):
:mod:`kvpilot.tuner.engines.tgi_budget` maps a :class:`~kvpilot.tuner.model.ModelSpec` onto them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TGI_WIGGLE_ROOM = 0.90
"""``models/globals.py`` line 32: the share of ``CUDA_MEMORY_FRACTION`` the warm-up hands out."""
LAUNCHER_WIGGLE_ROOM = 0.95
"""``launcher/src/main.rs`` line 1806: the launcher's own, for the default prefill's VRAM cap."""
MIN_COMPUTE_OPTIMAL = 100
"""``launcher/src/main.rs`` line 39: a compute-optimal prefill of 100 tokens or fewer is ignored."""
DEFAULT_PREFILL_TOKENS = 4096
"""``launcher/src/main.rs`` line 2126."""
PREFILL_DEFAULT_BY_MODEL_TYPE: Mapping[str, int] = {"qwen2_vl": 10_000, "qwen2_5_vl": 10_000, "gemma3": 8000}
"""``launcher/src/main.rs`` lines 2124-2125."""
DEFAULT_CUDA_GRAPHS = (1, 2, 4, 8, 16, 32)
"""``launcher/src/main.rs`` line 2181: captured after the KV cache; a failure there is logged, not fatal."""

BLOCK_SIZES: Mapping[str, int] = {
    "flashdecoding": 256,
    "flashinfer": 1,
    "flashdecoding-ipex": 64,
    "paged": 16,
}
"""``models/globals.py`` lines 38-46."""
FLASHINFER_HEAD_DIMS = frozenset({64, 128, 256})
"""``launcher/src/main.rs`` line 155."""
FALLBACK_ATTENTION_MODEL_TYPES = frozenset({"falcon", "deepseek_v2"})
"""``launcher/src/main.rs`` line 161."""
CHUNKING_ATTENTIONS = frozenset({"flashinfer", "flashdecoding", "flashdecoding-ipex"})
"""``models/model.py`` lines 81-90."""

KV_CACHE_DTYPE_BYTES: Mapping[str, int] = {"fp8_e4m3fn": 1, "fp8_e5m2": 1}
"""``--kv-cache-dtype`` values (``models/__init__.py`` lines 509-512); any other: "Unknown kv_cache_dtype"."""
MODEL_DTYPE_BYTES = 2
"""bfloat16 / float16: what a flash model loads and caches in without ``--kv-cache-dtype``."""

CARD_F16_FLOPS: Mapping[str, int] = {
    "nvidia-4090": 82 * 10**12,
    "nvidia-t4": 65 * 10**12,
    "nvidia-l4": 121 * 10**12,
    "nvidia-l40": 181 * 10**12,
    "nvidia-l40s": 363 * 10**12,
    "nvidia-a10g": 125 * 10**12,
    "nvidia-a40": 149 * 10**12,
    "nvidia-a100": 312 * 10**12,
    "nvidia-h100": 900 * 10**12,
    "nvidia-h200": 989 * 10**12,
}
"""``ComputeType::f16_flop`` (``launcher/src/main.rs`` lines 1754-1785), keyed by the card family."""
CARD_NAMES: Mapping[str, str] = {
    "nvidia-4090": "nvidia-4090",
    "nvidia-t4": "nvidia-t4",
    "nvidia-l4": "nvidia-l4",
    "nvidia-l40": "nvidia-l40",
    "nvidia-l40s": "nvidia-l40s",
    "nvidia-a10g": "nvidia-a10g",
    "nvidia-a40": "nvidia-a40",
    "nvidia-h100-80gb-hbm3": "nvidia-h100",
    "nvidia-h100-nvl": "nvidia-h100",
    "nvidia-h100": "nvidia-h100",
    "nvidia-a100-sxm4-80gb": "nvidia-a100",
    "nvidia-a100-sxm4-40gb": "nvidia-a100",
    "nvidia-a100-80gb-pcie": "nvidia-a100",
    "nvidia-a100": "nvidia-a100",
    "nvidia-h200": "nvidia-h200",
}
"""``impl From<&str> for Gpu`` (``launcher/src/main.rs`` lines 1712-1731): ``nvidia-smi``'s name, spaces to
``-`` and lower-cased (line 1826) -> the card family; any other name is ``Unknown`` (no flops: 4096)."""


def card_family(smi_name: str) -> str | None:
    """The launcher's card for ``nvidia-smi``'s GPU name (``None``: ``Gpu::Unknown``)."""
    return CARD_NAMES.get(smi_name.replace(" ", "-").lower())


@dataclass(frozen=True)
class LauncherConfig:
    """The launcher's ``Config`` (``launcher/src/main.rs`` lines 241-258): what it reads of the config."""

    max_position_embeddings: int | None
    head_dim: int | None
    num_heads: int | None
    num_kv_heads: int | None
    num_layers: int | None
    intermediate_size: int | None
    hidden_size: int | None
    vocab_size: int | None
    model_type: str | None = None
    quantized: bool = False
    vision: bool = False
    num_experts_per_token: int = 1
    num_shared_experts: int = 0
    num_experts: int = 1

    def flop(self) -> int | None:
        """``Config::flop`` (lines 281-308): one token's forward flops, ``None`` for a VLM."""
        if self.vision:
            return None
        if None in (self.num_heads, self.num_kv_heads, self.head_dim, self.hidden_size):
            return None
        if self.intermediate_size is None or self.num_layers is None:
            return None
        heads, kv, d, h = (
            self.num_heads or 0,
            self.num_kv_heads or 0,
            self.head_dim or 0,
            self.hidden_size or 0,
        )
        inter = self.intermediate_size * (self.num_experts_per_token + self.num_shared_experts)
        attn = 3 * (2 * heads * d * h) + 2 * (2 * kv * d * h)  # q, attn, o; k, v
        return (attn + 2 * 3 * h * inter) * self.num_layers

    def kv_vram_per_tok(self) -> int | None:
        """``Config::kv_vram_per_tok`` (lines 310-318): 2 (K, V) x 2 bytes; ``None`` when quantized."""
        if self.quantized or None in (self.num_kv_heads, self.head_dim, self.num_layers):
            return None
        return (self.num_kv_heads or 0) * 2 * (self.head_dim or 0) * 2 * (self.num_layers or 0)

    def mlp_vram_per_tok(self) -> int | None:
        """``Config::mlp_vram_per_tok`` (lines 320-328): ``(I + I/2) x experts x 2 bytes x 3``
        ("overshooting", its comment says)."""
        if self.intermediate_size is None:
            return None
        mlp = self.intermediate_size
        return (mlp + mlp // 2) * self.num_experts * 2 * 3

    def token_vram(self) -> int | None:
        """``Config::token_vram`` (lines 330-335)."""
        kv, mlp = self.kv_vram_per_tok(), self.mlp_vram_per_tok()
        return None if kv is None or mlp is None else kv + mlp

    def model_vram(self) -> int | None:
        """``Config::model_vram`` (lines 337-351): its parameter count x 2 bytes; ``None`` when quantized."""
        values = (self.num_heads, self.num_kv_heads, self.head_dim, self.hidden_size, self.intermediate_size)
        if self.quantized or None in values or self.vocab_size is None or self.num_layers is None:
            return None
        heads, kv, d, h, inter = (v or 0 for v in values)
        layer = 3 * inter * self.num_experts * h + (heads + 2 * kv) * d + heads * d * h
        return (layer * self.num_layers + 2 * h * self.vocab_size) * 2


@dataclass(frozen=True)
class PrefillDefault:
    """How the launcher arrived at its default ``--max-batch-prefill-tokens`` (lines 2114-2152)."""

    card: str | None
    compute_optimal: int | None
    """``f16_flop x num_shard / flop`` when over 100, else ``None``."""
    fallback: int
    max_position_embeddings: int | None
    vram_maximum: int | None
    model_vram: int | None
    """The launcher's estimate of the model (``None``: quantized, no estimate and no VRAM cap)."""
    value: int


def vram_maximum(
    config: LauncherConfig, smi_total_mib: int, num_shard: int, memory_fraction: float
) -> int | None:
    """``vram_maximum`` (lines 62-89) with ``ComputeType::vram`` (lines 1787-1810): the tokens the launcher
    thinks fit beside its estimate of the model. ``None`` when it cannot tell (quantized) or nothing fits."""
    total = smi_total_mib * 2**20 * num_shard
    available = int(float(total) * memory_fraction * LAUNCHER_WIGGLE_ROOM)
    model, per_token = config.model_vram(), config.token_vram()
    if model is None or per_token is None or available < model:
        return None
    return (available - model) // per_token


def default_max_batch_prefill_tokens(
    config: LauncherConfig,
    *,
    smi_name: str,
    smi_total_mib: int,
    num_shard: int,
    memory_fraction: float,
) -> PrefillDefault:
    """The launcher's default ``--max-batch-prefill-tokens`` on ``num_shard`` GPUs named ``smi_name``."""
    card = card_family(smi_name)
    flops, model_flop = CARD_F16_FLOPS.get(card or ""), config.flop()
    optimal = None
    if flops is not None and model_flop:
        size = flops * num_shard // model_flop
        optimal = size if size > MIN_COMPUTE_OPTIMAL else None
    fallback = PREFILL_DEFAULT_BY_MODEL_TYPE.get(config.model_type or "", DEFAULT_PREFILL_TOKENS)
    value = optimal if optimal is not None else fallback
    if config.max_position_embeddings is not None:
        value = min(value, config.max_position_embeddings)
    cap = vram_maximum(config, smi_total_mib, num_shard, memory_fraction)
    if cap is not None:
        value = min(value, cap)
    return PrefillDefault(
        card, optimal, fallback, config.max_position_embeddings, cap, config.model_vram(), value
    )


def resolve_attention(
    head_dim: int | None, model_type: str | None, compute_capability: tuple[int, int]
) -> str:
    """``resolve_attention`` (lines 131-199) with neither ``ATTENTION`` nor LoRA adapters set."""
    fallback = "paged" if compute_capability[0] < 8 else "flashdecoding"
    if head_dim not in FLASHINFER_HEAD_DIMS or model_type in FALLBACK_ATTENTION_MODEL_TYPES:
        return fallback
    return "flashinfer"


def supports_chunking(attention: str, speculate: int = 0) -> bool:
    """``Model.__init__`` (``models/model.py`` lines 73-90), with ``PREFILL_CHUNKING`` at its default 1."""
    return attention in CHUNKING_ATTENTIONS and speculate == 0


def kv_heads_per_shard(num_kv_heads: int, num_shard: int) -> int:
    """``flash_causal_lm.py`` lines 1291-1295: split over the shards unless there is one KV head (0 fails the
    assert at line 1296)."""
    return num_kv_heads // num_shard if num_kv_heads > 1 else num_kv_heads


def kv_block_bytes(*, layers: int, kv_heads: int, head_size: int, dtype_bytes: int, block_size: int) -> int:
    """``total_cache_size`` (``flash_causal_lm.py`` lines 1519-1521): one block of K and V in every layer."""
    return layers * block_size * kv_heads * head_size * 2 * dtype_bytes


@dataclass(frozen=True)
class WarmupRequest:
    prompt_tokens: int
    blocks: int


def warmup_batch(
    max_batch_prefill_tokens: int,
    max_input_tokens: int | None,
    max_total_tokens: int | None,
    block_size: int,
) -> tuple[WarmupRequest, ...]:
    """The router's warm-up batch (``grpc_client.rs`` lines 119-194) and the blocks each request reserves
    (``flash_causal_lm.py`` lines 341-350, no speculation)."""
    requests: list[WarmupRequest] = []
    used = 0
    while used < max_batch_prefill_tokens:
        prompt = max_batch_prefill_tokens - used
        if max_input_tokens is not None:
            prompt = min(max_input_tokens, prompt)
        new = max_total_tokens - prompt if max_total_tokens is not None else 1
        requests.append(WarmupRequest(prompt, math.ceil((prompt + new - 1) / block_size)))
        used += prompt
    return tuple(requests)


def free_after_prefill(free_now: int, total: int, memory_fraction: float) -> int:
    """``get_cuda_free_memory(device, CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM)`` (``import_utils.py`` lines
    13-17, called at ``flash_causal_lm.py`` line 1556)."""
    return max(0, int(free_now - (1 - memory_fraction * TGI_WIGGLE_ROOM) * total))


def infer_num_blocks(free_bytes: int, block_bytes: int, batch_blocks: int) -> int:
    """``num_blocks`` (``flash_causal_lm.py`` lines 1558-1563): the free memory in blocks, plus the warm-up
    batch's blocks (allocated during the measure, freed after)."""
    return free_bytes // block_bytes + batch_blocks
