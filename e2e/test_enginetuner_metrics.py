"""The EngineTuner's closed loop on metrics: real control plane, real Prometheus, the fleet simulator.

A Deployment shaped like production-stack's (e2e/targets.py), owned by a stand-in foreign controller that
server-side-applies its spec every 2 s, runs on the L4 KWOK nodes; the fleet simulator (e2e/fleet) plays
its pods' vLLM (selected by the target's own label, not kvpilot's) against an L4 ground truth whose KV
cache holds 24 576 tokens at 0.90, under long requests at a high rate, and serves their metrics to the
real Prometheus, which the operator on the host reads (``KVPILOT_PROMETHEUS_URL``, the fast pace of
``e2e.fleet.stack.closed_loop_env``).

The EngineTuner (mode Recommend) recommends; while the owner's pods run their own settings, their metrics
judge nothing (``MetricsAvailable=False``, ``RecommendationNotRunning``) although they are under pressure
too. Then the owner adopts the recommendation (edits its spec: a second generation, its own write); its
new pod runs it, preempts under KV pressure, and the loop lowers the recommendation (a ``Retuned`` entry,
trigger ``KvPressure``) from the same per-tick Prometheus queries the InferenceServices use. The owner
adopts the lowered recommendation as well; its pod is Ready (probation) and then hits CUDA OOM (a fault
the fleet injects): the recommendation reverts to the last good one (``RolledBack``, the lowered settings
in ``failedSettings``). kvpilot never writes the Deployment.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import Fleet, GroundTruth, Scenario, Workload
from e2e.fleet.stack import closed_loop_env
from e2e.prometheus import PrometheusServer
from e2e.targets import (
    FOREIGN_MANAGER,
    LLAMA,
    RESOURCE,
    ForeignController,
    engine_tuner,
    foreign_deployment,
    get,
    install_crds,
)
from e2e.waits import host_operator, wait_for
from kvpilot.operator.api import Settings
from kvpilot.operator.enginetuner import target
from kvpilot.tuner.vllm import command as vllm_command

# what the owner runs before it adopts kvpilot's recommendation: starts on an L4, differs from the plan
OWNER_COMMAND = [
    "vllm",
    "serve",
    LLAMA,
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "8",
    "--gpu_memory_utilization",
    "0.85",
]
# an L4 as torch sees it, Llama-3.1-8B in bf16: 24 576 tokens of KV at 0.90 (kvpilot's model says ~30 900)
L4_8B = GroundTruth(
    gpu_memory_gib=21.96,
    non_kv_gib=round(0.90 * 21.96 - 24576 * 131072 / (1 << 30), 4),
    kv_bytes_per_token=131072,
    default_max_num_seqs=256,
    startup_s=1.0,
    backoff_s=3.0,
)
STORM = Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500, time_scale=4.0)
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
WAIT_S = 120.0
RETUNE_WAIT_S = 300.0


@pytest.fixture
def stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Fleet, Path]]:
    install_crds(cluster)
    ns = f"kvtmet-{uuid.uuid4().hex[:8]}"
    with (
        cluster.temporary_namespace(ns),
        PrometheusServer(tmp_path / "prometheus", scrape_interval="1s") as prom,
    ):
        scenario = Scenario(truth=L4_8B, workload=STORM)
        fleet = Fleet(
            cluster.kubeconfig,
            prom.targets_file,
            namespaces=[ns],
            label_selector="model=llama",
            default_scenario=scenario,
            kubectl=cluster.kubectl_bin,
        )
        with fleet:
            env = {**closed_loop_env(prom.url), "KVPILOT_TARGET_INTERVAL": "2"}
            with host_operator(cluster, tmp_path / "kopf.log", "kvtmet-*", env) as log:
                yield ns, fleet, log
        assert fleet.errors == [], fleet.errors


def _status(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return dict((get(cluster, RESOURCE, "llama", "-n", ns) or {}).get("status") or {})


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c["type"] == type_), {})


def _adopt(manifest: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with ``settings`` on its vLLM command line (the webhook's rewrite, done by the owner)."""
    adopted = copy.deepcopy(manifest)
    (c,) = adopted["spec"]["template"]["spec"]["containers"]
    found = vllm_command.find_vllm_command(c["command"], ())
    assert found is not None
    c["command"], _ = vllm_command.rewrite_tuned_flags(
        c["command"], [], found, Settings.model_validate(settings).to_engine()
    )
    return adopted


def _compact(settings: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (settings or {}).items() if v is not None}


