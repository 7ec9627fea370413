"""The crash rules: which settings to try after vLLM stopped, from what its exit said.

One small pure function per :class:`~kvpilot.tuner.loop.observations.RestartKind` that engine arguments
can cure, from a :class:`~kvpilot.tuner.loop.remedies.Situation` to a
:class:`~kvpilot.tuner.loop.remedies.Proposal` (candidates in order of preference; the chain in
:mod:`kvpilot.tuner.loop.policy` filters them):

- ``CudaOOM``: from the OOM's evidence (failed allocation vs. headroom, start-up or under a batch):
  grow the non-vLLM headroom ``1 - gpu_memory_utilization`` VPA-style (x1.2, at least +0.02 and
  the shortfall, at most 0.05), or for a batch-shaped allocation cut ``max_num_seqs`` /
  ``max_num_batched_tokens`` (unless one utilisation step covers it and the KV cache still holds
  the sequences); when it repeats, utilisation and a batch cut together. At start-up a batch-shaped
  allocation is sized by ``max_num_seqs``: the cut is sized to the room it found at once, and no
  candidate keeps both the limit and the utilisation (fewer batched tokens alone would fail again).
  When the memory outside vLLM's budget follows the running batch (dcgm-exporter's fit, or the crash
  under a rising batch), utilisation and ``max_num_seqs`` are sized for the sequence limit
  (:func:`kvpilot.tuner.loop.gpu_memory.compute_limit_settings`), not one step.
- ``KvCacheTooSmall``: shorten ``max_model_len`` to what vLLM said fits, then fp8 KV; at the
  minimum context, fewer batched tokens, then just enough more utilisation.
- ``NoCacheBlocks``: raise ``gpu_memory_utilization`` a step, or halve the batched tokens.
- ``MambaCacheBlocks``: fewer sequences than the Mamba cache blocks vLLM found.
- ``InsufficientFreeMemory``: lower ``gpu_memory_utilization`` under the free share vLLM saw.

Host OOM kills and unknown crashes have no rule (``None``): the policy holds and says why.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import gpu_memory
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.observations import RestartEvent, RestartKind
from kvpilot.tuner.loop.remedies import (
    Proposal,
    Situation,
    ceil2,
    compute_oom_step,
    effective_value,
    fit_context,
    floor2,
    halve_batched,
    lower_gmu,
    predict_kv_tokens,
)
from kvpilot.tuner.types import GIB, EngineSettings


def calibrate_to_startup_error(situation: Situation, event: RestartEvent) -> Situation:
    """The situation as vLLM's "KV cache too small" text measured it: the capacity is its estimated
    maximum model length, and its "available KV cache memory (A GiB)" gives the bytes per token, so
    predictions for other settings scale from what vLLM saw rather than from a plan it just refuted."""
    cause = event.cause
    estimate = cause.estimated_max_model_len
    if not estimate:
        return situation
    budget = situation.budget
    if cause.available_kv_gib and cause.available_kv_gib > 0:
        budget = dataclasses.replace(
            budget,
            available_kv_cache_gib=cause.available_kv_gib,
            kv_cache_tokens=estimate,
            kv_bytes_per_token=max(1, int(cause.available_kv_gib * GIB / estimate)),
        )
    return dataclasses.replace(situation, budget=budget, capacity_tokens=estimate)


def propose_for_restart(situation: Situation, event: RestartEvent) -> Proposal | None:
    """The remedy for one crash of the current settings, or ``None`` if args cannot cure it."""
    kind = event.cause.kind
    if kind == RestartKind.CUDA_OOM:
        return _for_cuda_oom(situation, event)
    if kind == RestartKind.KV_CACHE_TOO_SMALL:
        return _for_kv_too_small(situation, event)
    if kind == RestartKind.NO_CACHE_BLOCKS:
        return _for_no_cache_blocks(situation, event)
    if kind == RestartKind.INSUFFICIENT_FREE_MEMORY:
        return _for_insufficient_free_memory(situation, event)
    if kind == RestartKind.MAMBA_CACHE_BLOCKS:
        return _for_mamba_cache_blocks(situation, event)
    return None


@dataclass(frozen=True, slots=True)
class OomEvidence:
    """What a CUDA OOM says about its cause (:func:`read_oom`)."""

    headroom_gib: float
    """``(1 - gpu_memory_utilization) x total``: the memory vLLM leaves to everything else."""
    shortfall_gib: float | None
    """How much more headroom the failed allocation needed: "Tried to allocate X" minus "of which F
    is free" (X alone when F is not printed); ``None`` when the text gives no size."""
    batch_shaped: bool
    """The failed allocation is at least ``oom_large_allocation`` of the headroom: one tensor sized by
    the batch, not the headroom filling up."""
    running: float | None
    """Requests running in the last sample of these settings before the crash; ``None`` = none
    served yet (the OOM came at start-up or warm-up: profile, CUDA-graph capture, sampler warm-up)."""
    big_batch: bool
    """The running batch was at the sequence limit (``seqs_saturation``)."""

    @property
    def at_startup(self) -> bool:
        return self.running is None


