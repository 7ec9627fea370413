"""TGI's ``IdleCapacity`` rule: ``--max-concurrent-requests`` binding with KV tokens to spare, answered with
the room the window measures, as SGLang's rule (:mod:`.sglang_idle`) answers a queue at its running-request
limit. Pure; one of TGI's metrics rules (:mod:`.tgi_rules` holds the others).

TGI's router admits at most ``--max-concurrent-requests`` (running + queued) and answers 429 "Model is
overloaded" beyond (``router/src/infer/mod.rs`` line 412), counting each refusal in
:data:`~kvpilot.tuner.tgi.serving.REQUEST_OVERLOADED` (line 117); its batch takes what the KV tokens hold
(``backends/v3/src/backend.rs``: ``next_batch`` within ``max_batch_total_tokens`` less what the running batch
may reach). So the demand beyond the limit is never seen as a queue -- it is answered 429, whose rate the
window carries (``MetricsSample.rejected_rate``) -- and what says how far a raise may go is the KV:
``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens`` per running request
(``tgi_batch_current_size``), the tokens each request may reach, which is what TGI's scheduler admits by.
The rule, with the engine-neutral pieces shared:

- the limit binds (running + queued at ``seqs_saturation`` of it in most samples, or 429s refused in most
  samples: ``sustain_fraction``) and the KV is not at the high band, and the inter-token latency is clear
  of its objective
  (:func:`.engine_latency.allows_raise`);
- with the KV tokens low (<= ``kv_usage_low`` in most samples) the raise is to the measured room, in one
  rollout (:func:`.engine_room.measure_room`: the requests the KV holds at ``target_kv_usage``); where no room
  is measured, by the step, more with a deeper queue (up to ``seqs_step_up_max``); inside the band only the
  measured room, when it stands over ``min_seqs_raise`` by more than its standard error
  (:func:`.engine_room.compute_room_error`), else hysteresis;
- within the hour after pressure or the latency objective found the limit too many, below it
  (:func:`.engine_flap.guard_raise`);
- below a raise that failed with these settings, approached from what runs
  (:func:`.engine_room.approach_failed`).

The raise is sized by the KV's room, not by the demand the 429s show: the extra concurrency they ask for is
the refused rate x the mean request time (Little's law), and the window has no request time (nor the
admitted rate it could be inferred from), so the rate only says that the limit binds.
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import tgi
from kvpilot.tuner.loop import engine_flap, engine_latency, engine_room
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY
from kvpilot.tuner.loop.tgi_fit import (
    TgiProposal,
    TgiSituation,
    compute_effective,
    concurrency_of,
    fraction_of,
)

FAILED_RAISES = ("start_oom", "runtime_oom", "rollout_failed")
"""The failures a raise of the admission limit is approached from below after."""


def _admitted(x: obs.MetricsSample) -> float | None:
    if x.running is None:
        return None
    return x.running + (x.waiting or 0.0)


def propose_for_idle(s: TgiSituation) -> TgiProposal | None:
    """The admission limit binds (running + queued at it, or 429s refused, in most samples) with spare KV
    tokens: more ``--max-concurrent-requests``, to the room the window measured."""
    p, w, eff = s.policy, s.window, s.effective
    limit = concurrency_of(eff)
    at_limit = obs.compute_fraction(w.samples, _admitted, lambda v: v >= p.seqs_saturation * limit)
    refused = obs.compute_fraction(w.samples, obs.rejected_rate, lambda v: v > 0.0)
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    if max(at_limit, refused) < p.sustain_fraction or high >= p.sustain_fraction:
        return None
    if not engine_latency.allows_raise(w, s.itl_p95_objective, p):
        return None  # the inter-token latency within slo_raise_margin of its objective: no more requests
    low = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v <= p.kv_usage_low)
    idle = low >= p.sustain_fraction
    room = engine_room.measure_room(w, p)
    if not idle and (
        room is None or room - engine_room.compute_room_error(w, p) < limit * (1.0 + p.min_seqs_raise)
    ):
        return None  # inside the band and no measured room for more (beyond its noise): hysteresis
    if room is not None:
        target, cap = room, f"the KV tokens' room at {p.target_kv_usage:.2f} usage"
    else:
        queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
        peak = obs.compute_max(w.samples, obs.running) or 0.0
        step = min(p.seqs_step_up_max, max(p.seqs_step_up, queue / max(peak, 1.0)))
        target, cap = max(limit + 1, math.ceil(limit * (1.0 + step))), f"step +{step:.0%} (no room measured)"
    guarded = engine_flap.guard_raise(target, s.pressure, s.now, p, "the KV tokens")
    if guarded.cap is not None:
        target, cap = guarded.target, guarded.cap
    failed_at = _failed_target(s, limit)
    if failed_at is not None and failed_at[0] < target:
        target, cap = failed_at
    if target < limit * (1.0 + guarded.least):
        return None  # not worth a rollout (within the flap guard's hour: a flap-sized raise)
    mean = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    return TgiProposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"running + queued requests at --max-concurrent-requests {limit} in {at_limit:.0%} of samples"
            f"{_refusals(w.samples, refused)} with KV tokens {mean:.0%} used (raise capped by {cap})"
        ),
        candidates=(dataclasses.replace(eff, max_concurrent_requests=target),),
        exhausted="--max-concurrent-requests is at its upper bound",
    )


def _refusals(samples: tuple[obs.MetricsSample, ...], refused: float) -> str:
    """The 429s in words: their mean rate and the share of samples with any (nothing without the series)."""
    rate = obs.compute_mean(samples, obs.rejected_rate)
    if rate is None:
        return ""
    return f', 429s ("{tgi.OVERLOADED}") in {refused:.0%}, {rate:.2f}/s on average,'


def _failed_target(s: TgiSituation, limit: int) -> tuple[int, str] | None:
    """The most ``--max-concurrent-requests`` a raise from ``limit`` may take after raises that failed (an
    OOM, or a rollout that failed) with the same shards and ``--max-total-tokens`` and no more memory left
    outside TGI's share (a fraction at or below the current one, a prefill at or below it), and why;
    ``None`` when none did. :func:`~.tgi_fit.is_ruled_out` rules out only the failed limit and more."""
    p, eff = s.policy, s.effective
    targets: list[tuple[int, str]] = []
    for run in s.failed:
        if run.kind not in FAILED_RAISES:
            continue
        failed = compute_effective(run.settings, s.memory)
        count = concurrency_of(failed)
        if (
            count <= limit
            or failed.num_shard != eff.num_shard
            or failed.max_total_tokens != eff.max_total_tokens
            or fraction_of(failed) > fraction_of(eff) + 1e-9
            or (failed.max_batch_prefill_tokens or 0) > (eff.max_batch_prefill_tokens or 0)
        ):
            continue
        seen = run.running if run.kind == "runtime_oom" else None
        targets.append(engine_room.approach_failed(limit, count, seen, p, "requests"))
    return min(targets) if targets else None
