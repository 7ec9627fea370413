"""The inter-token latency objective as every engine's own loop (SGLang's, TGI's) keeps it, whatever its
flags. Pure.

vLLM's rule (:func:`kvpilot.tuner.loop.slo.propose_for_slo`) in engine-neutral terms:
``spec.serving.slo.interTokenLatencyP95Seconds`` above its objective in most samples (``sustain_fraction``)
argues for shorter decode steps. Each step reads every running request's KV, so fewer running requests
shorten it: the limit on them is cut to the running requests x objective / measured, at most half a step
(``seqs_step_up_max / 2``) at once and always at least one below the limit (:func:`compute_running_cut`).
Where long prompts share the steps (a prompt's mean over a quarter of the tokens a prefill step takes:
:func:`long_prompts`), the engine's prefill budget is halved first: that shortens the steps a prefill stalls
without turning requests away. Which flags these are is each engine's (:func:`.tgi_rules.propose_for_itl`);
SGLang's rule (:func:`.sglang_rules.propose_for_itl`) only cuts: its scheduler runs a prefill batch alone,
so long prompts do not share the decode steps. And raises stop at the objective: :func:`allows_raise` is
false while the latency is within ``slo_raise_margin`` of it, so an idle raise never trades the objective
for throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig

LATENCY_SLO = "LatencySlo"
"""The trigger of a change a latency objective made (vLLM's :data:`kvpilot.tuner.loop.slo.LATENCY_SLO`)."""


@dataclass(frozen=True, slots=True)
class ItlMiss:
    """The inter-token latency objective missed in most of a window's samples."""

    objective: float
    """Seconds (``spec.serving.slo.interTokenLatencyP95Seconds``)."""
    measured: float
    """The window's mean p95, seconds."""
    share: float
    """The share of samples above the objective."""
    peak_running: float
    """The most running requests the window saw (0: none seen)."""


def find_itl_miss(
    window: obs.ObservationWindow, objective: float | None, policy: PolicyConfig
) -> ItlMiss | None:
    """The miss, when the p95 is above ``objective`` in at least ``sustain_fraction`` of the samples
    (``None``: no objective, or met often enough)."""
    if objective is None:
        return None
    over = obs.compute_fraction(window.samples, obs.itl_p95, lambda v: v > objective)
    if over < policy.sustain_fraction:
        return None
    measured = obs.compute_mean(window.samples, obs.itl_p95) or objective
    peak = obs.compute_max(window.samples, obs.running) or 0.0
    return ItlMiss(objective, measured, over, peak)


def compute_running_cut(limit: int, miss: ItlMiss, policy: PolicyConfig) -> int | None:
    """The limit on running requests that brings the latency to its objective: the running requests (the
    limit, or the peak the window saw below it) x objective / measured, at most half a step
    (``seqs_step_up_max / 2``) below them, at least one and at least one below ``limit`` (``None``: a
    limit of one has nothing to cut)."""
    if limit <= 1:
        return None
    peak = miss.peak_running
    base = min(float(limit), peak) if peak >= 1 else float(limit)
    ratio = miss.objective / miss.measured if miss.measured > 0 else 1.0
    target = math.floor(base * max(1.0 - policy.seqs_step_up_max / 2, ratio))
    return max(1, min(limit - 1, target))


def long_prompts(window: obs.ObservationWindow, prefill_tokens: int) -> bool:
    """Whether long prompts share the steps: the window's mean prompt over a quarter of the tokens one
    prefill step takes (``False`` where the window carries no prompt lengths)."""
    prompt = window.prompt_tokens
    return prompt is not None and prompt.mean > prefill_tokens / 4


def allows_raise(window: obs.ObservationWindow, objective: float | None, policy: PolicyConfig) -> bool:
    """Whether more running requests are allowed: not while the inter-token latency p95 (the window's mean)
    is within ``slo_raise_margin`` of ``objective`` (vLLM's :func:`kvpilot.tuner.loop.slo.allows_raise`)."""
    if objective is None:
        return True
    itl = obs.compute_mean(window.samples, obs.itl_p95)
    return itl is None or itl < objective * policy.slo_raise_margin


def describe_itl_miss(miss: ItlMiss, series: str = "inter-token latency p95") -> str:
    """The evidence in words: the ``series``' measured p95 against the objective, how often, the peak."""
    return (
        f"{series} {miss.measured * 1000:.0f} ms above the {miss.objective * 1000:.0f} ms objective in "
        f"{miss.share:.0%} of samples (peak running {miss.peak_running:.0f})"
    )
