"""The KV-bound rule: requests wait while vLLM runs fewer sequences than it may, because the KV cache is
full. More sequences cannot help (the scheduler would not admit them) and fewer only trade preemptions for
queueing; what helps is a larger KV cache. Pure.

vLLM V1's scheduler admits a waiting request only when the KV cache has blocks for it
(``vllm/v1/core/sched/scheduler.py``: ``kv_cache_manager.allocate_slots`` returns ``None`` and the request
stays waiting), and preempts a running one when a decode step finds no free block. So the signature is:

* a queue (mean waiting >= ``queue_min``),
* fewer running than ``max_num_seqs`` (peak running < ``seqs_saturation`` x the limit: the limit is not
  what holds them back),
* the KV cache full (mean usage >= ``target_kv_usage``) or preempting (>= ``preemption_rate_high``).

Candidates, each only when it is predicted (:func:`remedies.predict_kv_tokens`) to grow the KV cache by at
least ``kv_bound_min_gain``:

1. fp8 KV, when the bounds allow it (twice the tokens);
2. more ``gpu_memory_utilization`` *and* half the batched tokens, in one rollout;
3. more ``gpu_memory_utilization``: only with dcgm-exporter's telemetry, by what the fullest GPU has free
   over the whole window beyond twice the early-warning floor (:mod:`kvpilot.tuner.loop.slo` acts at the
   floor), at most ``max_gmu_step``, and never up to a utilisation that crashed (the history's CUDA OOMs,
   the failed settings): memory vLLM does not budget for is what the margin is for, and without telemetry
   the loop does not guess;
4. half the batched tokens (down to ``batched_tokens_floor``, and not below the mean prompt while the chunk
   still holds it whole: a shorter chunk frees activation memory for KV, while prompts longer than the chunk
   take more steps to prefill; prompts already longer than the chunk are chunked either way, and a
   smaller chunk prefills them in more, cheaper steps at the same attention work).

The trade (:mod:`kvpilot.tuner.loop.trade`) counts the queue the larger cache would admit as the gain.

The same growth serves two other rules: under KV pressure it comes before the cut of ``max_num_seqs``
(:func:`with_growth`), and a queue *at* the sequence limit whose room at ``target_kv_usage`` is spent
gets a larger cache and the sequences it holds (:func:`propose_growth_for_idle`).
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import gpu_memory, remedies
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.history import HistoryAction
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.remedies import Proposal, Situation, floor2
from kvpilot.tuner.types import EngineSettings

KV_BOUND = "KvBound"


def propose_for_kv_bound(s: Situation) -> Proposal | None:
    """A larger KV cache when the window shows requests held back by it (module docstring)."""
    p, w, eff = s.policy, s.window, s.effective
    seqs = eff.max_num_seqs or 1
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak_running = obs.compute_max(w.samples, obs.running) or 0.0
    usage = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
    if queue < p.queue_min or peak_running >= p.seqs_saturation * s.admission_limit:
        return None  # the admission limit (--max-num-active-seqs when given) holds the queue, not the cache
    if usage < p.target_kv_usage and rate < p.preemption_rate_high:
        return None
    grown, notes = compute_growth(s, fp8=True)
    if not grown:
        return None
    preempting = f", {rate:.2f} preemptions/s" if rate >= p.preemption_rate_high else ""
    return Proposal(
        trigger=KV_BOUND,
        evidence=(
            f"{queue:.1f} requests wait while {peak_running:.0f} of {seqs} sequences run with KV usage "
            f"{usage:.2f}{preempting}: the KV cache ({s.capacity_tokens} tokens) holds them back"
            + (f" ({notes})" if notes else "")
        ),
        candidates=tuple(grown),
        exhausted="no larger KV cache within the bounds",
    )


def compute_growth(s: Situation, *, fp8: bool) -> tuple[list[EngineSettings], str]:
    """The candidates that grow the KV cache by at least ``kv_bound_min_gain`` (module docstring's 1-4;
    ``fp8=False`` leaves out the first), and why a utilisation raise is not among them."""
    p, eff = s.policy, s.effective
    base = remedies.predict_kv_tokens(s, eff)
    if not base:
        return [], ""
    candidates: list[EngineSettings] = []
    if fp8 and s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        candidates.append(eff.replace(kv_cache_dtype="fp8"))
    raised, why = _raise_gmu(s)
    halved = _halve_batched(s)
    if raised is not None and halved is not None:
        candidates.append(raised.replace(max_num_batched_tokens=halved.max_num_batched_tokens))
    candidates.extend(c for c in (raised, halved) if c is not None)
    grown = [
        c for c in candidates if (remedies.predict_kv_tokens(s, c) or 0.0) >= base * (1 + p.kv_bound_min_gain)
    ]
    return grown, why


def with_growth(s: Situation, pressure: Proposal) -> Proposal:
    """A KV-pressure proposal (fp8 if allowed, then fewer sequences, last) with a larger KV cache tried
    before the cut: fewer sequences give up throughput that more blocks keep (two of 40k tokens against
    one)."""
    grown, _ = compute_growth(s, fp8=False)
    if not grown:
        return pressure
    *first, cut = pressure.candidates
    return dataclasses.replace(pressure, candidates=(*first, *(_fitted(s, g) for g in grown), cut))


def _fitted(s: Situation, grown: EngineSettings) -> EngineSettings:
    """``grown`` with ``max_num_seqs`` cut to what its larger cache holds below ``kv_usage_high`` (where
    pressure starts) by the observed lengths, when that is fewer: a larger cache that still cannot hold the
    limit keeps preempting (vLLM admits up to the limit whatever the cache holds), so the growth and the cut
    go in one rollout rather than two. At most ``seqs_step_down`` below the peak running batch, as the
    pressure rule's own cut (:func:`remedies.propose_for_pressure`)."""
    p, w = s.policy, s.window
    seqs = grown.max_num_seqs or 1
    length = w.compute_occupied_tokens(p.output_occupancy)
    tokens = remedies.predict_kv_tokens(s, grown)
    peak_running = obs.compute_max(w.samples, obs.running)
    if length is None or not tokens or not peak_running:
        return grown
    fit = max(1, math.floor(tokens * p.kv_usage_high / length))
    floor_step = math.floor(min(seqs, math.ceil(peak_running)) * (1.0 - p.seqs_step_down))
    target = max(fit, floor_step, 1)
    return grown.replace(max_num_seqs=target) if target < seqs else grown


