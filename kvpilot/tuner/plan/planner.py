"""The static planner: engine settings for a model on a GPU type, within the user's bounds.

Sits on top of the memory model (:mod:`kvpilot.tuner.memory.budget`); the CLI's ``plan``
and the operator's first deployment call :func:`compute_plan`. Pure and
deterministic: the same inputs give the same plan.

A chain of small steps, each a pure function:

1. tensor parallelism: the GPU count (it must divide the attention heads);
2. ``gpu_memory_utilization``: the largest fraction that leaves the head-room
   start-up profiling does not see (:func:`compute_safe_utilization`);
3. ``kv_cache_dtype``: ``auto``, or ``fp8`` when allowed, supported and useful;
4. ``max_model_len``: the wanted context, shortened to what fits (never below
   ``min_context``);
5. ``max_num_seqs``: the expected concurrency, or what the cache holds at a
   typical fill, within vLLM's own default;
6. check the budget; when nothing fits, say why and what would (more GPUs, fp8 KV,
   a shorter context, quantized weights).

Pinned settings are never changed; they are only checked.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.fp8_advice import describe_fp8_fits
from kvpilot.tuner.model import GDN, ModelSpec, QuantSpec
from kvpilot.tuner.plan.profiles import Learned
from kvpilot.tuner.plan.topology import (
    check_rank_gpus,
    compute_expert_shards,
    compute_pipeline_parallel,
    compute_rank_gpus,
    compute_tensor_parallel,
    compute_topology_budget,
    tensor_parallel_ok,
)
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, MemoryBudget, Plan, ServingBounds

TYPICAL_FILL = 0.25
"""Without an expected concurrency, size ``max_num_seqs`` for requests filling a quarter of the context."""
FRAGMENTATION_MARGIN_GIB = 1.25
"""Allocator slack after start-up that profiling does not see (case-036: 1.7 GiB reserved, 0.55 GiB free).
At least the memory model's failure margin (1.05 GiB on an H100) plus 0.2 GiB, on every GPU: the
planner stays on the safe side of the estimator."""
GRAPH_ESTIMATE_ERROR = 0.3
"""vLLM's CUDA-graph estimate was 0.54 GiB (30 %) short of the real pool for gpt-oss-20b."""
NOTHING_PINNED = EngineSettings()
CONTEXT_STEP = 1024
"""A shortened ``max_model_len`` is rounded down to a multiple of this."""

_BudgetOf = Callable[[EngineSettings], MemoryBudget]
"""The budget of the planned model on the planned GPU under some settings (memoized per plan)."""


def compute_safe_utilization(
    model: ModelSpec,
    gpu: GpuSpec,
    settings: EngineSettings,
    bounds: ServingBounds,
    vllm_version: str,
    pipeline_parallel_size: int = 1,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
) -> float:
    """``gpu_memory_utilization`` leaving what vLLM's profiling misses outside the budget.

    Outside the ``requested`` share vLLM must still find: the CUDA context (and NCCL
    with TP), one fresh fp32 logits buffer for the sampler warm-up after graph capture,
    allocator fragmentation, the CUDA graphs' estimation error (the whole graph pool for
    releases that do not subtract it), rounded down to a hundredth.
    """
    version = vllm.parse_version(vllm_version)
    r = memory.resolve_settings(
        model,
        gpu,
        settings,
        version,
        pipeline_parallel_size,
        performance_mode=engine.performance_mode,
        model_runner_v2=engine.model_runner_v2,
    )
    drafter = memory.resolve_drafter(model, engine.speculative, r.pp, r.tp)
    tokens, drafter_layers = memory.graph_speculation(model, engine.speculative, drafter, r.model_runner_v2)
    graphs = memory.compute_cuda_graph_bytes(
        model,
        gpu,
        pp=r.pp,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        version=version,
        performance_mode=r.performance_mode,
        enforce_eager=engine.enforce_eager,
        tp=r.tp,
        model_runner_v2=r.model_runner_v2,
        num_speculative_tokens=tokens,
        drafter_layers=drafter_layers,
    )
    graph_share = GRAPH_ESTIMATE_ERROR if vllm.subtracts_cuda_graphs(version, r.model_runner_v2) else 1.0
    logits = memory.compute_warmup_logits_bytes(model, r)
    headroom = (
        memory.CUDA_CONTEXT_GIB * GIB
        + (memory.NCCL_GIB * GIB if r.tp > 1 else 0)
        + logits
        + FRAGMENTATION_MARGIN_GIB * GIB
        + graphs * graph_share
    )
    util = math.floor((1 - headroom / gpu.total_bytes) * 100) / 100
    return min(bounds.max_gpu_memory_utilization, max(bounds.min_gpu_memory_utilization, util))


