"""The tuner's value objects: what goes into a plan and what comes out.

Sits at the bottom of :mod:`kvpilot.tuner`: every other tuner module imports it,
it imports nothing of ours. Frozen dataclasses only; no I/O, no clock, no
environment. The operator converts Kubernetes objects to and from these types at
its edge; nothing here knows Kubernetes exists.

Units: memory in bytes (``int``) inside the tuner; GiB (``float``) only where a
value is reported to people (``MemoryBudget``). Token counts are ``int``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The vLLM engine arguments kvpilot tunes.

    ``None`` means "not set: vLLM's default for the pinned version applies".
    These are the values rendered as ``--max-model-len`` and friends.
    """

    max_model_len: int | None = None
    """``--max-model-len``, tokens per request (prompt + output)."""
    max_num_seqs: int | None = None
    """``--max-num-seqs``, sequences scheduled at once."""
    gpu_memory_utilization: float | None = None
    """``--gpu-memory-utilization``, fraction of the GPU's CUDA-visible total, (0, 1]."""
    kv_cache_dtype: str | None = None
    """``--kv-cache-dtype``, e.g. ``auto`` or ``fp8``."""
    tensor_parallel_size: int | None = None
    """``--tensor-parallel-size``; the GPU count per replica unless pinned otherwise."""
    max_num_batched_tokens: int | None = None
    """``--max-num-batched-tokens``, the prefill chunk / profile-run size."""

    def replace(self, **changes: Unpack[SettingsChanges]) -> EngineSettings:
        """Return a copy with ``changes`` applied (``dataclasses.replace``); the type checker checks each
        keyword against its field."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        """The set fields only, keyed by their snake_case names."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


