"""The per-service series the dashboard and the alert rules read (docs/observability.md): what the
reconciler and the closed loop export for one InferenceService, and that a deleted service's go."""

from __future__ import annotations

import dataclasses
import time

import pytest
from closed_loop_fakes import LoopHarness
from operator_fakes import Harness, isvc
from prometheus_client import REGISTRY

from kvpilot.operator.clients import metrics
from kvpilot.tuner.loop import LatencySlo, PolicyConfig
from kvpilot.tuner.types import EngineSettings

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 140.75 MiB is free."
)


def _value(name: str, namespace: str, service: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"namespace": namespace, "inferenceservice": service, **labels})


def test_record_service_exports_settings_band_and_slo() -> None:
    settings = EngineSettings(max_num_seqs=64, max_model_len=8192, gpu_memory_utilization=0.9)
    metrics.record_service("t1", "a", settings, PolicyConfig(), LatencySlo(ttft_p95_seconds=0.5))
    assert _value("kvpilot_applied_setting", "t1", "a", setting="max_num_seqs") == 64
    assert _value("kvpilot_applied_setting", "t1", "a", setting="gpu_memory_utilization") == 0.9
    assert _value("kvpilot_applied_setting", "t1", "a", setting="max_num_batched_tokens") is None  # unset
    assert _value("kvpilot_kv_usage_threshold", "t1", "a", threshold="high") == PolicyConfig().kv_usage_high
    assert _value("kvpilot_kv_usage_threshold", "t1", "a", threshold="low") == PolicyConfig().kv_usage_low
    assert _value("kvpilot_slo_seconds", "t1", "a", objective="ttft_p95") == 0.5
    assert _value("kvpilot_slo_seconds", "t1", "a", objective="itl_p95") is None

    # settings only (the reconciler): band and SLO kept; a setting no longer set is dropped
    metrics.record_service("t1", "a", dataclasses.replace(settings, max_num_seqs=None))
    assert _value("kvpilot_applied_setting", "t1", "a", setting="max_num_seqs") is None
    assert _value("kvpilot_slo_seconds", "t1", "a", objective="ttft_p95") == 0.5
    metrics.record_service("t1", "a", settings, slo=None)  # the SLO was removed from the spec
    assert _value("kvpilot_slo_seconds", "t1", "a", objective="ttft_p95") is None
    metrics.record_service("t1", "a", settings, held=True)
    assert _value("kvpilot_service_held", "t1", "a") == 1
    metrics.record_service("t1", "a", settings)  # the reconciler: the closed loop's verdict stays
    assert _value("kvpilot_service_held", "t1", "a") == 1
    metrics.record_service("t1", "a", settings, held=False)
    assert _value("kvpilot_service_held", "t1", "a") == 0


def test_service_decisions_and_forget_service() -> None:
    metrics.record_decision("Retuned", "t2", "b")
    metrics.record_decision("Retuned", "t2", "b")
    metrics.record_decision("Held", "t2", "other")
    metrics.record_service("t2", "b", EngineSettings(max_num_seqs=8), PolicyConfig(), held=True)
    assert _value("kvpilot_service_decisions_total", "t2", "b", kind="Retuned") == 2
    stamp = _value("kvpilot_service_last_decision_timestamp_seconds", "t2", "b", kind="Retuned")
    assert stamp is not None and abs(stamp - time.time()) < 60
    metrics.forget_service("t2", "b")
    assert _value("kvpilot_service_decisions_total", "t2", "b", kind="Retuned") is None
    assert _value("kvpilot_service_last_decision_timestamp_seconds", "t2", "b", kind="Retuned") is None
    assert _value("kvpilot_applied_setting", "t2", "b", setting="max_num_seqs") is None
    assert _value("kvpilot_kv_usage_threshold", "t2", "b", threshold="high") is None
    assert _value("kvpilot_service_held", "t2", "b") is None
    assert _value("kvpilot_service_decisions_total", "t2", "other", kind="Held") == 1  # others' stay
    metrics.forget_service("t2", "b")  # twice: nothing left, no error


def test_record_service_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="namespace and a name"):
        metrics.record_service("", "a", EngineSettings())
    with pytest.raises(ValueError, match="must be a number"):
        metrics.record_service("t3", "a", EngineSettings(), slo=LatencySlo(ttft_p95_seconds="fast"))  # type: ignore[arg-type]


async def test_the_reconciler_and_the_closed_loop_export_what_they_apply(harness: Harness) -> None:
    harness.deps = dataclasses.replace(harness.deps, record_metrics=True)
    body = isvc(gpu={"count": 1, "product": "H100-SXM"}, namespace="t4")
    await harness.run(body)
    planned = body["status"]["applied"]
    assert _value("kvpilot_applied_setting", "t4", "llm", setting="max_num_seqs") == planned["maxNumSeqs"]
    assert _value("kvpilot_service_decisions_total", "t4", "llm", kind="Planned") == 1

    loop = LoopHarness(harness)
    loop.deps = dataclasses.replace(loop.deps, record_metrics=True)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    await loop.tick(body)
    assert body["status"]["history"][-1]["action"] == "Retuned"
    assert _value("kvpilot_service_decisions_total", "t4", "llm", kind="Retuned") == 1
    retuned = body["status"]["applied"]["gpuMemoryUtilization"]
    assert _value("kvpilot_applied_setting", "t4", "llm", setting="gpu_memory_utilization") == retuned
    assert _value("kvpilot_kv_usage_threshold", "t4", "llm", threshold="high") == PolicyConfig().kv_usage_high
    assert _value("kvpilot_service_held", "t4", "llm") == 0  # a retune is no hold
