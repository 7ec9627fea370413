"""Latency objectives in the closed loop. Pure.

**Latency SLOs** (``spec.serving.slo``, :class:`~kvpilot.tuner.loop.config.LatencySlo`), read from vLLM's
histograms as 95th percentiles per step:

* an **inter-token latency** above its objective in most samples argues for fewer sequences: a decode
  step reads every running sequence's KV, so fewer of them make each step shorter. When long prompts
  share the steps (chunked prefill), smaller prefill chunks (``max_num_batched_tokens``) are tried first:
  they shorten the steps without turning requests away;
* a **time to first token** above its objective while requests wait and the KV cache has room argues for
  more sequences (the queue is the wait), or, when nothing waits but prompts are long, a larger prefill
  budget;
* under the engine's ``--max-num-active-seqs`` (which kvpilot does not tune) the running requests are the
  cap's: neither objective moves ``max_num_seqs``, and the hold names the flag
  (:mod:`kvpilot.tuner.vllm.active_seqs`);
* raises stop at the SLO: :func:`allows_raise` is false while the inter-token latency is within
  ``slo_raise_margin`` of its objective, so an idle-capacity raise never trades the SLO for throughput.

GPU memory telemetry (dcgm-exporter) has its own module, :mod:`kvpilot.tuner.loop.gpu_memory`.
"""

from __future__ import annotations

import math

from kvpilot.tuner.loop import engine_latency
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.engine_latency import LATENCY_SLO as LATENCY_SLO
from kvpilot.tuner.loop.remedies import Proposal, Situation, compute_room_seqs
from kvpilot.tuner.types import EngineSettings


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def allows_raise(s: Situation) -> bool:
    """Whether more sequences are allowed: not while the inter-token latency is near its objective
    (:func:`.engine_latency.allows_raise`, which SGLang's and TGI's loops share)."""
    slo = s.context.slo
    return engine_latency.allows_raise(s.window, slo.itl_p95_seconds if slo else None, s.policy)


def propose_for_slo(s: Situation) -> Proposal | None:
    """A sustained latency-objective violation: what the knobs can do about it (or ``None``)."""
    slo = s.context.slo
    if slo is None:
        return None
    p, w = s.policy, s.window
    if slo.itl_p95_seconds is not None:
        target_itl = slo.itl_p95_seconds
        over = obs.compute_fraction(w.samples, obs.itl_p95, lambda v: v > target_itl)
        if over >= p.sustain_fraction:
            return _for_itl(s, target_itl, over)
    if slo.ttft_p95_seconds is not None:
        target_ttft = slo.ttft_p95_seconds
        over = obs.compute_fraction(w.samples, obs.ttft_p95, lambda v: v > target_ttft)
        if over >= p.sustain_fraction:
            return _for_ttft(s, target_ttft, over)
    return None


def _long_prompts(s: Situation, batched: int) -> bool:
    prompt = s.window.prompt_tokens
    return prompt is not None and prompt.mean > batched / 4


def _for_itl(s: Situation, objective: float, share: float) -> Proposal:
    p, w, eff = s.policy, s.window, s.effective
    itl = obs.compute_mean(w.samples, obs.itl_p95) or objective
    seqs = eff.max_num_seqs or 1
    candidates: list[EngineSettings] = []
    batched = eff.max_num_batched_tokens
    if batched is not None and batched > p.batched_tokens_floor and _long_prompts(s, batched):
        candidates.append(eff.replace(max_num_batched_tokens=max(p.batched_tokens_floor, batched // 2)))
    peak = obs.compute_max(w.samples, obs.running) or float(seqs)
    base = min(float(seqs), peak)
    target = max(1, min(seqs - 1, math.floor(base * max(1.0 - p.seqs_step_up_max / 2, objective / itl))))
    exhausted = "no smaller prefill chunk or sequence limit is left within the bounds"
    if s.active_cap is None:
        candidates.append(eff.replace(max_num_seqs=target))
    else:  # fewer running requests is the cap's to set (:mod:`kvpilot.tuner.vllm.active_seqs`)
        exhausted = f"no smaller prefill chunk is left within the bounds; {s.describe_cap(more=False)}"
    return Proposal(
        trigger=LATENCY_SLO,
        evidence=(
            f"inter-token latency p95 {_ms(itl)} above the {_ms(objective)} objective in {share:.0%} of "
            f"samples (peak running {peak:.0f})"
        ),
        candidates=tuple(candidates),
        exhausted=exhausted,
    )


def _for_ttft(s: Situation, objective: float, share: float) -> Proposal | None:
    p, w, eff = s.policy, s.window, s.effective
    ttft = obs.compute_mean(w.samples, obs.ttft_p95) or objective
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    kv = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    seqs = eff.max_num_seqs or 1
    batched = eff.max_num_batched_tokens
    candidates: list[EngineSettings] = []
    why = ""
    exhausted = "no more sequences or prefill budget fit without breaking the KV cache or the ITL SLO"
    if queue >= p.queue_min and kv < p.kv_usage_high and allows_raise(s):
        target = math.ceil(seqs * (1.0 + p.seqs_step_up))
        room = compute_room_seqs(s)
        if room is not None:
            target = min(target, room)
        if s.active_cap is not None:  # the queue waits at the cap: more --max-num-seqs admits nobody
            exhausted = s.describe_cap(more=True)
        elif target > seqs:
            candidates.append(eff.replace(max_num_seqs=target))
        why = f"{queue:.1f} requests wait with mean KV usage {kv:.2f}"
    elif queue < p.queue_min and batched is not None and _long_prompts(s, batched):
        if batched < p.slo_batched_tokens_max:
            candidates.append(eff.replace(max_num_batched_tokens=min(p.slo_batched_tokens_max, batched * 2)))
        why = "nothing waits: the prompts' prefill is the wait"
    else:
        return None  # KV-bound or already at the ITL objective: nothing here helps without breaking another
    return Proposal(
        trigger=LATENCY_SLO,
        evidence=f"time to first token p95 {_ms(ttft)} above the {_ms(objective)} objective in {share:.0%} "
        f"of samples; {why}",
        candidates=tuple(candidates),
        exhausted=exhausted,
    )
