"""SGLang's memory budget for one model on one GPU: the static fraction, the KV pool, the tokens it holds.

SGLang's own terms, not vLLM's (:mod:`kvpilot.tuner.sglang.defaults`): ``--mem-fraction-static`` is
(weights + KV pool) / GPU memory. SGLang measures the free memory before loading the model
(``pre_model_load_memory``), loads the weights, and gives the KV pool what is free after them less
``pre_model_load_memory * (1 - mem_fraction_static)`` (``_profile_available_bytes``); the pool holds
``pool_bytes // cell_size`` tokens, rounded down to a page, where a full-attention cell is
``kv_heads_per_rank * (head_dim + v_head_dim) * layers * kv_bytes`` (``pool_configurator.py`` lines
492-498). So ``pool = pre * fraction - weights``. The architecture facts come from
:mod:`kvpilot.tuner.model`, the weights from :func:`kvpilot.tuner.memory.compute_weight_bytes`.

Modelled: text-only models whose every KV layer is full attention, or MLA without a sparse-attention
indexer (sliding-window, hybrid, DSA and compressed layers have pool configurators or cell sizes of their
own in SGLang, and vision-language models a fraction adjustment: refused with a clear error).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpilot.tuner import errors, sglang
from kvpilot.tuner.fp8_advice import describe_fp8_fits
from kvpilot.tuner.memory import CUDA_CONTEXT_GIB, compute_weight_bytes
from kvpilot.tuner.model import DTYPE_BYTES, ModelSpec
from kvpilot.tuner.model.layers import FULL, MLA, NO_KV
from kvpilot.tuner.types import GIB, GpuSpec

MIB = 1 << 20


@dataclass(frozen=True)
class SglangBudget:
    """One SGLang engine's memory, per GPU, and the settings it was computed for."""

    settings: sglang.SglangSettings
    """The settings with every default SGLang would pick filled in."""
    gpu_mib: float
    """``nvidia-smi``'s total, which SGLang reads to pick its defaults."""
    cuda_graph_max_bs: int
    """The decode CUDA graph's largest batch (SGLang's tier default, capped by ``--max-running-requests``)."""
    reserve: sglang.Reserve
    fraction_is_default: bool
    pre_load_bytes: int
    """Free memory before the model loads: the CUDA-visible total less the CUDA context."""
    weight_bytes: int
    pool_bytes: int
    cell_bytes: int
    max_total_tokens: int
    context_length: int
    notes: tuple[str, ...] = ()
    """What the planner chose beyond SGLang's defaults and why (an fp8 KV cache: :func:`plan_sglang_kv`),
    printed after the budget (:func:`explain_sglang_budget`)."""
    would_fit: tuple[str, ...] = ()
    """Where the budget does not fit, what would (an fp8 KV cache the user has not allowed:
    :func:`plan_sglang_kv`), printed after why it does not (:func:`explain_sglang_infeasible`)."""

    @property
    def feasible(self) -> bool:
        """SGLang starts (a pool of at least one page) and one full-context request fits the pool."""
        return self.max_total_tokens >= self.context_length

    @property
    def rendered(self) -> sglang.SglangSettings:
        """What kvpilot renders: the context, the fraction and the prefill chunk pinned (so the pod does not
        depend on ``nvidia-smi``'s reading), the sequences, the KV dtype (unless ``auto``), TP and (above
        one) the pipeline stages the budget was computed for; the rest left to SGLang."""
        s = self.settings
        return sglang.SglangSettings(
            context_length=self.context_length,
            mem_fraction_static=s.mem_fraction_static,
            max_running_requests=s.max_running_requests,
            chunked_prefill_size=s.chunked_prefill_size,
            kv_cache_dtype=s.kv_cache_dtype if s.kv_cache_dtype != "auto" else None,
            tp_size=s.tp_size,
            pp_size=s.pp_size if (s.pp_size or 1) > 1 else None,
        )

    @property
    def full_context_requests(self) -> int:
        return self.max_total_tokens // self.context_length


def _check_modelled(spec: ModelSpec) -> None:
    kinds = {kind for kind in spec.layer_kinds if kind != NO_KV}
    sparse = any(layer.indexer_head_dim for layer in spec.layers)
    if kinds not in ({FULL}, {MLA}) or sparse or spec.compressed is not None:
        indexer = " with a sparse-attention indexer" if sparse else ""
        raise errors.InvalidEngineArgs(
            f"kvpilot's SGLang model covers full-attention and MLA models only; {spec.architecture} has "
            f"{sorted(kinds)} layers{indexer}, which SGLang sizes with another pool configurator "
            "(not modelled yet)"
        )
    if spec.is_multimodal:
        raise errors.InvalidEngineArgs(
            f"kvpilot's SGLang model covers text-only models; {spec.architecture} has a vision tower, for "
            "which SGLang lowers --mem-fraction-static by the tower's size (adjust_mem_fraction_for_vlm; "
            "not modelled yet)"
        )


