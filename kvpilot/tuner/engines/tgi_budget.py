"""TGI 3.3.7's memory budget for one model on one GPU: the warm-up, the KV blocks it infers, what it allows.

TGI's terms, not vLLM's or SGLang's (:mod:`kvpilot.tuner.tgi.warmup` holds every rule, with file and line of
tag ``v3.3.7``). The launcher picks ``--max-batch-prefill-tokens`` (compute-optimal for the card, capped by
``max_position_embeddings`` and its own VRAM estimate); the shard loads the weights, allocates the
warm-up batch's KV blocks and runs a prefill of that many tokens (out of memory there: "Not enough memory to
handle N prefill tokens"); then, with the prefill's activations still cached by torch,

    free = max(0, free_now - (1 - CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM) x total)
    num_blocks = free // (BLOCK_SIZE x kv_heads_per_shard x head_size x layers x 2 x dtype) + warm-up blocks
    max batch total tokens = num_blocks x BLOCK_SIZE

and the router refuses a ``--max-total-tokens`` above it ("Not enough memory to handle
`max_total_tokens=N`"). So the KV cache gets ``0.9 x total - CUDA context - weights - prefill activations``.

kvpilot's estimates, not TGI's code: the CUDA context and NCCL buffers
(:data:`~kvpilot.tuner.memory.CUDA_CONTEXT_GIB`, :data:`~kvpilot.tuner.memory.NCCL_GIB`), the weights
(:func:`~kvpilot.tuner.memory.compute_weight_bytes`), and the prefill's activation peak, taken as TGI's
launcher's own per-token estimate (``mlp_vram_per_tok``, which its comment calls overshooting) over the
shards. The tokenizer's ``model_max_length`` (one more cap on TGI's default ``--max-total-tokens``) is not
known here. CUDA graphs are captured after the KV cache, inside the wiggle room; a failure there is logged,
not fatal (``flash_causal_lm.py`` lines 1650-1677).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpilot.tuner import errors, tgi
from kvpilot.tuner.memory import CUDA_CONTEXT_GIB, NCCL_GIB, compute_weight_bytes
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.model.layers import FULL, NO_KV, SLIDING
from kvpilot.tuner.tgi import warmup
from kvpilot.tuner.tgi.models import check_served
from kvpilot.tuner.types import GIB, GpuSpec

MIB = 1 << 20
MIN_PREFILL_TOKENS = 256
"""The smallest ``--max-batch-prefill-tokens`` :func:`plan_tgi_budget` halves down to."""


@dataclass(frozen=True)
class TgiBudget:
    """One TGI shard's memory at warm-up, and the settings it was computed for."""

    settings: tgi.TgiSettings
    """Every value TGI would use filled in (``max_batch_total_tokens``: the inferred one)."""
    given: tgi.TgiSettings
    """The settings as given (``None``: TGI's default)."""
    prefill_default: warmup.PrefillDefault | None
    """How the launcher picked ``--max-batch-prefill-tokens`` (``None``: given)."""
    attention: str
    block_size: int
    chunking: bool
    kv_dtype_bytes: int
    layers: int
    kv_heads_per_shard: int
    head_size: int
    block_bytes: int
    warmup_requests: tuple[warmup.WarmupRequest, ...]
    total_bytes: int
    non_torch_bytes: int
    weight_bytes: int
    activation_bytes: int
    activation_bytes_per_token: int
    free_after_prefill_bytes: int
    kv_free_bytes: int
    num_blocks: int
    max_position_embeddings: int

    @property
    def warmup_blocks(self) -> int:
        return sum(r.blocks for r in self.warmup_requests)

    @property
    def warmup_kv_bytes(self) -> int:
        return self.warmup_blocks * self.block_bytes

    @property
    def memory_fraction(self) -> float:
        return self.settings.cuda_memory_fraction or tgi.CUDA_MEMORY_FRACTION_DEFAULT

    @property
    def warmup_peak_bytes(self) -> int:
        """Device memory in use at the end of the warm-up prefill."""
        return self.non_torch_bytes + self.weight_bytes + self.warmup_kv_bytes + self.activation_bytes

    @property
    def weights_fit(self) -> bool:
        """The CUDA context and the weights fit torch's share of the device before any KV or prefill."""
        loaded = self.non_torch_bytes + self.weight_bytes
        return loaded <= self.total_bytes and self.weight_bytes <= self.memory_fraction * self.total_bytes

    @property
    def prefill_fits(self) -> bool:
        """The warm-up's KV blocks and prefill fit the device and torch's share of it
        (``set_per_process_memory_fraction``, ``utils/dist.py`` line 56)."""
        torch_peak = self.warmup_peak_bytes - self.non_torch_bytes
        return (
            self.warmup_peak_bytes <= self.total_bytes
            and torch_peak <= self.memory_fraction * self.total_bytes
        )

    @property
    def max_batch_total_tokens(self) -> int:
        """What warm-up answers and the router exports as ``tgi_batch_max_total_tokens``."""
        return self.num_blocks * self.block_size

    @property
    def max_total_tokens(self) -> int:
        return self.settings.max_total_tokens or 0

    @property
    def max_input_tokens(self) -> int:
        return self.settings.max_input_tokens or 0

    @property
    def max_batch_prefill_tokens(self) -> int:
        return self.settings.max_batch_prefill_tokens or 0

    @property
    def default_max_total_tokens(self) -> int:
        """TGI's own ``--max-total-tokens`` when unset (``flash_causal_lm.py`` lines 1566-1577)."""
        return min(self.max_batch_total_tokens, self.max_position_embeddings)

    @property
    def concurrency(self) -> int:
        """Requests of ``--max-total-tokens`` each that the KV cache holds at once."""
        return self.max_batch_total_tokens // self.max_total_tokens if self.max_total_tokens else 0

    @property
    def refusals(self) -> list[str]:
        """What TGI would say on the way up, in its order (empty: it starts)."""
        if not self.prefill_fits:
            return [tgi.prefill_tokens_error(self.max_batch_prefill_tokens)]
        found = []
        if self.max_total_tokens > self.max_batch_total_tokens:
            found.append(tgi.max_total_tokens_error(self.max_total_tokens))
        if self.max_input_tokens >= self.max_total_tokens:
            found.append("`max_input_tokens` must be < `max_total_tokens`")
        if not self.chunking and self.max_input_tokens > self.max_batch_prefill_tokens:
            found.append(
                "`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: "
                f"{self.max_batch_prefill_tokens} and {self.max_input_tokens}"
            )
        if self.max_batch_prefill_tokens > self.max_batch_total_tokens:
            found.append(
                "`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. Given: "
                f"{self.max_batch_prefill_tokens} and {self.max_batch_total_tokens}"
            )
        return found

    @property
    def feasible(self) -> bool:
        """TGI starts, and its KV cache holds at least one request of ``--max-total-tokens``."""
        return not self.refusals

    @property
    def rendered(self) -> tgi.TgiSettings:
        """What kvpilot renders: the lengths, the prefill and the admission limit pinned (so the pod does not
        depend on ``nvidia-smi`` or on the warm-up), the memory fraction when not TGI's 1.0, the shards above
        one; ``--max-batch-total-tokens`` never (deprecated for flash models, ``backends/v3/src/lib.rs``
        lines 89-97)."""
        s = self.settings
        fraction = s.cuda_memory_fraction
        return tgi.TgiSettings(
            max_input_tokens=s.max_input_tokens,
            max_total_tokens=s.max_total_tokens,
            max_batch_prefill_tokens=s.max_batch_prefill_tokens,
            max_concurrent_requests=s.max_concurrent_requests,
            cuda_memory_fraction=fraction if fraction != tgi.CUDA_MEMORY_FRACTION_DEFAULT else None,
            num_shard=s.num_shard if (s.num_shard or 1) > 1 else None,
        )


