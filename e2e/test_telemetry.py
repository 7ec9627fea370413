"""Latency SLOs and GPU memory telemetry on the real control plane, with the real Prometheus reading the
fleet's vLLM histograms and dcgm-exporter framebuffer gauges:

* ``itl``: an inter-token-latency objective the planned settings miss (long prompts prefilled in large
  chunks beside many decodes) is met by a ``LatencySlo`` retune (smaller prefill chunks or fewer
  sequences);
* ``leak``: memory outside vLLM's budget grows while serving (fragmentation, up to 7 GiB: more than the
  planned utilisation leaves); dcgm-exporter's free framebuffer falls, and kvpilot lowers the
  utilisation (``GpuMemoryPressure``) before the CUDA OOM.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.stack import Stack

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 60}
TRUTH = GroundTruth(
    gpu_memory_gib=79.11, non_kv_gib=20.0, kv_bytes_per_token=131072, startup_s=1.0, backoff_s=2.0
)
CASES: dict[str, tuple[dict[str, Any], GroundTruth, Workload]] = {
    "itl": (
        {"maxContextLength": 16384, "concurrency": 64, "slo": {"interTokenLatencyP95Seconds": 0.05}},
        TRUTH,
        Workload(arrival_rate=6.0, prompt_tokens=6000, output_tokens=300, time_scale=1.0),
    ),
    "leak": (
        {"maxContextLength": 8192, "concurrency": 16},
        dataclasses.replace(TRUTH, runtime_headroom_gib=1.0, fb_leak_gib_per_min=3.0, fb_leak_max_gib=6.0),
        Workload(arrival_rate=2.0, prompt_tokens=400, output_tokens=100, time_scale=1.0),
    ),
}


def _isvc(name: str, ns: str, serving: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"id": MODEL, "source": "Catalogue"},
            "gpu": {"count": 1, "product": H100},
            "serving": serving,
            "tuning": {"mode": "Auto", **FAST},
        },
    }


@pytest.fixture(scope="module")
def telemetry(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    ns = f"e2e-telemetry-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    stack = Stack(
        cluster,
        Path(tmp_path_factory.mktemp("telemetry")),
        namespaces=[ns],
        operator_namespaces=[ns],
        scenarios={
            (ns, n): Scenario(name=n, truth=t, workload=w, seed=i)
            for i, (n, (_, t, w)) in enumerate(CASES.items())
        },
    )
    stack.start()
    try:
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        cluster.apply([_isvc(n, ns, serving) for n, (serving, _, _) in CASES.items()])
        yield stack, ns
        assert stack.fleet is not None and not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([ns])


def _retuned(obj: dict[str, Any], trigger: str) -> list[dict[str, Any]]:
    history = obj.get("status", {}).get("history") or []
    return [h for h in history if h.get("action") == "Retuned" and h.get("trigger") == trigger]


def test_an_inter_token_latency_objective_is_met_by_a_retune(telemetry: tuple[Stack, str]) -> None:
    stack, ns = telemetry
    obj = stack.wait_isvc(
        ns, "itl", lambda o: _retuned(o, "LatencySlo"), timeout=240, what="a LatencySlo retune"
    )
    (first, *_) = _retuned(obj, "LatencySlo")
    before, after = first["from"], first["to"]
    assert "inter-token latency p95" in first["reason"]
    assert (after.get("maxNumBatchedTokens") or 8192) < (before.get("maxNumBatchedTokens") or 8192) or (
        after["maxNumSeqs"] < before["maxNumSeqs"]
    )


def test_falling_free_gpu_memory_lowers_utilisation_before_the_oom(telemetry: tuple[Stack, str]) -> None:
    stack, ns = telemetry
    obj = stack.wait_isvc(
        ns, "leak", lambda o: _retuned(o, "GpuMemoryPressure"), timeout=240, what="a GpuMemoryPressure retune"
    )
    (first, *_) = _retuned(obj, "GpuMemoryPressure")
    assert first["to"]["gpuMemoryUtilization"] < first["from"]["gpuMemoryUtilization"]
    assert "dcgm-exporter" in first["reason"]
    assert stack.fleet is not None
    ooms = [e for e in stack.fleet.events_for(ns, "CudaOOM") if e.pod.startswith("leak-")]
    assert not ooms, [e.detail[:80] for e in ooms]  # the warning came first: no pod died of it
