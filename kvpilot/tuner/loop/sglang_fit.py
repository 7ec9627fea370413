"""SGLang's memory model as the closed loop asks it: the settings SGLang runs, the fraction's ceiling, the
pool a candidate holds, and which candidates the history ruled out. Pure.

``--mem-fraction-static`` is (weights + KV pool) / GPU memory (:mod:`kvpilot.tuner.engines.sglang_budget`);
the activations (``--chunked-prefill-size``) and the decode CUDA graph (``--max-running-requests``) live
outside it. The *ceiling* of the fraction is SGLang's own default for a set of settings: what its reserve
leaves; a larger one starts but runs out of memory outside the share. The *floor* is the fraction whose
pool holds one request of the context (where the model is modelled). A candidate passes :func:`pick`:
clamped to the bounds (:func:`clamp`), left unset where it matches SGLang's default (:func:`normalize`),
dropped when it changes nothing, the history ruled it out (:func:`is_ruled_out`) or its pool would not hold
one request of its context (:func:`would_start`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import errors, sglang
from kvpilot.tuner.engines import SglangBudget, compute_sglang_budget
from kvpilot.tuner.loop import engine_chain
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.engine_chain import FRACTION_STEP as FRACTION_STEP
from kvpilot.tuner.loop.engine_chain import ceil_grid as ceil_grid
from kvpilot.tuner.loop.engine_chain import floor_grid as floor_grid
from kvpilot.tuner.loop.engine_flap import PressureChange as PressureChange
from kvpilot.tuner.loop.engine_state import ROLLOUT_FAILED as ROLLOUT_FAILED
from kvpilot.tuner.loop.engine_state import EngineFailedRun, EngineProposal
from kvpilot.tuner.loop.engine_state import RunFailure as RunFailure
from kvpilot.tuner.loop.engine_state import running_before as running_before
from kvpilot.tuner.memory import CUDA_CONTEXT_GIB
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.types import GIB, GpuSpec

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class SglangMemory:
    """The GPU and, when it is modelled, the model: what bounds the fraction and predicts the pool."""

    gpu: GpuSpec
    spec: ModelSpec | None = None
    """``None``, or a model SGLang's budget does not cover: only the reserve bounds the fraction."""
    weights_total_bytes: int | None = None

    @property
    def gpu_mib(self) -> float:
        return (self.gpu.nvml_total_bytes or self.gpu.total_bytes) / _MIB


FailedRun = EngineFailedRun[sglang.SglangSettings]
"""Settings that failed, and how (``status.failedEngineArgs`` for SGLang)."""


@dataclass(frozen=True, slots=True)
class SglangSituation:
    """What a rule looks at: the settings (as written and with SGLang's defaults filled in), the window
    since the last change, the memory, the ruled-out runs, the config."""

    current: sglang.SglangSettings
    effective: sglang.SglangSettings
    window: obs.ObservationWindow
    memory: SglangMemory
    failed: tuple[FailedRun, ...]
    bounds: TuningBounds
    policy: PolicyConfig
    ttft_p95_objective: float | None = None
    itl_p95_objective: float | None = None
    pressure: tuple[PressureChange, ...] = ()
    """The loop's KvPressure changes that name their running requests (the flap guard's memory)."""
    now: float = 0.0


SglangProposal = EngineProposal[sglang.SglangSettings]
"""A rule's answer: candidates in order of preference, and why."""


# --- the memory model's answers -------------------------------------------------------------------


def compute_effective(settings: sglang.SglangSettings, memory: SglangMemory) -> sglang.SglangSettings:
    """``settings`` with SGLang's defaults for the context, the prefill chunk, TP and the fraction filled in
    (``--max-running-requests`` stays unset when unset: SGLang sizes it from the pool at start-up)."""
    chunk = settings.chunked_prefill_size or sglang.default_chunked_prefill_size(memory.gpu_mib)
    filled = dataclasses.replace(
        settings,
        chunked_prefill_size=chunk,
        tp_size=settings.tp_size or 1,
        context_length=settings.context_length or (memory.spec.max_model_len if memory.spec else None),
    )
    if filled.mem_fraction_static is None:
        filled = dataclasses.replace(filled, mem_fraction_static=compute_fraction_ceiling(filled, memory))
    return filled


def compute_fraction_ceiling(settings: sglang.SglangSettings, memory: SglangMemory) -> float:
    """The largest fraction that leaves SGLang's reserve for activations (the prefill chunk), CUDA graphs
    (the decode batch) and parallelism outside it: SGLang's own default for these settings."""
    gpu_mib, tp = memory.gpu_mib, settings.tp_size or 1
    chunk = settings.chunked_prefill_size or sglang.default_chunked_prefill_size(gpu_mib)
    graph = sglang.default_cuda_graph_max_bs(gpu_mib, tp, settings.max_running_requests)
    reserve = sglang.compute_reserve(
        gpu_mib,
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=graph,
        tp_size=tp,
        pp_size=settings.pp_size or 1,
    )
    return sglang.default_mem_fraction_static(gpu_mib, reserve)