def _launcher_config(spec: ModelSpec) -> warmup.LauncherConfig:
    moe = spec.moe
    return warmup.LauncherConfig(
        max_position_embeddings=spec.max_len_base or spec.max_model_len,
        head_dim=spec.head_dim,
        num_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads,
        num_layers=spec.num_layers,
        intermediate_size=moe.moe_intermediate_size if moe else spec.intermediate_size,
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        model_type=spec.model_type,
        quantized=spec.quantization is not None,
        vision=spec.is_multimodal,
        num_experts_per_token=moe.experts_per_token if moe else 1,
        num_experts=moe.num_experts if moe else 1,
    )


def _check_modelled(spec: ModelSpec, shards: int) -> None:
    check_served(
        spec.model_type,
        multimodal=spec.is_multimodal,
        quant_method=spec.quantization.method if spec.quantization else None,
    )
    kinds = {kind for kind in spec.layer_kinds if kind != NO_KV}
    if not kinds <= {FULL, SLIDING} or spec.mla is not None:
        raise errors.InvalidEngineArgs(
            f"kvpilot's TGI model covers full-attention (and sliding-window) layers only; "
            f"{spec.architecture} has {sorted(kinds)} layers"
        )
    if warmup.kv_heads_per_shard(spec.num_kv_heads, shards) < 1:
        raise errors.InvalidEngineArgs(
            f"--num-shard {shards} is more than {spec.architecture}'s {spec.num_kv_heads} KV heads: TGI's "
            "assert self.num_kv_heads > 0 fails (flash_causal_lm.py line 1296)"
        )


