"""SGLang's ``IdleCapacity`` rule: a queue at ``--max-running-requests`` with room in the pool, answered
with more running requests (with the room spent, a larger pool and the requests it holds:
:func:`propose_growth_for_idle`), as vLLM's rule (:func:`kvpilot.tuner.loop.remedies.propose_for_idle`)
answers a queue at ``--max-num-seqs``: the room the window measures (:mod:`.engine_room`; in the whole
pool, :data:`kvpilot.tuner.sglang.ADMISSION_TOKEN_USAGE`, where vLLM's is at ``target_kv_usage``: SGLang's
admission keeps the running requests' decode room itself, :mod:`kvpilot.tuner.sglang.scheduler`), the flap
guard after token pressure (:mod:`.engine_flap`), and a raise that failed approached from below -- the
engine-neutral pieces shared with TGI's rule (:mod:`.tgi_idle`). Pure; one of :mod:`.sglang_rules`' rules.
"""

from __future__ import annotations

import dataclasses
import math

from kvpilot.tuner import sglang
from kvpilot.tuner.loop import engine_flap, engine_room, sglang_bound
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY
from kvpilot.tuner.loop.sglang_fit import (
    SglangProposal,
    SglangSituation,
    compute_effective,
    compute_running_limit,
    fraction_of,
    layout_of,
)
from kvpilot.tuner.loop.sglang_rules import allows_raise

_FULL = sglang.ADMISSION_TOKEN_USAGE


def propose_for_idle(s: SglangSituation) -> SglangProposal | None:
    """A queue at the running-request limit and room in the pool: more running requests.

    As vLLM's rule (:func:`kvpilot.tuner.loop.remedies.propose_for_idle`), room is either sustained token
    usage <= ``kv_usage_low`` (raise by the step, or to what the queue asks for where the window measured
    the room for it, capped by the room the window's usage per running request shows in the whole pool,
    :data:`~kvpilot.tuner.sglang.ADMISSION_TOKEN_USAGE`) or, inside the 0.50..0.90 band, that measured room
    itself, taken whole when it is worth a rollout (at least ``min_seqs_raise`` more); without such room the
    band holds. Within ``flap_guard_seconds`` of a KvPressure change a raise stays below the limit that
    pressure found full and must be worth ``flap_min_raise``; pressure that came back within the hour holds
    the limit it set for ``peak_memory_seconds``; a raise that failed is bisected below."""
    p, w, eff = s.policy, s.window, s.effective
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak = obs.compute_max(w.samples, obs.running) or 0.0
    low = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v <= p.kv_usage_low)
    limit = eff.max_running_requests or math.ceil(peak)
    if queue < p.queue_min or limit < 1 or peak < p.seqs_saturation * limit or not allows_raise(s):
        return None
    mean_kv = obs.compute_mean(w.samples, obs.kv_usage)
    room = engine_room.measure_room(w, p, _FULL)
    idle = low >= p.sustain_fraction
    if not idle and (
        room is None or room - engine_room.compute_room_error(w, p, _FULL) < limit * (1.0 + p.min_seqs_raise)
    ):
        return None  # inside the band and no measured room for more (beyond its noise): hysteresis
    step = min(p.seqs_step_up_max, max(p.seqs_step_up, queue / max(peak, 1.0)))
    target = math.ceil(limit * (1.0 + step))
    caps = [f"step +{step:.0%}"]
    demand = math.ceil(peak + queue)
    if room is not None and idle and target < min(room, demand):
        # the window measured the room: the step's cap only guards a raise taken without that evidence
        target, caps = demand, [f"the queue: {demand} running requests asked for"]
    if room is not None and (room < target or not idle):
        target, caps = max(limit, room), [f"token room at {_FULL:.2f} usage"]
    guarded = engine_flap.guard_raise(target, s.pressure, s.now, p, "the pool")
    if guarded.cap is not None:
        target, caps = guarded.target, [guarded.cap]
    failed_at = _failed_running_target(s, limit)
    if failed_at is not None and failed_at[0] < target:
        target, caps = failed_at[0], [failed_at[1]]
    if target < limit * (1.0 + guarded.least):
        return None
    mean = mean_kv or 0.0
    where = (
        f"token usage <= {p.kv_usage_low:.2f} in {low:.0%} of samples"
        if idle
        else f"mean token usage {mean:.2f} with room for {room} running requests at {_FULL:.2f}"
    )
    return SglangProposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"{where} while {queue:.1f} requests wait and {peak:.0f} of {limit} run (capped by {caps[0]})"
        ),
        candidates=(dataclasses.replace(eff, max_running_requests=target),),
        exhausted="--max-running-requests is at its upper bound",
    )


