"""Each engine's own closed loop as both kinds ask it: the context it tunes within and its policy, in a
:class:`~.engine_reading.Profile` (SGLang's :data:`SGLANG_PROFILE`, TGI's :data:`TGI_PROFILE`). Pure.

An InferenceService of ``spec.engine.kind`` SGLang or TGI asks it for its own spec
(:mod:`kvpilot.operator.inferenceservice.sglang_loop`, :mod:`kvpilot.operator.inferenceservice.tgi_loop`);
an EngineTuner for the InferenceService spec its target plans as
(:mod:`kvpilot.operator.enginetuner.target_engine_loop`). The rules are the tuner's
(:func:`kvpilot.tuner.loop.compute_sglang_decision`, :func:`kvpilot.tuner.loop.compute_tgi_decision`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.loop.engine_reading import Profile
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.engine_pods import SGLANG, TGI
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.loop import (
    PolicyConfig,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    compute_sglang_decision,
    compute_tgi_decision,
)


def build_sglang_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> SglangContext:
    """What SGLang's policy tunes within: the GPU and the model, ``spec.tuning.bounds`` (the memory-share
    bounds bound ``--mem-fraction-static``; an fp8 KV cache where ``tuning.allowFp8KvCache`` allows it and
    the GPU supports it, as for vLLM), the TTFT and inter-token latency objectives of ``spec.serving.slo``."""
    memory = SglangMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, inputs.gpu.gpu.fp8_kv, None)
    return SglangContext(
        memory,
        bounds,
        policy,
        slo.ttft_p95_seconds if slo is not None else None,
        slo.itl_p95_seconds if slo is not None else None,
    )


def decide_sglang(
    state: SglangLoopState,
    evidence: SglangEvidence,
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    policy: PolicyConfig,
    now: float,
) -> SglangDecision:
    """SGLang's policy in the spec's context (:func:`build_sglang_context`)."""
    return compute_sglang_decision(state, evidence, build_sglang_context(spec, inputs, policy), now)


def build_tgi_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> TgiContext:
    """What TGI's policy tunes within: the GPU and the model, and ``spec.tuning.bounds`` merged with
    ``spec.serving`` (the concurrency bounds bound ``--max-concurrent-requests``, ``minContextLength`` and
    ``maxContextLength`` bound ``--max-total-tokens``, the memory-share floor bounds
    ``--cuda-memory-fraction``), and ``spec.serving.slo``'s inter-token latency objective (its TTFT objective
    is not kept for TGI: :class:`~kvpilot.tuner.loop.TgiContext`)."""
    memory = TgiMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, False, None)
    return TgiContext(memory, bounds, policy, slo.itl_p95_seconds if slo is not None else None)


def decide_tgi(
    state: TgiLoopState,
    evidence: TgiEvidence,
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    policy: PolicyConfig,
    now: float,
) -> TgiDecision:
    """TGI's policy in the spec's context (:func:`build_tgi_context`)."""
    return compute_tgi_decision(state, evidence, build_tgi_context(spec, inputs, policy), now)


SGLANG_PROFILE = Profile(SGLANG, sglang.SglangSettings, decide_sglang)
TGI_PROFILE = Profile(TGI, tgi.TgiSettings, decide_tgi)
PROFILES: Mapping[str, Profile[Any]] = {"SGLang": SGLANG_PROFILE, "TGI": TGI_PROFILE}
"""The engine's kind -> its loop's profile."""
