"""Both sides of the KV-cache contract: vLLM 0.33's own planning and kvpilot's, on one point.

A *point* is a model's config.json with (TP, PP, block size, KV dtype, max_model_len, bytes available
per GPU, GPU compute capability). vLLM's side builds every layer's ``KVCacheSpec`` with the wheel's own
classes (``FullAttentionSpec``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``,
``MLAAttentionSpec``, ``MambaSpec``; state shapes and dtypes from ``MambaStateShapeCalculator`` /
``MambaStateDtypeCalculator`` on the raw config; per-token-head dtypes through
``TritonAttentionBackend.customize_spec``), splits the layers over PP ranks with ``get_pp_indices``, and
runs ``get_global_kv_cache_groups`` -> ``get_kv_cache_configs`` (null block, fit check, the estimated
maximum length in its ``ValueError``) -> ``generate_scheduler_kv_cache_config`` ->
``get_kv_cache_capacity``. kvpilot's side is ``compute_kv_layout`` per PP rank, the minimum block count,
``compute_capacity``, as ``memory.compute_budget`` calls them.

What a CUDA start does that the CPU platform does not is set on the shared ``VllmConfig`` (the audit's
section 3.1): the hybrid KV-cache manager on, async scheduling on, Model Runner V2 (``PP + 1`` batches in
flight), ``mamba_cache_mode`` "align" with prefix caching, the ``LBNHC`` layout. One step is a copy rather
than a call: the hybrid block alignment (``Platform._align_hybrid_block_size``), because the real one
resolves the model class and walks its built layers, which needs the model's full ``ModelConfig`` (30 to
100 s per model on CPU); the copy is ten lines below, with the FlashInfer GDN checkpoint alignment
(``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``) and the kernel block sizes read from the wheel.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.memory import kv_cache
from kvpilot.tuner.model import CHUNKED, FULL, LINEAR, MLA, NO_KV, SLIDING, ModelSpec

_EST = re.compile(r"estimated maximum model length is (\d+)")
MAX_NUM_BATCHED_TOKENS = 8192
V033 = (0, 33, 0)


@dataclass(frozen=True)
class Point:
    tp: int
    pp: int
    block: int
    dtype: str
    max_len: int
    available: int
    capability: tuple[int, int]


@dataclass(frozen=True)
class Outcome:
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    starts: bool
    estimated_max_len: int | None


def _text(config: dict[str, Any]) -> dict[str, Any]:
    for key in ("text_config", "language_config", "llm_config"):
        nested = config.get(key)
        if isinstance(nested, dict):
            return {**{k: v for k, v in config.items() if k in ("torch_dtype", "dtype")}, **nested}
    return config


def _ssm_dtype(text: dict[str, Any], model_type: str) -> str:
    """vLLM's config hooks (``model_executor/models/config.py``) for ``--mamba-ssm-cache-dtype auto``."""
    if model_type.startswith("qwen3_5"):
        return str(text.get("mamba_ssm_dtype") or "auto")
    if model_type == "nemotron_h":
        return str(text.get("mamba_ssm_cache_dtype") or "float32")
    return "auto"


def mamba_spec_parts(
    m: Any, config: dict[str, Any], spec: ModelSpec, tp: int, torch_dtype: Any
) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """State shapes, dtypes and mamba type of one linear layer, from vLLM's calculators."""
    mu = m["mamba_utils"]
    text = _text(config)
    model_type = spec.model_type
    ssm = _ssm_dtype(text, model_type)
    if model_type == "nemotron_h":
        shapes = mu.MambaStateShapeCalculator.mamba2_state_shape(
            tp_world_size=tp,
            intermediate_size=text["mamba_num_heads"] * text["mamba_head_dim"],
            n_groups=text["n_groups"],
            num_heads=text["mamba_num_heads"],
            head_dim=text["mamba_head_dim"],
            state_size=text["ssm_state_size"],
            conv_kernel=text["conv_kernel"],
        )
        dtypes = mu.MambaStateDtypeCalculator.mamba2_state_dtype(torch_dtype, "auto", ssm)
        kind = m["MambaAttentionBackendEnum"].MAMBA2
    elif "linear_attn_config" in text:  # Kimi-K3: KimiK3DeltaAttention.get_state_shape / get_state_dtype
        kda = text["linear_attn_config"]
        shapes = mu.MambaStateShapeCalculator.kda_state_shape(
            tp, kda["num_heads"], kda["head_dim"], conv_kernel_size=kda["short_conv_kernel_size"]
        )
        dtypes = mu.MambaStateDtypeCalculator.kda_state_dtype(torch_dtype, "auto", "auto")
        kind = m["MambaAttentionBackendEnum"].GDN_ATTN  # GatedDeltaNetAttention.mamba_type
    else:
        shapes = mu.MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp,
            text["linear_num_key_heads"],
            text["linear_num_value_heads"],
            text["linear_key_head_dim"],
            text["linear_value_head_dim"],
            text["linear_conv_kernel_dim"],
        )
        dtypes = mu.MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch_dtype, "auto", ssm)
        kind = m["MambaAttentionBackendEnum"].GDN_ATTN
    return tuple(shapes), tuple(dtypes), kind


