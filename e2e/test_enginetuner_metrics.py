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

An SGLang Deployment made outside kvpilot (``python3 -m sglang.launch_server``, SGLang's own defaults, on an
H100 KWOK node), an EngineTuner in mode Auto with the operator's admission webhook (the API server calls
it over TLS, as in test_enginetuner_webhook.py): the plan's flags are published, the owner's pod evicted
and its successor rewritten by SGLang's own rewrite; the fleet plays it as SGLang 0.5.23 with weights that
leave the plan's share a ~24K-token pool (test_sglang_loop.py's storm), long requests at a high rate fill
it, SGLang retracts, and the EngineTuner's loop retunes for ``KvPressure`` or ``KvBound`` from SGLang's series
(``Retuned``, ``toEngineArgs``); Auto evicts the pod running the old flags, the webhook puts the new ones on
its successor, which passes probation (``lastGoodEngineArgs``). The Deployment stays the owner's.

The same for a TGI Deployment (``text-generation-launcher`` in exec form, TGI's own defaults): the plan's
``--max-concurrent-requests`` 4 (``serving.concurrency``) is put on the owner's next pod by TGI's rewrite;
the fleet plays it as TGI 3.3.7 under test_tgi_loop.py's admission load (eight requests a second, the rest
answered 429) with the KV tokens nearly empty, and the loop raises the limit (``IdleCapacity``) from TGI's
series, its reason naming the 429 rate; Auto rolls the raise out the same way and it passes probation.
Both share the stack (:func:`webhook_stack`) and the waits.
"""

from __future__ import annotations

import contextlib
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
from e2e.fleet.testing import H100_8B
from e2e.prometheus import PrometheusServer
from e2e.targets import (
    FOREIGN_MANAGER,
    LLAMA,
    RESOURCE,
    ForeignController,
    Webhook,
    engine_tuner,
    foreign_deployment,
    get,
    install_crds,
    webhook_configuration,
)
from e2e.test_sglang_loop import PLANNED_FRACTION, _storm_truth
from e2e.waits import host_operator, wait_for
from kvpilot.operator.api import Settings
from kvpilot.operator.enginetuner import target
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.tuner import sglang, tgi
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


def _status(cluster: LocalCluster, ns: str, name: str = "llama") -> dict[str, Any]:
    return dict((get(cluster, RESOURCE, name, "-n", ns) or {}).get("status") or {})


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

        _assert_the_owners(cluster, ns, "llama", generation=3)  # its three generations
        assert foreign.failures == []
    finally:
        foreign.stop()


H100 = "NVIDIA-H100-80GB-HBM3"
SGLANG_ARGS = [
    "--model-path", LLAMA, "--host", "0.0.0.0", "--port", "30000", "--enable-metrics",
    "--context-length", "8192",
]  # fmt: skip
"""The owner's SGLang server: its own defaults for everything kvpilot tunes but the context."""
TGI_COMMAND = ["text-generation-launcher"]
TGI_ARGS = ["--model-id", LLAMA, "--hostname", "0.0.0.0", "--port", "80"]
"""The owner's TGI launcher: its own defaults for everything kvpilot tunes."""
ADMISSION = Workload(arrival_rate=8.0, prompt_tokens=500, output_tokens=200)
"""test_tgi_loop.py's admission case: the router at ``--max-concurrent-requests`` 4, the KV nearly empty."""


def h100_target(name: str, command: list[str], args: list[str], container: str, image: str) -> dict[str, Any]:
    """A Deployment another stack made that runs ``command + args`` (container ``container``) on one H100."""
    manifest = foreign_deployment(name, command, args)
    pod = manifest["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    (c,) = pod["containers"]
    c |= {"name": container, "image": image, "env": []}
    return manifest


def sglang_target(name: str) -> dict[str, Any]:
    """A Deployment another stack made that runs SGLang's server on one H100."""
    command = ["python3", "-m", "sglang.launch_server"]
    return h100_target(name, command, SGLANG_ARGS, "sglang", "lmsysorg/sglang:v0.5.23")


def tgi_target(name: str) -> dict[str, Any]:
    """A Deployment another stack made that runs TGI's launcher (exec form) on one H100."""
    image = "ghcr.io/huggingface/text-generation-inference:3.3.7"
    return h100_target(name, TGI_COMMAND, TGI_ARGS, "tgi", image)


@contextlib.contextmanager
def webhook_stack(
    cluster: LocalCluster, tmp_path: Path, prefix: str, label: str, scenario: Scenario
) -> Iterator[tuple[str, Fleet, Path]]:
    """A namespace ``prefix-*``, the operator with its admission webhook (the API server calls it over TLS),
    Prometheus, and the fleet playing the pods labelled ``model=label`` against ``scenario``."""
    install_crds(cluster)
    ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    webhook = Webhook.make(tmp_path / "webhook")
    mwc = webhook_configuration(f"kvpilot-e2e-{ns}", webhook.port, webhook.ca, ns)
    with (
        cluster.temporary_namespace(ns),
        PrometheusServer(tmp_path / "prometheus", scrape_interval="1s") as prom,
    ):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(mwc))
        fleet = Fleet(
            cluster.kubeconfig,
            prom.targets_file,
            namespaces=[ns],
            label_selector=f"model={label}",
            default_scenario=scenario,
            kubectl=cluster.kubectl_bin,
        )
        try:
            with fleet:
                env = {**closed_loop_env(prom.url), **webhook.env()}
                with host_operator(cluster, tmp_path / "kopf.log", f"{prefix}-*", env) as log:
                    wait_for(lambda: "Listening for webhooks at" in log.read_text(), 30, "the webhook")
                    yield ns, fleet, log
            assert fleet.errors == [], fleet.errors
        finally:
            cluster.kubectl("delete", "mutatingwebhookconfiguration", mwc["metadata"]["name"], check=False)