def _cell_bytes(spec: ModelSpec, tp: int, pp: int, kv_cache_dtype: str) -> int:
    """``_compute_cell_size``: MHA ``kv_heads_per_rank * (head_dim + v_head_dim) * layers * kv_bytes``;
    MLA ``(kv_lora_rank + qk_rope_head_dim) * layers * kv_bytes``, the latent replicated on every rank
    (``pool_configurator.py`` lines 379-385, 492-498)."""
    element = sglang.KV_CACHE_DTYPE_BYTES[kv_cache_dtype] or DTYPE_BYTES[spec.dtype]
    layers = sum(1 for i in spec.layer_range(pp, 0) if spec.layers[i].kind in (FULL, MLA))
    if spec.mla is not None:
        return int((spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * layers * element)
    heads = max(1, spec.num_kv_heads // tp)
    return int(heads * (spec.head_dim + spec.head_dim) * layers * element)


def _resolve_settings(
    spec: ModelSpec, gpu_mib: float, settings: sglang.SglangSettings
) -> sglang.SglangSettings:
    tp = settings.tp_size or 1
    chunked = settings.chunked_prefill_size or sglang.default_chunked_prefill_size(gpu_mib)
    return sglang.SglangSettings(
        context_length=settings.context_length or spec.max_model_len,
        mem_fraction_static=settings.mem_fraction_static,
        max_running_requests=settings.max_running_requests,
        max_total_tokens=settings.max_total_tokens,
        chunked_prefill_size=chunked,
        max_prefill_tokens=settings.max_prefill_tokens,
        schedule_conservativeness=settings.schedule_conservativeness,
        kv_cache_dtype=sglang.check_kv_cache_dtype(settings.kv_cache_dtype),
        page_size=settings.page_size or 1,
        tp_size=tp,
        pp_size=settings.pp_size or 1,
    )


def compute_sglang_budget(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: sglang.SglangSettings | None = None,
    *,
    weights_total_bytes: int | None = None,
) -> SglangBudget:
    """The budget SGLang 0.5.23 arrives at for ``spec`` on ``gpu`` with ``settings``."""
    settings = settings or sglang.SglangSettings()
    sglang.check_settings(settings)
    _check_modelled(spec)
    gpu_mib = (gpu.nvml_total_bytes or gpu.total_bytes) / MIB
    s = _resolve_settings(spec, gpu_mib, settings)
    tp, pp, page = s.tp_size or 1, s.pp_size or 1, s.page_size or 1
    graph_bs = sglang.default_cuda_graph_max_bs(gpu_mib, tp, s.max_running_requests)
    reserve = sglang.compute_reserve(
        gpu_mib,
        chunked_prefill_size=s.chunked_prefill_size or 0,
        cuda_graph_max_bs=graph_bs,
        tp_size=tp,
        pp_size=pp,
    )
    fraction = s.mem_fraction_static or sglang.default_mem_fraction_static(gpu_mib, reserve)
    pre_load = int(gpu.total_bytes - CUDA_CONTEXT_GIB * GIB)
    weights = compute_weight_bytes(
        spec, tensor_parallel_size=tp, pipeline_parallel_size=pp, weights_total_bytes=weights_total_bytes
    )
    pool = max(0, int(pre_load * fraction) - weights)
    cell = _cell_bytes(spec, tp, pp, s.kv_cache_dtype or "auto")
    tokens = pool // cell // page * page
    if s.max_total_tokens is not None:
        tokens = min(tokens, s.max_total_tokens)
    return SglangBudget(
        settings=replace(s, mem_fraction_static=fraction),
        gpu_mib=gpu_mib,
        cuda_graph_max_bs=graph_bs,
        reserve=reserve,
        fraction_is_default=settings.mem_fraction_static is None,
        pre_load_bytes=pre_load,
        weight_bytes=weights,
        pool_bytes=pool,
        cell_bytes=cell,
        max_total_tokens=tokens,
        context_length=s.context_length or spec.max_model_len,
    )


def plan_sglang_budget(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: sglang.SglangSettings | None = None,
    *,
    weights_total_bytes: int | None = None,
) -> SglangBudget:
    """The first budget that fits, halving ``--chunked-prefill-size`` from SGLang's tier default down to
    :data:`~kvpilot.tuner.sglang.defaults.MIN_ACTIVATION_TOKENS` (each halving shrinks the activation
    reserve by 0.75 MiB per token, which SGLang's default fraction hands to the KV pool); the last tried when
    none fits. A ``--chunked-prefill-size`` or ``--mem-fraction-static`` given in ``settings`` is kept."""
    settings = settings or sglang.SglangSettings()
    budget = compute_sglang_budget(spec, gpu, settings, weights_total_bytes=weights_total_bytes)
    if settings.chunked_prefill_size is not None or settings.mem_fraction_static is not None:
        return budget
    chunk = budget.settings.chunked_prefill_size or sglang.MIN_ACTIVATION_TOKENS
    while not budget.feasible and chunk > sglang.MIN_ACTIVATION_TOKENS:
        chunk //= 2
        smaller = replace(settings, chunked_prefill_size=chunk)
        budget = compute_sglang_budget(spec, gpu, smaller, weights_total_bytes=weights_total_bytes)
    return budget


def meets(budget: SglangBudget, concurrency: int | None) -> bool:
    """One full-context request fits the pool, and so do ``concurrency`` of them when one is asked (the
    planner's test, as vLLM's planner asks it of its budget)."""
    return budget.feasible and (not concurrency or budget.full_context_requests >= concurrency)


def plan_sglang_kv(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: sglang.SglangSettings | None = None,
    *,
    allow_fp8_kv: bool = False,
    weights_total_bytes: int | None = None,
    min_context: int | None = None,
) -> SglangBudget:
    """:func:`plan_sglang_budget`, with an fp8 KV cache (:data:`~kvpilot.tuner.sglang.FP8_KV_CACHE_DTYPE`)
    exactly where vLLM's planner chooses one (``kvpilot.tuner.plan.planner._try_fp8_kv``): allowed
    (``allow_fp8_kv``), supported (the catalogue's ``gpu.fp8_kv``), a dtype not given in ``settings`` (a
    given one is never changed), and useful -- no concurrency asked (as many requests as fit), or the asked
    ``--max-running-requests`` of full-context requests missed in 16 bits; fp8 is kept when it meets the
    request or 16 bits does not either (a context to shorten then shortens less). The budget notes the
    choice. A budget that does not fit says whether an fp8 KV cache would, at the context or at
    ``min_context`` (the shortest the user accepts), and how to allow one (:func:`_fp8_would_fit`), as
    vLLM's infeasible plan does."""
    settings = settings or sglang.SglangSettings()
    budget = _choose_kv(spec, gpu, settings, allow_fp8_kv, weights_total_bytes)
    if budget.feasible:
        return budget
    hint = _fp8_would_fit(spec, gpu, settings, budget, allow_fp8_kv, min_context, weights_total_bytes)
    return replace(budget, would_fit=hint)


def _choose_kv(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: sglang.SglangSettings,
    allow_fp8_kv: bool,
    weights_total_bytes: int | None,
) -> SglangBudget:
    budget = plan_sglang_budget(spec, gpu, settings, weights_total_bytes=weights_total_bytes)
    concurrency = settings.max_running_requests
    if not (allow_fp8_kv and gpu.fp8_kv and settings.kv_cache_dtype is None):
        return budget
    if concurrency is not None and meets(budget, concurrency):
        return budget
    fp8 = replace(settings, kv_cache_dtype=sglang.FP8_KV_CACHE_DTYPE)
    candidate = plan_sglang_budget(spec, gpu, fp8, weights_total_bytes=weights_total_bytes)
    if not (meets(candidate, concurrency) or not meets(budget, concurrency)):
        return budget
    wanted = f"{concurrency} full-context request(s)" if concurrency else "as many requests as fit"
    note = (
        f"fp8 KV cache (--kv-cache-dtype {sglang.FP8_KV_CACHE_DTYPE}, allowed by allowFp8KvCache on "
        f"{gpu.name}): {candidate.max_total_tokens} tokens instead of {budget.max_total_tokens} with "
        f"--kv-cache-dtype auto, for {wanted}; "
        "scaled by the checkpoint's k/v scales, else 1.0 (possible accuracy loss)"
    )
    return replace(candidate, notes=(*candidate.notes, note))


def _fp8_would_fit(
    spec: ModelSpec,
    gpu: GpuSpec,
    settings: sglang.SglangSettings,
    budget: SglangBudget,
    allowed: bool,
    min_context: int | None,
    weights_total_bytes: int | None,
) -> tuple[str, ...]:
    """The line vLLM's infeasible plan writes (:func:`kvpilot.tuner.fp8_advice.describe_fp8_fits`) where an
    fp8 KV cache would make ``budget`` fit: the GPU supports one, no dtype was given, the budget is not fp8
    already, and its pool holds one request of the context, or of ``min_context`` (the operator then
    shortens the context to the pool); else nothing."""
    if not gpu.fp8_kv or settings.kv_cache_dtype is not None:
        return ()
    if sglang.is_fp8_kv_cache_dtype(budget.settings.kv_cache_dtype):
        return ()
    flags = f"--kv-cache-dtype {sglang.FP8_KV_CACHE_DTYPE}"
    fp8 = replace(settings, kv_cache_dtype=sglang.FP8_KV_CACHE_DTYPE)
    candidate = plan_sglang_budget(spec, gpu, fp8, weights_total_bytes=weights_total_bytes)
    pool = f"{candidate.max_total_tokens} tokens instead of {budget.max_total_tokens}"
    if candidate.feasible:
        where = f" ({pool}: {candidate.full_context_requests} {candidate.context_length}-token request(s))"
        return (describe_fp8_fits(flags, allowed=allowed, where=where),)
    if min_context and min_context < candidate.context_length and min_context <= candidate.max_total_tokens:
        where = f" at the minimum context {min_context} ({pool})"
        return (describe_fp8_fits(flags, allowed=allowed, where=where),)
    return ()


def _explain_reserve(budget: SglangBudget) -> str:
    r = budget.reserve
    text = (
        f"Reserved outside --mem-fraction-static: {r.total_mib / 1024:.2f} GiB = {r.floor_mib:.0f} MiB floor"
        f" + {r.activation_mib:.0f} MiB activations (1.5 MiB x prefill tokens)"
        f" + {r.parallel_mib:.0f} MiB parallel (TP x PP / 8 GiB)"
        f" + {r.graph_mib:.0f} MiB CUDA graph (2 MiB x batch)"
    )
    if r.large_gpu_floor_mib:
        text += f" + {r.large_gpu_floor_mib:.0f} MiB to the 10 GiB floor of GPUs over 60 GiB"
    return text


def _explain_fit(budget: SglangBudget) -> str:
    if budget.max_total_tokens == 0:
        return "Does not fit: " + sglang.no_kv_pool_error(budget.settings.mem_fraction_static)
    return (
        f"Does not fit: one {budget.context_length}-token request needs more than the pool's "
        f"{budget.max_total_tokens} tokens"
    )


def explain_sglang_budget(budget: SglangBudget) -> list[str]:
    """The budget in words, one line per step, as ``kvpilot plan --engine sglang`` prints it."""
    s = budget.settings
    source = " (SGLang's default: (GPU - reserved) / GPU)" if budget.fraction_is_default else " (given)"
    lines = [
        f"GPU memory (nvidia-smi): {budget.gpu_mib / 1024:.1f} GiB -> SGLang's tier defaults: "
        f"--chunked-prefill-size {sglang.default_chunked_prefill_size(budget.gpu_mib)}, "
        f"decode CUDA graph up to batch {budget.cuda_graph_max_bs}; --chunked-prefill-size "
        f"{s.chunked_prefill_size} here",
        _explain_reserve(budget),
        f"--mem-fraction-static {s.mem_fraction_static}{source}: the share for weights + KV pool",
        f"Free before load {budget.pre_load_bytes / GIB:.2f} GiB x {s.mem_fraction_static} - weights "
        f"{budget.weight_bytes / GIB:.2f} GiB = KV pool {budget.pool_bytes / GIB:.2f} GiB per GPU",
        f"KV cell {budget.cell_bytes} bytes/token ({s.kv_cache_dtype}) -> max_total_num_tokens "
        f"{budget.max_total_tokens} (page {s.page_size})",
        f"--context-length {budget.context_length}: {budget.full_context_requests} full-context request(s) "
        "fit the pool at once",
    ]
    lines += list(budget.notes)
    return lines if budget.feasible else [*lines, *explain_sglang_infeasible(budget)]


def explain_sglang_infeasible(budget: SglangBudget) -> list[str]:
    """Why ``budget`` does not fit, and what would (``would_fit``): the tail of :func:`explain_sglang_budget`
    and the operator's ``Infeasible`` message."""
    return [_explain_fit(budget), *budget.would_fit]