def _failed_running_target(s: SglangSituation, limit: int) -> tuple[int, str] | None:
    """The most ``--max-running-requests`` a raise from ``limit`` may take after raises that failed (an OOM,
    or a rollout that failed) with the current layout, context and no more memory left outside the share (a
    fraction at or below the current one, a prefill chunk at or below it), and why; ``None`` when none did.

    A run-time OOM whose batch never filled its limit (the window saw at most ``running`` of them run, more
    than ``limit`` and under ``seqs_saturation`` of the failed limit) says the memory that follows the batch
    ran out at about that many: the raise stays below it. Otherwise (a start-up OOM, a batch that filled its
    limit, no samples) it approaches the failure from what runs by one ``seqs_step_up`` at most, halfway when
    that is closer, rather than trying the failed raise again less one: a probe above the failure is another
    crash and rollback, one below it only a rollout, so the search leans low.
    :func:`~.sglang_fit.is_ruled_out` rules out only the failed batch and more."""
    p, eff = s.policy, s.effective

    targets: list[tuple[int, str]] = []
    for run in s.failed:
        if run.kind not in ("start_oom", "runtime_oom", "rollout_failed"):
            continue
        failed = compute_effective(run.settings, s.memory)
        count = failed.max_running_requests
        if (
            count is None
            or count <= limit
            or layout_of(failed, context=True) != layout_of(eff, context=True)
            or fraction_of(failed) > fraction_of(eff) + 1e-9
            or (failed.chunked_prefill_size or 0) > (eff.chunked_prefill_size or 0)
        ):
            continue
        seen = run.running if run.kind == "runtime_oom" else None
        targets.append(engine_room.approach_failed(limit, count, seen, p))
    return min(targets) if targets else None


def propose_growth_for_idle(s: SglangSituation) -> SglangProposal | None:
    """A queue at the running-request limit with no room left in the pool: a larger pool and the
    running requests it holds there (the window's room less its own noise,
    :func:`.engine_room.compute_room_error`, scaled by the pool's growth), by at least the raise worth a
    rollout, below a limit pressure found full (:func:`.engine_flap.guard_raise`) and a raise that failed
    (:func:`_failed_running_target`); not while the inter-token latency is within ``slo_raise_margin``
    of its objective. ``None`` when no growth is left or the raise it allows is too small."""
    p, w, eff = s.policy, s.window, s.effective
    limit = compute_running_limit(eff, s.memory)
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak = obs.compute_max(w.samples, obs.running) or 0.0
    usage = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    room = engine_room.measure_room(w, p, _FULL)
    if limit is None or room is None or queue < p.queue_min or peak < p.seqs_saturation * limit:
        return None
    if not allows_raise(s):
        return None
    failed = _failed_running_target(s, limit)
    # the room's lower end: a noisy window raises less; one too noisy to square (inf) not at all
    error = engine_room.compute_room_error(w, p, _FULL)
    if not math.isfinite(error):
        return None
    candidates: list[sglang.SglangSettings] = []
    for grown in sglang_bound.compute_pool_growth(s):
        gain = sglang_bound.compute_pool_gain(s, grown)
        if gain is None or gain < 1.0 + p.kv_bound_min_gain:
            continue
        guarded = engine_flap.guard_raise(math.floor((room - error) * gain), s.pressure, s.now, p, "the pool")
        target = min(guarded.target, failed[0]) if failed is not None else guarded.target
        if target >= limit * (1.0 + guarded.least):
            candidates.append(dataclasses.replace(grown, max_running_requests=target))
    if not candidates:
        return None
    return SglangProposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"{queue:.1f} requests wait while {peak:.0f} of {limit} run with token usage {usage:.2f}: "
            f"room for {room} at {_FULL:.2f}; a larger pool holds "
            f"{candidates[0].max_running_requests}"
        ),
        candidates=tuple(candidates),
        exhausted="no larger KV pool within the bounds",
    )
