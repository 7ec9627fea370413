"""The EngineTuner's closed loop beyond crashes: the metrics of the pods that run the recommendation (from
the InferenceService loop's shared per-tick snapshot), and probation and rollback of a retune; with the
in-memory API of test_enginetuner, the real planner and the real policy."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import kopf
import pytest
from closed_loop_fakes import window
from test_enginetuner import (
    CUDA_OOM,
    NS,
    PS_COMMAND,
    FakeTargetKube,
    compact,
    crashed,
    deployment,
    pod_of,
    tuner,
)

from kvpilot.operator import api
from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.enginetuner import target_deps, target_handlers
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.status import status_patch, tuner_status
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner.loop import ObservationWindow
from kvpilot.tuner.vllm import command as vllm_command

T0 = 1.8e9
URL = "http://prometheus:9090"
PACE = LoopPace(min_change_interval_seconds=0.0, probation_seconds=60.0)


class Windows:
    """``TargetDeps.fetch_window``: a canned window, and what each call asked for."""

    def __init__(self) -> None:
        self.window: ObservationWindow | None = None
        self.calls: list[dict[str, Any]] = []

    async def __call__(
        self, prom: Any, namespace: str, name: str, now: float, **kw: Any
    ) -> ObservationWindow:
        self.calls.append({"namespace": namespace, "name": name, **kw})
        return self.window or ObservationWindow.unavailable("no window set", now)


async def run(
    body: dict[str, Any],
    kube: FakeTargetKube,
    now: float,
    fetch: Any,
    emitter: RecordingEmitter | None = None,
) -> RecordingEmitter:
    emitter = emitter or RecordingEmitter()
    patch = kopf.Patch()
    deps = target_deps.TargetDeps(
        kube=kube, emit=emitter, clock=lambda: now, prom=URL, pace=PACE, fetch_window=fetch
    )
    await target_handlers.reconcile(
        body=body,
        spec=body["spec"],
        meta=body["metadata"],
        status=body["status"],
        patch=patch,
        logger=logging.getLogger("test"),
        deps=deps,
    )
    for key, value in (patch.get("status") or {}).items():
        if value is None:
            body["status"].pop(key, None)
        else:
            body["status"][key] = value
    for fn in patch.fns:
        fn(body)
    return emitter


def running(
    kube: FakeTargetKube, name: str, settings: dict[str, Any] | None, *, started: float
) -> dict[str, Any]:
    """A Ready pod of the target whose vLLM runs ``settings`` (the recommendation, as the webhook or the
    owner put it there), or the owner's command line (``None``)."""
    pod = pod_of(kube.workloads[(NS, "Deployment", "llama")], name)
    if settings is not None:
        (c,) = pod["spec"]["containers"]
        found = vllm_command.find_vllm_command(c["command"], ())
        assert found is not None
        c["command"], _ = vllm_command.rewrite_tuned_flags(
            c["command"], [], found, api.Settings.model_validate(settings).to_engine()
        )
    pod["status"]["startTime"] = status_patch.format_time(started)
    pod["status"]["conditions"][0]["lastTransitionTime"] = status_patch.format_time(started + 30)
    return pod


def pressure(now: float) -> ObservationWindow:
    """Sustained KV usage at 0.97 with preemptions, every sequence slot busy."""
    return window(now, kv=0.97, preempt=0.5, running=64.0, waiting=20.0)


def history(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["action"], h["trigger"]) for h in body["status"].get("history") or ()]


def cond(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in body["status"].get("conditions") or () if c["type"] == type_), {})


@pytest.fixture
def kube() -> FakeTargetKube:
    k = FakeTargetKube()
    k.workloads[(NS, "Deployment", "llama")] = deployment("llama", PS_COMMAND)
    k.pods = [running(k, "owners", None, started=T0 - 3600)]
    return k