def _raise_gmu(s: Situation) -> tuple[EngineSettings | None, str]:
    """One utilisation step up into memory dcgm-exporter shows free all window, or why not."""
    p, eff = s.policy, s.effective
    gmu = eff.gpu_memory_utilization or 0.0
    frees = obs.values_of(s.window.samples, obs.gpu_memory_free_gib)
    total = gpu_memory.compute_device_total(s.window.samples)
    if not frees or total is None:
        return None, "no GPU memory telemetry to raise gpuMemoryUtilization on"
    floor = gpu_memory.compute_free_floor(p, total)
    spare = min(frees) - 2.0 * floor
    step = min(p.max_gmu_step, floor2(spare / total)) if total > 0 else 0.0
    if step < 0.01:
        return (
            None,
            f"the GPU has {min(frees):.2f} GiB free at its fullest: no room to raise gpuMemoryUtilization",
        )
    target = floor2(gmu + step)
    crashed = _lowest_crashed_gmu(s)
    if crashed is not None and target >= crashed:
        target = floor2(crashed - 0.01)
        if target <= gmu:
            return None, f"gpuMemoryUtilization {crashed} crashed before"
    return eff.replace(gpu_memory_utilization=target), ""


def _lowest_crashed_gmu(s: Situation) -> float | None:
    """The lowest utilisation the history shows crashing for memory (a CUDA OOM, or too little free memory
    at start-up) that a crash remedy moved away from, or any a rollback left (conservatively, whatever
    failed). A start-up "KV cache too small" does not count: more utilisation is its cure."""
    causes = (RestartKind.CUDA_OOM, RestartKind.INSUFFICIENT_FREE_MEMORY)
    seen = [
        gmu
        for e in s.history
        if (e.action == HistoryAction.RETUNED and e.trigger in causes)
        or e.action == HistoryAction.ROLLED_BACK
        for gmu in (s.effective_of(e.from_settings).gpu_memory_utilization,)
        if gmu is not None
    ]
    return min(seen) if seen else None


