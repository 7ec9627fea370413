"""The flap guard every engine's own loop (SGLang's, TGI's) puts on an idle raise, whatever its flags. Pure.

vLLM's guard (:func:`kvpilot.tuner.loop.history.compute_pressure_ceiling`,
:func:`kvpilot.tuner.loop.remedies.compute_peak_seqs`) in engine-neutral terms. A ``KvPressure`` change
found the KV full at N requests (the limit it cut from, or kept while it grew the KV); an idle raise after
it is the same knob going up again, and a service whose load comes in bursts would see the two take turns,
one rollout each. So, on the limit on requests the engine's rules move (SGLang's
``--max-running-requests``, TGI's ``--max-concurrent-requests``):

- within ``flap_guard_seconds`` of such a change (TGI's loop counts a ``LatencySlo`` change too: the
  objective missed at N) an idle raise stays below N and must be worth
  ``flap_min_raise`` (``min_seqs_raise`` otherwise);
- pressure that came back within ``flap_guard_seconds`` of an earlier pressure change is the service's peak
  load, not a transient: the limit the last one left holds for ``peak_memory_seconds``.

:func:`compute_pressure_changes` reads the loop's changes (``status.history``'s ``fromEngineArgs`` and
``toEngineArgs``) with the engine's own reading of the limit; :func:`guard_raise` caps a raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.engine_state import KV_PRESSURE, EngineChange

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class PressureChange:
    """A change KV pressure made: when, the limit on requests it found full (the limit it cut from, or kept
    while it grew the KV) and the one it left."""

    time: float
    pressured: int | None
    """``None``: what it found full is not known (SGLang's limit left unset, sized at start-up)."""
    left: int | None
    trigger: str = KV_PRESSURE
    """What found the limit too many: ``KvPressure``, or (TGI's) the latency objective missed at it."""


def compute_pressure_changes(
    changes: Sequence[EngineChange[S]],
    limit_of: Callable[[S], int | None],
    triggers: tuple[str, ...] = (KV_PRESSURE,),
) -> tuple[PressureChange, ...]:
    """The changes of ``triggers`` (``KvPressure``'s), oldest first, with the limits they found full and
    left by ``limit_of`` (the engine's reading of its flags: ``None`` where the flags do not name it; a
    change whose flags are not known names none)."""
    out = []
    for c in changes:
        if c.trigger not in triggers:
            continue
        before = limit_of(c.before) if c.before is not None else None
        after = limit_of(c.after) if c.after is not None else None
        out.append(PressureChange(c.time, before, after if after is not None else before, c.trigger))
    return tuple(sorted(out, key=lambda x: x.time))


@dataclass(frozen=True, slots=True)
class Guarded:
    """A raise after the flap guard: its target, why it was capped (``None``: it was not) and the least
    relative raise worth a rollout."""

    target: int
    cap: str | None
    least: float


def guard_raise(
    target: int, pressure: Sequence[PressureChange], now: float, policy: PolicyConfig, noun: str = "the KV"
) -> Guarded:
    """``target`` capped below the limit recent pressure found ``noun`` full at and by the limit pressure
    that came back settled, with the least raise worth a rollout (``flap_min_raise`` within
    ``flap_guard_seconds`` of a pressure change, ``min_seqs_raise`` otherwise)."""
    p = policy
    cap: str | None = None
    recent = [c for c in pressure if now - p.flap_guard_seconds < c.time <= now]
    found = [c.pressured for c in recent if c.pressured is not None]
    if found and min(found) - 1 < target:
        ceiling, why = min((c.pressured, c.trigger) for c in recent if c.pressured is not None)
        said = f"KV pressure found {noun} full" if why == KV_PRESSURE else f"{why} found it too many"
        target, cap = ceiling - 1, f"below {ceiling}, where {said}"
    settled = compute_recurring_cut(pressure, now, p)
    if settled is not None and settled < target:
        target, cap = settled, f"{settled}, where pressure that came back within the hour settled"
    return Guarded(target, cap, p.flap_min_raise if recent else p.min_seqs_raise)


def compute_recurring_cut(pressure: Sequence[PressureChange], now: float, policy: PolicyConfig) -> int | None:
    """At most this many requests, or ``None``: what the last KvPressure change left, for
    ``peak_memory_seconds`` after it, when that pressure came back within ``flap_guard_seconds`` of an
    earlier pressure change -- the service's peak load, not a transient (vLLM's
    :func:`kvpilot.tuner.loop.remedies.compute_peak_seqs`)."""
    p = policy
    changes = [c for c in pressure if c.time <= now]
    if len(changes) < 2 or changes[-1].time <= now - p.peak_memory_seconds:
        return None
    last, earlier = changes[-1], changes[-2]
    return last.left if last.time - earlier.time <= p.flap_guard_seconds else None