async def test_kv_pressure_on_the_pods_running_it_lowers_the_recommendation(kube: FakeTargetKube) -> None:
    windows = Windows()
    kube.workloads[(NS, "Deployment", "llama")]["spec"]["replicas"] = 2
    body = tuner("Initial")
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    await run(body, kube, T0 + 30, windows)
    assert windows.calls == []  # no pod runs the recommendation: nothing is asked of Prometheus
    assert cond(body, "MetricsAvailable")["reason"] == tuner_status.NOT_RUNNING_REASON

    # a new pod carries it (the webhook), next to the owner's old one; they are under KV pressure
    kube.pods.append(running(kube, "tuned", planned, started=T0 + 10))
    windows.window = pressure(T0 + 1000)
    emitter = await run(body, kube, T0 + 1000, windows)
    (call,) = windows.calls
    # only the pod that runs the recommendation, with the closed loop's window, step and snapshot age
    assert (call["namespace"], call["name"], call["pods"]) == (NS, "llama", ("tuned",))
    assert (call["window_seconds"], call["step_seconds"], call["max_age_seconds"]) == (300.0, 30.0, 30.0)
    st = body["status"]
    assert history(body) == [("Planned", "Discovered"), ("Retuned", "KvPressure")]
    lowered = st["recommendation"]["settings"]
    assert lowered != planned and st["recommendation"]["trigger"] == "KvPressure"
    last = st["history"][-1]
    assert compact(last["from"]) == compact(planned) and compact(last["to"]) == compact(lowered)
    assert "failedSettings" not in st  # pressure is not a failure
    assert compact(st["rollout"]["settings"]) == compact(lowered) and st["rollout"]["phase"] == "RollingOut"
    assert cond(body, "MetricsAvailable")["status"] == "True"
    assert "Retuned" in emitter.reasons and "Recommended" in emitter.reasons

    # the same pressure a tick later changes nothing more: the pods do not run the new settings yet
    await run(body, kube, T0 + 1030, windows)
    assert body["status"]["recommendation"]["settings"] == lowered and len(history(body)) == 2


async def test_steady_metrics_hold_and_mark_the_recommendation_good(kube: FakeTargetKube) -> None:
    windows = Windows()
    body = tuner("Recommend")
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    kube.pods = [running(kube, "adopted", planned, started=T0 + 10)]  # the owner rolled the recommendation
    windows.window = window(T0 + 1000, kv=0.7)
    await run(body, kube, T0 + 1000, windows)
    st = body["status"]
    assert st["recommendation"]["settings"] == planned and history(body) == [("Planned", "Discovered")]
    assert compact(st["lastGoodSettings"]) == compact(planned)  # Ready and crash-free past probation
    assert cond(body, "MetricsAvailable")["reason"] == "MetricsFresh"


async def test_a_crash_on_probation_rolls_back_to_the_last_good_settings(kube: FakeTargetKube) -> None:
    windows = Windows()
    body = tuner("Initial")
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    kube.pods = [running(kube, "tuned", planned, started=T0 + 10)]
    windows.window = pressure(T0 + 1000)
    await run(body, kube, T0 + 1000, windows)
    lowered = body["status"]["recommendation"]["settings"]
    assert compact(body["status"]["lastGoodSettings"]) == compact(planned)

    # the owner's ReplicaSet replaces the pod; the webhook puts the lowered settings on the new one
    kube.pods = [running(kube, "lowered", lowered, started=T0 + 1100)]
    windows.window = window(T0 + 1200, kv=0.7)
    await run(body, kube, T0 + 1200, windows)
    rollout = body["status"]["rollout"]
    assert rollout["phase"] == "Probation" and rollout["probationUntil"] == status_patch.format_time(
        T0 + 1260
    )
    assert cond(body, "RolloutInProgress")["reason"] == "Probation"

    # it hits CUDA OOM on probation: back to the planned settings, the lowered ones never again
    kube.pods = [crashed(kube.pods[0], T0 + 1230, CUDA_OOM)]
    emitter = await run(body, kube, T0 + 1240, windows)
    st = body["status"]
    assert history(body)[-1] == ("RolledBack", "RolloutFailed")
    assert compact(st["recommendation"]["settings"]) == compact(planned)
    assert st["recommendation"]["trigger"] == "RolloutFailed"
    assert [compact(f) for f in st["failedSettings"]] == [compact(lowered)]
    assert compact(st["rollout"]["settings"]) == compact(planned)  # the way back is rolled out in turn
    assert "RolledBack" in emitter.reasons

    # once a pod of the planned settings passed probation, the rollout is over
    kube.pods = [running(kube, "back", planned, started=T0 + 1300)]
    windows.window = window(T0 + 1400, kv=0.7)
    await run(body, kube, T0 + 1400, windows)
    assert body["status"]["rollout"]["phase"] == "Probation"
    emitter = await run(body, kube, T0 + 1500, windows)
    assert "rollout" not in body["status"] and "RolloutSucceeded" in emitter.reasons
    assert history(body)[-1] == ("RolledBack", "RolloutFailed")


