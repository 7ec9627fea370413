"""The start-up memory budget of one vLLM engine, per GPU rank, as vLLM computes it.

Sits above :mod:`kvpilot.tuner.memory.weights` and :mod:`kvpilot.tuner.memory.kv_cache`; the
planner and ``kvpilot estimate`` call :func:`compute_budget`. Pure arithmetic; every vLLM fact it
uses (which release does what) comes from :mod:`kvpilot.tuner.vllm`.

vLLM 0.33 (``v1/worker/gpu_worker.py::Worker.determine_available_memory``,
``utils/mem_utils.py::memory_profiling``)::

    requested    = ceil(total x gpu_memory_utilization)
    non_kv       = total_consumed + transient_peak_headroom                      (0.27+)
                 = weights + sampler_state (V2) + non_torch  +  peak_activation
    available_kv = requested - non_kv [- cuda_graph_estimate (0.20+)]
                 = kv_cache_memory_bytes, when --kv-cache-memory-bytes is set
    num_blocks   = available_kv // bytes_per_block        (minimum over ranks)

Each term here is a physical model with a few constants fitted on real start-up
logs (``bench/memory_accuracy.py``, ``docs/memory-model.md``):

* peak activation of the profile run: the larger of the forward pass over
  ``max_num_batched_tokens`` tokens (MLP / MoE intermediates, hidden-size
  temporaries) and the sampler warm-up (``max_num_seqs`` rows x vocabulary of
  fp32 logits and their copies), plus what stays allocated meanwhile (the hidden
  states, the fused-MoE workspace, the multimodal encoder cache), or the vision encoder's own forward
  over vLLM's dummy items when that is larger (:mod:`.encoder`);
* Model Runner V2's persistent sampler state (0.33+, :func:`kvpilot.tuner.vllm.compute_sampler_state_bytes`);
* non-torch memory: cuBLAS / attention workspaces, and what tensor parallelism creates after the init
  snapshot over NVLink-class links (vLLM's own communicators are built before it; PCIe-only ranks add
  what pipeline stages add);
* CUDA graphs (:mod:`.graphs`): the estimate vLLM subtracts, or the pool captured after the KV cache.

Never raises for "does not fit": the budget says ``starts=False`` and carries the
error text vLLM would print.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import encoder, kv_cache, refusals, weights
from kvpilot.tuner.memory.graphs import compute_cuda_graph_bytes
from kvpilot.tuner.memory.kv_connector import compute_kv_connector_bytes
from kvpilot.tuner.memory.lora import compute_lora_bytes
from kvpilot.tuner.memory.moe_kernels import compute_moe_kernel_bytes
from kvpilot.tuner.memory.speculative import (
    Drafter,
    compute_drafter_bytes,
    resolve_drafter,
    speculative_state_tokens,
    with_drafter_layers,
)
from kvpilot.tuner.model import DTYPE_BYTES, ModelSpec
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, MemoryBudget

MEMORY_MODEL_VERSION = "2026.12.7.11"
"""The memory model's version: bump it whenever a change here (or in :mod:`.kv_cache`, :mod:`.weights`)
moves a prediction. Fleet-learned TuningProfiles are keyed by it
(:mod:`kvpilot.tuner.plan.profiles`), so a new memory model never reuses ratios learned against the old one's
predictions."""


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Fitted constants of one vLLM release range (see docs/memory-model.md)."""

    sampler_bytes_per_logit: float
    """Bytes per (row x vocab) element the sampler warm-up holds at its peak, beyond the logits themselves."""
    forward_hidden_copies: float
    """Hidden-size temporaries per token alive at the forward peak (residual, norm output, attention
    output...), beside the MLP's own intermediates."""
    non_torch_single: float
    """GiB of non-torch memory of a single-GPU engine (cuBLAS and attention workspaces)."""
    non_torch_pp: float
    """GiB of non-torch memory of a pipeline-parallel stage without tensor parallelism."""
    non_torch_tp: float
    """GiB of non-torch memory added by tensor parallelism (custom all-reduce buffers and friends)."""
    non_torch_tp_per_rank: float
    """GiB added per TP rank on top of ``non_torch_tp``."""