def _halve_batched(s: Situation) -> EngineSettings | None:
    p, eff = s.policy, s.effective
    tokens = eff.max_num_batched_tokens
    if tokens is None:
        return None
    half = max(p.batched_tokens_floor, tokens // 2, eff.max_num_seqs or 1)
    prompt = s.window.prompt_tokens.mean if s.window.prompt_tokens else 0.0
    if half >= tokens or (half < math.ceil(prompt) <= tokens):
        return None  # a chunk that holds the mean prompt whole is not split: each would take two steps
    return eff.replace(max_num_batched_tokens=half)


def propose_growth_for_idle(s: Situation) -> Proposal | None:
    """A queue at the sequence limit with no room left at ``target_kv_usage``: a larger KV cache and the
    sequences it holds there, in one rollout.

    :func:`remedies.propose_for_idle` raises the limit up to the room the window shows; once the cache is
    at its target usage that room is spent and the band holds. The same growth as the KV-bound rule's
    (:func:`compute_growth`: fp8 KV if allowed, more utilisation into memory dcgm-exporter shows free,
    half the batched tokens) then makes room, and the limit goes up to what the larger cache holds at
    ``target_kv_usage`` (the fewer of the observed lengths' and the observed usage's figure), by at least
    :func:`remedies.compute_min_raise` (``flap_min_raise`` after a KV-pressure cut), below a limit KV
    pressure cut from within ``flap_guard_seconds``, and at most what a recurring pressure's last cut set
    (:func:`remedies.compute_peak_seqs`)."""
    p, w, eff = s.policy, s.window, s.effective
    if s.active_cap is not None:
        return None  # the queue is at --max-num-active-seqs: more max_num_seqs admits nobody
    seqs = eff.max_num_seqs or 1
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak_running = obs.compute_max(w.samples, obs.running) or 0.0
    usage = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    running = obs.compute_mean(w.samples, obs.running) or 0.0
    if queue < p.queue_min or peak_running < p.seqs_saturation * seqs or usage <= 0 or running < 1:
        return None
    base = remedies.predict_kv_tokens(s, eff)
    grown, notes = compute_growth(s, fp8=True)
    if not base or not grown:
        return None
    since = s.now - p.flap_guard_seconds
    ceiling = history_mod.compute_pressure_ceiling(s.history, remedies.KV_PRESSURE, since)
    least, _ = remedies.compute_min_raise(s)
    peak = remedies.compute_peak_seqs(s)
    candidates: list[EngineSettings] = []
    for g in grown:
        target = remedies.compute_room_seqs(s, scale=(remedies.predict_kv_tokens(s, g) or 0.0) / base)
        if target is None:
            continue
        if ceiling is not None:
            target = min(target, ceiling - 1)
        if peak is not None:
            target = min(target, peak)
        if target >= seqs * (1.0 + least):
            candidates.append(g.replace(max_num_seqs=target))
    if not candidates:
        return None
    room = remedies.compute_room_seqs(s)
    short = (
        f"room for {room} at {p.target_kv_usage:.2f}, fewer than the {math.ceil(peak_running + queue)} the "
        "queue asks for"
        if room is not None and room > seqs
        else f"no room for more at {p.target_kv_usage:.2f}"
    )
    return Proposal(
        trigger=remedies.IDLE_CAPACITY,
        evidence=(
            f"{queue:.1f} requests wait while {peak_running:.0f} of {seqs} sequences run with KV usage "
            f"{usage:.2f}: {short} in the KV cache ({s.capacity_tokens} tokens); a larger one holds "
            f"{candidates[0].max_num_seqs}" + (f" ({notes})" if notes else "")
        ),
        candidates=tuple(candidates),
        exhausted="no larger KV cache within the bounds",
    )