def read_oom(s: Situation, event: RestartEvent) -> OomEvidence:
    """The OOM's figures against the current settings and the window before it."""
    p, eff, cause = s.policy, s.effective, event.cause
    total = s.budget.gpu_total_gib or cause.total_gib or 0.0
    headroom = (1.0 - effective_value(eff.gpu_memory_utilization)) * total
    shortfall = None
    if cause.tried_gib is not None:
        shortfall = max(0.0, cause.tried_gib - (cause.free_gib or 0.0))
    batch_shaped = (
        cause.tried_gib is not None and headroom > 0 and cause.tried_gib >= p.oom_large_allocation * headroom
    )
    before = [x for x in s.window.samples if x.time <= event.time and x.running is not None and x.running > 0]
    running = max(before, key=lambda x: x.time).running if before else None
    seqs = eff.max_num_seqs or 1
    big = running is not None and running >= p.seqs_saturation * seqs
    return OomEvidence(headroom, shortfall, batch_shaped, running, big)


def compute_oom_cover(
    eff: EngineSettings, oom: OomEvidence, total_gib: float, policy: PolicyConfig, capped: bool = True
) -> float:
    """The utilisation whose extra headroom covers the OOM's shortfall with VPA's 20 % margin, VPA's
    step at least, ``max_gmu_step`` at most when ``capped``."""
    gmu = effective_value(eff.gpu_memory_utilization)
    step = compute_oom_step(gmu, policy)
    if oom.shortfall_gib is not None and total_gib > 0:
        step = max(step, oom.shortfall_gib * policy.oom_headroom_ratio / total_gib)
    return floor2(gmu - (min(step, policy.max_gmu_step) if capped else step))