@pytest.mark.e2e
def test_kv_pressure_on_the_targets_pods_lowers_the_recommendation(
    cluster: LocalCluster, stack: tuple[str, Fleet, Path]
) -> None:
    ns, fleet, log = stack
    manifest = foreign_deployment("llama", OWNER_COMMAND, None)
    foreign = ForeignController(cluster, ns, manifest)
    foreign.apply_once()
    foreign.start()
    try:
        tuner = engine_tuner("llama", "Recommend")
        tuner["spec"] |= {"serving": {"maxContextLength": 8192}, "tuning": FAST}
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(tuner))

        def recommended() -> Any:
            status = _status(cluster, ns)
            held = _condition(status, "MetricsAvailable").get("reason") == "RecommendationNotRunning"
            return status if (status.get("recommendation") or {}).get("settings") and held else None

        status = wait_for(recommended, WAIT_S, f"{ns}/llama: a recommendation, not yet run")
        planned = status["recommendation"]["settings"]
        assert planned["maxModelLen"] == 8192 and planned["maxNumSeqs"] > 8, planned
        # the owner's pod is under pressure too, but its settings are not the recommendation's
        wait_for(lambda: any(e.kind == "Serving" for e in fleet.events_for(ns)), WAIT_S, "the owner's pod")

        # the owner adopts the recommendation (its Helm values, say): its own write, a new ReplicaSet
        foreign.manifest = _adopt(manifest, planned)
        foreign.apply_once()

        def retuned() -> Any:
            status = _status(cluster, ns)
            entries = [h for h in status.get("history") or () if h["action"] == "Retuned"]
            return status if entries else None

        status = wait_for(retuned, RETUNE_WAIT_S, f"{ns}/llama: a metrics-driven retune")
        entry = next(h for h in status["history"] if h["action"] == "Retuned")
        assert entry["trigger"] == "KvPressure", (status["history"], log.read_text()[-3000:])
        assert _compact(entry["from"]) == _compact(planned)
        lowered = status["recommendation"]["settings"]
        assert status["recommendation"]["trigger"] == "KvPressure"
        assert lowered["maxNumSeqs"] < planned["maxNumSeqs"] or lowered.get("kvCacheDtype") == "fp8", lowered
        assert "failedSettings" not in status  # pressure is not a failure
        assert _compact(status["lastGoodSettings"]) == _compact(planned)  # Ready, crash-free past probation
        assert _compact(status["rollout"]["settings"]) == _compact(lowered)
        assert [h["action"] for h in status["history"]][:1] == ["Planned"]

        # the owner adopts the lowered one too; its pod is Ready (probation), then hits CUDA OOM
        foreign.manifest = _adopt(manifest, lowered)
        foreign.apply_once()

        def on_probation() -> bool:
            return (_status(cluster, ns).get("rollout") or {}).get("phase") == "Probation"

        wait_for(on_probation, WAIT_S, f"{ns}/llama: the lowered recommendation on probation")
        engine = Settings.model_validate(lowered).to_engine()
        pods = (get(cluster, "pods", "-n", ns, "-l", "model=llama") or {}).get("items") or []
        (pod,) = [p for p in pods if target.pod_carries(p, "vllm", engine)]
        wait_for(lambda: fleet.inject(ns, pod=pod["metadata"]["name"]), WAIT_S, "a CUDA OOM on probation")

        def rolled_back() -> Any:
            status = _status(cluster, ns)
            return status if any(h["action"] == "RolledBack" for h in status.get("history") or ()) else None

        status = wait_for(rolled_back, WAIT_S, f"{ns}/llama: the lowered recommendation rolled back")
        entry = next(h for h in status["history"] if h["action"] == "RolledBack")
        assert entry["trigger"] == "RolloutFailed" and "CudaOOM" in entry["reason"], status["history"]
        assert _compact(status["recommendation"]["settings"]) == _compact(planned)  # the last good settings
        assert [_compact(f) for f in status["failedSettings"]] == [_compact(lowered)]
        assert _compact(status["lastGoodSettings"]) == _compact(planned)

        # the Deployment is the owner's alone: its three generations, no other writer
        deploy = get(cluster, "deployment", "llama", "-n", ns, "--show-managed-fields")
        assert deploy["metadata"]["generation"] == 3
        writers = {
            m["manager"] for m in deploy["metadata"]["managedFields"] if m.get("subresource") != "status"
        }
        assert writers == {FOREIGN_MANAGER}, deploy["metadata"]["managedFields"]
        assert foreign.failures == []
    finally:
        foreign.stop()