def _smi_name(gpu: GpuSpec) -> str:
    """``nvidia-smi``'s name as the launcher reads it: the GPU feature discovery label is that name with
    spaces as ``-`` (the launcher does the same before lower-casing)."""
    return gpu.gfd_products[0] if gpu.gfd_products else gpu.name


def compute_tgi_budget(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: tgi.TgiSettings | None = None,
    *,
    weights_total_bytes: int | None = None,
    kv_cache_dtype: str | None = None,
) -> TgiBudget:
    """The budget TGI 3.3.7 arrives at for ``spec`` on ``gpu`` with ``settings`` (one shard's view)."""
    given = settings or tgi.TgiSettings()
    tgi.check_settings(given)
    shards = given.num_shard or 1
    _check_modelled(spec, shards)
    if kv_cache_dtype is not None and kv_cache_dtype not in warmup.KV_CACHE_DTYPE_BYTES:
        raise errors.InvalidEngineArgs(
            f"TGI --kv-cache-dtype {kv_cache_dtype!r} is unknown; it takes "
            f"{sorted(warmup.KV_CACHE_DTYPE_BYTES)}"
        )
    fraction = given.cuda_memory_fraction or tgi.CUDA_MEMORY_FRACTION_DEFAULT
    config = _launcher_config(spec)
    prefill_default = None
    prefill = given.max_batch_prefill_tokens
    if prefill is None:
        prefill_default = warmup.default_max_batch_prefill_tokens(
            config,
            smi_name=_smi_name(gpu),
            smi_total_mib=(gpu.nvml_total_bytes or gpu.total_bytes) // MIB,
            num_shard=shards,
            memory_fraction=fraction,
        )
        prefill = prefill_default.value
    attention = warmup.resolve_attention(spec.head_dim, spec.model_type, gpu.compute_capability)
    block = warmup.BLOCK_SIZES[attention]
    dtype_bytes = warmup.KV_CACHE_DTYPE_BYTES.get(kv_cache_dtype or "", warmup.MODEL_DTYPE_BYTES)
    kv_heads = warmup.kv_heads_per_shard(spec.num_kv_heads, shards)
    block_bytes = warmup.kv_block_bytes(
        layers=spec.num_layers,
        kv_heads=kv_heads,
        head_size=spec.head_dim,
        dtype_bytes=dtype_bytes,
        block_size=block,
    )
    requests = warmup.warmup_batch(prefill, given.max_input_tokens, given.max_total_tokens, block)
    weights = compute_weight_bytes(spec, tensor_parallel_size=shards, weights_total_bytes=weights_total_bytes)
    non_torch = int(CUDA_CONTEXT_GIB * GIB + (NCCL_GIB * GIB if shards > 1 else 0))
    per_token = (config.mlp_vram_per_tok() or 0) // shards
    activation = prefill * per_token
    warmup_kv = sum(r.blocks for r in requests) * block_bytes
    free_now = max(0, gpu.total_bytes - non_torch - weights - warmup_kv - activation)
    kv_free = warmup.free_after_prefill(free_now, gpu.total_bytes, fraction)
    num_blocks = warmup.infer_num_blocks(kv_free, block_bytes, sum(r.blocks for r in requests))
    max_position = config.max_position_embeddings or spec.max_model_len
    max_total = given.max_total_tokens or min(num_blocks * block, max_position)
    resolved = tgi.TgiSettings(
        max_input_tokens=given.max_input_tokens or max(1, max_total - 1),
        max_total_tokens=max_total,
        max_batch_prefill_tokens=prefill,
        max_batch_total_tokens=num_blocks * block,
        max_concurrent_requests=given.max_concurrent_requests or tgi.MAX_CONCURRENT_REQUESTS_DEFAULT,
        cuda_memory_fraction=fraction,
        num_shard=shards,
    )
    return TgiBudget(
        settings=resolved,
        given=given,
        prefill_default=prefill_default,
        attention=attention,
        block_size=block,
        chunking=warmup.supports_chunking(attention),
        kv_dtype_bytes=dtype_bytes,
        layers=spec.num_layers,
        kv_heads_per_shard=kv_heads,
        head_size=spec.head_dim,
        block_bytes=block_bytes,
        warmup_requests=requests,
        total_bytes=gpu.total_bytes,
        non_torch_bytes=non_torch,
        weight_bytes=weights,
        activation_bytes=activation,
        activation_bytes_per_token=per_token,
        free_after_prefill_bytes=free_now,
        kv_free_bytes=kv_free,
        num_blocks=num_blocks,
        max_position_embeddings=max_position,
    )


