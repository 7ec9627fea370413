"""The pods of an SGLang service as its closed loop reads them: :mod:`.engine_pods` with SGLang's flags.

Each container's arguments parsed back into :class:`~kvpilot.tuner.sglang.SglangSettings`
(:func:`kvpilot.tuner.sglang.parse_sglang_args`), its last termination classified by the engine seam
(:meth:`kvpilot.tuner.engines.SglangEngine.classify_failure`), from the termination message, else from the
previous log's tail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator.pods import engine_pods, pod_reading, pod_summary
from kvpilot.operator.pods.engine_pods import SGLANG, EnginePod
from kvpilot.tuner import sglang

ENGINE = SGLANG.engine
SglangPod = EnginePod[sglang.SglangSettings]


def build_sglang_pod(pod: Mapping[str, Any], log: str | None = None) -> SglangPod:
    """One pod: its flags, and its last termination classified from the message (and ``log``, when read)."""
    return engine_pods.build_engine_pod(SGLANG, pod, log)


def read_sglang_pods(
    reader: pod_reading.PodReader, namespace: str, owner: str, logs: pod_reading.LogCache = pod_reading.LOGS
) -> list[SglangPod]:
    """The pods of the Deployment ``owner`` (blocking: run it in a worker thread)."""
    return engine_pods.read_engine_pods(SGLANG, reader, namespace, owner, logs)


def compute_sglang_serving(
    pods: Sequence[SglangPod], current: sglang.SglangSettings | None
) -> pod_summary.Serving:
    """The service's serving state from its SGLang pods (:func:`engine_pods.compute_engine_serving`)."""
    return engine_pods.compute_engine_serving(SGLANG, pods, current)