def through_mixer2(m: Any, base: Any) -> Any:
    """``base`` as vLLM's own ``MambaMixer2.get_kv_cache_spec`` returns it (0.33 adds one prefill
    checkpoint block, alignment 1): the method itself, called on a probe whose ``MambaBase`` part
    returns ``base`` (building the mixer needs a full model config and a device)."""
    mixer2 = m["MambaMixer2"]
    mamba_base = next(c for c in mixer2.__mro__[1:] if c.__name__ == "MambaBase")

    class _Base(mamba_base):  # type: ignore[misc,valid-type]
        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return self.__dict__["probe_spec"]

    class _Probe(mixer2, _Base):  # type: ignore[misc,valid-type]
        pass

    probe = object.__new__(_Probe)
    object.__setattr__(probe, "probe_spec", base)
    return mixer2.get_kv_cache_spec(probe, None)


def build_vllm_specs(
    m: Any, vc: Any, config: dict[str, Any], spec: ModelSpec, p: Point
) -> tuple[list[dict[str, Any]], int]:
    """Every layer's KVCacheSpec, split into PP workers, and the block size the platform settles on."""
    if spec.compressed is not None:
        return build_compressed_specs(m, vc, config, spec, p)
    vc.cache_config.kv_cache_layout = "LBNHC"
    torch = m["torch"]
    model_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[spec.dtype]
    kv_dtype = model_dtype if p.dtype == "auto" else m["STR_DTYPE_TO_TORCH_DTYPE"][p.dtype]
    quant = m["get_kv_quant_mode"](p.dtype)
    per_token_head = p.dtype.endswith("_per_token_head")
    block = p.block
    align = True  # prefix caching on: MambaModelConfig's align mode
    checkpoint = 0
    state: tuple[Any, ...] | None = None
    if any(layer.kind == LINEAR for layer in spec.layers):
        shapes, dtypes, mamba_type = mamba_spec_parts(m, config, spec, p.tp, model_dtype)
        mamba_page = m["MambaSpec"](shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
        full = next(layer for layer in spec.layers if layer.kind in (FULL, MLA))
        one = _attention_spec(m, full, 1, p.tp, kv_dtype, quant, p.dtype, per_token_head)
        alignment = prefill_checkpoint_alignment(m, config, spec, p) if align else None
        block, padded = align_hybrid_block_size(block, spec.mla is not None, alignment, mamba_page, one)
        checkpoint = 1 if alignment else 0
        state = (shapes, dtypes, mamba_type, None if padded == mamba_page else padded, alignment)
    specs: dict[int, Any] = {}
    for index, layer in enumerate(spec.layers):
        if layer.kind == NO_KV:
            continue
        if layer.kind == LINEAR:
            assert state is not None
            shapes, dtypes, mamba_type, padded, alignment = state
            specs[index] = m["MambaSpec"](
                shapes=shapes,
                dtypes=dtypes,
                block_size=block,
                page_size_padded=padded,
                mamba_type=mamba_type,
                mamba_cache_mode="align" if align else "none",
                num_prefill_checkpoint_blocks=checkpoint,
                # KimiK3DeltaAttention.get_kv_cache_spec sets the alignment on its spec; GDN leaves None.
                prefill_checkpoint_alignment=alignment if "linear_attn_config" in _text(config) else None,
            )
            if mamba_type == m["MambaAttentionBackendEnum"].MAMBA2:  # Nemotron-H's MambaMixer2
                specs[index] = through_mixer2(m, specs[index])
        else:
            specs[index] = _attention_spec(m, layer, block, p.tp, kv_dtype, quant, p.dtype, per_token_head)
    named = {f"model.layers.{i}.attn": (i, s) for i, s in specs.items()}
    for index in indexer_layers(config, spec.num_layers):
        named[f"model.layers.{index}.self_attn.indexer.k_cache"] = (index, indexer_spec(m, config, block))
    workers = []
    for rank in range(p.pp):
        start, end = m["get_pp_indices"](spec.num_layers, rank, p.pp)
        workers.append({name: s for name, (i, s) in named.items() if start <= i < end})
    return workers, block


def align_hybrid_block_size(
    block: int, mla: bool, alignment: int | None, mamba_page: int, one: Any
) -> tuple[int, int]:
    """A copy of ``Platform._align_hybrid_block_size`` (``platforms/interface.py``): the attention block
    that holds one state page, and the page the state is padded to (``one``: a one-token attention spec)."""
    kernel = max(16, block)
    if mla:
        kernel = max(kernel, 128)
    if alignment:
        kernel = math.lcm(kernel, alignment)
    attn_block = kernel * -(-mamba_page // (kernel * one.page_size_bytes))
    attn_block = 16 * -(-attn_block // 16)
    block = max(block, attn_block)
    return block, block * one.page_size_bytes


def prefill_checkpoint_alignment(m: Any, config: dict[str, Any], spec: ModelSpec, p: Point) -> int | None:
    """The state layers' prefill-checkpoint grid on this GPU: FlashInfer GDN (Qwen3-Next, Qwen3.5) or
    FlashKDA (Kimi-K3). The kernel choice is a copy of ``_resolve_gdn_prefill_backend`` /
    ``resolve_kda_prefill_backend`` (both ask the CUDA platform); the grids are the wheel's own."""
    text = _text(config)
    if "linear_attn_config" in text:
        kda = text["linear_attn_config"]
        flashkda = (
            p.capability[0] in (9, 10, 12)
            and kda["head_dim"] == 128
            and spec.dtype == "bfloat16"
            and kda.get("gate_lower_bound") is not None
        )
        return m["kda_prefill_checkpoint_alignment"]("flashkda" if flashkda else "triton")
    if spec.model_type != "nemotron_h" and kv_vllm.uses_flashinfer_gdn(
        p.capability, text.get("linear_key_head_dim", 0)
    ):
        return int(m["FLASHINFER_GDN_CHECKPOINT_ALIGNMENT"])
    return None


def build_compressed_specs(
    m: Any, vc: Any, config: dict[str, Any], spec: ModelSpec, p: Point
) -> tuple[list[dict[str, Any]], int]:
    """DeepSeek-V4's caches, each from the wheel's own class: the ``DeepseekV4SWACache``,
    ``CompressorStateCache`` and ``DeepseekV4IndexerCache`` modules are built (under
    ``set_current_vllm_config``, their registrations removed again), the compressed latent's spec is
    ``DeepseekV4Attention.get_kv_cache_spec`` on the attributes its ``__init__`` sets, the KV dtype from
    ``_resolve_dsv4_kv_cache_dtype`` (CUDA's FlashMLA
    layout). The block is the one the DSV4 indexer backend accepts, the layout the one it asks for
    (block-outermost, so vLLM packs the groups). The attention layer's own ``__init__`` (its linears, rotary
    and kernels) is not run: it needs the CUDA kernels and a built model."""
    torch = m["torch"]
    block = m["DeepseekV4IndexerBackend"].get_supported_kernel_block_sizes()[0]
    vc.cache_config.kv_cache_layout = m["DeepseekV4IndexerBackend"].supported_kv_cache_layouts()[0].name
    cache_dtype, torch_dtype = m["resolve_dsv4_kv_cache_dtype"](True, p.dtype, None)
    vc.cache_config.block_size = block
    vc.cache_config.cache_dtype = cache_dtype
    text = _text(config)
    head, index_head, window = text["head_dim"], text["index_head_dim"], text["sliding_window"]
    forward = vc.compilation_config.static_forward_context
    before = set(forward)
    named: dict[str, tuple[int, Any]] = {}
    try:
        with m["set_current_vllm_config"](vc):
            for index in range(spec.num_layers):
                ratio = max(1, text["compress_ratios"][index])
                prefix = f"model.layers.{index}.attn"
                swa_name = f"{prefix}.swa_cache"
                swa = m["DeepseekV4SWACache"](head, window, torch_dtype, swa_name, vc.cache_config)
                named[swa.prefix] = (index, swa.get_kv_cache_spec(vc))
                if ratio > 1:
                    attn = types.SimpleNamespace(
                        compress_ratio=ratio,
                        head_dim=head,
                        kv_cache_dtype=cache_dtype,
                        kv_cache_torch_dtype=torch_dtype,
                    )
                    named[prefix] = (index, m["DeepseekV4Attention"].get_kv_cache_spec(attn, vc))
                    coff = 1 + (ratio == 4)  # DeepseekCompressor: kv_state + score_state
                    state = m["CompressorStateCache"](
                        2 * coff * head, torch.float32, ratio, f"{prefix}.compressor.state_cache"
                    )
                    named[state.prefix] = (index, state.get_kv_cache_spec(vc))
                if ratio == 4:
                    k_cache = m["DeepseekV4IndexerCache"](
                        index_head + index_head // 128 * 4,
                        torch.uint8,
                        f"{prefix}.indexer.k_cache",
                        vc.cache_config,
                        compress_ratio=ratio,
                    )
                    named[k_cache.prefix] = (index, k_cache.get_kv_cache_spec(vc))
                    state = m["CompressorStateCache"](
                        2 * 2 * index_head, torch.float32, ratio, f"{prefix}.indexer.compressor.state_cache"
                    )
                    named[state.prefix] = (index, state.get_kv_cache_spec(vc))
    finally:
        for name in set(forward) - before:
            del forward[name]
        vc.cache_config.block_size = 16
        vc.cache_config.cache_dtype = "auto"
    workers = []
    for rank in range(p.pp):
        start, end = m["get_pp_indices"](spec.num_layers, rank, p.pp)
        workers.append({name: s for name, (i, s) in named.items() if start <= i < end})
    return workers, block


def indexer_layers(config: dict[str, Any], num_layers: int) -> list[int]:
    """The layers that build a sparse-attention indexer: a copy of ``DeepseekV2DecoderLayer``'s
    "IndexCache" rule (``model_executor/models/deepseek_v2.py``), which needs a built model to run."""
    text = _text(config)
    if "index_topk" not in text:
        return []
    freq = text.get("index_topk_freq") or 1
    pattern = text.get("index_topk_pattern")
    offset = text.get("index_skip_topk_offset", 2)
    layers = []
    for layer in range(num_layers):
        if pattern is None:
            skip = max(layer - offset + 1, 0) % freq != 0
        else:
            skip = 0 <= layer < len(pattern) and pattern[layer] == "S"
        if not skip:
            layers.append(layer)
    return layers


def indexer_spec(m: Any, config: dict[str, Any], block: int) -> Any:
    """One layer's indexer cache spec from the wheel's own ``DeepseekV32IndexerCache.get_kv_cache_spec``;
    its ``head_dim`` as ``Indexer.__init__`` computes it (fp8 keys plus an fp32 scale per 128)."""
    head = _text(config)["index_head_dim"]
    cache = types.SimpleNamespace(
        head_dim=head + head // 128 * 4,
        dtype=m["torch"].uint8,
        cache_config=types.SimpleNamespace(block_size=block),
    )
    return m["DeepseekV32IndexerCache"].get_kv_cache_spec(cache, None)


def _attention_spec(
    m: Any, layer: Any, block: int, tp: int, kv_dtype: Any, quant: Any, dtype: str, per_token_head: bool
) -> Any:
    if layer.kind == MLA:
        return m["MLAAttentionSpec"](
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=layer.head_dim,
            dtype=kv_dtype,
            cache_dtype_str=dtype,
            kv_quant_mode=quant,
            state_content_bytes={"fp8_ds_mla": 656}.get(dtype),
        )
    common = dict(
        block_size=block,
        num_kv_heads=max(1, layer.num_kv_heads // tp),
        head_size=layer.head_dim,
        head_size_v=layer.head_dim_v,
        dtype=kv_dtype,
        kv_quant_mode=quant,
    )
    if layer.kind == SLIDING:
        spec = m["SlidingWindowSpec"](**common, sliding_window=layer.window)
    elif layer.kind == CHUNKED:
        spec = m["ChunkedLocalAttentionSpec"](**common, attention_chunk_size=layer.window)
    else:
        spec = m["FullAttentionSpec"](**common)
    return m["TritonAttentionBackend"].customize_spec(spec) if per_token_head else spec


def vllm_outcome(m: Any, vc: Any, workers: list[dict[str, Any]], p: Point) -> Outcome:
    vc.model_config.max_model_len = p.max_len
    vc.parallel_config.pipeline_parallel_size = p.pp
    vc.parallel_config.tensor_parallel_size = p.tp
    groups = m["get_global_kv_cache_groups"](vc, workers)
    available = [p.available] * p.pp
    try:
        configs = m["get_kv_cache_configs"](vc, workers, available, groups)
    except ValueError as exc:
        found = _EST.search(str(exc))
        # The counts vLLM would log are never reached; take them from the allocation alone.
        configs = m["get_kv_cache_configs_unchecked"](vc, workers, available, groups)
        blocks = configs[0].num_blocks
        tokens, conc = m["get_kv_cache_capacity"](vc, m["generate_scheduler_kv_cache_config"](configs))
        return Outcome(blocks, tokens, conc, False, int(found.group(1)) if found else None)
    scheduler = m["generate_scheduler_kv_cache_config"](configs)
    tokens, conc = m["get_kv_cache_capacity"](vc, scheduler)
    return Outcome(configs[0].num_blocks, tokens, conc, True, None)


def build_cuda_like_config(model_config: Any) -> Any:
    """A ``VllmConfig`` for ``model_config`` set the way a CUDA start sets it (hybrid manager, async
    scheduling, V2 runner, prefix caching on, Mamba align mode)."""
    from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig, VllmConfig

    config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=16, enable_prefix_caching=True),
        parallel_config=ParallelConfig(),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_num_seqs=1024,
            max_model_len=model_config.max_model_len,
            is_encoder_decoder=False,
        ),
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.scheduler_config.async_scheduling = True
    config.cache_config.kv_cache_layout = "LBNHC"
    config.cache_config.mamba_cache_mode = "align"
    return config


def kvpilot_outcome(
    spec: ModelSpec, p: Point, in_flight_batches: int, enable_prefix_caching: bool | None = None
) -> Outcome:
    layouts = [
        kv_cache.compute_kv_layout(
            spec,
            tensor_parallel_size=p.tp,
            pipeline_parallel_size=p.pp,
            pp_rank=rank,
            kv_cache_dtype=p.dtype,
            block_size=p.block,
            vllm_version=V033,
            compute_capability=p.capability,
            enable_prefix_caching=enable_prefix_caching,
        )
        for rank in range(p.pp)
    ]
    in_flight = in_flight_batches * MAX_NUM_BATCHED_TOKENS
    cap, _ = kv_cache.compute_stage_capacity(layouts, [p.available] * p.pp, p.max_len, in_flight, V033)
    est = None if cap.fits or cap.longest_fitting_len <= 0 else cap.longest_fitting_len
    return Outcome(cap.num_blocks, cap.tokens, cap.max_concurrency, cap.fits, est)


def compare_outcomes(
    m: Any,
    vc: Any,
    workers: list[dict[str, Any]],
    spec: ModelSpec,
    p: Point,
    enable_prefix_caching: bool | None = None,
) -> tuple[Outcome, Outcome]:
    """kvpilot's outcome and vLLM's (``vc`` set to the point's PP) for one point, each with its in-flight
    batches: ``(ours, theirs)``."""
    vc.parallel_config.pipeline_parallel_size = p.pp
    theirs = vllm_outcome(m, vc, workers, p)
    ours = kvpilot_outcome(spec, p, kv_vllm.in_flight_batches(V033, p.pp), enable_prefix_caching)
    return ours, theirs


def collect_misses(
    m: Any,
    vc: Any,
    spec: ModelSpec,
    points: Iterable[Point],
    vllm_workers: Callable[[Point], list[dict[str, Any]]],
    ours_point: Callable[[Point], Point] = lambda p: p,
    theirs_point: Callable[[Point], Point] = lambda p: p,
) -> list[str]:
    """Every point where kvpilot's outcome differs from vLLM's, as a line each (empty: all exact).

    ``vllm_workers`` builds vLLM's per-PP-rank layer specs for a point; ``ours_point`` and
    ``theirs_point`` let a contract give each side its own reading of the point (e.g. the KV dtype
    ``auto`` resolves to), both default to the point itself. ``vc`` is set to the point's PP.
    """
    misses = []
    for point in points:
        ours_at, theirs_at = ours_point(point), theirs_point(point)
        vc.parallel_config.pipeline_parallel_size = point.pp
        theirs = vllm_outcome(m, vc, vllm_workers(theirs_at), theirs_at)
        ours = kvpilot_outcome(spec, ours_at, kv_vllm.in_flight_batches(V033, point.pp))
        if ours != theirs:
            misses.append(f"{point}: kvpilot {ours} vLLM {theirs}")
    return misses


def unchecked(planning: Any) -> Any:
    """``get_kv_cache_configs`` without its fit check (for the counts of a point that does not start)."""

    def run(vc: Any, workers: Any, available: Any, groups: Any) -> Any:
        original = planning._check_enough_kv_cache_memory
        planning._check_enough_kv_cache_memory = lambda *args, **kwargs: None
        try:
            return planning.get_kv_cache_configs(vc, workers, available, groups)
        finally:
            planning._check_enough_kv_cache_memory = original

    return run


__all__ = [
    "Outcome",
    "Point",
    "build_vllm_specs",
    "collect_misses",
    "through_mixer2",
    "kvpilot_outcome",
    "replace",
    "unchecked",
    "vllm_outcome",
]