def _budget(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    settings: EngineSettings,
    version: str,
    weights: int | None,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> MemoryBudget:
    """The budget of ``settings`` on a replica of ``gpu_count`` GPUs: the GPUs the tensor-parallel
    group leaves over are pipeline stages, as the operator renders them."""
    return compute_topology_budget(model, gpu, gpu_count, settings, version, weights, engine, expert_shards)


def _round_to_step(length: int) -> int:
    """``length`` rounded down to a multiple of ``CONTEXT_STEP`` (kept as is when shorter than one)."""
    return length // CONTEXT_STEP * CONTEXT_STEP if length >= CONTEXT_STEP else length


def _bisect_longest(ok: Callable[[int], bool], upper: int) -> int:
    """The largest length in [1, upper] with ``ok`` (assumed monotone), rounded down to a step; 0 if none."""
    if upper <= 0 or not ok(1):
        return 0
    if ok(upper):
        return upper
    lo, hi = 0, upper
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return _round_to_step(lo)


def _longest_fitting(budget_of: _BudgetOf, settings: EngineSettings, upper: int) -> int:
    """The longest ``max_model_len`` <= ``upper`` with which the engine starts (0 if none)."""

    def starts(length: int) -> bool:
        return budget_of(settings.replace(max_model_len=length)).starts

    # Shortcut: the budget at ``upper`` already knows the longest length its KV cache holds.
    hint = budget_of(settings.replace(max_model_len=upper)).longest_fitting_len
    if hint:
        guess = _round_to_step(hint)
        if guess and starts(guess) and not starts(min(upper, guess + CONTEXT_STEP)):
            return guess
    return _bisect_longest(starts, upper)


def _context_of(settings: EngineSettings, budget: MemoryBudget, model: ModelSpec) -> int:
    """The ``max_model_len`` vLLM runs ``settings`` with: the budget's (which resolves ``-1``, auto-fit,
    to what the KV cache holds), else the setting, else the model's own maximum."""
    return budget.max_model_len or settings.max_model_len or model.max_model_len


def _round_seqs(n: float) -> int:
    n = max(1, int(n))
    return n if n < 16 else n // 8 * 8


def _choose_max_num_seqs(
    model: ModelSpec,
    gpu: GpuSpec,
    settings: EngineSettings,
    bounds: ServingBounds,
    version: str,
    budget_of: _BudgetOf,
    kv_ratio: float = 1.0,
) -> int:
    if bounds.concurrency:
        return bounds.clamp_seqs(max(1, bounds.concurrency))
    cap = vllm.default_batch_limits(vllm.parse_version(version), gpu).max_num_seqs
    budget = budget_of(settings.replace(max_num_seqs=cap))
    length = _context_of(settings, budget, model)
    typical = budget.kv_cache_tokens * kv_ratio / max(1.0, TYPICAL_FILL * length)
    seqs = bounds.clamp_seqs(min(cap, _round_seqs(typical)))
    if model.linear_state is not None:
        # vLLM 0.33 refuses more sequences than a state model's cache blocks (each decoding sequence
        # holds a state block during CUDA-graph capture): vllm.mamba_cache_blocks_error. Falcon-H1's
        # state layers are its attention layers' twins (``with_state``), not LINEAR ones.
        seqs = max(1, min(seqs, budget.num_gpu_blocks))
    return seqs


def _with_batched_tokens(
    settings: EngineSettings, gpu: GpuSpec, version: str, pinned: EngineSettings
) -> EngineSettings:
    """vLLM refuses ``max_num_batched_tokens < max_num_seqs``: raise it when the default would be short."""
    if pinned.max_num_batched_tokens is not None or settings.max_num_seqs is None:
        return settings
    default = vllm.default_batch_limits(vllm.parse_version(version), gpu).max_num_batched_tokens
    if settings.max_num_seqs > default:
        return settings.replace(max_num_batched_tokens=settings.max_num_seqs)
    return settings


def _suggestions(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    bounds: ServingBounds,
    settings: EngineSettings,
    pinned: EngineSettings,
    version: str,
    budget_of: _BudgetOf,
    fits: Callable[[MemoryBudget], bool],
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> list[str]:
    """What would fit instead: more GPUs, fp8 KV, a shorter context, quantized weights."""
    out: list[str] = []
    if pinned.tensor_parallel_size is None and engine.data_parallel is None:  # a rank's GPUs are the pod's
        for count in (2, 4, 8, 16, 32, 64):
            if count <= gpu_count or not tensor_parallel_ok(model, count):
                continue
            if fits(budget_of(settings.replace(tensor_parallel_size=count))):
                out.append(f"{count} {gpu.name} GPUs (tensor parallel {count}) fit these settings.")
                break
    length = _context_of(settings, budget_of(settings), model)
    floor = bounds.min_context or 1
    auto_kv = (settings.kv_cache_dtype or "auto") == "auto" and pinned.kv_cache_dtype is None
    if auto_kv and gpu.fp8_kv:
        allowed, flags = bounds.allow_fp8_kv, "--kv-cache-dtype fp8"
        fp8 = settings.replace(kv_cache_dtype="fp8")
        if fits(budget_of(fp8)):
            out.append(describe_fp8_fits(flags, allowed=allowed))
        elif (
            pinned.max_model_len is None
            and floor < length
            and fits(budget_of(fp8.replace(max_model_len=floor)))
        ):
            out.append(describe_fp8_fits(flags, allowed=allowed, where=f" at the minimum context {floor}"))
    longest = _longest_fitting(budget_of, settings, length)
    if floor <= longest < length:
        out.append(f"A shorter context fits: max_model_len {longest} is the longest that starts.")
    elif 0 < longest < floor:
        out.append(
            f"Only a context of at most {longest} tokens starts, below the minimum context {floor}: "
            f"lower minContextLength only if the workload allows it."
        )
    if model.quantization is None:
        quant = QuantSpec("fp8", 8) if gpu.compute_capability >= (8, 9) else QuantSpec("awq", 4, 128)
        smaller = dataclasses.replace(model, quantization=quant)
        if fits(_budget(smaller, gpu, gpu_count, settings, version, None, engine, expert_shards)):
            kind = "FP8" if quant.method == "fp8" else "4-bit AWQ/GPTQ"
            out.append(
                f"A {kind}-quantized checkpoint of this model fits (kvpilot never changes the checkpoint)."
            )
    if not out:
        out.append("Nothing close fits: use a larger GPU or more GPUs.")
    return out


def compute_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    bounds: ServingBounds,
    *,
    pinned: EngineSettings = NOTHING_PINNED,
    vllm_version: str = vllm.PINNED_VLLM_VERSION,
    weights_total_bytes: int | None = None,
    pin_kv_cache_memory: bool = False,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    learned: Learned | None = None,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> Plan:
    """Plan vLLM's engine settings for ``model`` on ``gpu_count`` x ``gpu`` within ``bounds``.

    ``learned``: a fleet-learned TuningProfile (:mod:`kvpilot.tuner.plan.profiles`): the utilisation stays
    at or below its ceiling (below the lowest that OOMed; never below ``bounds``' minimum), and
    ``max_num_seqs`` is sized for the learned KV capacity (the budget's tokens times the learned ratio).

    ``pin_kv_cache_memory``: render ``--kv-cache-memory-bytes`` with the KV pool the plan's budget
    leaves (the same blocks) instead of ``--gpu-memory-utilization`` (:func:`_pin_kv_pool`).
    ``engine``: what the pods run besides the tuned settings (:class:`kvpilot.tuner.vllm.EngineFlags`: their
    ``VLLM_USE_V2_MODEL_RUNNER``, ``--enforce-eager``, ``--performance-mode``, prefix caching); the plan is
    for that engine. Its ``--max-num-active-seqs`` keeps ``max_num_seqs`` the capacity the plan sizes; a cap
    above it is refused by name (vLLM 0.33 does not start) and the warnings say which limit admits.
    ``expert_shards``: the replica is one data-parallel rank of a group whose routed experts split over the
    group (:func:`kvpilot.tuner.plan.nodes.compute_node_plan` plans such groups)."""
    release, release_warning = vllm.check_release(vllm_version)
    _check_data_parallel(engine, gpu_count, pinned, expert_shards)
    if model.architecture != model.model_type:  # a config without ``architectures`` names its model_type
        vllm.check_architecture_registered(model.architecture, release)
    p = _Planning(
        model,
        gpu,
        gpu_count,
        bounds,
        pinned,
        vllm_version,
        weights_total_bytes,
        engine,
        learned,
        [release_warning] if release_warning else [],
        expert_shards,
    )
    first_unmodelled = len(p.warnings)  # the speculative flags' warning goes here once the layout is known
    p.warnings += [vllm.describe_unmodelled_flag(flag) for flag in engine.unmodelled]
    lora_gap = memory.lora_unbudgeted_reason(model) if engine.lora is not None else None
    if lora_gap is not None:
        p.warnings.append(
            f"--enable-lora is not in kvpilot's memory model for {model.architecture} ({lora_gap}): its "
            f"LoRA buffers are not budgeted; lower --gpu-memory-utilization by --max-loras x "
            f"--max-lora-rank x the wrapped layers' widths."
        )
    p.warnings += _kv_connector_gaps(model, engine.kv_connector)
    memory.check_moe_backend_model(model, engine.moe_backend)  # vLLM refuses it at load
    moe_gap = memory.describe_unbudgeted_moe_backend(model, engine.moe_backend, vllm_version)
    if moe_gap is not None:
        p.warnings.append(moe_gap)
    settings = _choose_tensor_parallel(p)
    if engine.speculative is not None:  # what vLLM refuses of the drafter, its TP against the chosen one
        memory.check_speculative_model(model, engine.speculative, settings.tensor_parallel_size or 1)
    settings, wanted = _choose_context(p, settings)
    settings = _choose_utilization(p, settings)
    settings, budget = p.settle(settings)
    settings, budget = _try_fp8_kv(p, settings, budget)
    settings, budget = _shorten_context(p, settings, budget, wanted)
    if engine.max_num_active_seqs is not None and settings.max_num_seqs is not None:
        # the cap admits, max_num_seqs sizes memory and graphs (:mod:`kvpilot.tuner.vllm.active_seqs`)
        vllm.check_active_below_seqs(engine.max_num_active_seqs, settings.max_num_seqs)
        p.warnings.append(vllm.describe_active_seqs_plan(engine.max_num_active_seqs, settings.max_num_seqs))
    feasible, reasons = _judge(p, settings, budget)
    _warn_about_capacity(p, budget)
    profile, note, learned_tokens = _profile_fields(learned, budget)
    kv_bytes = None
    if pin_kv_cache_memory and feasible:
        kv_bytes, settings, budget = _pin_kv_pool(
            model, gpu, gpu_count, settings, vllm_version, weights_total_bytes, budget, engine, expert_shards
        )
    if engine.lora is not None and lora_gap is None:
        p.warnings.append(_describe_lora(engine.lora, budget))
    connector = engine.kv_connector
    if connector is not None and (connector.lmcache or not vllm.kv_connector_unmodelled(connector)):
        p.warnings.append(_describe_kv_connector(connector, budget))  # what is budgeted (the gaps: above)
    tp = settings.tensor_parallel_size or 1
    pp = compute_pipeline_parallel(p.rank_gpus, tp)
    if engine.data_parallel is not None and expert_shards == memory.ONE_ENGINE:  # a node plan says its own
        experts = model.moe.num_experts if model.moe is not None else None
        p.warnings.insert(first_unmodelled, vllm.describe_data_parallel(engine.data_parallel, tp, experts))
    spec_gap = memory.describe_unbudgeted_speculative(
        model, engine.speculative, engine.speculative_flags, pp, tp
    )
    if spec_gap is not None:
        p.warnings.insert(first_unmodelled, spec_gap)
    elif engine.speculative is not None:
        # the drafter the plan's budget counts, resolved once for the plan's line on it
        drafter = memory.resolve_drafter(model, engine.speculative, pp, tp)
        p.warnings.append(
            _describe_speculative(model, engine.speculative, engine.speculative_flags[0], budget, drafter)
        )
    return Plan(
        settings=settings,
        budget=budget,
        feasible=feasible,
        concurrency_at_max_len=budget.max_concurrency,
        gpu=gpu.name,
        gpu_count=gpu_count,
        pipeline_parallel_size=pp,
        data_parallel_size=engine.data_parallel.local if engine.data_parallel is not None else 1,
        vllm_version=vllm_version,
        warnings=tuple(p.warnings),
        reasons=reasons,
        args=_render(settings, kv_bytes),
        kv_cache_memory_bytes=kv_bytes,
        profile=profile,
        profile_note=note,
        learned_kv_cache_tokens=learned_tokens,
    )


def _check_data_parallel(
    engine: vllm.EngineFlags, gpu_count: int, pinned: EngineSettings, expert_shards: memory.ExpertShards
) -> None:
    """Refuse data-parallel flags the plan cannot honour: ranks that do not split the pod's GPUs evenly, or a
    data-parallel size given to a rank of a group the node planner lays out itself (:mod:`.nodes`; its
    expert shards win over a lone ``--enable-expert-parallel``)."""
    if engine.data_parallel is None:
        return
    if expert_shards != memory.ONE_ENGINE:
        check_no_data_parallel(engine)
    check_rank_gpus(gpu_count, engine, pinned.tensor_parallel_size)


def check_no_data_parallel(engine: vllm.EngineFlags) -> None:
    """Refuse a ``--data-parallel-size`` among the engine flags of a replica of several nodes: its layout is
    the node planner's to choose (:mod:`.nodes`)."""
    if engine.data_parallel is not None and engine.data_parallel.size > 1:
        raise errors.InvalidEngineArgs(
            f"{vllm.DATA_PARALLEL_SIZE_FLAG} is the layout kvpilot chooses for a replica of several nodes; "
            "leave it out of the engine arguments",
            flag=vllm.DATA_PARALLEL_SIZE_FLAG,
        )


@dataclass
class _Planning:
    """One planning's inputs, its memoized budgets and the warnings its steps collect."""

    model: ModelSpec
    gpu: GpuSpec
    gpu_count: int
    bounds: ServingBounds
    pinned: EngineSettings
    version: str
    weights: int | None
    engine: vllm.EngineFlags
    learned: Learned | None
    warnings: list[str]
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE
    budgets: dict[EngineSettings, MemoryBudget] = field(default_factory=dict)

    @property
    def rank_gpus(self) -> int:
        """The GPUs of one engine: the pod's, or a data-parallel rank's share of them."""
        return compute_rank_gpus(self.gpu_count, self.engine)

    def budget_of(self, s: EngineSettings) -> MemoryBudget:
        """Memoized: the context searches and the suggestions revisit the same settings."""
        if s not in self.budgets:
            self.budgets[s] = _budget(
                self.model,
                self.gpu,
                self.gpu_count,
                s,
                self.version,
                self.weights,
                self.engine,
                self.expert_shards,
            )
        return self.budgets[s]

    def meets(self, budget: MemoryBudget) -> bool:
        """It starts and holds the expected concurrency at the full context."""
        if not budget.starts:
            return False
        return not self.bounds.concurrency or budget.max_concurrency + 1e-9 >= self.bounds.concurrency

    def settle(self, s: EngineSettings) -> tuple[EngineSettings, MemoryBudget]:
        """``s`` with its sequences and batched tokens chosen (unless pinned), and its budget."""
        if self.pinned.max_num_seqs is None:
            kv_ratio = self.learned.kv_ratio if self.learned and self.learned.kv_ratio is not None else 1.0
            seqs = _choose_max_num_seqs(
                self.model, self.gpu, s, self.bounds, self.version, self.budget_of, kv_ratio
            )
            s = s.replace(max_num_seqs=seqs)
        s = _with_batched_tokens(s, self.gpu, self.version, self.pinned)
        return s, self.budget_of(s)


def _choose_tensor_parallel(p: _Planning) -> EngineSettings:
    """Step 1: the pinned settings with a tensor-parallel size vLLM accepts (the GPU count when it can; a
    data-parallel rank's GPUs when the pod runs several engines)."""
    model, gpu_count = p.model, p.rank_gpus
    tp = p.pinned.tensor_parallel_size or compute_tensor_parallel(model, gpu_count)
    if p.pinned.tensor_parallel_size is None and tp != gpu_count:
        p.warnings.append(
            f"tensor_parallel_size {tp}: vLLM refuses {gpu_count} for this model (it must divide the "
            f"{model.num_attention_heads} attention heads and the padded vocabulary, and divide or be "
            f"divided by the {model.num_kv_heads} KV heads)"
            + (f"; the other GPUs run {gpu_count // tp} pipeline stages." if gpu_count // tp > 1 else ".")
        )
    return p.pinned.replace(tensor_parallel_size=tp)


def _choose_context(p: _Planning, settings: EngineSettings) -> tuple[EngineSettings, int]:
    """Step 2: the wanted ``max_model_len`` (the pinned one, else the bounds' within the model's maximum)."""
    model_max, bounds = p.model.max_model_len, p.bounds
    wanted = p.pinned.max_model_len or min(bounds.max_context or model_max, model_max)
    if bounds.max_context and bounds.max_context > model_max and p.pinned.max_model_len is None:
        p.warnings.append(
            f"max_context {bounds.max_context} exceeds the model's maximum {model_max}; using {model_max}."
        )
    return settings.replace(max_model_len=wanted), wanted


def _choose_utilization(p: _Planning, settings: EngineSettings) -> EngineSettings:
    """Step 3: an ``auto`` KV cache unless pinned, and the safe utilisation under a learned ceiling."""
    if p.pinned.kv_cache_dtype is None:
        settings = settings.replace(kv_cache_dtype="auto")
    _explain_auto_kv(p, settings)
    if p.pinned.gpu_memory_utilization is not None:
        return settings
    bounds, learned = p.bounds, p.learned
    seq_guess = settings.replace(max_num_seqs=p.pinned.max_num_seqs or bounds.concurrency)
    pp = compute_pipeline_parallel(p.rank_gpus, settings.tensor_parallel_size or 1)
    util = compute_safe_utilization(p.model, p.gpu, seq_guess, bounds, p.version, pp, p.engine)
    if learned is not None and learned.utilization_ceiling is not None:
        util = max(bounds.min_gpu_memory_utilization, min(util, learned.utilization_ceiling))
        if learned.utilization_ceiling < bounds.min_gpu_memory_utilization:
            p.warnings.append(
                f"{learned.name} saw CUDA OOM at gpu_memory_utilization "
                f"{learned.lowest_oom_utilization}, "
                f"below the spec's minimum {bounds.min_gpu_memory_utilization}: the minimum is kept."
            )
    return settings.replace(gpu_memory_utilization=util)


def _explain_auto_kv(p: _Planning, settings: EngineSettings) -> None:
    """``--kv-cache-dtype auto`` on a checkpoint that declares its KV cache: say what auto runs."""
    quant = p.model.quantization
    declared = quant.kv_cache if quant is not None else None
    resolved = vllm.resolve_kv_cache_dtype(settings.kv_cache_dtype, declared)
    if (settings.kv_cache_dtype or "auto") == "auto" and resolved != "auto":
        p.warnings.append(
            f"--kv-cache-dtype auto means {resolved} for this checkpoint: its quantization_config "
            f"declares a {resolved} KV cache, which vLLM runs for auto; the KV cache is sized in {resolved}."
        )


def _try_fp8_kv(
    p: _Planning, settings: EngineSettings, budget: MemoryBudget
) -> tuple[EngineSettings, MemoryBudget]:
    """Step 4: an fp8 KV cache when allowed, supported and useful (no concurrency asked, or it is missed)."""
    fp8_ok = p.bounds.allow_fp8_kv and p.gpu.fp8_kv and p.pinned.kv_cache_dtype is None
    if not fp8_ok or (p.bounds.concurrency is not None and p.meets(budget)):
        return settings, budget
    candidate, cand_budget = p.settle(
        settings.replace(kv_cache_dtype="fp8", max_num_seqs=p.pinned.max_num_seqs)
    )
    if p.meets(cand_budget) or not p.meets(budget):
        return candidate, cand_budget
    return settings, budget


def _shorten_context(
    p: _Planning, settings: EngineSettings, budget: MemoryBudget, wanted: int
) -> tuple[EngineSettings, MemoryBudget]:
    """Step 5: when nothing fits, the longest context that does (never below ``min_context``)."""
    if p.meets(budget) or p.pinned.max_model_len is not None:
        return settings, budget
    floor = p.bounds.min_context or 1
    lo = _bisect_longest(lambda length: p.meets(p.budget_of(settings.replace(max_model_len=length))), wanted)
    if lo < floor:
        return settings, budget
    shorter, short_budget = p.settle(settings.replace(max_model_len=lo, max_num_seqs=p.pinned.max_num_seqs))
    if not p.meets(short_budget):
        # The sequences chosen for the shorter context cost memory too (the V2 sampler state, more
        # graphs): the longest context that fits with them, else the sequences the length was searched
        # with, which fit by construction.
        seqs = shorter.max_num_seqs
        again = _bisect_longest(
            lambda length: p.meets(p.budget_of(settings.replace(max_model_len=length, max_num_seqs=seqs))), lo
        )
        shorter = settings.replace(max_model_len=again, max_num_seqs=seqs)
        short_budget = p.budget_of(shorter)
        if again < floor or not p.meets(short_budget):
            shorter = settings.replace(max_model_len=lo)
            short_budget = p.budget_of(shorter)
    if not p.meets(short_budget):
        return settings, budget
    p.warnings.append(
        f"max_model_len shortened from {wanted} to {shorter.max_model_len} to fit the KV cache."
    )
    return shorter, short_budget


def _judge(p: _Planning, settings: EngineSettings, budget: MemoryBudget) -> tuple[bool, tuple[str, ...]]:
    """Step 6: feasible, or why not and what would fit instead."""
    bounds = p.bounds
    feasible = p.meets(budget) and (
        not bounds.min_context or _context_of(settings, budget, p.model) >= bounds.min_context
    )
    if feasible:
        return True, ()
    length = _context_of(settings, budget, p.model)
    why = budget.error or (
        f"the KV cache holds {budget.max_concurrency:.2f} sequences of {length} tokens, "
        f"fewer than the expected concurrency {bounds.concurrency}."
    )
    suggestions = _suggestions(
        p.model,
        p.gpu,
        p.gpu_count,
        bounds,
        settings,
        p.pinned,
        p.version,
        p.budget_of,
        p.meets,
        p.engine,
        p.expert_shards,
    )
    return False, (why, *suggestions)


def _warn_about_capacity(p: _Planning, budget: MemoryBudget) -> None:
    """Step 7: a pinned sequence limit below the expected concurrency; less than one full-length sequence."""
    pinned, bounds = p.pinned, p.bounds
    if pinned.max_num_seqs and bounds.concurrency and pinned.max_num_seqs < bounds.concurrency:
        p.warnings.append(
            f"The pinned max_num_seqs {pinned.max_num_seqs} is below the expected concurrency "
            f"{bounds.concurrency}."
        )
    if budget.max_concurrency < 1 and budget.starts:
        p.warnings.append("The KV cache holds less than one max_model_len sequence.")


def _profile_fields(learned: Learned | None, budget: MemoryBudget) -> tuple[str | None, str, int | None]:
    """The plan's ``profile``, ``profile_note`` and ``learned_kv_cache_tokens``: set only when the profile
    changed something (a profile below its sample guards is named in the note, not used)."""
    if learned is None:
        return None, "", None
    note = learned.describe()
    if not learned.used:
        return None, note, None
    tokens = round(budget.kv_cache_tokens * learned.kv_ratio) if learned.kv_ratio is not None else None
    return learned.name, note, tokens


def _pin_kv_pool(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    settings: EngineSettings,
    version: str,
    weights: int | None,
    budget: MemoryBudget,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> tuple[int | None, EngineSettings, MemoryBudget]:
    """The plan's KV pool as ``--kv-cache-memory-bytes``, the settings and the budget under that pin.

    The pool is the smallest stage's available memory (the same blocks vLLM would find). The
    utilisation leaves the settings: the rendered arguments carry the pool instead, and vLLM's
    default utilisation sets only the start-up free-memory check. The pinned budget checks that the
    rest still fits the GPU; if it would not start, the plan keeps its utilisation."""
    if budget.kv_pool_bytes <= 0:
        return None, settings, budget
    tp = settings.tensor_parallel_size or 1
    if expert_shards == memory.ONE_ENGINE:
        gpu_count = compute_rank_gpus(gpu_count, engine)
    pp = compute_pipeline_parallel(gpu_count, tp)
    unpinned = settings.replace(gpu_memory_utilization=None)
    pinned = memory.compute_budget(
        model,
        gpu,
        unpinned,
        pipeline_parallel_size=pp,
        vllm_version=version,
        weights_total_bytes=weights,
        kv_cache_memory_bytes=budget.kv_pool_bytes,
        expert_shards=compute_expert_shards(engine, tp, expert_shards),
        **engine.budget_kwargs(),
    )
    if not pinned.starts:
        return None, settings, budget
    return budget.kv_pool_bytes, unpinned, pinned


def _describe_lora(lora: vllm.LoraFlags, budget: MemoryBudget) -> str:
    """The plan's line on the LoRA term: vLLM preallocates it at load, whatever adapters are served."""
    dtype = lora.lora_dtype or "the model's dtype"
    sharded = ", fully sharded" if lora.fully_sharded else ""
    return (
        f"--enable-lora: vLLM preallocates {budget.lora_gib:.2f} GiB of LoRA buffers per GPU at load "
        f"({lora.max_loras} x rank {lora.max_lora_rank} in {dtype}{sharded}), counted in the weights."
    )


def _kv_connector_gaps(model: ModelSpec, connector: vllm.KvConnector | None) -> list[str]:
    """The plan's warnings on what of ``--kv-transfer-config``'s connector is not budgeted, by name."""
    if connector is None:
        return []
    gaps = []
    gap = vllm.kv_connector_unmodelled(connector)
    if gap is not None:
        gaps.append(f"{vllm.KV_TRANSFER_CONFIG_FLAG} is not wholly in kvpilot's memory model: {gap}.")
    kinds = sorted(set(model.layer_kinds))
    if vllm.kv_connector_turns_hma_off(connector) and len(kinds) > 1:
        gaps.append(
            f"{vllm.KV_TRANSFER_CONFIG_FLAG} {connector.name} does not support vLLM's hybrid KV cache "
            f"manager, so vLLM turns it off for this model's mixed layers ({', '.join(kinds)}): every "
            f"layer then keeps full-length pages (state-space hybrids fail to start), which kvpilot's KV "
            f"figures do not model; they overstate the KV cache."
        )
    model_gap = memory.kv_connector_unbudgeted_reason(model, connector)
    if model_gap is not None:
        gaps.append(
            f"{vllm.KV_TRANSFER_CONFIG_FLAG} {connector.name} is not in kvpilot's memory model for "
            f"{model.architecture} ({model_gap}): its staging buffer is not budgeted; lower "
            f"--gpu-memory-utilization by chunk_size x the KV bytes per token."
        )
    return gaps


def _describe_kv_connector(connector: vllm.KvConnector, budget: MemoryBudget) -> str:
    """The plan's line on the connector's term: allocated after vLLM sizes the KV cache, so the KV cache is
    unchanged and the buffers come out of the memory the utilisation leaves; LMCache's pinned host memory."""
    text = f"{vllm.KV_TRANSFER_CONFIG_FLAG} {connector.name}: "
    chunk = vllm.lmcache_staging_chunk(connector)
    if budget.kv_connector_gib:
        text += (
            f"{budget.kv_connector_gib:.2f} GiB per GPU at start-up (a staging chunk of {chunk} tokens of "
            f"KV), allocated after vLLM sizes the KV cache: the KV cache is unchanged, the buffer comes "
            f"out of the memory --gpu-memory-utilization leaves free"
        )
    else:
        text += "no GPU memory of its own budgeted at start-up"
    host = vllm.compute_lmcache_host_bytes(connector, 1)
    if host is not None:
        text += (
            f"; LMCache's CPU backend pins {host / GIB:.1f} GiB of host memory per GPU (max_local_cpu_size), "
            f"out of the pod's memory"
        )
    return text + "."


def _describe_speculative(
    model: ModelSpec,
    spec: vllm.SpeculativeFlags,
    flag: str,
    budget: MemoryBudget,
    drafter: memory.Drafter | None,
) -> str:
    """The plan's line on speculative decoding it budgets: the drafter's weights, buffers and KV layers
    (``drafter``: the one the budget counts), or nothing for a CPU proposer; what it never budgets, by
    name."""
    tokens = spec.num_speculative_tokens
    if drafter is not None and drafter.eagle3 is not None:
        eagle3, n = drafter.eagle3, drafter.kv_layers
        about = (
            f"the EAGLE3 drafter ({eagle3.architecture}, {_count(n, 'layer')}, an LM head of "
            f"{eagle3.draft_vocab_size:,} tokens)"
        )
        return _describe_drafter(flag, vllm.EAGLE3, tokens or 1, about, n, "", budget)
    if drafter is not None and drafter.draft is not None:
        draft, n = drafter.draft, drafter.kv_layers
        about = f"the draft model ({draft.architecture}, {_count(n, 'layer')}, its own embedding and LM head)"
        state = _state_text(model, spec)
        return _describe_drafter(flag, vllm.DRAFT_MODEL, tokens or 1, about, n, state, budget)
    if spec.method != vllm.MTP:
        count = f", {_count(tokens, 'draft token')}" if tokens else ""
        state = ""
        if model.linear_state is not None:  # vLLM sizes a hybrid's state for the draft tokens, any method
            state = (
                "; the draft tokens each request's linear-attention state also holds (more state pages, and "
                "conv positions) are not budgeted for this method"
            )
        return (
            f"{flag} (method {spec.method}{count}): the proposer runs on the CPU and takes no GPU memory of "
            f"its own{state}; {vllm.SPECULATIVE_UNBUDGETED}."
        )
    layers = model.num_mtp_layers
    about = f"the MTP drafter's {_count(layers, 'layer')}"
    state = _state_text(model, spec)
    return _describe_drafter(
        flag, vllm.MTP, tokens or layers, about, layers, state, budget, plural=layers > 1
    )


def _describe_drafter(
    flag: str,
    method: str,
    drafted: int,
    about: str,
    kv_layers: int,
    state: str,
    budget: MemoryBudget,
    *,
    plural: bool = False,
) -> str:
    """The one sentence of a budgeted drafter (``about``: what it is, the sentence's subject, ``plural``
    when it names several layers; ``drafted``: the draft tokens; ``state``: what a hybrid's state holds
    more for them, or nothing)."""
    verb, add = ("take", "add") if plural else ("takes", "adds")
    return (
        f"{flag} (method {method}, {_count(drafted, 'draft token')}): {about} {verb} "
        f"{budget.speculative_gib:.2f} GiB per GPU (weights and the proposer's buffers, counted in the "
        f"weights) and {add} {_count(kv_layers, 'KV layer')} to the cache ({budget.kv_bytes_per_token:,} "
        f"bytes per token){state}; {vllm.SPECULATIVE_UNBUDGETED}."
    )


def _state_text(model: ModelSpec, spec: vllm.SpeculativeFlags) -> str:
    """What a hybrid's state layers hold more for the draft tokens (budgeted: MTP, a draft model)."""
    if model.linear_state is None:
        return ""
    drafted = memory.speculative_state_tokens(model, spec)
    return f"; each request's linear-attention state holds {_count(drafted, 'more page')} per state group" + (
        f" and its conv state {_count(drafted, 'more position')}"
        if vllm.speculative_conv_positions(model.linear_state.family == GDN, drafted)
        else ""
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _render(settings: EngineSettings, kv_cache_memory_bytes: int | None = None) -> tuple[str, ...]:
    try:
        return vllm.build_vllm_args(settings, kv_cache_memory_bytes=kv_cache_memory_bytes)
    except errors.TunerError:  # a pinned value the renderer refuses: the caller validates pins
        return ()