_COEFFS: tuple[tuple[vllm.Version, Coefficients], ...] = (
    # 0.8.x V1: non-torch is "GPU used minus torch", so it includes the CUDA context.
    ((0, 0), Coefficients(36.4, 4.25, 0.60, 0.50, 0.0, 0.0)),
    ((0, 9), Coefficients(12.8, 4.25, 0.10, 0.07, 0.0, 0.0)),
    ((0, 11), Coefficients(36.4, 4.25, 0.13, 0.07, 0.35, 0.05)),
    # 0.17 cut the sampler warm-up's peak by 60 % (Qwen3-14B on an H100: 5.64 GiB in 0.15/0.16,
    # 2.23 GiB in 0.17/0.18); 0.18 added 0.12 GiB of non-torch memory (0.13 -> 0.25 GiB).
    ((0, 17), Coefficients(12.8, 4.25, 0.13, 0.07, 0.35, 0.05)),
    ((0, 18), Coefficients(12.8, 4.25, 0.25, 0.07, 1.90, 0.06)),
)
"""(first release, coefficients), oldest first; a release uses the last row at or below it.
0.33 uses the 0.18+ row (0.19 is the newest release with many measured start-ups)."""

MM_ENCODER_COPIES = 2.0
"""Multimodal models: encoder output cache + merged embeddings, per batched token x hidden."""


def coefficients(version: vllm.Version) -> Coefficients:
    chosen = _COEFFS[0][1]
    for first, coeffs in _COEFFS:
        if version >= first:
            chosen = coeffs
    return chosen


@dataclass(frozen=True, slots=True)
class _Resolved:
    tp: int
    pp: int
    util: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    dtype: str
    auto_max_model_len: bool = False
    """``--max-model-len -1``: vLLM shortens ``max_model_len`` to what the KV cache holds."""
    model_runner_v2: bool = False
    """The engine runs Model Runner V2 (:func:`kvpilot.tuner.vllm.uses_model_runner_v2`)."""
    performance_mode: str | None = None

    @property
    def sampler_rows(self) -> int:
        """Rows of the sampler warm-up: one per sequence, at most one per batched token."""
        return min(self.max_num_seqs, self.max_num_batched_tokens)


def _runner_model(model: ModelSpec) -> vllm.RunnerModel:
    """What vLLM's runner choice reads of the model (0.22-0.28 choose V2 by model)."""
    kinds = set(model.layer_kinds)
    has_state = model.linear_state is not None
    return vllm.RunnerModel(
        architecture=model.architecture,
        is_moe=model.moe is not None,
        is_quantized=model.quantization is not None,
        is_hybrid=has_state and len(kinds) > 1,
        is_attention_free=has_state and len(kinds) == 1,
    )


def resolve_settings(
    model: ModelSpec,
    gpu: GpuSpec,
    settings: EngineSettings,
    version: vllm.Version,
    pipeline_parallel_size: int = 1,
    dtype: str | None = None,
    *,
    performance_mode: str | None = None,
    model_runner_v2: bool | None = None,
) -> _Resolved:
    """The settings vLLM runs (:func:`kvpilot.tuner.vllm.compute_effective_settings`) as the budget needs
    them; ``max_model_len -1`` (auto) stands for the model's maximum until the KV cache is sized
    (``v1/core/kv_cache_planning.py::_auto_fit_max_model_len``: vLLM derives the config's maximum,
    sizes the batch defaults and the profile run from it, then fits the length after profiling).

    ``model_runner_v2`` is ``VLLM_USE_V2_MODEL_RUNNER`` (``None``: unset, the release's default);
    ``performance_mode`` is ``--performance-mode`` (``None``: balanced)."""
    derived = model.default_max_model_len(version)
    eff = vllm.compute_effective_settings(
        settings,
        gpu,
        version,
        derived,
        performance_mode=performance_mode,
        mm_prefix_item_tokens=model.mm_prefix_item_tokens,
    )
    assert eff.max_num_seqs is not None and eff.max_num_batched_tokens is not None
    assert eff.gpu_memory_utilization is not None and eff.max_model_len is not None
    auto = eff.max_model_len == vllm.AUTO_MAX_MODEL_LEN
    return _Resolved(
        tp=eff.tensor_parallel_size or 1,
        pp=pipeline_parallel_size,
        util=eff.gpu_memory_utilization,
        max_model_len=derived if auto else eff.max_model_len,
        max_num_seqs=eff.max_num_seqs,
        max_num_batched_tokens=eff.max_num_batched_tokens,
        kv_cache_dtype=vllm.resolve_kv_cache_dtype(
            eff.kv_cache_dtype, model.quantization.kv_cache if model.quantization else None
        ),
        dtype=dtype or model.dtype,
        auto_max_model_len=auto,
        model_runner_v2=vllm.uses_model_runner_v2(version, model_runner_v2, _runner_model(model)),
        performance_mode=performance_mode,
    )


