"""What an SGLang service's closed-loop tick reads into SGLang's policy: the shared engine reading
(:mod:`kvpilot.operator.loop.engine_reading`) in SGLang's flags, and the context it tunes within
(:mod:`kvpilot.operator.loop.engine_profiles`'). Pure.

:func:`build_state_and_evidence` and :func:`build_sglang_context`, for
:func:`kvpilot.operator.inferenceservice.sglang_loop.run_sglang_tick`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator.loop import engine_reading
from kvpilot.operator.loop.engine_profiles import build_sglang_context
from kvpilot.operator.pods.engine_pods import SGLANG
from kvpilot.operator.pods.sglang_pods import SglangPod
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import ObservationWindow, SglangChange, SglangEvidence, SglangLoopState

__all__ = ["build_sglang_context", "build_state_and_evidence", "compute_current", "read_changes"]


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


def read_changes(status: Mapping[str, Any]) -> tuple[SglangChange, ...]:
    """The loop's changes in SGLang's flags (:func:`engine_reading.read_changes`)."""
    return engine_reading.read_changes(SGLANG, status)