async def test_a_retune_nobody_rolls_out_is_pending_never_failed(kube: FakeTargetKube) -> None:
    windows = Windows()
    body = tuner("Recommend")
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    kube.pods = [running(kube, "adopted", planned, started=T0 + 10)]
    windows.window = pressure(T0 + 1000)
    await run(body, kube, T0 + 1000, windows)
    lowered = body["status"]["recommendation"]["settings"]
    assert lowered != planned
    # the owner keeps running the planned settings far past the rollout's deadline (900 s)
    for t in (T0 + 1500, T0 + 3000, T0 + 6000):
        windows.window = pressure(t)
        await run(body, kube, t, windows)
    st = body["status"]
    assert st["recommendation"]["settings"] == lowered and "failedSettings" not in st
    assert history(body) == [("Planned", "Discovered"), ("Retuned", "KvPressure")]
    assert cond(body, "MetricsAvailable")["reason"] == tuner_status.NOT_RUNNING_REASON
    assert cond(body, "RolloutInProgress")["reason"] == "Waiting"


async def test_the_slo_of_spec_serving_acts_on_the_target(kube: FakeTargetKube) -> None:
    windows = Windows()
    body = tuner("Initial", serving={"slo": {"ttftP95Seconds": 0.5}})
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    kube.pods = [running(kube, "tuned", planned, started=T0 + 10)]
    slow = window(T0 + 1000, kv=0.6, preempt=0.0, running=3.0, waiting=30.0)
    windows.window = ObservationWindow(
        slow.start,
        slow.end,
        tuple(s.__class__(**{**_fields(s), "ttft_p95": 4.0}) for s in slow.samples),
        slow.prompt_tokens,
        slow.generation_tokens,
        pods=1,
    )
    await run(body, kube, T0 + 1000, windows)
    assert history(body)[-1][1] == "LatencySlo", body["status"]["history"]


def _fields(sample: Any) -> dict[str, Any]:
    return {f: getattr(sample, f) for f in sample.__slots__}


# --- the shared snapshot: no query per target ------------------------------------------------------


