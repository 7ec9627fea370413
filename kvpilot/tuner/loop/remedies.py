"""The retuning rules: given what went wrong (or right), which settings to try next.

Each rule is a small pure function from a :class:`Situation` to a :class:`Proposal`: the
trigger, the evidence in words, and *candidate* settings in order of preference. Rules
do not check bounds, failed settings, cooldowns or whether vLLM would start; the chain
in :mod:`kvpilot.tuner.loop.policy` filters candidates through those steps and picks the
first survivor. That keeps each rule a few lines of arithmetic with its own table test.

Rules, by trigger:

- ``CudaOOM``: from the OOM's evidence (failed allocation vs. headroom, start-up or under a batch):
  grow the non-vLLM headroom ``1 - gpu_memory_utilization`` VPA-style (x1.2, at least +0.02 and
  the shortfall, at most 0.05), or for a batch-shaped allocation cut ``max_num_seqs`` /
  ``max_num_batched_tokens`` (unless one utilisation step covers it and the KV cache still holds
  the sequences); when it repeats, utilisation and a batch cut together.
- ``KvCacheTooSmall``: shorten ``max_model_len`` to what vLLM said fits, then fp8 KV; at the
  minimum context, fewer batched tokens, then just enough more utilisation.
- ``NoCacheBlocks``: raise ``gpu_memory_utilization`` a step, or halve the batched tokens.
- ``InsufficientFreeMemory``: lower ``gpu_memory_utilization`` under the free share vLLM saw.
- ``KvPressure``: fp8 KV if allowed, else fewer sequences (sized to capacity when lengths are known).
- ``IdleCapacity``: a queue at the sequence limit with room in the KV cache (usage <= 0.50, or the
  window's lengths and usage say more fit at 0.80): more sequences (+25 %, up to x2 with a deep
  queue), within that room, under the anti-flap ceiling (lifted when the window shows room for it)
  and bisecting towards any count that failed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.history import HistoryEntry
from kvpilot.tuner.loop.observations import ObservationWindow, RestartEvent, RestartKind
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget

KV_PRESSURE = "KvPressure"
IDLE_CAPACITY = "IdleCapacity"


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything a rule may look at, already reduced to the current settings' evidence."""

    current: EngineSettings
    """Settings on the Deployment now, as written (``None`` = vLLM's default)."""
    effective: EngineSettings
    """``current`` as vLLM runs it: every field set (:func:`compute_effective`)."""
    budget: MemoryBudget
    window: ObservationWindow
    """Samples since the last change only."""
    context: TuningContext
    history: tuple[HistoryEntry, ...]
    now: float
    capacity_tokens: int | None
    """KV tokens the current settings hold: vLLM's report when there is one, else the plan's."""
    failed: tuple[EngineSettings, ...] = ()
    """Settings that crashed or failed to roll out (``status.failedSettings``)."""

    @property
    def bounds(self) -> TuningBounds:
        return self.context.bounds

    @property
    def policy(self) -> PolicyConfig:
        return self.context.policy

    def effective_of(self, settings: EngineSettings) -> EngineSettings:
        """``settings`` as vLLM would run them on this service's GPU."""
        return compute_effective(settings, self.context)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A rule's answer: try these settings, in this order, because of this."""

    trigger: str
    evidence: str
    candidates: tuple[EngineSettings, ...]
    crash: bool = False
    """A crash remedy: skips the metrics cooldown, and the current settings are marked failed."""
    exhausted: str = ""
    """What to say when no candidate survives the filters."""
    infeasible_when_exhausted: bool = False
    """No survivor means the service cannot run within the bounds (else: hold)."""
    urgent: bool = False
    """Ahead of a crash (e.g. GPU memory running out): skips the metrics cooldown like a crash remedy,
    but the current settings are not marked failed."""


# --- effective settings and capacity ------------------------------------------------------