def plan_tgi_budget(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: tgi.TgiSettings | None = None,
    *,
    weights_total_bytes: int | None = None,
    kv_cache_dtype: str | None = None,
) -> TgiBudget:
    """The budget of the settings kvpilot would render: TGI's own defaults, then pinned.

    First TGI's way (the launcher's prefill, the KV inferred, ``--max-total-tokens`` its default
    ``min(max batch total tokens, max_position_embeddings)``); then those values pinned, as kvpilot renders
    them, which changes the warm-up batch (each request now reserves ``--max-total-tokens`` of KV). While TGI
    would not start: the prefill halved (TGI's own advice) down to :data:`MIN_PREFILL_TOKENS`,
    ``--max-total-tokens`` lowered to the inferred total, the prefill lowered to it, or (without prefill
    chunking) ``--max-input-tokens`` lowered to the prefill. Values given in ``settings`` are kept."""
    given = settings or tgi.TgiSettings()

    def compute(s: tgi.TgiSettings) -> TgiBudget:
        return compute_tgi_budget(
            spec, gpu, s, weights_total_bytes=weights_total_bytes, kv_cache_dtype=kv_cache_dtype
        )

    first = compute(given)
    current = replace(
        given,
        max_total_tokens=first.max_total_tokens,
        max_input_tokens=given.max_input_tokens or first.max_input_tokens,
        max_batch_prefill_tokens=first.max_batch_prefill_tokens,
        max_concurrent_requests=first.settings.max_concurrent_requests,
    )
    budget = compute(current)
    for _ in range(64):
        if budget.feasible:
            break
        prefill, total = budget.max_batch_prefill_tokens, budget.max_total_tokens
        inferred, free_input = budget.max_batch_total_tokens, given.max_input_tokens is None
        if not budget.weights_fit:
            break
        if (
            not budget.prefill_fits
            and given.max_batch_prefill_tokens is None
            and prefill > MIN_PREFILL_TOKENS
        ):
            current = replace(current, max_batch_prefill_tokens=max(MIN_PREFILL_TOKENS, prefill // 2))
        elif total > inferred >= 2 and given.max_total_tokens is None and free_input:
            current = replace(current, max_total_tokens=inferred, max_input_tokens=inferred - 1)
        elif prefill > inferred >= 1 and given.max_batch_prefill_tokens is None:
            current = replace(current, max_batch_prefill_tokens=inferred)
        elif not budget.chunking and budget.max_input_tokens > prefill and free_input:
            current = replace(current, max_input_tokens=prefill)
        else:
            break
        budget = compute(current)
    return replace(budget, prefill_default=first.prefill_default)
