"""SGLang's closed-loop rules: which settings to try next, in SGLang's own terms. Pure.

The vLLM rules (:mod:`.remedies`, :mod:`.crash_remedies`) step ``gpu_memory_utilization``, which caps
everything vLLM allocates; SGLang's ``--mem-fraction-static`` covers only weights + KV pool, with
activations (``--chunked-prefill-size``) and CUDA graphs (``--max-running-requests``) outside it
(:mod:`kvpilot.tuner.engines.sglang_budget`). So the meaning of a move of the fraction is inverted between
start-up and run time, and each rule here says which way it goes:

- ``StartMemoryShort`` (the seam's ``start_memory_short``: "Not enough memory. Please try to increase
  --mem-fraction-static", "Loaded weights leave no GPU memory for the KV cache"): *raise* the fraction to
  what the memory model says holds one full-context request (at least SGLang's printed minimum plus one
  request), never past the ceiling -- the fraction SGLang's own default leaves the activations and CUDA
  graphs (:func:`~.sglang_fit.compute_fraction_ceiling`); when the memory model does not explain the
  failure (less was free than it predicts), to the ceiling; past it, halve ``--chunked-prefill-size`` (a
  smaller activation reserve lifts the ceiling); past that, shorten ``--context-length`` to the pool at the
  ceiling (within ``minContextLength``); then, where allowed, an fp8 KV cache with the full context, then
  with the context its pool holds (vLLM's ``KvCacheTooSmall`` order: :mod:`.sglang_fp8`); else infeasible,
  with the numbers (and ``allowFp8KvCache`` named where only it keeps a fitting fp8 cache out).
- ``StartOOM`` / ``RuntimeOOM`` (CUDA-graph capture failed; ``CUDA out of memory``): *lower* the fraction by
  the OOM step on the headroom (VPA's, :func:`kvpilot.tuner.loop.remedies.compute_oom_step`) while the pool
  still holds one full-context request; else halve ``--chunked-prefill-size`` (activations); a graph
  capture OOM also offers fewer ``--max-running-requests`` (the decode graph's batch), and so does a
  run-time OOM that came back at the same batch after a smaller fraction (first: the memory follows the
  batch). Where allowed, an fp8 KV cache at a smaller fraction that keeps the pool's tokens comes before
  any cut of the running requests (first where the batch would be cut first; :mod:`.sglang_fp8`).
- ``GpuMemoryPressure`` (dcgm-exporter's free framebuffer below the floor,
  ``PolicyConfig.gpu_memory_free_min_gib``, or falling towards it within the horizon, while serving:
  vLLM's engine-neutral detection,
  :func:`.gpu_memory.detect_memory_warning`): the run-time OOM's answer ahead of the crash -- *lower* the
  fraction by the OOM step while the pool holds a full request, else halve ``--chunked-prefill-size``, else
  (where allowed) fp8 at a smaller fraction, else fewer ``--max-running-requests``; one step, not a crash
  (nothing marked failed), urgent as vLLM's (no cooldown, no restart trade; the minimum interval and the
  hourly limit hold) (:func:`propose_for_gpu_memory`).
- ``KvPressure`` (sustained token usage with retractions, or "KV cache pool is full. Retract requests."):
  more pool when the fraction is under its ceiling and no OOM ruled that out; at the ceiling, more pool by
  halving ``--chunked-prefill-size`` (a smaller activation reserve lifts the ceiling, as for a start-up
  short of memory); else an fp8 KV cache (``--kv-cache-dtype fp8_e4m3``, twice the tokens) where the bounds
  allow one (``allowFp8KvCache`` and the GPU's support, as vLLM's rule: before the cut); else fewer
  ``--max-running-requests``.
- ``IdleCapacity``: a queue at the running-request limit with room in the pool: more running requests
  (:mod:`.sglang_idle`).
- ``LatencySlo``: the inter-token latency objective missed in most samples: fewer
  ``--max-running-requests`` (and no idle raise while it is within ``slo_raise_margin`` of its objective);
  never a smaller prefill chunk, which is vLLM's answer to long prompts (:func:`propose_for_itl`); the TTFT
  objective missed: a smaller ``--chunked-prefill-size``.

A value the history ruled out is never proposed again (:func:`~.sglang_fit.is_ruled_out`): a fraction at or
below one that was memory-short at start-up, or at or above one that ran out of memory with no smaller
prefill chunk and no fewer running requests, or settings that failed as a whole.
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import sglang
from kvpilot.tuner.engines import FailureKind
from kvpilot.tuner.loop import engine_latency, gpu_memory, sglang_bound, sglang_fp8
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.engine_latency import LATENCY_SLO as LATENCY_SLO
from kvpilot.tuner.loop.engine_state import KV_PRESSURE as KV_PRESSURE
from kvpilot.tuner.loop.engine_state import RUNTIME_OOM as RUNTIME_OOM
from kvpilot.tuner.loop.engine_state import START_MEMORY_SHORT, TRIGGERS
from kvpilot.tuner.loop.engine_state import START_OOM as START_OOM
from kvpilot.tuner.loop.gpu_memory import GPU_MEMORY_PRESSURE as GPU_MEMORY_PRESSURE
from kvpilot.tuner.loop.remedies import compute_oom_step
from kvpilot.tuner.loop.sglang_fit import (
    FRACTION_STEP,
    SglangProposal,
    SglangSituation,
    compute_chunk_trials,
    compute_effective,
    compute_fraction_ceiling,
    compute_fraction_floor,
    compute_fraction_for_context,
    compute_shorter_context,
    compute_wanted_fraction,
    floor_grid,
    fraction_of,
    holds_full_request,
    layout_of,
    predict_pool_tokens,
)

# --- crash rules ----------------------------------------------------------------------------------


def propose_for_memory_short(s: SglangSituation, failure_text: str) -> SglangProposal:
    """Start-up left no KV pool: raise the fraction, within what leaves activations and graphs their room."""
    eff, p = s.effective, s.policy
    fraction = fraction_of(eff)
    parsed = sglang.classify_log(failure_text)
    minimum = parsed.minimum_fraction if parsed is not None else None
    needed = compute_fraction_for_context(eff, s.memory)
    wanted = compute_wanted_fraction(eff, s.memory, minimum)
    candidates: list[sglang.SglangSettings] = []
    lines: list[str] = []
    trials = compute_chunk_trials(eff, p)
    ceilings = [compute_fraction_ceiling(trial, s.memory) for trial in trials]
    for trial, ceiling in zip(trials, ceilings, strict=True):
        lines.append(
            f"--chunked-prefill-size {trial.chunked_prefill_size}: activations and CUDA graphs leave "
            f"--mem-fraction-static at most {ceiling}"
        )
    if wanted is not None:  # the fewest prefill tokens given up for the fraction asked
        reaching = [t for t, c in zip(trials, ceilings, strict=True) if c >= wanted]
        candidates += [dataclasses.replace(reaching[0], mem_fraction_static=wanted)] if reaching else []
    else:  # no model, or one the failure refuted (less was free than it thinks): up to the ceiling
        lines.append("the memory model does not explain the failure: the largest fraction that leaves room")
        candidates += [
            dataclasses.replace(t, mem_fraction_static=c)
            for t, c in zip(trials, ceilings, strict=True)
            if c >= fraction + FRACTION_STEP
        ][:1]
    # the highest ceiling, with the fewest prefill tokens given up for it
    shorter = compute_shorter_context(s, trials[ceilings.index(max(ceilings))], minimum)
    if shorter is not None:
        candidates.append(shorter)
        lines.append(
            f"at --mem-fraction-static {shorter.mem_fraction_static} the pool holds "
            f"{predict_pool_tokens(shorter, s.memory)} tokens: --context-length {shorter.context_length}"
        )
    # then fp8, as vLLM's KvCacheTooSmall offers it after the context that fits: the full context, then
    # the context the fp8 pool holds
    fp8, fp8_lines = sglang_fp8.propose_for_memory_short(s, trials, ceilings, minimum)
    allowed = sglang_fp8.allows_fp8(s)
    if allowed:
        candidates += fp8
        lines += fp8_lines
    need = f" (the memory model: {needed} holds one {eff.context_length}-token request)" if needed else ""
    said = f"; SGLang's minimum {minimum:.4f}" if minimum else ""
    return SglangProposal(
        trigger=START_MEMORY_SHORT,
        evidence=f"SGLang left no KV pool at --mem-fraction-static {fraction}{said}{need}",
        candidates=tuple(candidates),
        crash=True,
        exhausted=(
            f"no larger fraction within the bounds (at most {s.bounds.max_gpu_memory_utilization}) leaves "
            "room for activations and CUDA graphs, and no shorter context within the bounds fits"
            + (f" (nor with {sglang_fp8.FP8_FLAGS})" if allowed else "")
            + ": the weights need a larger GPU, more tensor parallelism or quantization"
            + sglang_fp8.describe_permission(s, fp8)
        ),
        infeasible_when_exhausted=True,
        explanation=tuple(lines),
    )


def _smaller_share(
    s: SglangSituation,
) -> tuple[list[sglang.SglangSettings], list[str], sglang.SglangSettings | None]:
    """A run-time OOM's answer, after the crash or ahead of it: a smaller ``--mem-fraction-static`` by the
    OOM step while the pool still holds a full request, a halved prefill chunk, then an fp8 KV cache at the
    smaller fraction where allowed (the same tokens in half the bytes: before any cut of the batch); with the
    lines that say so, and the fp8 candidate (``None``: none; offered only where allowed)."""
    eff, p = s.effective, s.policy
    fraction = fraction_of(eff)
    lower = floor_grid(fraction - compute_oom_step(fraction, p))
    floor = compute_fraction_floor(s)
    candidates: list[sglang.SglangSettings] = []
    lines = [f"OOM step on the headroom 1 - {fraction}: --mem-fraction-static {lower}"]
    if floor is None or lower >= floor:
        candidates.append(dataclasses.replace(eff, mem_fraction_static=lower))
    else:
        bar = f"one {eff.context_length}-token request" if holds_full_request(s) else "a page"
        lines.append(f"below {floor} the pool would not hold {bar}")
    chunk = eff.chunked_prefill_size or p.batched_tokens_floor
    if chunk // 2 >= p.batched_tokens_floor:
        candidates.append(dataclasses.replace(eff, chunked_prefill_size=chunk // 2))
    fp8, fp8_line = sglang_fp8.propose_for_oom(s, lower)
    offered = fp8 if fp8 is not None and sglang_fp8.allows_fp8(s) else None
    if offered is not None:
        candidates.append(offered)
        lines.append(fp8_line)
    return candidates, lines, fp8


def propose_for_oom(s: SglangSituation, kind: FailureKind, text: str) -> SglangProposal:
    """Out of GPU memory outside the static share: a smaller fraction while the pool still holds a full
    request, else a smaller prefill chunk (activations); at graph capture, also fewer running requests."""
    eff, p = s.effective, s.policy
    fraction = fraction_of(eff)
    candidates, lines, fp8 = _smaller_share(s)
    offered = fp8 if fp8 is not None and sglang_fp8.allows_fp8(s) else None
    if kind == "start_oom":
        running = eff.max_running_requests or sglang.default_cuda_graph_max_bs(
            s.memory.gpu_mib, eff.tp_size or 1
        )
        if running > 1:
            candidates.append(
                dataclasses.replace(
                    eff, max_running_requests=max(1, math.floor(running * (1 - p.seqs_step_down)))
                )
            )
    if kind == "runtime_oom" and (cut := _batch_cut(s)) is not None:
        # a smaller fraction did not cure an OOM at this batch: the memory follows the batch, fewer first
        candidates.insert(0, dataclasses.replace(eff, max_running_requests=cut[0]))
        lines.insert(0, cut[1])
        if offered is not None:  # half the pool's bytes keep the batch: before its cut (vLLM's order)
            candidates.remove(offered)
            candidates.insert(0, offered)
    where = "while capturing CUDA graphs" if kind == "start_oom" else "while serving"
    return SglangProposal(
        trigger=TRIGGERS[kind],
        evidence=f"CUDA out of memory {where} at --mem-fraction-static {fraction} ({text[:160]})",
        candidates=tuple(candidates),
        crash=True,
        exhausted=(
            "no smaller fraction holds a full request, and the prefill chunk is at its floor"
            + (f" (nor with {sglang_fp8.FP8_FLAGS})" if offered is not None else "")
            + sglang_fp8.describe_permission(s, [fp8] if fp8 is not None else [])
        ),
        infeasible_when_exhausted=True,
        explanation=tuple(lines),
    )


def _batch_cut(s: SglangSituation) -> tuple[int, str] | None:
    """Fewer running requests, and why, when a run-time OOM came back after a smaller fraction: an earlier
    run-time OOM with the same layout and context, as many running requests and as large a prefill chunk
    (or more) at a larger fraction says the headroom the fraction gave did not cure it, so the memory that
    follows the batch does (as vLLM's rules tell a batch's memory from a budget's, issue 32); else ``None``.
    The cut is one ``seqs_step_down`` below the limit, or below the running requests the crash saw when the
    batch never filled its limit. Without it each OOM lowered the fraction again (0.84 -> 0.5 in ten
    crashes, bench sglang-bad-new-settings before its raise could be rolled back)."""
    eff, p = s.effective, s.policy

    same = [
        (run, fraction_of(failed))
        for run in s.failed
        if run.kind == "runtime_oom"
        and layout_of(failed := compute_effective(run.settings, s.memory), context=True)
        == layout_of(eff, context=True)
        and fraction_of(failed) >= fraction_of(eff) - 1e-9
        and (failed.chunked_prefill_size or 0) >= (eff.chunked_prefill_size or 0)
        and (failed.max_running_requests or 0) >= (eff.max_running_requests or 0)
    ]
    earlier = [f for run, f in same if f > fraction_of(eff) + 1e-9]
    seen = [run.running for run, _ in same if run.running is not None]
    limit = eff.max_running_requests or (max(seen) if seen else None)
    if not earlier or limit is None or limit <= 1:
        return None
    ran = min((r for r in seen if r < limit), default=limit)
    cut = max(1, min(math.floor(limit * (1 - p.seqs_step_down)), ran - 1 if ran < limit else limit))
    was = max(earlier)
    return cut, (
        f"out of memory again at {limit} running requests after --mem-fraction-static {was} -> "
        f"{fraction_of(eff)}: the memory follows the batch; --max-running-requests {cut}"
    )


# --- GPU memory telemetry: ahead of a run-time OOM ---------------------------------------------------


def propose_for_gpu_memory(s: SglangSituation) -> SglangProposal | None:
    """dcgm-exporter's free framebuffer below the floor (or falling towards it within the horizon) while
    SGLang serves (:func:`.gpu_memory.detect_memory_warning`, vLLM's engine-neutral detection): what runs
    out is the memory outside ``--mem-fraction-static`` -- activations and CUDA graphs -- so the answer is
    the run-time OOM rule's, before the crash: a *smaller* fraction by the OOM step while the pool still
    holds a full request, else a halved ``--chunked-prefill-size`` (activations), else (where allowed) an fp8
    KV cache at a smaller fraction, else fewer ``--max-running-requests`` (the decode graph's batch). One
    step; not a crash: nothing is marked failed, and :func:`~.sglang_policy.compute_sglang_decision` lets
    it skip the cooldown and the restart trade as vLLM's urgent warning does (not the minimum interval or
    the hourly limit)."""
    warning = gpu_memory.detect_memory_warning(s.window.samples, s.policy)
    if warning is None:
        return None
    eff, p = s.effective, s.policy
    fraction = fraction_of(eff)
    candidates, lines, _ = _smaller_share(s)
    peak = obs.compute_max(warning.samples, obs.running)
    limit = eff.max_running_requests
    base = min(limit, math.ceil(peak)) if limit and peak else (limit or (math.ceil(peak) if peak else None))
    if base is not None and base > 1:
        cut = max(1, min(base - 1, math.floor(base * (1 - p.seqs_step_down))))
        candidates.append(dataclasses.replace(eff, max_running_requests=cut))
    return SglangProposal(
        trigger=GPU_MEMORY_PRESSURE,
        evidence=f"{warning.describe()} at --mem-fraction-static {fraction}",
        candidates=tuple(candidates),
        exhausted=(
            "no smaller --mem-fraction-static within the bounds holds a full request, the prefill chunk is "
            "at its floor and --max-running-requests at its lower bound: holding"
        ),
        explanation=tuple(lines),
    )


# --- metrics rules --------------------------------------------------------------------------------


def propose_for_pressure(s: SglangSituation, retraction_texts: int = 0) -> SglangProposal | None:
    """Sustained token usage at the high band with retractions (or SGLang's "KV cache pool is full"):
    more pool where the ceiling leaves room (at the ceiling, by halving the prefill chunk, whose smaller
    activation reserve lifts it), else an fp8 KV cache where the bounds allow one (``allow_fp8_kv``: the
    user's ``allowFp8KvCache`` and the GPU's support, as vLLM's pressure rule asks) and the cache is not fp8
    yet, else fewer running requests."""
    p, w, eff = s.policy, s.window, s.effective
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
    if not retraction_texts and (high < p.sustain_fraction or rate < p.preemption_rate_high):
        return None
    candidates = sglang_bound.compute_pool_growth(s)
    peak = obs.compute_max(w.samples, obs.running)
    limit = eff.max_running_requests
    base = min(limit, math.ceil(peak)) if limit and peak else (limit or (math.ceil(peak) if peak else None))
    if base is not None and base > 1:
        candidates.append(
            dataclasses.replace(
                eff, max_running_requests=max(1, min(base - 1, math.floor(base * (1 - p.seqs_step_down))))
            )
        )
    texts = f'; {retraction_texts} "KV cache pool is full" log(s)' if retraction_texts else ""
    return SglangProposal(
        trigger=KV_PRESSURE,
        evidence=(
            f"token usage >= {p.kv_usage_high:.2f} in {high:.0%} of samples with {rate:.2f} retractions/s "
            f"(peak running {peak or 0:.0f}){texts}"
        ),
        candidates=tuple(candidates),
        exhausted=(
            "no pool left under the fraction's ceiling, no fp8 KV cache allowed or left to switch to, and "
            "--max-running-requests at its lower bound"
        ),
    )


def propose_for_itl(s: SglangSituation) -> SglangProposal | None:
    """The inter-token latency objective missed in most samples (:mod:`.engine_latency`, shared with TGI's
    loop): each decode step reads every running request's KV, so fewer running requests shorten it.

    Not vLLM's smaller prefill chunk first where long prompts share the steps: in SGLang 0.5.23 they do not
    share them. ``Scheduler.get_next_batch_to_run`` (``managers/scheduler.py``) runs a prefill batch instead
    of the decode batch whenever ``get_new_batch_prefill`` returns one, and a chunked prompt's next chunk
    is one again (``_get_new_batch_prefill_raw`` continues ``chunked_req`` before the queue), so the decodes
    wait for the whole prompt whatever the chunk (only ``--enable-mixed-chunk``, off by default and never
    rendered by kvpilot, puts the decodes in the prefill batch). A smaller chunk adds batches, not pace."""
    p, w, eff = s.policy, s.window, s.effective
    miss = engine_latency.find_itl_miss(w, s.itl_p95_objective, p)
    if miss is None:
        return None
    candidates: list[sglang.SglangSettings] = []
    limit = eff.max_running_requests or math.ceil(miss.peak_running)
    cut = engine_latency.compute_running_cut(limit, miss, p)
    if cut is not None:
        candidates.append(dataclasses.replace(eff, max_running_requests=cut))
    return SglangProposal(
        trigger=LATENCY_SLO,
        evidence=engine_latency.describe_itl_miss(miss),
        candidates=tuple(candidates),
        exhausted="no smaller running-request limit is left within the bounds",
    )


def allows_raise(s: SglangSituation) -> bool:
    """Whether more running requests are allowed: not while the inter-token latency p95 is within
    ``slo_raise_margin`` of its objective (:func:`.engine_latency.allows_raise`), so an idle raise never
    trades the objective for throughput."""
    return engine_latency.allows_raise(s.window, s.itl_p95_objective, s.policy)


def propose_for_ttft(s: SglangSituation) -> SglangProposal | None:
    """The TTFT objective missed in most samples: a smaller prefill chunk, so a long prompt's prefill no
    longer holds a whole step and queued requests reach their first token sooner."""
    objective = s.ttft_p95_objective
    if objective is None:
        return None
    p, w, eff = s.policy, s.window, s.effective
    over = obs.compute_fraction(w.samples, obs.ttft_p95, lambda v: v > objective)
    if over < p.sustain_fraction:
        return None
    ttft = obs.compute_mean(w.samples, obs.ttft_p95) or objective
    chunk = eff.chunked_prefill_size or p.batched_tokens_floor
    candidates = (
        (dataclasses.replace(eff, chunked_prefill_size=chunk // 2),)
        if chunk // 2 >= p.batched_tokens_floor
        else ()
    )
    return SglangProposal(
        trigger=LATENCY_SLO,
        evidence=(
            f"time to first token p95 {ttft * 1000:.0f} ms above the {objective * 1000:.0f} ms objective in "
            f"{over:.0%} of samples"
        ),
        candidates=candidates,
        exhausted=f"--chunked-prefill-size is at its floor ({p.batched_tokens_floor})",
    )