class SettingsChanges(TypedDict, total=False):
    """The keywords of :meth:`EngineSettings.replace`: any subset of its fields, each with its field's type
    (``tests/tuner/test_types.py`` checks the two agree)."""

    max_model_len: int | None
    max_num_seqs: int | None
    gpu_memory_utilization: float | None
    kv_cache_dtype: str | None
    tensor_parallel_size: int | None
    max_num_batched_tokens: int | None


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model as the memory model needs it (an entry of :mod:`kvpilot.tuner.gpus`)."""

    name: str
    """Catalogue name, e.g. ``H100-SXM``."""
    total_bytes: int
    """Total device memory as CUDA/torch reports it (``cudaMemGetInfo`` total), not the marketing size."""
    compute_capability: tuple[int, int]
    fp8_kv: bool
    """Whether vLLM can run an fp8 KV cache on it (compute capability >= 8.9 on NVIDIA; MI300X)."""
    interconnect: str = "pcie"
    """``nvlink``, ``pcie`` or ``infinity-fabric``: decides all-reduce buffers and TP cost."""
    vendor: str = "nvidia"
    gfd_products: tuple[str, ...] = ()
    """``nvidia.com/gpu.product`` label values that name this GPU."""
    nvml_total_bytes: int | None = None
    """Total as NVML reports it (vLLM 0.33 picks batch defaults from this); ``None`` = same as total_bytes."""

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


@dataclass(frozen=True, slots=True)
class ServingBounds:
    """What the user asks of a deployment; the planner never leaves these bounds."""

    min_context: int | None = None
    """Shortest ``max_model_len`` acceptable; below it the plan is infeasible."""
    max_context: int | None = None
    """Longest ``max_model_len`` wanted; ``None`` means the model's own maximum."""
    concurrency: int | None = None
    """Expected concurrent sequences at ``max_context``; ``None`` = as many as fit."""
    allow_fp8_kv: bool = False
    """Whether the planner may choose an fp8 KV cache."""
    allow_weight_quantization: bool = False
    """Whether the planner may *suggest* quantized weights (it never changes the checkpoint)."""
    min_gpu_memory_utilization: float = 0.5
    max_gpu_memory_utilization: float = 0.95
    min_max_num_seqs: int = 1
    """The fewest ``max_num_seqs`` the planner may choose (``spec.tuning.bounds.maxNumSeqs.min``)."""
    max_max_num_seqs: int | None = None
    """The most ``max_num_seqs`` the planner may choose (``spec.tuning.bounds.maxNumSeqs.max``)."""

    def clamp_seqs(self, seqs: int) -> int:
        """``seqs`` moved into ``[min_max_num_seqs, max_max_num_seqs]``."""
        seqs = max(seqs, self.min_max_num_seqs)
        return min(seqs, self.max_max_num_seqs) if self.max_max_num_seqs is not None else seqs


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Per-GPU-rank memory accounting of one vLLM start, as vLLM itself does it.

    All figures in GiB (binary), per rank. ``available_kv_cache_gib`` is what vLLM
    logs as "Available KV cache memory"; ``kv_cache_tokens`` and ``max_concurrency``
    match vLLM's "GPU KV cache size" and "Maximum concurrency" lines.
    """

    gpu_total_gib: float
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    available_kv_cache_gib: float
    kv_bytes_per_token: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    starts: bool
    error: str | None = None
    """Why vLLM would refuse to start (the text vLLM would raise), or ``None``."""
    longest_fitting_len: int | None = None
    """The longest ``max_model_len`` this KV cache holds one request of (vLLM's "estimated maximum
    model length"); ``None`` when not computed (the engine starts, or no memory is left at all)."""
    max_model_len: int = 0
    """The ``max_model_len`` vLLM runs with: the setting, the model's default when unset, or what
    ``--max-model-len -1`` (auto) fits to the KV cache."""
    kv_pool_bytes: int = 0
    """The KV pool every rank allocates in bytes: the smallest stage's available memory (what
    ``--kv-cache-memory-bytes`` pins to give these very blocks); 0 when nothing is left."""
    sampler_state_gib: float = 0.0
    """Model Runner V2's persistent sampler buffers (0.33+; on the last pipeline stage), inside the
    budget beside the weights: ``requested = weights + activation + sampler_state + non_torch
    [+ cuda_graphs] + available_kv_cache``."""
    cuda_graphs_in_budget: bool = True
    """Whether vLLM subtracts its CUDA-graph estimate from the budget before sizing the KV cache
    (:func:`kvpilot.tuner.vllm.subtracts_cuda_graphs`); otherwise the graphs are captured afterwards, in
    the memory the utilisation leaves free."""
    lora_gib: float = 0.0
    """vLLM's LoRA buffers (``--enable-lora``: ``--max-loras`` adapters at ``--max-lora-rank``), part of
    ``weights_gib`` as vLLM's "Model loading took" counts them."""
    kv_connector_gib: float = 0.0
    """The KV connector's GPU buffers (``--kv-transfer-config``, e.g. LMCache's staging chunk), the largest
    rank's: allocated after vLLM sizes the KV cache, so not among the terms above; they come out of the
    memory ``gpu_memory_utilization`` leaves free."""
    speculative_gib: float = 0.0
    """The MTP drafter of ``--speculative-config`` (its layers' weights, loaded inside "Model loading took",
    and the proposer's buffers), part of ``weights_gib``; its KV layers are in ``kv_bytes_per_token``."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's answer: settings, the budget behind them, and what they buy."""

    settings: EngineSettings
    budget: MemoryBudget
    feasible: bool
    concurrency_at_max_len: float
    """Sequences of ``max_model_len`` tokens the KV cache holds at once."""
    gpu: str
    """Catalogue name of the GPU planned for."""
    gpu_count: int
    vllm_version: str
    warnings: tuple[str, ...] = ()
    pipeline_parallel_size: int = 1
    """Pipeline stages of the planned replica (the GPUs the tensor-parallel group leaves over)."""
    data_parallel_size: int = 1
    """The engines (data-parallel ranks) the pod runs, each with these settings and this budget; 1: one."""
    reasons: tuple[str, ...] = ()
    """When infeasible: why, and what would fit (more GPUs, fp8 KV, shorter context, ...)."""
    args: tuple[str, ...] = field(default=())
    """The rendered vLLM arguments, e.g. ``("--max-model-len", "8192", ...)``."""
    profile: str | None = None
    """The fleet-learned TuningProfile the plan started from (``kvpilot.tuner.plan.profiles``); ``None``:
    the memory model's plan alone."""
    profile_note: str = ""
    """What the profile changed (the Planned event and ``status.profile`` carry it)."""
    learned_kv_cache_tokens: int | None = None
    """The budget's KV tokens times the profile's learned ratio (what vLLM is expected to report)."""
    kv_cache_memory_bytes: int | None = None
    """``--kv-cache-memory-bytes`` when the plan pins the KV pool (``args`` then renders it instead of
    ``--gpu-memory-utilization``); ``None``: the pool is what the utilisation leaves."""
