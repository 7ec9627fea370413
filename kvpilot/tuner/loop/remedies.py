"""The retuning rules: given what went wrong (or right), which settings to try next.

Each rule is a small pure function from a :class:`Situation` to a :class:`Proposal`: the
trigger, the evidence in words, and *candidate* settings in order of preference. Rules
do not check bounds, failed settings, cooldowns or whether vLLM would start; the chain
in :mod:`kvpilot.tuner.loop.policy` filters candidates through those steps and picks the
first survivor. That keeps each rule a few lines of arithmetic with its own table test.

Rules, by trigger:

- ``CudaOOM``: grow the non-vLLM headroom ``1 - gpu_memory_utilization`` VPA-style (x1.2,
  at least +0.02, at most 0.05); when it repeats, also halve ``max_num_batched_tokens`` or
  cut ``max_num_seqs``.
- ``KvCacheTooSmall``: shorten ``max_model_len`` to what vLLM said fits, then fp8 KV.
- ``NoCacheBlocks``: raise ``gpu_memory_utilization`` a step, or halve the batched tokens.
- ``InsufficientFreeMemory``: lower ``gpu_memory_utilization`` under the free share vLLM saw.
- ``KvPressure``: fp8 KV if allowed, else fewer sequences (sized to capacity when lengths are known).
- ``IdleCapacity``: more sequences (+25 %, up to x2 with a deep queue), within KV capacity, under
  the anti-flap ceiling and bisecting towards any count that failed.
"""

from __future__ import annotations

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


# --- effective settings and capacity ------------------------------------------------------