class FleetProm:
    """A ``PromClient`` answering every query with one series per (namespace, pod), recording the queries."""

    def __init__(self, pods: Sequence[tuple[str, str]], kv: float) -> None:
        self.pods, self.kv, self.queries = list(pods), kv, []  # type: ignore[var-annotated]

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.queries.append(query)
        t = float((params or {}).get("time", T0))
        if "timestamp(" in query:
            return [{"metric": {"namespace": ns, "pod": p}, "value": [t, str(t - 2)]} for ns, p in self.pods]
        return []

    def custom_query_range(
        self, query: str, start_time: Any, end_time: Any, step: str
    ) -> list[dict[str, Any]]:
        self.queries.append(query)
        start, end, dt = start_time.timestamp(), end_time.timestamp(), float(step)
        times = [start + i * dt for i in range(int((end - start) // dt) + 1)]
        value = {"kv_cache_usage": self.kv, "preemptions": 0.5, "running": 64.0, "waiting": 20.0}
        v = next((x for k, x in value.items() if k in query), None)
        if v is None:
            return []
        return [
            {"metric": {"namespace": ns, "pod": p}, "values": [[t, str(v)] for t in times]}
            for ns, p in self.pods
        ]


async def test_every_target_and_service_of_a_tick_share_one_snapshot(kube: FakeTargetKube) -> None:
    """Three EngineTuners and an InferenceService in one tick: the queries of one tick, not one set each."""
    bodies, pods = [], []
    for i in range(3):
        name = f"llama{i}"
        kube.workloads[(NS, "Deployment", name)] = deployment(name, PS_COMMAND)
        body = tuner("Initial", target_name=name, gpu={"product": "NVIDIA-L4", "count": 1})
        body["metadata"]["name"] = name
        bodies.append(body)
    idle = Windows()
    for body in bodies:
        await run(body, kube, T0, idle)
    for i, body in enumerate(bodies):
        rec = body["status"]["recommendation"]["settings"]
        pod = running(kube, f"llama{i}-abc12-p", rec, started=T0 + 10)
        pod["metadata"]["labels"]["model"] = f"llama{i}"
        pod["metadata"]["ownerReferences"][0]["name"] = f"llama{i}-abc12"
        pods.append(pod)
    kube.pods = pods
    client = FleetProm([(NS, p["metadata"]["name"]) for p in pods] + [("other", "svc-0")], kv=0.97)
    # one factory object for every caller (the operator's is prometheus._default_client): one snapshot
    fetch = functools.partial(prometheus.fetch_observations, client_factory=lambda s: client)
    for body in bodies:
        await run(body, kube, T0 + 1000, fetch)
    # the InferenceService loop's own read in the same tick (closed_loop.run_once passes these)
    w = await fetch(
        PrometheusSettings(url=URL),
        "other",
        "svc",
        T0 + 1001,
        pods=("svc-0",),
        window_seconds=300.0,
        step_seconds=30.0,
        max_age_seconds=30.0,
    )
    assert w.available
    assert len(client.queries) == prometheus.QUERIES_PER_TICK
    assert not any("llama" in q for q in client.queries)  # no pod names in PromQL: the split is ours
    for body in bodies:  # each judged its own pod's series (pressure)
        assert history(body)[-1] == ("Retuned", "KvPressure"), body["status"].get("history")


async def test_the_plans_entry_outlives_a_full_history(kube: FakeTargetKube) -> None:
    """The history is the loop's memory of the plan: past 20 entries its Planned entry stays first, so the
    recommendation is not reset to the plan (and its failed settings) by holds piling up."""
    windows = Windows()
    body = tuner("Initial")
    await run(body, kube, T0, windows)
    planned = body["status"]["recommendation"]["settings"]
    held = {"action": "Held", "to": planned, "from": planned, "reason": "r"}
    body["status"]["history"] += [
        {**held, "time": status_patch.format_time(T0 + i), "trigger": f"T{i % 2}"} for i in range(19)
    ]
    kube.pods = [running(kube, "tuned", planned, started=T0 + 10)]
    windows.window = pressure(T0 + 1000)
    await run(body, kube, T0 + 1000, windows)
    entries = body["status"]["history"]
    assert len(entries) == 20 and entries[0]["action"] == "Planned" and entries[-1]["action"] == "Retuned"
    lowered = body["status"]["recommendation"]["settings"]
    assert lowered != planned
    await run(body, kube, T0 + 1030, windows)
    assert body["status"]["recommendation"]["settings"] == lowered
    assert [h["action"] for h in body["status"]["history"]].count("Planned") == 1