def compute_activation_bytes(
    model: ModelSpec,
    *,
    tp: int,
    pp: int,
    pp_rank: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype: str,
    version: vllm.Version,
    max_model_len: int | None = None,
    expert_shards: weights.ExpertShards = weights.ONE_ENGINE,
    model_runner_v2: bool = False,
    moe_backend: str | None = None,
) -> int:
    """Torch peak memory increase of the profile run on one rank.

    On a rank of a data-parallel group (``expert_shards``) the MoE layers work on the whole group's tokens:
    0.33's default all-to-all (``allgather_reducescatter``, ``AgRsAll2AllManager.dispatch``) gathers every
    DP rank's hidden states before the experts run, and the profile run has every rank at
    ``max_num_batched_tokens``; the experts' width is whole under expert parallelism, split over DP x TP
    without it.

    On the first stage of a multimodal model the profile run first encodes vLLM's dummy items
    (:mod:`.encoder`): the peak is the larger of that forward's and the decoder's, the decoder's with
    the encoder cache still held. ``max_model_len`` sizes the dummy items (Qwen2-VL's video frames,
    items per prompt); ``None`` stands for the model's own maximum.

    The sampler's share is the V1 runner's dummy sampling (fp32 logits and their copies, the fitted
    ``sampler_bytes_per_logit``), and Model Runner V2's from 0.33 (its fp32 warm-up pass); V2 before 0.33
    samples once from the model-dtype logits, which are then its whole peak
    (:func:`kvpilot.tuner.vllm.profile_samples_in_fp32`).

    ``moe_backend`` is ``--moe-backend``: where it runs a kernel kvpilot has read (:mod:`.moe_kernels`), that
    kernel's peak and workspace replace the fitted routed-experts width and workspace."""
    c = coefficients(version)
    b = DTYPE_BYTES[dtype]
    tokens = max_num_batched_tokens
    h = model.hidden_size
    moe = model.moe
    # A gated MLP writes gate and up (two widths) and their product (one); an up/down one (Nemotron-H's
    # relu2 experts, vLLM's ``*_no_mul`` activations, ``adjust_N_for_activation``) the up and its activation.
    widths = 3 if model.mlp_gated else 2
    dp = max(1, expert_shards.ranks // tp)
    gathered = tokens * dp  # the tokens the MoE layers see (every DP rank's)
    kernel = None
    if moe is not None:
        expert = moe.moe_intermediate_size / (1 if expert_shards.expert_parallel else tp * dp)
        kernel = compute_moe_kernel_bytes(
            model, moe_backend, version, tokens=gathered, intermediate_size=int(expert), dtype_bytes=b
        )
        width = 0.0 if kernel else moe.experts_per_token * (widths * expert + 2 * h) * dp
        width += widths * moe.shared_intermediate_size / tp
        width += widths * moe.parallel_dense_intermediate_size / tp
    elif not model.intermediate_size and model.linear_state is not None:
        # An attention-free Mamba block has no MLP: its widest tensors are the mixer's in_proj (x and z)
        # and the conv output, three intermediate widths (not calibrated on a start: no log exists).
        width = 3 * model.linear_state.conv_dim / tp
    else:  # the widest dense MLP (DeciLM's per-layer widths, Gemma 4's double-wide KV-sharing layers)
        own = (layer.mlp_intermediate or 0 for layer in model.layers)
        width = widths * max([model.intermediate_size, *own]) / tp
    forward = tokens * b * (c.forward_hidden_copies * h + width) + (kernel.peak if kernel else 0)
    last, first = pp_rank == pp - 1, pp_rank == 0
    carry = tokens * h * b  # the hidden states the sampler reads
    pp_buffers = 2 * tokens * h * b if pp > 1 else 0  # hidden + residual sent or received between stages
    sampler = 0.0
    if last:
        rows = min(max_num_seqs, tokens)
        fp32_pipeline = not model_runner_v2 or vllm.profile_samples_in_fp32(version)
        sampler = rows * model.vocab_size * ((c.sampler_bytes_per_logit if fp32_pipeline else 0.0) + b)
    workspace = 0.0
    if kernel is not None:
        workspace = kernel.workspace
    elif moe is not None and not (model.quantization and model.quantization.method == "mxfp4"):
        expert = moe.moe_intermediate_size / (1 if expert_shards.expert_parallel else tp * dp)
        workspace = gathered * moe.experts_per_token * (h + 2 * expert) * b
    if dp > 1:
        workspace += gathered * h * b  # the gathered hidden states
    peak = max(forward, sampler + carry + workspace) + pp_buffers
    if model.is_multimodal and first:
        vision = encoder.compute_encoder_profile_peak(
            model.vision_tower,
            tp=tp,
            dtype_bytes=b,
            max_num_batched_tokens=tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len or model.max_model_len,
        )
        if vision is None:  # a tower whose forward is not modelled: the fitted cache + embeddings term
            peak += MM_ENCODER_COPIES * tokens * h * b
        else:  # the encoder forward, then the decoder's beside the encoder cache and the merged embeddings
            peak = max(vision.forward_bytes, peak + vision.cache_bytes + tokens * h * b)
    return int(peak)


def compute_warmup_logits_bytes(model: ModelSpec, r: _Resolved) -> int:
    """The fresh fp32 logits buffer (rows x vocabulary) the sampler warm-up allocates after graph capture."""
    return r.sampler_rows * model.vocab_size * 4


def compute_non_torch_bytes(tp: int, pp: int, version: vllm.Version, *, interconnect: str) -> int:
    """Non-torch memory counted inside the budget: workspaces, and what the ranks' collectives create.

    vLLM builds its own communicators (pynccl, custom all-reduce, symmetric memory) before the init snapshot
    (:data:`kvpilot.tuner.vllm.COMMUNICATORS_BEFORE_SNAPSHOT_SINCE`), so their buffers are never charged; what
    tensor parallelism adds is created lazily after it. The fitted TP terms (``non_torch_tp``: 1.9 GiB at
    TP 2 and TP 4 alike on NVLink H100s, 0.19 logs) are the NVLink-class paths' (NCCL over NVLink/NVSwitch,
    the FlashInfer all-reduce fusion of SM90 / SM100,
    :data:`kvpilot.tuner.vllm.ALLREDUCE_FUSION_CAPABILITIES`);
    none of them exists between PCIe-only GPUs (custom all-reduce refuses more than
    :data:`kvpilot.tuner.vllm.CUSTOM_ALLREDUCE_MAX_PCIE_GPUS` of them), whose ranks talk plain NCCL as
    pipeline stages do: ``non_torch_pp``. A PCIe log agrees: 0.21 GiB with tensor parallelism on L40S
    (case-079, ~0.11; H100 TP 4: 2.17 GiB, case-029)."""
    c = coefficients(version)
    if tp == 1 and pp == 1:
        gib = c.non_torch_single
    elif tp == 1 or interconnect == "pcie":
        gib = c.non_torch_pp
    else:
        gib = c.non_torch_pp + c.non_torch_tp + c.non_torch_tp_per_rank * tp
    return int(gib * GIB)


def compute_sampler_state_bytes(model: ModelSpec, r: _Resolved, *, last_stage: bool) -> int:
    """Model Runner V2's persistent sampler buffers on one rank (0 under the V1 runner, on a
    non-last pipeline stage, or for a pooling model): :func:`kvpilot.tuner.vllm.compute_sampler_state_bytes`.
    Allocated after the init snapshot, so vLLM charges them to ``total_consumed``."""
    if not (r.model_runner_v2 and last_stage):
        return 0
    return vllm.compute_sampler_state_bytes(r.max_num_seqs, model.vocab_size)


def _refused(gpu: GpuSpec, requested: int, error: str, max_model_len: int) -> MemoryBudget:
    return MemoryBudget(
        gpu_total_gib=gpu.total_bytes / GIB,
        requested_gib=requested / GIB,
        weights_gib=0.0,
        activation_gib=0.0,
        non_torch_gib=0.0,
        cuda_graph_gib=0.0,
        available_kv_cache_gib=0.0,
        kv_bytes_per_token=0,
        num_gpu_blocks=0,
        kv_cache_tokens=0,
        max_concurrency=0.0,
        starts=False,
        error=error,
        max_model_len=max_model_len,
    )


def compute_budget(
    model: ModelSpec,
    gpu: GpuSpec,
    settings: EngineSettings,
    *,
    pipeline_parallel_size: int = 1,
    vllm_version: str = vllm.PINNED_VLLM_VERSION,
    weights_total_bytes: int | None = None,
    enforce_eager: bool = False,
    block_size: int | None = None,
    dtype: str | None = None,
    kv_cache_memory_bytes: int | None = None,
    model_runner_v2: bool | None = None,
    performance_mode: str | None = None,
    enable_prefix_caching: bool | None = None,
    expert_shards: weights.ExpertShards = weights.ONE_ENGINE,
    lora: vllm.LoraFlags | None = None,
    kv_connector: vllm.KvConnector | None = None,
    speculative: vllm.SpeculativeFlags | None = None,
    moe_backend: str | None = None,
) -> MemoryBudget:
    """vLLM's start-up accounting on one rank; ``starts=False`` with vLLM's error when it would refuse.

    ``kv_cache_memory_bytes`` is ``--kv-cache-memory-bytes``: vLLM still runs the profile pass but
    returns that many bytes as the KV pool of every worker, ignoring the utilisation for the pool
    (``gpu_worker.py::determine_available_memory``, 0.33); the rest of the budget must then fit in
    the GPU itself, which vLLM does not check before allocating (:func:`vllm.kv_cache_memory_oom_error`).
    ``model_runner_v2`` is ``VLLM_USE_V2_MODEL_RUNNER`` (``None`` = the release's default),
    ``performance_mode`` ``--performance-mode`` and ``enforce_eager`` ``--enforce-eager``;
    ``enable_prefix_caching`` is ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` (``None``:
    vLLM's default, off for attention-free models): it decides whether state layers run in align mode
    (2-3 pages a request). The operator reads all four from the pod's environment and extra args
    (:class:`kvpilot.tuner.vllm.EngineFlags`). ``expert_shards``: one data-parallel rank of a DP group, its
    routed experts split over the group (:class:`~kvpilot.tuner.memory.weights.ExpertShards`; the rest of
    the rank, its KV cache included, is a whole engine of ``tensor_parallel_size``). ``lora``:
    ``--enable-lora`` and its sizes; its buffers load with the weights (:func:`.lora.compute_lora_bytes`).
    ``kv_connector``: ``--kv-transfer-config``'s connector; its GPU buffers come after the KV cache is sized,
    in the memory the utilisation leaves (:func:`.kv_connector.compute_kv_connector_bytes`).
    ``speculative``: ``--speculative-config``; an MTP drafter kvpilot models adds its weights and buffers
    (:func:`.speculative.compute_drafter_bytes`) and its KV layers (:func:`.speculative.with_drafter_layers`);
    so does an EAGLE3 drafter or a separate draft model whose ``config.json`` it carries (``draft_config``;
    :mod:`.eagle3`, :mod:`.draft_model`; a draft the target's TP cannot split is vLLM's refusal). The drafter
    is resolved once (:func:`.speculative.resolve_drafter`: its config read once) for every stage.
    ``moe_backend``: ``--moe-backend`` (:func:`compute_activation_bytes`).
    """
    version = vllm.parse_version(vllm_version)
    r = resolve_settings(
        model,
        gpu,
        settings,
        version,
        pipeline_parallel_size,
        dtype,
        performance_mode=performance_mode,
        model_runner_v2=model_runner_v2,
    )
    requested = math.ceil(gpu.total_bytes * r.util)
    refusal = refusals.check_parallel_sizes(model, r.tp, r.pp)
    drafter = resolve_drafter(model, speculative, r.pp, r.tp)  # once: every stage sizes this one
    draft = drafter.draft if drafter is not None else None
    if refusal is None and draft is not None:  # the draft's own heads and vocabulary split over its TP
        draft_refusal = refusals.check_parallel_sizes(draft, r.tp, 1)
        refusal = f"the draft model {draft.architecture}: {draft_refusal}" if draft_refusal else None
    if refusal is not None:
        return _refused(gpu, requested, refusal, r.max_model_len)
    shared = _compute_shared_costs(model, gpu, r, version, enforce_eager, speculative, drafter)
    stages = tuple(
        _compute_stage(
            model,
            gpu,
            r,
            version,
            rank,
            requested,
            shared,
            weights_total_bytes=weights_total_bytes,
            block_size=block_size,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            enable_prefix_caching=enable_prefix_caching,
            expert_shards=expert_shards,
            lora=lora,
            kv_connector=kv_connector,
            drafter=drafter,
            moe_backend=moe_backend,
        )
        for rank in range(r.pp)
    )
    fit = _compute_fit(r, version, stages, shared.in_flight)
    error = refusals.compute_start_error(
        refusals.Startup(
            model=model,
            gpu=gpu,
            version=version,
            requested=requested,
            stages=stages,
            asked_max_model_len=settings.max_model_len,
            max_model_len=r.max_model_len,
            auto_max_model_len=r.auto_max_model_len,
            max_num_seqs=r.max_num_seqs,
            sampler_rows=r.sampler_rows,
            util=r.util,
            tp=r.tp,
            blocks=fit.blocks,
            capacity=fit.capacity,
            checked=fit.checked,
            graphs=shared.graphs,
            subtract_graphs=shared.subtract_graphs,
            non_torch=shared.non_torch,
            warmup_logits=compute_warmup_logits_bytes(model, r),
            enforce_eager=enforce_eager,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
        )
    )
    return _build_budget(gpu, requested, stages, fit, shared, error)


@dataclass(frozen=True, slots=True)
class _SharedCosts:
    """What every pipeline stage pays alike, in bytes (tokens for ``in_flight``)."""

    graphs: int
    subtract_graphs: bool
    """Whether the release subtracts the CUDA-graph estimate from the budget (0.20+)."""
    in_flight: int
    non_torch: int


def _compute_shared_costs(
    model: ModelSpec,
    gpu: GpuSpec,
    r: _Resolved,
    version: vllm.Version,
    enforce_eager: bool,
    speculative: vllm.SpeculativeFlags | None = None,
    drafter: Drafter | None = None,
) -> _SharedCosts:
    tokens, drafter_layers = graph_speculation(model, speculative, drafter, r.model_runner_v2)
    graphs = compute_cuda_graph_bytes(
        model,
        gpu,
        pp=r.pp,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        version=version,
        performance_mode=r.performance_mode,
        enforce_eager=enforce_eager,
        tp=r.tp,
        model_runner_v2=r.model_runner_v2,
        num_speculative_tokens=tokens,
        drafter_layers=drafter_layers,
    )
    in_flight = vllm.compute_in_flight_tokens(
        EngineSettings(max_num_batched_tokens=r.max_num_batched_tokens), version, r.pp, r.model_runner_v2
    )
    return _SharedCosts(
        graphs,
        vllm.subtracts_cuda_graphs(version, r.model_runner_v2),
        in_flight,
        compute_non_torch_bytes(r.tp, r.pp, version, interconnect=gpu.interconnect),
    )


def _compute_stage(
    model: ModelSpec,
    gpu: GpuSpec,
    r: _Resolved,
    version: vllm.Version,
    rank: int,
    requested: int,
    shared: _SharedCosts,
    *,
    weights_total_bytes: int | None,
    block_size: int | None,
    kv_cache_memory_bytes: int | None,
    enable_prefix_caching: bool | None,
    expert_shards: weights.ExpertShards = weights.ONE_ENGINE,
    lora: vllm.LoraFlags | None = None,
    kv_connector: vllm.KvConnector | None = None,
    drafter: Drafter | None = None,
    moe_backend: str | None = None,
) -> refusals.Stage:
    """One pipeline stage's budget (its first TP rank): weights, activation peak, sampler state, what is
    left for the KV cache, and the KV layout of its layers."""
    w = weights.compute_weight_bytes(
        model,
        tensor_parallel_size=r.tp,
        pipeline_parallel_size=r.pp,
        pp_rank=rank,
        dtype=r.dtype,
        weights_total_bytes=weights_total_bytes,
        expert_shards=expert_shards,
    )
    lora_bytes = 0
    if lora is not None:  # loaded with the model: inside vLLM's "Model loading took X GiB"
        lora_bytes = compute_lora_bytes(
            model,
            lora,
            tensor_parallel_size=r.tp,
            pipeline_parallel_size=r.pp,
            pp_rank=rank,
            dtype=r.dtype,
            max_num_batched_tokens=r.max_num_batched_tokens,
            max_num_seqs=r.max_num_seqs,
        )
        w += lora_bytes
    # the MTP drafter loads with the model, inside "Model loading took X GiB"; the proposer's buffers are
    # allocated after the init snapshot (:mod:`.speculative`)
    spec_bytes = compute_drafter_bytes(
        model,
        drafter,
        tensor_parallel_size=r.tp,
        dtype=r.dtype,
        max_num_batched_tokens=r.max_num_batched_tokens,
        max_num_seqs=r.max_num_seqs,
        model_runner_v2=r.model_runner_v2,
    )
    w += spec_bytes
    act = compute_activation_bytes(
        model,
        tp=r.tp,
        pp=r.pp,
        pp_rank=rank,
        max_num_batched_tokens=r.max_num_batched_tokens,
        max_num_seqs=r.max_num_seqs,
        dtype=r.dtype,
        version=version,
        max_model_len=r.max_model_len,
        expert_shards=expert_shards,
        model_runner_v2=r.model_runner_v2,
        moe_backend=moe_backend,
    )
    state = compute_sampler_state_bytes(model, r, last_stage=rank == r.pp - 1)
    if kv_cache_memory_bytes is not None:
        available = kv_cache_memory_bytes
    else:
        graphs = shared.graphs if shared.subtract_graphs else 0
        available = requested - w - act - state - shared.non_torch - graphs
    # a budgeted MTP drafter or draft model: a hybrid's state layers hold its draft tokens too
    state_drafts = 0
    if drafter is not None and drafter.state_holds_draft_tokens:
        state_drafts = speculative_state_tokens(model, drafter.spec)
    layout = kv_cache.compute_kv_layout(
        with_drafter_layers(model, drafter),
        tensor_parallel_size=r.tp,
        pipeline_parallel_size=r.pp,
        pp_rank=rank,
        kv_cache_dtype=r.kv_cache_dtype,
        dtype=r.dtype,
        block_size=block_size,
        vllm_version=version,
        compute_capability=gpu.compute_capability,
        enable_prefix_caching=enable_prefix_caching,
        # a gated DeltaNet's conv state and state pages grow with the draft tokens (:mod:`.speculative`)
        num_speculative_tokens=state_drafts,
    )
    connector = compute_kv_connector_bytes(  # built after the KV cache is sized: not in ``available``
        model,
        kv_connector,
        tensor_parallel_size=r.tp,
        pipeline_parallel_size=r.pp,
        pp_rank=rank,
        kv_cache_dtype=r.kv_cache_dtype,
        dtype=r.dtype,
    )
    return refusals.Stage(
        w, act, state, available, layout, lora_bytes, kv_connector=connector, speculative=spec_bytes
    )


def graph_speculation(
    model: ModelSpec,
    speculative: vllm.SpeculativeFlags | None,
    drafter: Drafter | None,
    model_runner_v2: bool,
) -> tuple[int, int]:
    """What ``--speculative-config`` changes in the CUDA-graph estimate
    (:func:`.graphs.compute_cuda_graph_bytes`): ``num_speculative_tokens`` (the count given, else an MTP
    drafter's layers or suffix decoding's default depth; 0 without speculative decoding), and the decoder
    layers of the budgeted drafter (``drafter``, :func:`.speculative.resolve_drafter`'s) whose graphs the
    estimate captures (an MTP or EAGLE3 drafter; a separate draft model under the V1 runner only, Model
    Runner V2's standalone speculator capturing none: :func:`.graphs.drafter_graph_count`)."""
    if speculative is None:
        return 0, 0
    layers = drafter.kv_layers if drafter is not None else 0
    if model_runner_v2 and speculative.method == vllm.DRAFT_MODEL:
        layers = 0
    tokens = speculative.num_speculative_tokens
    if tokens is None:  # vLLM's own count: an MTP drafter's layers, suffix decoding's tree depth
        tokens = vllm.SUFFIX_DEFAULT_TOKENS if speculative.method == vllm.SUFFIX else model.num_mtp_layers
    return tokens, layers


@dataclass(frozen=True, slots=True)
class _Fit:
    blocks: int
    """KV blocks of the engine: the fewest any stage holds."""
    capacity: kv_cache.KvCapacity
    checked: int
    """The stage vLLM reports on: the first that fails its check."""
    max_model_len: int
    """The length served: the asked one, or with ``--max-model-len -1`` the longest that fits."""


def _compute_fit(
    r: _Resolved, version: vllm.Version, stages: tuple[refusals.Stage, ...], in_flight: int
) -> _Fit:
    """vLLM's fit check over the stages, and its auto-fit of ``max_model_len``."""
    blocks = min(kv_cache.compute_num_blocks(s.available, s.layout) for s in stages)
    capacity, checked = kv_cache.compute_stage_capacity(
        [s.layout for s in stages], [s.available for s in stages], r.max_model_len, in_flight, version
    )
    max_model_len = r.max_model_len
    if r.auto_max_model_len and not capacity.fits and capacity.longest_fitting_len > 0:
        # vLLM's _auto_fit_max_model_len: the longest length one request of which fits, found after
        # the profile run (which used the model's maximum); the capacity is then reported for it.
        worst = stages[checked]
        max_model_len = capacity.longest_fitting_len
        capacity = kv_cache.compute_capacity(
            worst.layout, worst.available, max_model_len, in_flight, version, num_blocks=blocks
        )
    return _Fit(blocks, capacity, checked, max_model_len)


def _build_budget(
    gpu: GpuSpec,
    requested: int,
    stages: tuple[refusals.Stage, ...],
    fit: _Fit,
    shared: _SharedCosts,
    error: str | None,
) -> MemoryBudget:
    """The budget as vLLM would log it: the first stage's terms, the engine's blocks and capacity."""
    first, capacity = stages[0], fit.capacity
    return MemoryBudget(
        gpu_total_gib=gpu.total_bytes / GIB,
        requested_gib=requested / GIB,
        weights_gib=first.weights / GIB,
        lora_gib=first.lora / GIB,
        kv_connector_gib=max(s.kv_connector for s in stages) / GIB,
        speculative_gib=first.speculative / GIB,
        activation_gib=first.activation / GIB,
        non_torch_gib=shared.non_torch / GIB,
        cuda_graph_gib=shared.graphs / GIB,
        available_kv_cache_gib=first.available / GIB,
        sampler_state_gib=first.sampler_state / GIB,
        cuda_graphs_in_budget=shared.subtract_graphs,
        kv_pool_bytes=max(0, min(s.available for s in stages)),
        kv_bytes_per_token=first.layout.bytes_per_token,
        num_gpu_blocks=max(0, fit.blocks),
        kv_cache_tokens=max(0, capacity.tokens),
        max_concurrency=max(0.0, capacity.max_concurrency),
        starts=error is None,
        error=error,
        longest_fitting_len=None if capacity.fits else capacity.longest_fitting_len,
        max_model_len=fit.max_model_len,
    )
