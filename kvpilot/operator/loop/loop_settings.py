"""The closed loop's settings: its pace from the operator's environment, its policy from the spec.

:class:`LoopPace` is read once, at start-up (:func:`pace_from_env`, called from the
``@kopf.on.startup`` handler in :mod:`kvpilot.operator.main`, as kopf's configuration docs
prescribe); an invalid value stops the operator there with :class:`LoopConfigError`, never in
the middle of the loop. The timer interval is the exception: kopf takes it when the timer is
registered, at import, so :mod:`kvpilot.operator.inferenceservice.closed_loop` reads that one value with
:func:`interval_from_env`.

:func:`build_policy` and :func:`build_bounds` turn a spec's ``tuning`` and ``serving`` and the
pace into the tuner's :class:`~kvpilot.tuner.loop.PolicyConfig` and
:class:`~kvpilot.tuner.loop.TuningBounds`. Pure apart from the environment read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from kvpilot.operator import api
from kvpilot.tuner.loop import LatencySlo, PolicyConfig, TuningBounds
from kvpilot.tuner.types import EngineSettings

INTERVAL_ENV = "KVPILOT_CLOSED_LOOP_INTERVAL"
DEFAULT_INTERVAL_S = 30.0
STEP_ENV = "KVPILOT_METRICS_STEP_SECONDS"
DEFAULT_STEP_S = 30.0
MIN_CHANGE_INTERVAL_ENV = "KVPILOT_MIN_CHANGE_INTERVAL"
WINDOW_ENV = "KVPILOT_METRICS_WINDOW_SECONDS"
MIN_SAMPLES_ENV = "KVPILOT_MIN_SAMPLES"
PROBATION_ENV = "KVPILOT_PROBATION_SECONDS"
_POLICY_DEFAULTS = PolicyConfig()


class LoopConfigError(ValueError):
    """An operator environment variable of the closed loop has an invalid value (raised at start-up)."""


def _number_from_env(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float,
    strict: bool,
    integer: bool = False,
) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    what = "an integer" if integer else "a number of seconds"
    bound = f">= {minimum:g}" if not strict else f"> {minimum:g}"
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        raise LoopConfigError(f"{name}={raw!r}: expected {what} {bound}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise LoopConfigError(f"{name}={raw!r}: expected {what} {bound}")
    return value


@dataclass(frozen=True, slots=True)
class LoopPace:
    """The closed loop's pace, from the operator's environment (tests and demos speed it up)."""

    interval_seconds: float = DEFAULT_INTERVAL_S
    step_seconds: float = DEFAULT_STEP_S
    """Seconds between metric samples. The window is 10 steps and metrics older than 4 steps (at least
    60 s) are stale, so a fast e2e setup (scraping every few seconds) can use 5 s and act within a minute."""
    min_change_interval_seconds: float = _POLICY_DEFAULTS.min_change_interval_seconds
    window_seconds: float | None = None
    """``None``: 10 steps."""
    min_samples: int = _POLICY_DEFAULTS.min_samples
    probation_seconds: float = _POLICY_DEFAULTS.probation_seconds


def interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The timer interval: ``$KVPILOT_CLOSED_LOOP_INTERVAL`` seconds, default 30; or LoopConfigError."""
    env = environ if environ is not None else os.environ
    return _number_from_env(env, INTERVAL_ENV, DEFAULT_INTERVAL_S, minimum=0, strict=True)


def pace_from_env(environ: Mapping[str, str] | None = None) -> LoopPace:
    """:class:`LoopPace` from ``$KVPILOT_CLOSED_LOOP_INTERVAL``, ``$KVPILOT_METRICS_STEP_SECONDS``,
    ``$KVPILOT_MIN_CHANGE_INTERVAL``, ``$KVPILOT_METRICS_WINDOW_SECONDS``, ``$KVPILOT_MIN_SAMPLES``
    and ``$KVPILOT_PROBATION_SECONDS``; unset or empty = the default. Raises :class:`LoopConfigError`."""
    env = environ if environ is not None else os.environ
    base = LoopPace()
    step = _number_from_env(env, STEP_ENV, base.step_seconds, minimum=0, strict=True)
    window = _number_from_env(env, WINDOW_ENV, 0.0, minimum=0, strict=False) or None
    if window is not None and window < step:
        raise LoopConfigError(f"{WINDOW_ENV}={window:g}: shorter than one sample step ({STEP_ENV}={step:g})")
    return LoopPace(
        interval_seconds=interval_from_env(env),
        step_seconds=step,
        min_change_interval_seconds=_number_from_env(
            env, MIN_CHANGE_INTERVAL_ENV, base.min_change_interval_seconds, minimum=0, strict=False
        ),
        window_seconds=window,
        min_samples=int(
            _number_from_env(env, MIN_SAMPLES_ENV, base.min_samples, minimum=1, strict=False, integer=True)
        ),
        probation_seconds=_number_from_env(
            env, PROBATION_ENV, base.probation_seconds, minimum=0, strict=False
        ),
    )


def build_policy(spec: api.InferenceServiceSpec, pace: LoopPace | None = None) -> PolicyConfig:
    """kvpilot's policy defaults, with ``spec.tuning``'s knobs and the operator's pace (the window scaled
    to the sample step unless the pace sets it)."""
    t, pace = spec.tuning, pace or LoopPace()
    return PolicyConfig(
        cooldown_seconds=float(t.cooldown_seconds),
        max_changes_per_hour=t.max_changes_per_hour,
        rollout_deadline_seconds=float(t.rollout_deadline_seconds),
        window_seconds=pace.window_seconds or 10 * pace.step_seconds,
        staleness_seconds=max(4 * pace.step_seconds, 60.0),
        min_change_interval_seconds=pace.min_change_interval_seconds,
        min_samples=pace.min_samples,
        probation_seconds=pace.probation_seconds,
    )


def build_bounds(
    spec: api.InferenceServiceSpec, fp8_supported: bool, pinned: EngineSettings | None = None
) -> TuningBounds:
    """The planner's bounds (``spec.to_bounds``: serving and tuning.bounds merged), for the loop; fp8 only
    if allowed *and* supported; ``pinned`` (:func:`kvpilot.operator.planning.modes.compute_user_args`: the
    spec's
    pinned values and tuned flags in extraArgs) never changed."""
    return TuningBounds.from_serving(spec.to_bounds(), fp8_supported=fp8_supported, pinned=pinned)


def build_slo(spec: api.InferenceServiceSpec) -> LatencySlo | None:
    """``spec.serving.slo`` as the loop's :class:`LatencySlo` (``None`` without one)."""
    slo = spec.serving.slo
    if slo is None or (slo.ttft_p95_seconds is None and slo.inter_token_latency_p95_seconds is None):
        return None
    return LatencySlo(
        ttft_p95_seconds=slo.ttft_p95_seconds, itl_p95_seconds=slo.inter_token_latency_p95_seconds
    )