def predict_pool_tokens(settings: sglang.SglangSettings, memory: SglangMemory) -> int | None:
    """Tokens the KV pool holds under ``settings`` (effective), ``None`` when the model is not modelled."""
    budget = _budget(settings, memory)
    return None if budget is None else budget.max_total_tokens


def compute_chunk_trials(eff: sglang.SglangSettings, p: PolicyConfig) -> list[sglang.SglangSettings]:
    """``eff``, then with the prefill chunk halved down to ``batched_tokens_floor``: the settings whose
    smaller activation reserve lifts the fraction's ceiling, the fewest prefill tokens given up first."""
    trials, chunk = [eff], eff.chunked_prefill_size or p.batched_tokens_floor
    while chunk // 2 >= p.batched_tokens_floor:
        chunk //= 2
        trials.append(dataclasses.replace(eff, chunked_prefill_size=chunk))
    return trials


def compute_running_limit(settings: sglang.SglangSettings, memory: SglangMemory) -> int | None:
    """The running requests SGLang serves with under ``settings`` (effective): ``--max-running-requests``
    capped by the pool, or SGLang's own default from the pool and the context
    (:func:`kvpilot.tuner.sglang.default_max_running_requests`); ``None`` when the pool is not modelled and
    no limit is written."""
    tokens = predict_pool_tokens(settings, memory)
    context = settings.context_length
    if not tokens or not context:
        return settings.max_running_requests
    return sglang.default_max_running_requests(tokens, context, settings.max_running_requests)


def compute_fraction_for_context(settings: sglang.SglangSettings, memory: SglangMemory) -> float | None:
    """The smallest fraction (on the 0.01 grid) whose pool holds one request of the settings' context."""
    budget = _budget(settings, memory)
    if budget is None or settings.context_length is None:
        return None
    needed = budget.weight_bytes + budget.cell_bytes * (
        settings.context_length + (budget.settings.page_size or 1)
    )
    return ceil_grid(needed / budget.pre_load_bytes)


def compute_context_share(settings: sglang.SglangSettings, memory: SglangMemory) -> float | None:
    """The share of the GPU one request of the settings' context takes in the pool (``None``: unknown)."""
    budget = _budget(settings, memory)
    if budget is None or settings.context_length is None:
        return None
    return (
        budget.cell_bytes
        * (settings.context_length + (budget.settings.page_size or 1))
        / budget.pre_load_bytes
    )


def compute_budget(settings: sglang.SglangSettings, memory: SglangMemory) -> SglangBudget | None:
    """The memory model's budget for ``settings`` (``None``: the model is not modelled or refuses them)."""
    return _budget(settings, memory)


def _budget(settings: sglang.SglangSettings, memory: SglangMemory) -> SglangBudget | None:
    if memory.spec is None:
        return None
    try:
        return compute_sglang_budget(
            memory.spec, memory.gpu, settings, weights_total_bytes=memory.weights_total_bytes
        )
    except errors.InvalidEngineArgs:
        return None


def fraction_of(settings: sglang.SglangSettings) -> float:
    if settings.mem_fraction_static is None:
        raise AssertionError("effective settings have the fraction set")
    return settings.mem_fraction_static


def compute_wanted_fraction(
    settings: sglang.SglangSettings, memory: SglangMemory, minimum: float | None
) -> float | None:
    """The fraction a start-up short of memory asks for ``settings`` (effective): SGLang's printed
    ``minimum`` plus one request of the context (a step where unknown), and at least what the memory model
    says holds that request; without a minimum, the model's fraction where it explains the failure (above
    the current one); at least one step above the current fraction. ``None``: neither says (the failure
    refuted the model, or it is not modelled)."""
    fraction = fraction_of(settings)
    needed = compute_fraction_for_context(settings, memory)
    share = compute_context_share(settings, memory)
    wanted: float | None = None
    if minimum is not None:  # SGLang measured where the pool starts: that, and one request of the context
        wanted = max(ceil_grid(minimum + (share or FRACTION_STEP)), needed or 0.0)
    elif needed is not None and needed > fraction:  # the memory model explains the failure
        wanted = needed
    return None if wanted is None else max(wanted, round(fraction + FRACTION_STEP, 3))


