"""The room an idle raise measures, whatever the engine's flags (SGLang's, TGI's own loops). Pure.

vLLM's measured room (:func:`kvpilot.tuner.loop.remedies.compute_room_seqs`) in engine-neutral terms: a
window where the limit on requests binds with KV to spare says how much KV one running request takes, so
the running requests the KV holds at ``target_kv_usage`` are ``target_kv_usage x running / KV usage``
(:func:`measure_room`, on the window's means). Inside the usage band a raise stands on that room alone, and
must clear its own noise: :func:`compute_room_error`, the room's standard error sample to sample, as VPA's
recommendation moves only outside its confidence band (noisy scrapes crept SGLang's room 200 -> 217 -> 234
-> 247 -> 267, one rollout each). A raise that failed (an OOM, a rollout that failed) with settings that
leave no more memory is approached from below (:func:`approach_failed`): a probe above a failure is another
crash and rollback, one below it only a rollout, so the search leans low. Which failures count, and which
limit, is each engine's (:mod:`.sglang_idle`, :mod:`.tgi_idle`).
"""

from __future__ import annotations

import math

from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig


def measure_room(
    window: obs.ObservationWindow, policy: PolicyConfig, usage: float | None = None
) -> int | None:
    """The running requests the KV holds at ``usage`` (``target_kv_usage`` unless the engine's admission
    guards more of it: SGLang's, :data:`kvpilot.tuner.sglang.ADMISSION_TOKEN_USAGE`), by the window's mean
    usage per running request (``None``: no running request or no usage seen, or a room too large to be a
    number)."""
    mean_kv = obs.compute_mean(window.samples, obs.kv_usage)
    mean_running = obs.compute_mean(window.samples, obs.running)
    if not mean_kv or not mean_running or mean_kv <= 0 or mean_running < 1:
        return None
    measured = (usage or policy.target_kv_usage) * mean_running / mean_kv
    return math.floor(measured) if math.isfinite(measured) else None


def compute_room_error(
    window: obs.ObservationWindow, policy: PolicyConfig, usage: float | None = None
) -> float:
    """The standard error of the room the window measured (``usage`` x running / KV usage, sample by sample,
    as :func:`measure_room`): the room's own noise. 0 with fewer than two samples; infinite where the rooms
    are too far apart to square (a near-zero usage sample): then there is no measured room to stand on."""
    share = usage or policy.target_kv_usage
    rooms = [
        share * x.running / x.kv_usage
        for x in window.samples
        if x.running is not None and x.kv_usage is not None and x.kv_usage > 0 and x.running >= 1
    ]
    rooms = [r for r in rooms if math.isfinite(r)]
    if len(rooms) < 2:
        return 0.0
    mean = sum(rooms) / len(rooms)
    try:
        var = sum((r - mean) ** 2 for r in rooms) / (len(rooms) - 1)
    except OverflowError:
        return math.inf
    return math.sqrt(var / len(rooms))


def approach_failed(
    limit: int, failed: int, seen: int | None, policy: PolicyConfig, noun: str = "running requests"
) -> tuple[int, str]:
    """The most a raise from ``limit`` may take towards ``failed``, a limit that failed with these settings,
    and why. A run-time OOM whose batch never filled its limit (``seen``: the most requests the window saw
    run before it, more than ``limit`` and under ``seqs_saturation`` of ``failed``) ran out at about that
    many: the raise stays below it. Otherwise one ``seqs_step_up`` from ``limit`` at most, halfway to
    ``failed`` when that is closer -- never the failed raise again less one."""
    p = policy
    step, half = math.ceil(limit * (1.0 + p.seqs_step_up)), (limit + failed) // 2
    if seen is not None and limit < seen < p.seqs_saturation * failed:
        return seen - 1, f"below {seen}, the {noun} when {failed} ran out of memory"
    if step < half:
        return step, f"one step (+{p.seqs_step_up:.0%}) towards {failed}, which failed"
    return half, f"halfway to {failed}, which failed with these settings"
