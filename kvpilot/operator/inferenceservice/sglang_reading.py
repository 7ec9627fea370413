"""What an SGLang service's closed-loop tick reads into SGLang's policy: :mod:`.engine_reading` in SGLang's
flags, and the context it tunes within. Pure.

:func:`build_state_and_evidence` and :func:`build_sglang_context`, for
:func:`kvpilot.operator.inferenceservice.sglang_loop.run_sglang_tick`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.inferenceservice import engine_reading
from kvpilot.operator.loop import loop_settings
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods.engine_pods import SGLANG
from kvpilot.operator.pods.sglang_pods import SglangPod
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import (
    ObservationWindow,
    PolicyConfig,
    SglangChange,
    SglangContext,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
)


def compute_current(pods: Sequence[SglangPod]) -> sglang.SglangSettings:
    """The settings most live pods run (SGLang's defaults when no pod says)."""
    return engine_reading.compute_current(pods, sglang.SglangSettings)


def build_state_and_evidence(
    pods: Sequence[SglangPod],
    window: ObservationWindow,
    status: Mapping[str, Any],
    *,
    mode: str = "Recommend",
    replicas: int = 1,
) -> tuple[SglangLoopState, SglangEvidence]:
    """The policy's inputs in SGLang's flags (:func:`engine_reading.build_state_and_evidence`)."""
    return engine_reading.build_state_and_evidence(
        SGLANG, sglang.SglangSettings, pods, window, status, mode=mode, replicas=replicas
    )


def build_sglang_context(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, policy: PolicyConfig
) -> SglangContext:
    """What the policy tunes within: the GPU and the model, ``spec.tuning.bounds`` (the memory-share bounds
    bound ``--mem-fraction-static``), the TTFT and inter-token latency objectives of ``spec.serving.slo``."""
    memory = SglangMemory(inputs.gpu.gpu, inputs.model.spec, inputs.model.checkpoint_bytes)
    slo = loop_settings.build_slo(spec)
    bounds = loop_settings.build_bounds(spec, False, None)
    return SglangContext(
        memory,
        bounds,
        policy,
        slo.ttft_p95_seconds if slo is not None else None,
        slo.itl_p95_seconds if slo is not None else None,
    )


def read_changes(status: Mapping[str, Any]) -> tuple[SglangChange, ...]:
    """The loop's changes in SGLang's flags (:func:`engine_reading.read_changes`)."""
    return engine_reading.read_changes(SGLANG, status)