def cut_seqs_for(eff: EngineSettings, oom: OomEvidence, tried_gib: float | None, policy: PolicyConfig) -> int:
    """Sequences after a CUDA OOM: the usual 25 % cut (from the running batch when it was at the
    limit), or for a batch-shaped allocation in proportion to the room it found (an allocation sized
    by the batch shrinks with it), with VPA's 20 % margin -- at most halving in one crash while serving
    (the batch that ran is a guess at what sized it; a repeat cuts again). At start-up the whole sized
    cut: nothing ran, the allocation that failed is sized by ``max_num_seqs`` itself (CUDA-graph capture,
    the sampler's warm-up), so the room it found sizes the limit, and a second start-up OOM would cost
    a whole restart more."""
    seqs = eff.max_num_seqs or 1
    base = min(float(seqs), oom.running) if oom.running is not None and oom.big_batch else float(seqs)
    target = math.floor(base * (1.0 - policy.seqs_step_down))
    sized = oom.batch_shaped and tried_gib and oom.shortfall_gib is not None
    if sized and tried_gib:
        room = max(tried_gib - (oom.shortfall_gib or 0.0), 0.0)
        target = min(target, math.floor(seqs * room / (tried_gib * policy.oom_headroom_ratio)))
        if oom.at_startup:
            return max(1, target)
    return max(1, target, seqs // 2)


def _for_cuda_oom(s: Situation, event: RestartEvent) -> Proposal:
    """Choose the remedy from the OOM's evidence (:class:`OomEvidence`):

    - the headroom filled up (a small allocation): more headroom, VPA-style, enough for the shortfall;
    - a batch-shaped allocation whose measured shortfall less utilisation covers while the KV cache
      there still holds every sequence at ``target_kv_usage``: that utilisation, even past
      ``max_gmu_step`` (utilisation traded for the sequences, which keep serving);
    - otherwise batch-shaped: cut what sizes it -- ``max_num_seqs`` at start-up/warm-up (CUDA graphs,
      the sampler) or under a batch at the limit, ``max_num_batched_tokens`` under a smaller batch.

    Repeats (the same settings OOMed twice, or the previous change was an OOM remedy) escalate:
    utilisation and a batch cut together.
    """
    p, eff = s.policy, s.effective
    oom = read_oom(s, event)
    total = s.budget.gpu_total_gib or event.cause.total_gib or 0.0
    streak = history_mod.compute_recent_streak(s.history, RestartKind.CUDA_OOM, s.now - p.flap_guard_seconds)
    escalate = streak >= 1 or event.restart_count >= 2
    # the trade: a measured shortfall covered by less utilisation -- past max_gmu_step, since the
    # evidence sizes the step -- while the KV cache there still holds every sequence at the target
    full = eff.replace(gpu_memory_utilization=compute_oom_cover(eff, oom, total, p, capped=False))
    trade = (
        oom.batch_shaped
        and oom.shortfall_gib is not None
        and effective_value(full.gpu_memory_utilization) >= s.bounds.min_gpu_memory_utilization
        and _keeps_sequences(s, full)
    )
    cover = full if trade else eff.replace(gpu_memory_utilization=compute_oom_cover(eff, oom, total, p))
    sized = _cover_the_limit(s, event, oom, cover, total)
    if sized is not None:
        cover = sized
    g2, g3 = lower_gmu(cover, 1, p), lower_gmu(cover, 2, p)
    seqs = eff.replace(max_num_seqs=cut_seqs_for(eff, oom, event.cause.tried_gib, p))
    batched = halve_batched(eff, p)
    seqs_first = oom.at_startup or oom.big_batch
    driver, other = (seqs, batched) if seqs_first else (batched, seqs)
    field, other_field = (
        ("max_num_seqs", "max_num_batched_tokens")
        if seqs_first
        else ("max_num_batched_tokens", "max_num_seqs")
    )
    how: str
    order: tuple[EngineSettings, ...]
    if oom.batch_shaped and not trade:
        how = f"a batch-shaped allocation: cut {field.replace('_', '-')}"
        order = (driver, _merge(driver, other, other_field), _merge(cover, driver, field), cover, g2, g3)
        if escalate:
            order = (
                _merge(cover, driver, field),
                _merge(_merge(cover, driver, field), other, other_field),
                *order,
            )
    else:
        how = "more headroom" + (
            " (traded for the sequences: the KV cache still holds them)" if oom.batch_shaped else ""
        )
        if sized is not None:
            how += " for the sequence limit (the memory outside vLLM's budget follows the batch)"
        if escalate:
            order = (
                _merge(cover, batched, "max_num_batched_tokens"),
                _merge(cover, seqs, "max_num_seqs"),
                _merge(g2, batched, "max_num_batched_tokens"),
                _merge(g2, seqs, "max_num_seqs"),
                cover,
                g2,
                g3,
                batched,
                seqs,
            )
        else:
            order = (cover, g2, g3, batched, seqs, _merge(cover, seqs, "max_num_seqs"))
    if oom.at_startup and oom.batch_shaped:
        order = tuple(c for c in order if not _retries_startup_allocation(eff, c))
    where = f" on {event.pod}" if event.pod else ""
    again = f" (restart {event.restart_count}, escalating)" if escalate else ""
    phase = "at start-up or warm-up" if oom.at_startup else f"under {oom.running:.0f} running"
    return Proposal(
        trigger=RestartKind.CUDA_OOM,
        evidence=(
            f"CUDA OOM{where}{again} {phase}, headroom {oom.headroom_gib:.1f} GiB: "
            f"{event.cause.detail}; {how}"
        ),
        candidates=order,
        crash=True,
        exhausted="no lower utilisation, batch or sequence limit is left within the bounds",
        infeasible_when_exhausted=True,
    )


def _retries_startup_allocation(eff: EngineSettings, candidate: EngineSettings) -> bool:
    """After a batch-shaped CUDA OOM at start-up, ``candidate`` keeps the sequence limit and asks no less
    utilisation: the allocation that failed outside vLLM's budget (CUDA-graph capture and the sampler's
    warm-up, sized by ``max_num_seqs``) would fail again in the same headroom. Fewer batched tokens do not
    help it: the profile run they size is measured inside the budget."""
    seqs = eff.max_num_seqs or 1
    same_seqs = (candidate.max_num_seqs or seqs) >= seqs
    gmu = effective_value(candidate.gpu_memory_utilization or eff.gpu_memory_utilization)
    return same_seqs and gmu >= effective_value(eff.gpu_memory_utilization)


def _cover_the_limit(
    s: Situation, event: RestartEvent, oom: OomEvidence, cover: EngineSettings, total: float
) -> EngineSettings | None:
    """When the memory outside vLLM's budget follows the running batch -- dcgm-exporter's free memory fell
    with it before the crash, or the crash came under a rising batch (:func:`gpu_memory.bound_growth_at`,
    the whole headroom per request) -- the utilisation and sequence limit that leave the floor free
    (:func:`gpu_memory.compute_limit_settings`) from ``cover`` down: one step more headroom would let the
    next pod run a few more and crash again."""
    growth = gpu_memory.fit_batch_growth(s.window.samples, before=event.time) or gpu_memory.bound_growth_at(
        s, event.time, oom.running, oom.headroom_gib, 0.0
    )
    if growth is None:
        return None
    sized = gpu_memory.compute_limit_settings(s, growth, total, effective_value(cover.gpu_memory_utilization))
    if sized is None:
        return None
    return cover.replace(gpu_memory_utilization=sized.gpu_memory_utilization, max_num_seqs=sized.max_num_seqs)


def _keeps_sequences(s: Situation, candidate: EngineSettings) -> bool:
    """The KV cache of ``candidate`` still holds ``max_num_seqs`` sequences of the observed length at
    ``target_kv_usage``. Without observed lengths (an OOM before anything was served), it keeps at least
    ``oom_trade_kv_floor`` of today's capacity. Unknown capacity: no."""
    tokens = predict_kv_tokens(s, s.effective_of(candidate))
    if tokens is None or s.capacity_tokens is None:
        return False
    length = s.window.compute_occupied_tokens(s.policy.output_occupancy)
    if length is None:
        return tokens >= s.policy.oom_trade_kv_floor * s.capacity_tokens
    return tokens * s.policy.target_kv_usage >= (s.effective.max_num_seqs or 1) * length


def _for_kv_too_small(s: Situation, event: RestartEvent) -> Proposal:
    """Shorten the context to what fits, then fp8 KV; where the context is at the user's minimum, free
    memory for the KV cache instead: fewer batched tokens (smaller profile activations, keeping the
    run-time headroom), then just enough more utilisation, then both."""
    p, eff, cause = s.policy, s.effective, event.cause
    length = cause.max_model_len or eff.max_model_len
    fits = cause.estimated_max_model_len or s.capacity_tokens
    if fits and length and fits >= length:
        fits = None  # the plan said it fits and vLLM disagreed: the plan is no guide here
    candidates: list[EngineSettings] = []
    shorter = eff
    if fits:
        shorter = eff.replace(max_model_len=fit_context(fits, p))
    elif length:
        shorter = eff.replace(max_model_len=fit_context(length / 2, p))
    candidates.append(shorter)
    if s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        fp8 = eff.replace(kv_cache_dtype="fp8")
        candidates.append(fp8)
        if fits:
            candidates.append(fp8.replace(max_model_len=fit_context(2 * fits, p)))
    # the context that survives the bounds (the minimum when the fit is below it): free memory for it
    needed_len = s.bounds.clamp(shorter).max_model_len or length
    fewer = [shorter.replace(max_num_batched_tokens=b) for b in _batched_halvings(eff, p)]
    candidates.extend(fewer)
    raised = _raise_gmu_to_fit(s, shorter, needed_len)
    if raised is not None:
        candidates.append(raised)
        candidates.extend(raised.replace(max_num_batched_tokens=f.max_num_batched_tokens) for f in fewer)
    minimum = s.bounds.min_max_model_len
    would_fit = f"max-model-len <= {fit_context(fits, p)}" if fits else "a shorter max-model-len"
    hints = [would_fit]
    if not s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        hints.append("allowFp8KvCache (about twice the tokens) where the GPU supports it")
    hints.append("a higher gpuMemoryUtilization bound")
    hints.append("more GPUs per replica (tensor parallel)")
    return Proposal(
        trigger=RestartKind.KV_CACHE_TOO_SMALL,
        evidence=(
            f"vLLM could not start: max-model-len {length} does not fit the KV cache"
            + (
                f" (estimated maximum model length is {cause.estimated_max_model_len})"
                if cause.estimated_max_model_len
                else ""
            )
        ),
        candidates=tuple(candidates),
        crash=True,
        exhausted=(f"nothing fits at or above the minimum context {minimum}" if minimum else "nothing fits")
        + "; would fit: "
        + ", or ".join(hints),
        infeasible_when_exhausted=True,
    )


def _batched_halvings(eff: EngineSettings, policy: PolicyConfig) -> list[int]:
    """``max_num_batched_tokens`` halved, then halved again, down to ``batched_tokens_floor``."""
    out: list[int] = []
    tokens = eff.max_num_batched_tokens or policy.batched_tokens_floor
    while tokens > policy.batched_tokens_floor:
        tokens = max(policy.batched_tokens_floor, tokens // 2)
        out.append(tokens)
    return out


def _raise_gmu_to_fit(s: Situation, base: EngineSettings, length: int | None) -> EngineSettings | None:
    """``base`` with the smallest utilisation (0.01 steps) whose KV cache holds one ``length`` request
    with ``context_margin`` to spare, from the capacity vLLM reported; ``None`` when unknown."""
    budget, gmu = s.budget, effective_value(s.effective.gpu_memory_utilization)
    if not length or s.capacity_tokens is None or budget.kv_bytes_per_token <= 0 or budget.gpu_total_gib <= 0:
        return None
    calibration = s.capacity_tokens / budget.kv_cache_tokens if budget.kv_cache_tokens else 1.0
    missing = length * (1.0 + s.policy.context_margin) - s.capacity_tokens
    if missing <= 0:
        return None
    delta = missing * budget.kv_bytes_per_token / (calibration * budget.gpu_total_gib * GIB)
    return base.replace(gpu_memory_utilization=ceil2(gmu + delta))


def _for_mamba_cache_blocks(s: Situation, event: RestartEvent) -> Proposal:
    """A hybrid model's state pool holds fewer sequences than ``max_num_seqs``: run that many (what vLLM
    says fits), or free memory for more blocks with a higher utilisation."""
    p, eff = s.policy, s.effective
    blocks = event.cause.cache_blocks or 1
    fits = eff.replace(max_num_seqs=max(1, min(blocks, (eff.max_num_seqs or blocks + 1) - 1)))
    gmu = effective_value(eff.gpu_memory_utilization)
    raised = eff.replace(gpu_memory_utilization=ceil2(gmu + p.max_gmu_step))
    return Proposal(
        trigger=RestartKind.MAMBA_CACHE_BLOCKS,
        evidence=f"vLLM could not capture CUDA graphs: max_num_seqs {eff.max_num_seqs} exceeds the "
        f"{blocks} Mamba cache blocks",
        candidates=(fits, raised),
        crash=True,
        exhausted="the state pool holds fewer sequences than the bounds allow; would fit: a lower "
        "max_num_seqs, a higher gpuMemoryUtilization bound or more GPUs per replica",
        infeasible_when_exhausted=True,
    )


def _for_no_cache_blocks(s: Situation, event: RestartEvent) -> Proposal:
    p, eff = s.policy, s.effective
    gmu = effective_value(eff.gpu_memory_utilization)
    raised = eff.replace(gpu_memory_utilization=ceil2(gmu + p.max_gmu_step))
    batched = halve_batched(eff, p)
    return Proposal(
        trigger=RestartKind.NO_CACHE_BLOCKS,
        evidence="vLLM could not start: no available memory for the cache blocks",
        candidates=(raised, batched, _merge(raised, batched, "max_num_batched_tokens")),
        crash=True,
        exhausted="weights and activations leave no room for a KV cache within the bounds; "
        "would fit: more GPUs per replica, quantized weights, or a higher gpuMemoryUtilization bound",
        infeasible_when_exhausted=True,
    )


def _for_insufficient_free_memory(s: Situation, event: RestartEvent) -> Proposal:
    p, eff, cause = s.policy, s.effective, event.cause
    candidates: list[EngineSettings] = []
    if cause.free_gib is not None and cause.total_gib:
        candidates.append(eff.replace(gpu_memory_utilization=floor2(cause.free_gib / cause.total_gib - 0.01)))
    candidates.extend(lower_gmu(eff, k, p) for k in (1, 2, 3))
    return Proposal(
        trigger=RestartKind.INSUFFICIENT_FREE_MEMORY,
        evidence=f"vLLM could not start: less free GPU memory than requested ({event.cause.detail})",
        candidates=tuple(candidates),
        crash=True,
        exhausted="another process holds GPU memory; no utilisation within the bounds fits",
        infeasible_when_exhausted=True,
    )


def _merge(base: EngineSettings, other: EngineSettings, field: str) -> EngineSettings:
    return base.replace(**{field: getattr(other, field)})