def compute_effective(settings: EngineSettings, context: TuningContext) -> EngineSettings:
    """``settings`` with the release's defaults for the unset fields, on the service's GPU: what vLLM
    runs, and what the policy steps from (:func:`kvpilot.tuner.vllm.compute_effective_settings`)."""
    return vllm.compute_effective_settings(
        settings,
        context.gpu,
        vllm.parse_version(context.vllm_version),
        context.default_max_model_len,
        mm_prefix_item_tokens=context.mm_prefix_item_tokens,
    )


def compute_capacity_tokens(
    effective: EngineSettings, budget: MemoryBudget, window: ObservationWindow, observed_kv_tokens: int | None
) -> int | None:
    """KV tokens of the running settings: vLLM's own report beats the plan (calibration).

    The window's report counts only if ``vllm:cache_config_info`` was for these settings
    (same utilisation and dtype); ``observed_kv_tokens`` is the figure kept in
    ``status.calibration`` from an earlier window of the same settings.
    """
    reported = window.kv_capacity_tokens
    if reported and report_matches(effective, window):
        return reported
    if observed_kv_tokens:
        return observed_kv_tokens
    return budget.kv_cache_tokens or None


def report_matches(effective: EngineSettings, window: ObservationWindow) -> bool:
    gmu = window.reported_gpu_memory_utilization
    cur = effective.gpu_memory_utilization
    if gmu is not None and cur is not None and abs(gmu - cur) > 1e-6:
        return False
    dtype = window.reported_kv_cache_dtype
    return dtype is None or dtype == (effective.kv_cache_dtype or "auto")


def predict_kv_tokens(situation: Situation, candidate: EngineSettings) -> float | None:
    """KV tokens ``candidate`` would hold, scaled from the current capacity. ``None``: unknown.

    Linear in the memory handed to vLLM (``gpu_memory_utilization x total``) and inversely
    so in the KV element size (fp8 halves it). A cut of ``max_num_batched_tokens`` frees
    ``activation_batched_share`` of the planned activation peak in proportion; weights,
    graphs and the sampler are taken as unchanged, so this errs low.
    """
    base = situation.capacity_tokens
    cur = situation.effective
    budget = situation.budget
    if base is None:
        return None
    tokens = float(base)
    calibration = base / budget.kv_cache_tokens if budget.kv_cache_tokens else 1.0
    cur_gmu = cur.gpu_memory_utilization or 0.0
    new_gmu = candidate.gpu_memory_utilization or cur_gmu
    freed_bytes = 0.0
    if new_gmu != cur_gmu:
        if budget.kv_bytes_per_token <= 0 or budget.gpu_total_gib <= 0:
            return None
        freed_bytes += (new_gmu - cur_gmu) * budget.gpu_total_gib * GIB
    cur_batched, new_batched = cur.max_num_batched_tokens, candidate.max_num_batched_tokens
    if cur_batched and new_batched and new_batched < cur_batched and budget.kv_bytes_per_token > 0:
        share = situation.policy.activation_batched_share * (1.0 - new_batched / cur_batched)
        freed_bytes += share * budget.activation_gib * GIB
    if freed_bytes:
        tokens += calibration * freed_bytes / budget.kv_bytes_per_token
    if vllm.is_fp8(candidate.kv_cache_dtype) and not vllm.is_fp8(cur.kv_cache_dtype):
        tokens *= 2.0
    elif vllm.is_fp8(cur.kv_cache_dtype) and not vllm.is_fp8(candidate.kv_cache_dtype):
        tokens /= 2.0
    return max(tokens, 0.0)


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


# --- single moves ----------------------------------------------------------------------------


def _set(value: float | None) -> float:
    """A field of effective settings (always set; ``None`` only from a caller's bug)."""
    if value is None:
        raise AssertionError("effective settings have every field set")
    return value


def floor2(value: float) -> float:
    """Round down to two decimals (``gpu_memory_utilization`` granularity)."""
    return math.floor(value * 100 + 1e-9) / 100


def ceil2(value: float) -> float:
    return math.ceil(value * 100 - 1e-9) / 100


