"""TGI's closed-loop rules: what each of its failures and metrics conditions proposes, in TGI's flags. Pure.

TGI 3.3.7 (``v3.3.7``; the texts and series: :mod:`kvpilot.tuner.tgi`) sizes its KV cache at warm-up from the
memory free after a prefill of ``--max-batch-prefill-tokens`` (``flash_causal_lm.py`` lines 1523-1563), under
``--cuda-memory-fraction`` x 0.9 of the GPU; it never evicts a running request, and its router admits at most
``--max-concurrent-requests`` (queued + running), answering 429 "Model is overloaded" beyond
(``router/src/infer/mod.rs`` line 412). So:

- ``StartOOM`` ("Not enough memory to handle N prefill tokens. You need to decrease
  `--max-batch-prefill-tokens`", ``flash_causal_lm.py`` lines 1549-1553): halve ``--max-batch-prefill-tokens``
  from the N it names (TGI's own advice), down to
  :data:`~kvpilot.tuner.engines.tgi_budget.MIN_PREFILL_TOKENS`;
  then a larger ``--cuda-memory-fraction`` where it is below 1 (torch's cap on the process).
- ``StartMemoryShort`` ("Not enough memory to handle `max_total_tokens=N`", ``backends/v3/src/lib.rs`` lines
  98-100: one request of ``--max-total-tokens`` does not fit the KV tokens the warm-up inferred): more memory
  by ``--cuda-memory-fraction`` 1 where it is below; else a shorter ``--max-total-tokens`` -- the KV tokens
  the memory model predicts (less the context margin), else N less the step -- never below
  ``serving.minContextLength``; else a halved prefill (its activations leave more for the KV); else
  infeasible.
- ``RuntimeOOM`` (PyTorch's "CUDA out of memory" while serving): a smaller ``--cuda-memory-fraction`` by the
  OOM step on the headroom (VPA's, :func:`~kvpilot.tuner.loop.remedies.compute_oom_step`: less KV, more room
  for activations) while the KV cache still holds one request of ``--max-total-tokens``; else a halved
  prefill.
- ``GpuMemoryPressure``: dcgm-exporter's free framebuffer below the floor
  (``PolicyConfig.gpu_memory_free_min_gib``), or falling towards it within the horizon, while serving (vLLM's
  engine-neutral detection, :func:`.gpu_memory.detect_memory_warning`): the ``RuntimeOOM`` answer one step
  ahead of the crash -- a smaller ``--cuda-memory-fraction`` while the KV holds a request of
  ``--max-total-tokens``, else a halved prefill; not a crash (nothing marked failed), urgent as vLLM's
  (no cooldown, no restart trade; the minimum interval and the hourly limit hold)
  (:func:`propose_for_gpu_memory`).
- ``IdleCapacity``: the admission limit binds with spare KV tokens -- running + queued requests
  (``tgi_batch_current_size`` + ``tgi_queue_size``) at ``--max-concurrent-requests``, or 429 "Model is
  overloaded" refused (``MetricsSample.rejected_rate``), in most samples while
  ``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens`` stays under the high band: raise
  ``--max-concurrent-requests`` to the room the window measured, within the flap guard, below raises that
  failed (:mod:`.tgi_idle`).
- ``LatencySlo``: ``spec.serving.slo.interTokenLatencyP95Seconds`` missed in most samples: a halved
  ``--max-batch-prefill-tokens`` where long prompts share the steps, else fewer
  ``--max-concurrent-requests`` (:func:`propose_for_itl`, on :mod:`.engine_latency`).
- ``KvPressure``: the KV tokens full (the same ratio at the high band) with a queue in most samples: there is
  nothing to admit more into. More KV by a larger ``--cuda-memory-fraction`` where it is below 1 and no OOM
  ruled that out; else nothing: TGI never evicts (its batch admits what the KV holds, the queue waits for
  room), so fewer ``--max-concurrent-requests`` would refuse (429) requests the queue would serve and, below
  the running batch, leave KV tokens idle (:func:`propose_for_pressure`); the loop holds and recommends more
  replicas.

A value the history ruled out is never proposed again (:func:`~.tgi_fit.is_ruled_out`).
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import tgi
from kvpilot.tuner.engines.tgi_budget import MIN_PREFILL_TOKENS
from kvpilot.tuner.loop import engine_latency, gpu_memory
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.engine_chain import floor_grid
from kvpilot.tuner.loop.engine_latency import LATENCY_SLO as LATENCY_SLO
from kvpilot.tuner.loop.engine_state import KV_PRESSURE as KV_PRESSURE
from kvpilot.tuner.loop.engine_state import RUNTIME_OOM as RUNTIME_OOM
from kvpilot.tuner.loop.engine_state import START_MEMORY_SHORT as START_MEMORY_SHORT
from kvpilot.tuner.loop.engine_state import START_OOM as START_OOM
from kvpilot.tuner.loop.gpu_memory import GPU_MEMORY_PRESSURE as GPU_MEMORY_PRESSURE
from kvpilot.tuner.loop.remedies import compute_oom_step
from kvpilot.tuner.loop.tgi_fit import (
    TgiProposal,
    TgiSituation,
    compute_budget,
    compute_effective,
    concurrency_of,
    fraction_of,
    predict_kv_tokens,
)
from kvpilot.tuner.tgi.serving import TIME_PER_TOKEN

# --- crash rules ----------------------------------------------------------------------------------


def _halvings(prefill: int | None) -> list[int]:
    """``prefill`` halved, again and again, down to :data:`MIN_PREFILL_TOKENS`."""
    out, value = [], prefill or 0
    while value // 2 >= MIN_PREFILL_TOKENS:
        value //= 2
        out.append(value)
    return out


def _with_prefill(s: TgiSituation, eff: tgi.TgiSettings, prefill: int) -> tgi.TgiSettings:
    """``eff`` with ``prefill`` tokens per prefill batch, ``--max-input-tokens`` lowered to it where the
    attention backend does not chunk a prefill (the router's check, ``backends/v3/src/main.rs`` line 188)."""
    settings = dataclasses.replace(eff, max_batch_prefill_tokens=prefill)
    budget = compute_budget(settings, s.memory)
    max_input = settings.max_input_tokens
    if budget is None or budget.chunking or max_input is None or max_input <= prefill:
        return settings
    return dataclasses.replace(settings, max_input_tokens=prefill)


def _more_fraction(eff: tgi.TgiSettings, step: float | None = None) -> tgi.TgiSettings | None:
    fraction = fraction_of(eff)
    if fraction >= 1.0 - 1e-9:
        return None
    grown = 1.0 if step is None else min(1.0, round(fraction + step, 3))
    return dataclasses.replace(eff, cuda_memory_fraction=grown)


def propose_for_prefill(s: TgiSituation, text: str) -> TgiProposal:
    """The warm-up prefill did not fit: fewer prefill tokens (TGI's advice), else a larger fraction."""
    eff = s.effective
    parsed = tgi.classify_log(text)
    named = parsed.tokens if parsed is not None and parsed.tokens else eff.max_batch_prefill_tokens
    if named is not None and eff.max_batch_prefill_tokens is not None:  # never above the flags' own
        named = min(named, eff.max_batch_prefill_tokens)
    candidates = [_with_prefill(s, eff, p) for p in _halvings(named)]
    more = _more_fraction(eff)
    candidates += [more] if more is not None else []
    return TgiProposal(
        trigger=START_OOM,
        evidence=f"TGI's warm-up could not hold a prefill of {named} tokens ({text[:160]})",
        candidates=tuple(candidates),
        crash=True,
        exhausted=(
            f"--max-batch-prefill-tokens is at its floor ({MIN_PREFILL_TOKENS}) and "
            "--cuda-memory-fraction at "
            "1: the weights need a larger GPU, more shards or quantization"
        ),
        infeasible_when_exhausted=True,
    )


def propose_for_total_tokens(s: TgiSituation, text: str) -> TgiProposal:
    """One request of ``--max-total-tokens`` does not fit the KV tokens TGI inferred: more memory, else a
    shorter ``--max-total-tokens`` within the context bounds, else fewer prefill tokens."""
    eff, p = s.effective, s.policy
    parsed = tgi.classify_log(text)
    named = parsed.tokens if parsed is not None and parsed.tokens else eff.max_total_tokens or 0
    candidates: list[tgi.TgiSettings] = []
    lines: list[str] = []
    more = _more_fraction(eff)
    if more is not None:
        candidates.append(more)
    # the KV the warm-up infers with its own lengths: one of --max-total-tokens per warm-up request would
    # reserve the very KV that does not fit
    inferred = predict_kv_tokens(
        dataclasses.replace(eff, max_total_tokens=None, max_input_tokens=None), s.memory
    )
    if inferred is not None and 0 < inferred < named:
        lines.append(f"the memory model: the warm-up infers {inferred} KV tokens")
        wanted = int(inferred * (1.0 - p.context_margin))
    else:
        wanted = math.floor(named * (1.0 - p.seqs_step_down))
    multiple = p.context_multiple if wanted >= 4 * p.context_multiple else 16
    shorter = wanted // multiple * multiple
    floor = s.bounds.min_max_model_len or 1
    if 1 < shorter < named and shorter >= floor:
        max_input = min(eff.max_input_tokens or shorter - 1, shorter - 1)
        candidates.append(dataclasses.replace(eff, max_total_tokens=shorter, max_input_tokens=max_input))
    elif shorter < floor:
        lines.append(f"--max-total-tokens {shorter} would be below serving.minContextLength {floor}")
    candidates += [_with_prefill(s, eff, x) for x in _halvings(eff.max_batch_prefill_tokens)][:1]
    return TgiProposal(
        trigger=START_MEMORY_SHORT,
        evidence=(
            f"TGI's KV cache cannot hold one request of --max-total-tokens {named} at --cuda-memory-fraction "
            f"{fraction_of(eff)}"
        ),
        candidates=tuple(candidates),
        crash=True,
        exhausted=(
            f"--cuda-memory-fraction is 1, no shorter --max-total-tokens fits at or above "
            f"serving.minContextLength ({floor}) and the prefill is at its floor"
        ),
        infeasible_when_exhausted=True,
        explanation=tuple(lines),
    )


def _repeated_ooms(s: TgiSituation) -> int:
    """How many run-time OOMs the history holds at a larger fraction on the same shards: the current
    fraction is not the first step down from a failure that a step did not cure."""
    eff = s.effective
    return sum(
        1
        for run in s.failed
        if run.kind == "runtime_oom"
        and (failed := compute_effective(run.settings, s.memory)).num_shard == eff.num_shard
        and fraction_of(failed) > fraction_of(eff) + 1e-9
    )


def _oom_step(s: TgiSituation) -> tuple[float, str]:
    """The fraction one run-time OOM takes: VPA's step on the headroom
    (:func:`~kvpilot.tuner.loop.remedies.compute_oom_step`), doubled for each OOM at a larger fraction
    already in the history. TGI's OOM names only the allocation that failed, not the memory outside the KV
    that was short; the warm-up's KV takes what the fraction gives (``1 - 0.9 x fraction`` is left, TGI's
    wiggle room), so at TGI's default 1.0 the headroom is 0 and VPA's step is its 0.02 floor. Doubling
    searches that unknown distance in k OOMs for 0.02 x (2^k - 1) instead of 0.02 x k -- an overshoot of at
    most the last step, which the idle and pressure rules may take back below the OOMs."""
    fraction = fraction_of(s.effective)
    base = compute_oom_step(fraction, s.policy)
    repeats = _repeated_ooms(s)
    if repeats == 0:
        return base, f"OOM step on the headroom 1 - {fraction}"
    step = min(base * 2**repeats, fraction / 2)
    return step, f"OOM step on the headroom 1 - {fraction}, x{2**repeats} after {repeats} OOM(s) above it"


def _smaller_share(s: TgiSituation) -> tuple[list[tgi.TgiSettings], list[str]]:
    """A run-time OOM's answer, after the crash or ahead of it: a smaller ``--cuda-memory-fraction`` by the
    OOM step (:func:`_oom_step`: less KV, more room for activations) while the KV still holds one request of
    ``--max-total-tokens``, else a halved ``--max-batch-prefill-tokens``; with the lines that say so."""
    eff = s.effective
    fraction = fraction_of(eff)
    step, why = _oom_step(s)
    lower = floor_grid(fraction - step)
    candidates: list[tgi.TgiSettings] = []
    lines = [f"{why}: --cuda-memory-fraction {lower}"]
    smaller = dataclasses.replace(eff, cuda_memory_fraction=lower)
    budget = compute_budget(smaller, s.memory)
    if budget is None or budget.feasible:
        candidates.append(smaller)
    else:
        lines.append(f"at {lower} TGI would not start: {budget.refusals[0]}")
    candidates += [_with_prefill(s, eff, x) for x in _halvings(eff.max_batch_prefill_tokens)][:1]
    return candidates, lines


def propose_for_oom(s: TgiSituation, text: str) -> TgiProposal:
    """Out of GPU memory while serving: a smaller fraction (less KV, more room for activations) while the KV
    still holds one request of ``--max-total-tokens``, else fewer prefill tokens."""
    fraction = fraction_of(s.effective)
    candidates, lines = _smaller_share(s)
    return TgiProposal(
        trigger=RUNTIME_OOM,
        evidence=f"CUDA out of memory while serving at --cuda-memory-fraction {fraction} ({text[:160]})",
        candidates=tuple(candidates),
        crash=True,
        exhausted="no smaller fraction holds a request of --max-total-tokens; the prefill is at its floor",
        infeasible_when_exhausted=True,
        explanation=tuple(lines),
    )


# --- GPU memory telemetry: ahead of a run-time OOM ---------------------------------------------------


def propose_for_gpu_memory(s: TgiSituation) -> TgiProposal | None:
    """dcgm-exporter's free framebuffer below the floor (or falling towards it within the horizon) while TGI
    serves (:func:`.gpu_memory.detect_memory_warning`, vLLM's engine-neutral detection). TGI's warm-up sizes
    its KV from ``--cuda-memory-fraction``; what runs out while serving is the rest (activations, the
    allocator's fragments), so the answer is the run-time OOM rule's, before the crash: a *smaller* fraction
    by the OOM step (less KV, more room) while the KV still holds one request of ``--max-total-tokens``, else
    a halved ``--max-batch-prefill-tokens``. One step; not a crash: nothing is marked failed, and
    :func:`~.tgi_policy.compute_tgi_decision` lets it skip the cooldown and the restart trade as vLLM's urgent
    warning does (not the minimum interval or the hourly limit)."""
    warning = gpu_memory.detect_memory_warning(s.window.samples, s.policy)
    if warning is None:
        return None
    fraction = fraction_of(s.effective)
    candidates, lines = _smaller_share(s)
    return TgiProposal(
        trigger=GPU_MEMORY_PRESSURE,
        evidence=f"{warning.describe()} at --cuda-memory-fraction {fraction}",
        candidates=tuple(candidates),
        exhausted=(
            "no smaller --cuda-memory-fraction within the bounds holds a request of --max-total-tokens and "
            "the prefill is at its floor: holding"
        ),
        explanation=tuple(lines),
    )


# --- metrics rules --------------------------------------------------------------------------------


def propose_for_itl(s: TgiSituation) -> TgiProposal | None:
    """The inter-token latency objective missed in most samples (:mod:`.engine_latency`, as SGLang's and
    vLLM's rules answer it), read on TGI's time per output token. TGI's router prefills a new batch of up
    to ``--max-batch-prefill-tokens`` while every running request waits for its next token
    (``backends/v3/src/backend.rs``, ``batching_task``), so where long prompts share the steps a halved
    prefill budget comes first (only where TGI chunks a prefill or the halved budget still holds
    ``--max-input-tokens``: the latency never shortens the prompts served); else fewer
    ``--max-concurrent-requests``, the one request-count bound kvpilot sets on TGI's running batch (it
    bounds running + queued; the batch's tokens are the KV TGI infers, which for flash models replaces a
    given ``--max-batch-total-tokens``: ``backends/v3/src/lib.rs``, ``connect_backend``), to the running
    requests x objective / measured, at most half a step."""
    p, w, eff = s.policy, s.window, s.effective
    miss = engine_latency.find_itl_miss(w, s.itl_p95_objective, p)
    if miss is None:
        return None
    candidates: list[tgi.TgiSettings] = []
    prefill = eff.max_batch_prefill_tokens
    floor = max(MIN_PREFILL_TOKENS, p.batched_tokens_floor)
    if prefill is not None and prefill // 2 >= floor and engine_latency.long_prompts(w, prefill):
        halved = _shorter_prefill_steps(s, eff, prefill // 2)
        candidates += [halved] if halved is not None else []
    cut = engine_latency.compute_running_cut(concurrency_of(eff), miss, p)
    if cut is not None:
        candidates.append(dataclasses.replace(eff, max_concurrent_requests=cut))
    return TgiProposal(
        trigger=LATENCY_SLO,
        evidence=engine_latency.describe_itl_miss(miss, f"time per output token p95 ({TIME_PER_TOKEN})"),
        candidates=tuple(candidates),
        exhausted=(
            "no smaller --max-batch-prefill-tokens or --max-concurrent-requests is left within the bounds"
        ),
    )


def _shorter_prefill_steps(s: TgiSituation, eff: tgi.TgiSettings, prefill: int) -> tgi.TgiSettings | None:
    """``eff`` with ``prefill`` tokens per prefill batch where TGI still serves every prompt it served: it
    chunks a prefill (the memory model's attention backend), or ``prefill`` holds ``--max-input-tokens``
    (``None``: neither is known to hold)."""
    settings = dataclasses.replace(eff, max_batch_prefill_tokens=prefill)
    budget = compute_budget(settings, s.memory)
    if budget is not None and budget.chunking:
        return settings
    max_input = eff.max_input_tokens
    return settings if max_input is not None and max_input <= prefill else None


def is_kv_bound(s: TgiSituation) -> bool:
    """The KV tokens full (at the high band) with a queue in most samples."""
    p, w = s.policy, s.window
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    queued = obs.compute_fraction(w.samples, obs.waiting, lambda v: v >= p.queue_min)
    return high >= p.sustain_fraction and queued >= p.sustain_fraction


def propose_for_pressure(s: TgiSituation) -> TgiProposal | None:
    """The KV tokens full with a queue: more KV where the fraction is below 1; else no candidate, and the
    exhausted answer says why (:func:`~.tgi_policy.compute_tgi_decision` asks the latency objective and the
    idle rule first then, and holds with more replicas recommended when neither has a change).

    TGI's scheduler admits a request into the batch only when the tokens it may reach fit the KV
    (``backends/v3/src/backend.rs``: ``next_batch`` within ``max_batch_total_tokens`` less what the running
    batch may reach) and never evicts one, so at a full KV the running batch is what the KV holds and the
    queue waits for room: there is no recompute to stop, as vLLM's fewer sequences stop preemption. Fewer
    ``--max-concurrent-requests`` below the running batch would leave KV tokens idle, and any cut answers 429
    to requests the queue would have served; the latency objective (:func:`propose_for_itl`) is the rule that
    cuts the limit for the requests' sake."""
    p, w, eff = s.policy, s.window, s.effective
    if not is_kv_bound(s):
        return None
    more = _more_fraction(eff, p.max_gmu_step)
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    queued = obs.compute_fraction(w.samples, obs.waiting, lambda v: v >= p.queue_min)
    peak = obs.compute_max(w.samples, obs.running)
    return TgiProposal(
        trigger=KV_PRESSURE,
        evidence=(
            f"KV tokens >= {p.kv_usage_high:.0%} used in {high:.0%} of samples with a queue in {queued:.0%} "
            f"(peak running {peak or 0:.0f})" + (": more KV tokens for the queue" if more is not None else "")
        ),
        candidates=(more,) if more is not None else (),
        exhausted=(
            f"no larger --cuda-memory-fraction than {fraction_of(eff)} is left (1 is the whole GPU; a "
            "larger one that ran out of memory is ruled out): TGI's batch is what its KV holds and the queue "
            "waits for room (no eviction to stop); more needs more GPU memory (shards), a shorter "
            "--max-total-tokens or more replicas"
        ),
    )
