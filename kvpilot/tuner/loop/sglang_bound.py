"""SGLang's ``KvBound`` rule: requests wait while SGLang runs fewer than its running-request limit because
the KV pool is full, answered with a larger pool, as vLLM's (:mod:`kvpilot.tuner.loop.kv_bound`). Pure;
one of :mod:`.sglang_rules`' rules.

SGLang 0.5.23 admits a queued request only while the pool holds its prompt, a page and what every running
request may still write, scaled by the new-token ratio (``PrefillAdder``, ``managers/schedule_policy.py``;
``_get_running_request_total_token_offset``, lines 785-795); one that does not fit ends the pass with the
batch marked full until a running request leaves (``managers/scheduler.py`` line 4282). So a pool that
holds the running batch's outputs keeps the queue waiting with the limit unreached, and retracts only
when the ratio under-reserved: token usage high, few or no retractions, a queue, running below the limit.
``KvPressure`` (:func:`.sglang_rules.propose_for_pressure`) reads retractions and does not fire there; more
running requests would not be admitted, and fewer only leave the pool's room idle.

The signature, as vLLM's: a queue (mean queued >= ``queue_min``), the most that ran below
``seqs_saturation`` of the limit SGLang serves with (``--max-running-requests`` capped by the pool, or its
default from the pool: :func:`~.sglang_fit.compute_running_limit`), and token usage at
``target_kv_usage`` on average or retractions at ``preemption_rate_high``. Candidates
(:func:`compute_pool_growth`), each only where the memory model predicts the pool to grow by at least
``kv_bound_min_gain``: a larger ``--mem-fraction-static`` under its ceiling (by ``max_gmu_step`` at most;
at the ceiling, with ``--chunked-prefill-size`` halved, whose smaller activation reserve lifts it), then,
where allowed, an fp8 KV cache (twice the tokens). The trade counts the queue the larger pool admits
(:func:`~.restart_trade.compute_kv_bound_share`).

The same growth answers a queue *at* the limit whose room at ``target_kv_usage`` is spent
(:func:`.sglang_idle.propose_growth_for_idle`, vLLM's :func:`~.kv_bound.propose_growth_for_idle`).
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import sglang
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import sglang_fp8
from kvpilot.tuner.loop.kv_bound import KV_BOUND as KV_BOUND
from kvpilot.tuner.loop.sglang_fit import (
    FRACTION_STEP,
    SglangProposal,
    SglangSituation,
    compute_chunk_trials,
    compute_effective,
    compute_fraction_ceiling,
    compute_running_limit,
    floor_grid,
    fraction_of,
    predict_pool_tokens,
)


def compute_pool_growth(s: SglangSituation) -> list[sglang.SglangSettings]:
    """More pool: a larger fraction under its ceiling and the bounds (by ``max_gmu_step`` at most; where the
    ceiling is reached, with the prefill chunk halved until it leaves room, the fewest prefill tokens given
    up), then, where the bounds allow one (:func:`.sglang_fp8.allows_fp8`), an fp8 KV cache at the same
    fraction."""
    p, eff = s.policy, s.effective
    candidates: list[sglang.SglangSettings] = []
    fraction = fraction_of(eff)
    for trial in compute_chunk_trials(eff, p):
        ceiling = floor_grid(compute_fraction_ceiling(trial, s.memory))
        if ceiling - fraction >= FRACTION_STEP - 1e-9:
            grown = min(ceiling, round(fraction + p.max_gmu_step, 3), s.bounds.max_gpu_memory_utilization)
            if (
                grown - fraction >= FRACTION_STEP - 1e-9
            ):  # the bound may leave no step: no chunk cut for nothing
                candidates.append(dataclasses.replace(trial, mem_fraction_static=grown))
            break
    if sglang_fp8.allows_fp8(s):
        # no more pool from the fraction (or a raise the history rules out): twice the tokens, before a cut
        candidates.append(dataclasses.replace(eff, kv_cache_dtype=sglang.FP8_KV_CACHE_DTYPE))
    return candidates


def compute_pool_gain(s: SglangSituation, settings: sglang.SglangSettings) -> float | None:
    """The pool under ``settings`` over the current one, by the memory model (``None``: not modelled)."""
    before = predict_pool_tokens(s.effective, s.memory)
    after = predict_pool_tokens(compute_effective(settings, s.memory), s.memory)
    return after / before if before and after else None


def propose_for_pool_bound(s: SglangSituation) -> SglangProposal | None:
    """A larger pool when the window shows the queue held back by it (module docstring)."""
    p, w, eff = s.policy, s.window, s.effective
    limit = compute_running_limit(eff, s.memory)
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak = obs.compute_max(w.samples, obs.running) or 0.0
    usage = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
    if limit is None or queue < p.queue_min or peak >= p.seqs_saturation * limit:
        return None  # the limit (or nothing known) holds the queue, not the pool
    if usage < p.target_kv_usage and rate < p.preemption_rate_high:
        return None
    least = 1.0 + p.kv_bound_min_gain
    grown = [c for c in compute_pool_growth(s) if (compute_pool_gain(s, c) or least) >= least]
    if not grown:
        return None
    retracting = f", {rate:.2f} retractions/s" if rate >= p.preemption_rate_high else ""
    tokens = predict_pool_tokens(eff, s.memory)
    pool = f" ({tokens} tokens)" if tokens else ""
    return SglangProposal(
        trigger=KV_BOUND,
        evidence=(
            f"{queue:.1f} requests wait while {peak:.0f} of {limit} run with token usage {usage:.2f}"
            f"{retracting}: the KV pool{pool} holds them back"
        ),
        candidates=tuple(grown),
        exhausted="no larger KV pool within the bounds",
    )