def compute_effective(settings: EngineSettings, context: TuningContext) -> EngineSettings:
    """``settings`` with the release's defaults for the unset fields, on the service's GPU: what vLLM
    runs, and what the policy steps from (:func:`kvpilot.tuner.vllm.compute_effective_settings`)."""
    return vllm.compute_effective_settings(
        settings, context.gpu, vllm.parse_version(context.vllm_version), context.default_max_model_len
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
    so in the KV element size (fp8 halves it). Weights, activations and graphs are taken
    as unchanged: cutting batched tokens or sequences only frees memory, so this errs low.
    """
    base = situation.capacity_tokens
    cur = situation.effective
    budget = situation.budget
    if base is None:
        return None
    tokens = float(base)
    cur_gmu = cur.gpu_memory_utilization or 0.0
    new_gmu = candidate.gpu_memory_utilization or cur_gmu
    if new_gmu != cur_gmu:
        if budget.kv_bytes_per_token <= 0 or budget.gpu_total_gib <= 0:
            return None
        calibration = base / budget.kv_cache_tokens if budget.kv_cache_tokens else 1.0
        delta_bytes = (new_gmu - cur_gmu) * budget.gpu_total_gib * GIB
        tokens += calibration * delta_bytes / budget.kv_bytes_per_token
    if vllm.is_fp8(candidate.kv_cache_dtype) and not vllm.is_fp8(cur.kv_cache_dtype):
        tokens *= 2.0
    elif vllm.is_fp8(cur.kv_cache_dtype) and not vllm.is_fp8(candidate.kv_cache_dtype):
        tokens /= 2.0
    return max(tokens, 0.0)


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
    return None


def _for_cuda_oom(s: Situation, event: RestartEvent) -> Proposal:
    p, eff = s.policy, s.effective
    streak = history_mod.compute_recent_streak(s.history, RestartKind.CUDA_OOM, s.now - p.flap_guard_seconds)
    escalate = streak >= 1 or event.restart_count >= 2
    g1, g2, g3 = (lower_gmu(eff, k, p) for k in (1, 2, 3))
    seqs, batched = cut_seqs(eff, p), halve_batched(eff, p)
    order: tuple[EngineSettings, ...]
    if escalate:
        order = (
            _merge(g1, batched, "max_num_batched_tokens"),
            _merge(g1, seqs, "max_num_seqs"),
            _merge(g2, batched, "max_num_batched_tokens"),
            _merge(g2, seqs, "max_num_seqs"),
            g1,
            g2,
            g3,
            batched,
            seqs,
        )
    else:
        order = (g1, g2, g3, batched, seqs, _merge(g1, seqs, "max_num_seqs"))
    where = f" on {event.pod}" if event.pod else ""
    again = f" (restart {event.restart_count}, escalating)" if escalate else ""
    return Proposal(
        trigger=RestartKind.CUDA_OOM,
        evidence=f"CUDA OOM{where}{again}: {event.cause.detail}",
        candidates=order,
        crash=True,
        exhausted="no lower utilisation, batch or sequence limit is left within the bounds",
        infeasible_when_exhausted=True,
    )


def _for_kv_too_small(s: Situation, event: RestartEvent) -> Proposal:
    p, eff, cause = s.policy, s.effective, event.cause
    length = cause.max_model_len or eff.max_model_len
    fits = cause.estimated_max_model_len or s.capacity_tokens
    if fits and length and fits >= length:
        fits = None  # the plan said it fits and vLLM disagreed: the plan is no guide here
    candidates: list[EngineSettings] = []
    if fits:
        candidates.append(eff.replace(max_model_len=fit_context(fits, p)))
    elif length:
        candidates.append(eff.replace(max_model_len=fit_context(length / 2, p)))
    if s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        fp8 = eff.replace(kv_cache_dtype="fp8")
        candidates.append(fp8)
        if fits:
            candidates.append(fp8.replace(max_model_len=fit_context(2 * fits, p)))
    minimum = s.bounds.min_max_model_len
    would_fit = f"max-model-len <= {fit_context(fits, p)}" if fits else "a shorter max-model-len"
    hints = [would_fit]
    if not s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        hints.append("allowFp8KvCache (about twice the tokens) where the GPU supports it")
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
    """Sustained low KV usage while requests queue at the sequence limit: more sequences."""
    p, w, eff = s.policy, s.window, s.effective
    low = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v <= p.kv_usage_low)
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak_running = obs.compute_max(w.samples, obs.running) or 0.0
    seqs = eff.max_num_seqs or 1
    if low < p.sustain_fraction or queue < p.queue_min or peak_running < p.seqs_saturation * seqs:
        return None
    step = min(p.seqs_step_up_max, max(p.seqs_step_up, queue / max(peak_running, 1.0)))
    target = math.ceil(seqs * (1.0 + step))
    caps = [f"step +{step:.0%}"]
    fit = _fit_seqs(s)
    if fit is not None and fit < target:
        target, caps = fit, [f"KV capacity {s.capacity_tokens} tokens"]
    ceiling = history_mod.compute_pressure_ceiling(s.history, KV_PRESSURE, s.now - p.flap_guard_seconds)
    if ceiling is not None and ceiling - 1 < target:
        target, caps = ceiling - 1, [f"below {ceiling}, where KV pressure forced a cut"]
    failed_at = _failed_seqs_ceiling(s)
    if failed_at is not None and (seqs + failed_at) // 2 < target:
        # bisect between what runs and what failed, rather than creeping up one by one
        target, caps = (seqs + failed_at) // 2, [f"halfway to {failed_at}, which failed with these settings"]
    if target < seqs * (1.0 + p.min_seqs_raise):
        target = seqs
    raised = eff.replace(max_num_seqs=target)
    if raised.max_num_batched_tokens is not None and raised.max_num_batched_tokens < target:
        raised = raised.replace(max_num_batched_tokens=target)
    return Proposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"KV usage <= {p.kv_usage_low:.2f} in {low:.0%} of samples while {queue:.1f} requests wait "
            f"and {peak_running:.0f} of {seqs} sequences run (capped by {caps[0]})"
        ),
        candidates=(raised,) if target > seqs else (),
        exhausted="no more sequences fit (" + caps[0] + ")",
    )


def _failed_seqs_ceiling(s: Situation) -> int | None:
    """The fewest sequences that failed with everything else as now: raising to it or past it fails again."""
    mine = s.effective.replace(max_num_seqs=None, max_num_batched_tokens=None)
    seqs = [
        f.max_num_seqs
        for f in (s.effective_of(x) for x in s.failed)
        if f.max_num_seqs is not None
        and f.max_num_seqs > (s.effective.max_num_seqs or 0)
        and f.replace(max_num_seqs=None, max_num_batched_tokens=None) == mine
    ]
    return min(seqs) if seqs else None


def _fit_seqs(s: Situation) -> int | None:
    """Sequences of the observed mean length that fill the KV cache to ``target_kv_usage``."""
    length = s.window.mean_sequence_tokens
    if s.capacity_tokens is None or length is None:
        return None
    return max(1, math.floor(s.capacity_tokens * s.policy.target_kv_usage / length))