def compute_oom_step(gmu: float, policy: PolicyConfig) -> float:
    """How far one CUDA OOM lowers ``gpu_memory_utilization``: VPA's OOM bump on the headroom."""
    headroom = 1.0 - gmu
    grown = max(headroom * policy.oom_headroom_ratio, headroom + policy.oom_min_step)
    return min(grown - headroom, policy.max_gmu_step)


def lower_gmu(eff: EngineSettings, steps: int, policy: PolicyConfig) -> EngineSettings:
    gmu = _set(eff.gpu_memory_utilization)
    for _ in range(steps):
        gmu = floor2(gmu - compute_oom_step(gmu, policy))
    return eff.replace(gpu_memory_utilization=gmu)


def cut_seqs(eff: EngineSettings, policy: PolicyConfig) -> EngineSettings:
    seqs = eff.max_num_seqs or 1
    return eff.replace(max_num_seqs=max(1, math.floor(seqs * (1.0 - policy.seqs_step_down))))


def halve_batched(eff: EngineSettings, policy: PolicyConfig) -> EngineSettings:
    tokens = eff.max_num_batched_tokens or policy.batched_tokens_floor
    return eff.replace(max_num_batched_tokens=max(policy.batched_tokens_floor, tokens // 2))


def fit_context(tokens: float, policy: PolicyConfig) -> int:
    """The longest ``max_model_len`` to ask for when ``tokens`` fit, with margin and rounding."""
    usable = tokens * (1.0 - policy.context_margin)
    multiple = policy.context_multiple if usable >= 4 * policy.context_multiple else 16
    return int(usable // multiple) * multiple


# --- crash rules ------------------------------------------------------------------------------


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
    headroom = (1.0 - _set(eff.gpu_memory_utilization)) * total
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
    gmu = _set(eff.gpu_memory_utilization)
    step = compute_oom_step(gmu, policy)
    if oom.shortfall_gib is not None and total_gib > 0:
        step = max(step, oom.shortfall_gib * policy.oom_headroom_ratio / total_gib)
    return floor2(gmu - (min(step, policy.max_gmu_step) if capped else step))


def cut_seqs_for(eff: EngineSettings, oom: OomEvidence, tried_gib: float | None, policy: PolicyConfig) -> int:
    """Sequences after a CUDA OOM: the usual 25 % cut (from the running batch when it was at the
    limit), or for a batch-shaped allocation in proportion to the room it found (an allocation sized
    by the batch shrinks with it), with VPA's 20 % margin -- at most halving in one crash; a repeat
    cuts again."""
    seqs = eff.max_num_seqs or 1
    base = min(float(seqs), oom.running) if oom.running is not None and oom.big_batch else float(seqs)
    target = math.floor(base * (1.0 - policy.seqs_step_down))
    if oom.batch_shaped and tried_gib and oom.shortfall_gib is not None:
        room = max(tried_gib - oom.shortfall_gib, 0.0)
        target = min(target, math.floor(seqs * room / (tried_gib * policy.oom_headroom_ratio)))
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
        and _set(full.gpu_memory_utilization) >= s.bounds.min_gpu_memory_utilization
        and _keeps_sequences(s, full)
    )
    cover = full if trade else eff.replace(gpu_memory_utilization=compute_oom_cover(eff, oom, total, p))
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
            order = (_merge(cover, driver, field), _merge(_merge(cover, driver, field), other, other_field),
                     *order)  # fmt: skip
    else:
        how = "more headroom" + (" (traded for the sequences: the KV cache still holds them)"
                                 if oom.batch_shaped else "")  # fmt: skip
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


def _keeps_sequences(s: Situation, candidate: EngineSettings) -> bool:
    """The KV cache of ``candidate`` still holds ``max_num_seqs`` sequences of the observed length at
    ``target_kv_usage``. Without observed lengths (an OOM before anything was served), it may lose at
    most the margin that sizing leaves, ``1 - target_kv_usage`` of today's capacity. Unknown capacity: no."""
    tokens = predict_kv_tokens(s, s.effective_of(candidate))
    if tokens is None or s.capacity_tokens is None:
        return False
    length = s.window.compute_occupied_tokens(s.policy.output_occupancy)
    if length is None:
        return tokens >= s.policy.target_kv_usage * s.capacity_tokens
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
    budget, gmu = s.budget, _set(s.effective.gpu_memory_utilization)
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
    gmu = _set(eff.gpu_memory_utilization)
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
    gmu = _set(eff.gpu_memory_utilization)
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


# --- metrics rules ----------------------------------------------------------------------------


def propose_for_pressure(s: Situation) -> Proposal | None:
    """Sustained high KV usage *with* preemptions: fp8 KV if allowed, else fewer sequences."""
    p, w, eff = s.policy, s.window, s.effective
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
    if high < p.sustain_fraction or rate < p.preemption_rate_high:
        return None
    candidates: list[EngineSettings] = []
    if s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        candidates.append(eff.replace(kv_cache_dtype="fp8"))
    seqs = eff.max_num_seqs or 1
    peak_running = obs.compute_max(w.samples, obs.running)
    base = min(seqs, math.ceil(peak_running)) if peak_running else seqs
    floor_step = math.floor(base * (1.0 - p.seqs_step_down))
    target = floor_step
    fit = _fit_seqs(s)
    if fit is not None and fit < base:
        target = max(fit, floor_step)
    candidates.append(eff.replace(max_num_seqs=max(1, min(target, base - 1))))
    return Proposal(
        trigger=KV_PRESSURE,
        evidence=(
            f"KV usage >= {p.kv_usage_high:.2f} in {high:.0%} of samples with "
            f"{rate:.2f} preemptions/s (peak running {peak_running or 0:.0f})"
        ),
        candidates=tuple(candidates),
        exhausted="already at the lower bound of maxNumSeqs",
    )


def propose_for_idle(s: Situation) -> Proposal | None:
    """Requests queue at the sequence limit and the KV cache has room: more sequences.

    Room is either sustained KV usage <= ``kv_usage_low`` (raise by the step, capped by what fits when
    that is known) or, inside the hysteresis band, what the window shows fits at ``target_kv_usage``
    (:func:`compute_room_seqs`): without such evidence the band holds.
    """
    p, w, eff = s.policy, s.window, s.effective
    low = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v <= p.kv_usage_low)
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak_running = obs.compute_max(w.samples, obs.running) or 0.0
    seqs = eff.max_num_seqs or 1
    if queue < p.queue_min or peak_running < p.seqs_saturation * seqs:
        return None
    room = compute_room_seqs(s)
    idle = low >= p.sustain_fraction
    if not idle and (room is None or room < seqs * (1.0 + p.min_seqs_raise)):
        return None  # inside the band and no evidence that more sequences fit: hysteresis
    step = min(p.seqs_step_up_max, max(p.seqs_step_up, queue / max(peak_running, 1.0)))
    target = math.ceil(seqs * (1.0 + step))
    caps = [f"step +{step:.0%}"]
    if room is not None and room < target:
        target, caps = room, [f"KV room at {p.target_kv_usage:.2f} usage ({s.capacity_tokens} tokens)"]
    ceiling = history_mod.compute_pressure_ceiling(s.history, KV_PRESSURE, s.now - p.flap_guard_seconds)
    lifted = ceiling is not None and room is not None and _usage_room(s) is not None and room >= ceiling
    if ceiling is not None and not lifted and ceiling - 1 < target:
        target, caps = ceiling - 1, [f"below {ceiling}, where KV pressure forced a cut"]
    failed_at = _failed_seqs_ceiling(s, eff)
    trade = None
    if failed_at is not None and (seqs + failed_at) // 2 < target:
        trade = _trade_headroom_for(s, target)
        # bisect between what runs and what failed, rather than creeping up one by one
        target, caps = (seqs + failed_at) // 2, [f"halfway to {failed_at}, which failed with these settings"]
    if target < seqs * (1.0 + p.min_seqs_raise):
        target = seqs
    raised = _with_seqs(eff, target)
    candidates: tuple[EngineSettings, ...] = (raised,) if target > seqs else ()
    if trade is not None:
        candidates = (trade, *candidates)
        gmu = trade.gpu_memory_utilization
        caps.append(f"or {trade.max_num_seqs} at utilisation {gmu} (headroom traded)")
    mean_kv = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    where = (
        f"KV usage <= {p.kv_usage_low:.2f} in {low:.0%} of samples"
        if idle
        else f"mean KV usage {mean_kv:.2f} with room for {room} sequences at {p.target_kv_usage:.2f}"
    )
    lift = f"; the cut below {ceiling} is lifted: the window shows room for it" if lifted else ""
    return Proposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"{where} while {queue:.1f} requests wait and {peak_running:.0f} of {seqs} sequences run "
            f"(capped by {'; '.join(caps)}){lift}"
        ),
        candidates=candidates,
        exhausted="no more sequences fit (" + caps[0] + ")",
    )