def compute_shorter_context(
    s: SglangSituation, trial: sglang.SglangSettings, minimum: float | None = None
) -> sglang.SglangSettings | None:
    """``trial`` at its ceiling with the context its pool holds there (rounded down), when that is shorter.

    Where SGLang printed the fraction its weights take (``minimum``: ``1 - available/pre`` = weights / the
    memory free before the load), the pool at the ceiling is at most what that measurement leaves
    (:func:`_measured_pool_tokens`): the failure refuted the memory model's free memory, so its pool is not
    trusted above SGLang's own figure."""
    top = compute_fraction_ceiling(trial, s.memory)
    at_top = dataclasses.replace(trial, mem_fraction_static=top)
    tokens = predict_pool_tokens(at_top, s.memory)
    measured = _measured_pool_tokens(at_top, s, minimum)
    if tokens is not None and measured is not None:
        tokens = min(tokens, measured)
    context = s.effective.context_length
    if tokens is None or context is None or tokens <= 0:
        return None
    usable = tokens * (1.0 - s.policy.context_margin)
    multiple = s.policy.context_multiple if usable >= 4 * s.policy.context_multiple else 16
    shorter = int(usable // multiple) * multiple
    if shorter <= 0 or shorter >= context:
        return None
    return dataclasses.replace(at_top, context_length=shorter)


def _measured_pool_tokens(
    settings: sglang.SglangSettings, s: SglangSituation, minimum: float | None
) -> int | None:
    """The pool at ``settings``' fraction by SGLang's printed minimum: ``minimum`` = weights / free memory
    before the load, so the pool is ``weights x (fraction / minimum - 1)`` (``None``: no minimum, or the
    model's weights and cell are unknown; 0 at or below the minimum)."""
    budget = _budget(settings, s.memory)
    if minimum is None or minimum <= 0 or budget is None:
        return None
    pool = budget.weight_bytes * (fraction_of(settings) / minimum - 1.0)
    return max(0, int(pool // budget.cell_bytes))


# --- what the history ruled out -------------------------------------------------------------------


def layout_of(x: sglang.SglangSettings, *, context: bool = False) -> tuple[object, ...]:
    """What a run's memory evidence is bound to: parallelism, KV dtype and page size (and, with
    ``context``, the context length). A failure says nothing about settings of another layout."""
    layout = (x.tp_size, x.pp_size, x.kv_cache_dtype, x.page_size)
    return (*layout, x.context_length) if context else layout


def _same_layout(a: sglang.SglangSettings, b: sglang.SglangSettings) -> bool:
    return layout_of(a) == layout_of(b)


def _same_parallelism(a: sglang.SglangSettings, b: sglang.SglangSettings) -> bool:
    """The same weights per GPU: parallelism and page size, whatever the KV dtype."""
    return (a.tp_size, a.pp_size, a.page_size) == (b.tp_size, b.pp_size, b.page_size)


def is_ruled_out(candidate: sglang.SglangSettings, s: SglangSituation) -> bool:
    """Whether a failed run of the history rules ``candidate`` (effective) out: the same settings; a
    fraction at or below one that left no pool at start-up (with any KV dtype: the weights, not the cell,
    filled the share); a fraction at or above one that ran out of memory with no smaller prefill chunk and
    no fewer running requests (with the same KV dtype)."""
    eff = compute_effective(candidate, s.memory)
    for run in s.failed:
        failed = compute_effective(run.settings, s.memory)
        if failed == eff:
            return True
        # no pool at start-up: the weights filled the share, whatever the cell (an fp8 cache too)
        short = run.kind == "start_memory_short" and fraction_of(eff) <= fraction_of(failed) + 1e-9
        if short and _same_parallelism(failed, eff):
            return True
        if not _same_layout(failed, eff):
            continue
        if run.kind in ("start_oom", "runtime_oom") and _holds_more(eff, failed, s.memory):
            return True
    return False


def _holds_more(eff: sglang.SglangSettings, failed: sglang.SglangSettings, memory: SglangMemory) -> bool:
    """``eff`` needs at least the memory ``failed`` ran out of: no smaller fraction, prefill chunk or batch
    (``--max-running-requests``; unset: the decode CUDA graph's default batch)."""
    return (
        fraction_of(eff) >= fraction_of(failed) - 1e-9
        and (eff.chunked_prefill_size or 0) >= (failed.chunked_prefill_size or 0)
        and _batch(eff, memory) >= _batch(failed, memory)
    )


def _batch(settings: sglang.SglangSettings, memory: SglangMemory) -> int:
    return settings.max_running_requests or sglang.default_cuda_graph_max_bs(
        memory.gpu_mib, settings.tp_size or 1
    )


def pick(s: SglangSituation, proposal: SglangProposal) -> sglang.SglangSettings | None:
    """The first candidate that, clamped to the bounds, changes something and was not ruled out."""
    for candidate in proposal.candidates:
        settings = normalize(clamp(candidate, s), s)
        if compute_effective(settings, s.memory) == s.effective:
            continue
        if is_ruled_out(settings, s) or not would_start(settings, s):
            continue
        return settings
    return None


def would_start(settings: sglang.SglangSettings, s: SglangSituation) -> bool:
    """The pool the memory model predicts for ``settings`` meets the bar (:func:`holds_full_request`): one
    request of the context, or, where the current settings already run with a shorter pool, any pool at
    all (SGLang starts with one page; unknown: yes)."""
    eff = compute_effective(settings, s.memory)
    tokens = predict_pool_tokens(eff, s.memory)
    if tokens is None or eff.context_length is None:
        return True
    return tokens >= eff.context_length if holds_full_request(s) else tokens > 0


def holds_full_request(s: SglangSituation) -> bool:
    """Whether the bar is one request of the context: the current settings' pool holds one (by the memory
    model; unknown: yes), or holds nothing (they cannot run: a remedy must reach the bar). A service that
    already runs with a pool shorter than its context (SGLang's default context on a small GPU) keeps the
    bar at a pool SGLang starts with, so no rule is blocked by a bar the service never met."""
    tokens = predict_pool_tokens(s.effective, s.memory)
    context = s.effective.context_length
    return tokens is None or context is None or tokens >= context or tokens == 0


def compute_fraction_floor(s: SglangSituation) -> float | None:
    """The smallest fraction a rule may lower to: the pool holds one full-context request (or, where the
    current settings do not, one page); ``None`` when the model is not modelled."""
    if holds_full_request(s):
        return compute_fraction_for_context(s.effective, s.memory)
    budget = _budget(s.effective, s.memory)
    if budget is None:
        return None
    return ceil_grid(
        (budget.weight_bytes + budget.cell_bytes * (budget.settings.page_size or 1)) / budget.pre_load_bytes
    )


def clamp(settings: sglang.SglangSettings, s: SglangSituation) -> sglang.SglangSettings:
    """``settings`` within the bounds: running requests and context by :class:`TuningBounds`; the fraction
    at least ``min_gpu_memory_utilization`` (the seam's memory share) and at most the ceiling."""
    b = s.bounds
    running = engine_chain.clamp_sequences(settings.max_running_requests, b)
    context = engine_chain.clamp_context(settings.context_length, b)
    chunk = settings.chunked_prefill_size
    if chunk is not None:
        chunk = max(chunk, min(s.policy.batched_tokens_floor, s.effective.chunked_prefill_size or chunk))
    out = dataclasses.replace(
        settings, max_running_requests=running, context_length=context, chunked_prefill_size=chunk
    )
    fraction = out.mem_fraction_static
    if fraction is not None:
        top = min(
            b.max_gpu_memory_utilization, compute_fraction_ceiling(compute_effective(out, s.memory), s.memory)
        )
        out = dataclasses.replace(
            out, mem_fraction_static=round(min(max(fraction, b.min_gpu_memory_utilization), top), 3)
        )
    return out


def normalize(settings: sglang.SglangSettings, s: SglangSituation) -> sglang.SglangSettings:
    """Leave unset what the current settings leave unset, where SGLang's default is the candidate's value.
    A fraction SGLang would move with a new prefill chunk or batch (its default follows the reserve) stays
    written: a cut of the chunk after an OOM must not hand the freed activations to the pool."""
    return engine_chain.leave_defaults(settings, s.current, lambda x: compute_effective(x, s.memory))


def describe_change(before: sglang.SglangSettings, after: sglang.SglangSettings) -> str:
    """``--flag a -> b`` for every rendered field that differs (unset: SGLang's default)."""
    return engine_chain.describe_flag_change(before, after, sglang.FLAGS)


def describe_settings(settings: sglang.SglangSettings) -> str:
    """The flags as rendered, on one line (SGLang's defaults: the flags left out)."""
    return " ".join(sglang.build_sglang_args(settings)) or "SGLang's defaults"


def explain_pool(settings: sglang.SglangSettings, memory: SglangMemory) -> str | None:
    """One line: the pool the memory model predicts for ``settings`` (``None`` when not modelled)."""
    tokens = predict_pool_tokens(settings, memory)
    if tokens is None:
        return None
    pre = memory.gpu.total_bytes - CUDA_CONTEXT_GIB * GIB
    return (
        f"--mem-fraction-static {settings.mem_fraction_static} of {pre / GIB:.1f} GiB free before load: "
        f"{tokens} KV tokens"
    )