@pytest.fixture
def sglang_stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Fleet, Path]]:
    scenario = Scenario(truth=_storm_truth(PLANNED_FRACTION), workload=STORM)
    with webhook_stack(cluster, tmp_path, "kvtsg", "sg", scenario) as stack:
        yield stack


@pytest.fixture
def tgi_stack(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Fleet, Path]]:
    with webhook_stack(
        cluster, tmp_path, "kvttgi", "tgi", Scenario(truth=H100_8B, workload=ADMISSION)
    ) as stack:
        yield stack


def _live_pods(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = (get(cluster, "pods", "-n", ns, "-l", f"model={name}") or {}).get("items") or []
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _container_args(pod: dict[str, Any]) -> list[str]:
    (c,) = pod["spec"]["containers"]
    return [str(a) for a in c.get("args") or ()]


def _apply_auto_tuner(cluster: LocalCluster, ns: str, name: str, serving: dict[str, Any]) -> None:
    tuner = engine_tuner(name, "Auto")
    tuner["spec"] |= {"gpu": {"product": H100, "count": 1}, "serving": serving, "tuning": FAST}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(tuner))


def _wait_for_planned_pod(
    cluster: LocalCluster, ns: str, name: str, engine: str, container: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The status and the pod once the plan is published and a pod of the target runs it in ``container``:
    the owner's pod evicted, its successor rewritten by the webhook with ``engine``'s rewrite."""

    def planned_pod() -> Any:
        status = _status(cluster, ns, name)
        args = (status.get("recommendation") or {}).get("engineArgs")
        if not args:
            return None
        wanted = EngineArgs(engine, tuple(args))
        pods = [p for p in _live_pods(cluster, ns, name) if target.pod_carries(p, container, wanted)]
        return (status, pods[0]) if pods else None

    status, pod = wait_for(
        planned_pod, WAIT_S, f"{ns}/{name}: the owner's pod replaced by one running the plan"
    )
    assert status["discovered"]["engine"] == engine, status["discovered"]
    assert [h["action"] for h in status["history"]][:1] == ["Planned"]
    assert "kvpilot.io/tuned" in pod["metadata"]["annotations"]
    return status, pod


def _wait_for_retune(
    cluster: LocalCluster, ns: str, name: str, triggers: tuple[str, ...], log: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The status and the first ``Retuned`` entry once the loop retunes (for one of ``triggers``), published
    as the recommendation and the rollout's, and nothing applied or failed."""

    def retuned() -> Any:
        status = _status(cluster, ns, name)
        entries = [h for h in status.get("history") or () if h["action"] == "Retuned"]
        return status if entries else None

    status = wait_for(retuned, RETUNE_WAIT_S, f"{ns}/{name}: a metrics-driven retune")
    entry = next(h for h in status["history"] if h["action"] == "Retuned")
    assert entry["trigger"] in triggers, (status["history"], log.read_text()[-3000:])
    assert entry["toEngineArgs"] == status["recommendation"]["engineArgs"]
    assert status["rollout"]["engineArgs"] == entry["toEngineArgs"]
    assert "appliedEngineArgs" not in status and "failedEngineArgs" not in status
    return status, entry


def _wait_past_probation(
    cluster: LocalCluster, ns: str, name: str, engine: str, container: str, args: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Auto evicts the pod running the plan; its successor runs ``args`` in ``container`` and passes
    probation (``lastGoodEngineArgs``): the status and that pod."""

    def passed() -> Any:
        status = _status(cluster, ns, name)
        return status if status.get("lastGoodEngineArgs") == args else None

    status = wait_for(passed, RETUNE_WAIT_S, f"{ns}/{name}: the retune rolled out and past probation")
    (pod,) = _live_pods(cluster, ns, name)
    assert target.pod_carries(pod, container, EngineArgs(engine, tuple(args))), pod
    assert status["evictions"] >= 2
    return status, pod


def _assert_the_owners(cluster: LocalCluster, ns: str, name: str, generation: int) -> None:
    """The Deployment is the owner's alone: ``generation`` generations, no other writer."""
    deploy = get(cluster, "deployment", name, "-n", ns, "--show-managed-fields")
    assert deploy["metadata"]["generation"] == generation
    writers = {m["manager"] for m in deploy["metadata"]["managedFields"] if m.get("subresource") != "status"}
    assert writers == {FOREIGN_MANAGER}, deploy["metadata"]["managedFields"]


@pytest.mark.e2e
def test_auto_retunes_an_sglang_deployment_made_elsewhere_and_rolls_it_out(
    cluster: LocalCluster, sglang_stack: tuple[str, Fleet, Path]
) -> None:
    ns, fleet, log = sglang_stack
    foreign = ForeignController(cluster, ns, sglang_target("sg"))
    foreign.apply_once()
    foreign.start()
    try:
        _apply_auto_tuner(cluster, ns, "sg", {"maxContextLength": 8192})
        status, pod = _wait_for_planned_pod(cluster, ns, "sg", "SGLang", "sglang")
        planned = sglang.parse_sglang_args(status["recommendation"]["engineArgs"])
        runs = sglang.parse_sglang_args(_container_args(pod))
        assert runs.mem_fraction_static == planned.mem_fraction_static, (pod["spec"], planned)
        assert _container_args(pod)[:7] == SGLANG_ARGS[:7]  # the owner's flags stay

        fleet.wait_for(
            lambda: any((p["preemptions"] or 0) > 0 for p in fleet.pods(ns)),
            timeout=RETUNE_WAIT_S,
            what="SGLang retracting requests in the storm's pool",
        )
        # SGLang's admission reserves the running requests' outputs: the pool fills with a queue behind it
        # and few retractions, so KvBound (a queue behind a full pool) or KvPressure answers it
        status, entry = _wait_for_retune(cluster, ns, "sg", ("KvPressure", "KvBound"), log)
        new = sglang.parse_sglang_args(entry["toEngineArgs"])
        more_pool = (new.mem_fraction_static or 0) > (planned.mem_fraction_static or 0)
        fewer_running = new.max_running_requests is not None and (
            planned.max_running_requests is None or new.max_running_requests < planned.max_running_requests
        )
        assert more_pool or fewer_running, (planned, new)

        _, pod = _wait_past_probation(cluster, ns, "sg", "SGLang", "sglang", entry["toEngineArgs"])
        assert sglang.parse_sglang_args(_container_args(pod)).mem_fraction_static == new.mem_fraction_static

        _assert_the_owners(cluster, ns, "sg", generation=1)
        assert foreign.failures == []
    finally:
        foreign.stop()


@pytest.mark.e2e
def test_auto_retunes_a_tgi_deployment_made_elsewhere_and_rolls_it_out(
    cluster: LocalCluster, tgi_stack: tuple[str, Fleet, Path]
) -> None:
    ns, fleet, log = tgi_stack
    foreign = ForeignController(cluster, ns, tgi_target("tgi"))
    foreign.apply_once()
    foreign.start()
    try:
        _apply_auto_tuner(cluster, ns, "tgi", {"maxContextLength": 8192, "concurrency": 4})
        status, pod = _wait_for_planned_pod(cluster, ns, "tgi", "TGI", "tgi")
        planned = tgi.parse_tgi_args(status["recommendation"]["engineArgs"])
        assert planned.max_concurrent_requests == 4, planned  # serving.concurrency
        (c,) = pod["spec"]["containers"]
        assert c["command"] == TGI_COMMAND
        assert _container_args(pod)[: len(TGI_ARGS)] == TGI_ARGS  # the owner's flags stay
        assert tgi.parse_tgi_args(_container_args(pod)).max_concurrent_requests == 4

        fleet.wait_for(
            lambda: any(p["kind"] == "TGI" and (p["running"] or 0) >= 4 for p in fleet.pods(ns)),
            timeout=RETUNE_WAIT_S,
            what="TGI's router at --max-concurrent-requests 4",
        )
        status, entry = _wait_for_retune(cluster, ns, "tgi", ("IdleCapacity",), log)
        new = tgi.parse_tgi_args(entry["toEngineArgs"])
        assert (new.max_concurrent_requests or 0) > 4, (planned, new)
        assert "429s" in entry["reason"] and "/s on average" in entry["reason"], entry  # the 429 rate

        _, pod = _wait_past_probation(cluster, ns, "tgi", "TGI", "tgi", entry["toEngineArgs"])
        runs = tgi.parse_tgi_args(_container_args(pod))
        assert runs.max_concurrent_requests == new.max_concurrent_requests, (pod["spec"], new)

        _assert_the_owners(cluster, ns, "tgi", generation=1)
        assert foreign.failures == []
    finally:
        foreign.stop()