def compute_room_seqs(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences the KV cache holds at ``target_kv_usage``: the fewer of what the observed lengths say
    (:func:`_fit_seqs`) and what the observed usage per running sequence says; ``None`` if neither.
    ``scale``: for a cache that many times the current one (a candidate's predicted tokens over today's)."""
    known = [x for x in (_fit_seqs(s, scale), _usage_room(s, scale)) if x is not None]
    return min(known) if known else None


def _usage_room(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences at ``target_kv_usage`` by the window's mean KV usage per running sequence."""
    mean_kv = obs.compute_mean(s.window.samples, obs.kv_usage)
    mean_running = obs.compute_mean(s.window.samples, obs.running)
    if not mean_kv or not mean_running or mean_kv <= 0 or mean_running < 1:
        return None
    return max(1, math.floor(s.policy.target_kv_usage * mean_running / mean_kv * scale))


def _failed_seqs_ceiling(s: Situation, settings: EngineSettings) -> int | None:
    """The fewest sequences above ``settings``' that failed with everything else as in ``settings``
    (effective): raising to it or past it fails again."""
    mine = settings.replace(max_num_seqs=None, max_num_batched_tokens=None)
    seqs = [
        f.max_num_seqs
        for f in (s.effective_of(x) for x in s.failed)
        if f.max_num_seqs is not None
        and f.max_num_seqs > (settings.max_num_seqs or 0)
        and f.replace(max_num_seqs=None, max_num_batched_tokens=None) == mine
    ]
    return min(seqs) if seqs else None


def _with_seqs(settings: EngineSettings, seqs: int) -> EngineSettings:
    raised = settings.replace(max_num_seqs=seqs)
    if raised.max_num_batched_tokens is not None and raised.max_num_batched_tokens < seqs:
        raised = raised.replace(max_num_batched_tokens=seqs)
    return raised


def _trade_headroom_for(s: Situation, target: int) -> EngineSettings | None:
    """``target`` sequences at one OOM step less utilisation, when a raise to ``target`` failed at the
    current one: the failure of more sequences is most often memory outside vLLM's budget (CUDA graphs
    and the sampler grow with them), which the step gives back. Only while the KV cache at the lower
    utilisation still holds ``target`` sequences of the observed length at ``target_kv_usage``, and
    below any count that failed at that utilisation. ``None`` when not worth trying."""
    p, eff = s.policy, s.effective
    lower = lower_gmu(eff, 1, p)
    failed_there = _failed_seqs_ceiling(s, lower)
    if failed_there is not None and failed_there <= target:
        return None
    length = s.window.compute_occupied_tokens(p.output_occupancy)
    tokens = predict_kv_tokens(s, lower)
    if length is None or tokens is None or tokens * p.target_kv_usage < target * length:
        return None
    return _with_seqs(lower, target)


def _fit_seqs(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences of the observed mean occupancy (prompt + ``output_occupancy`` x output) that fill the
    KV cache to ``target_kv_usage``."""
    length = s.window.compute_occupied_tokens(s.policy.output_occupancy)
    if s.capacity_tokens is None or length is None:
        return None
    return max(1, math.floor(s.capacity_tokens * scale * s.policy.target_kv_usage / length))
