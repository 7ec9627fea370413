"""The status an SGLang service's closed-loop tick writes: :mod:`.engine_patch` in SGLang's flags.

``status.recommendation.engineArgs``, in mode Auto ``status.appliedEngineArgs``, ``status.rollout`` and
``status.lastGoodEngineArgs``, ``status.failedEngineArgs`` and the ``ClosedLoop`` condition, as
:mod:`.engine_patch` writes them for every engine with rules of its own; here read and written with
:func:`kvpilot.tuner.sglang.parse_sglang_args` and :func:`kvpilot.tuner.sglang.build_sglang_args`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.pods.engine_pods import SGLANG
from kvpilot.operator.pods.pod_summary import Serving
from kvpilot.operator.status import engine_patch
from kvpilot.operator.status.engine_patch import FAILED_LIMIT, RECOMMENDING, TUNING
from kvpilot.operator.status.status_patch import StatusPatch
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import FailedRun, SglangDecision, SglangRollout

__all__ = [
    "FAILED_LIMIT",
    "RECOMMENDING",
    "TUNING",
    "build_sglang_patch",
    "read_args",
    "read_failed_runs",
    "read_rollout",
]


def read_failed_runs(status: Mapping[str, Any]) -> tuple[FailedRun, ...]:
    """``status.failedEngineArgs`` as SGLang's ruled-out runs (an entry that does not parse: skipped)."""
    return engine_patch.read_failed_runs(SGLANG, status)


def read_args(status: Mapping[str, Any], field: str) -> sglang.SglangSettings | None:
    """``status.<field>`` (SGLang's flags) parsed; ``None`` when unset or it no longer parses."""
    return engine_patch.read_args(SGLANG, status, field)


def read_rollout(status: Mapping[str, Any], current: sglang.SglangSettings) -> SglangRollout | None:
    """``status.rollout`` of SGLang's flags, while it is the rollout of ``current``."""
    return engine_patch.read_rollout(SGLANG, status, current)


def build_sglang_patch(
    old: Mapping[str, Any],
    decision: SglangDecision,
    mode: str,
    *,
    generation: int | None,
    now: float,
    deadline_seconds: float = 900.0,
    serving: Serving | None = None,
) -> StatusPatch:
    """The tick's status and its events (:func:`engine_patch.build_engine_patch` in SGLang's flags)."""
    return engine_patch.build_engine_patch(
        SGLANG,
        old,
        decision,
        mode,
        generation=generation,
        now=now,
        deadline_seconds=deadline_seconds,
        serving=serving,
    )
