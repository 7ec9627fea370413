"""The closed loop end to end without a cluster: fake reconciler + fake pods + canned metrics.

Each test first lets the (fake-planned) reconciler apply an InferenceService, then runs
the closed-loop tick the way kopf's timer would and checks the Deployment, the status
and the events.
"""

from __future__ import annotations

import copy
import logging
import re

import kopf
import pytest
from closed_loop_fakes import T0, LoopHarness, pod, rfc3339, window
from operator_fakes import Harness, condition, isvc

from kvpilot.operator.clients import metrics
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.inferenceservice import closed_loop, handlers, reconcile_deps
from kvpilot.operator.loop import loop_deps, loop_settings
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.pods import pod_reading
from kvpilot.tuner.loop import ObservationWindow
from kvpilot.tuner.loop.policy import Action, Trigger

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 140.75 MiB is free."
)
KV_TOO_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (10.53 GiB). Based on the available memory, "
    "the estimated maximum model length is 86240. Try increasing `gpu_memory_utilization`"
)


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.fixture
async def loop(harness: Harness) -> LoopHarness:
    return LoopHarness(harness)


async def applied(harness: Harness, **spec: object) -> dict:
    body = isvc(gpu={"count": 1, "product": "H100-SXM"}, **spec)
    await harness.run(body)
    return body


async def test_prometheus_down_holds_and_says_so(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    before = len(harness.kube.applied)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.METRICS_UNAVAILABLE)
    cond = condition(body, "MetricsAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "MetricsUnavailable")
    assert "connection refused" in cond["message"]
    assert len(harness.kube.applied) == before
    # nothing observed yet is no decision: the condition says it, no history entry, no event
    assert [h["action"] for h in body["status"]["history"]] == ["Planned"]
    assert "Held" not in harness.emitter.reasons
    await loop.tick(body)  # the same again: nothing to write
    assert harness.kube.take_status_patches("ns1", "llm") == []
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    assert condition(body, "MetricsAvailable")["status"] == "True"
    loop.window = None  # metrics that were there and went: a notable hold, recorded once
    await loop.tick(body)
    assert [h["action"] for h in body["status"]["history"]] == ["Planned", "Held"]
    await loop.tick(body)
    assert [h["action"] for h in body["status"]["history"]] == ["Planned", "Held"]
    assert harness.emitter.reasons.count("Held") == 1


async def test_a_wrong_prometheus_ca_is_its_own_reason_and_one_warning(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    message = "Prometheus query failed (https://p:9090): TLS verification failed: certificate verify failed"
    loop.window = ObservationWindow.unavailable(message, T0, "PrometheusTLSError")
    d = await loop.tick(body)
    assert d is not None and d.action == Action.HOLD
    cond = condition(body, "MetricsAvailable")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "PrometheusTLSError", message)
    warnings = [e for e in harness.emitter.events if e[1] == "PrometheusTLSError"]
    assert warnings == [("Warning", "PrometheusTLSError", message)]
    await loop.tick(body)  # still failing: no second event
    assert harness.emitter.reasons.count("PrometheusTLSError") == 1
    loop.window = ObservationWindow.unavailable("401", T0, "PrometheusUnauthorized")
    await loop.tick(body)  # a new cause: a new event
    assert harness.emitter.reasons.count("PrometheusUnauthorized") == 1
    loop.window = ObservationWindow.unavailable("no URL", T0, "PrometheusNotConfigured")
    await loop.tick(body)  # no Prometheus at all is a supported set-up: the condition says so, no Warning
    assert condition(body, "MetricsAvailable")["reason"] == "PrometheusNotConfigured"
    assert "PrometheusNotConfigured" not in harness.emitter.reasons


async def test_steady_marks_the_settings_good(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.STEADY)
    assert condition(body, "MetricsAvailable")["status"] == "True"
    assert body["status"]["lastGoodSettings"]["gpuMemoryUtilization"] == 0.95
    assert [h["action"] for h in body["status"]["history"]] == ["Planned"]


async def test_calibration_records_vllms_reported_capacity(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    loop.window = window(loop.now + 30, capacity=401_234, gmu=0.95)
    await loop.tick(body)
    assert body["status"]["calibration"] == {"observedKvCacheTokens": 401_234}
    loop.window = window(loop.now + 30, capacity=350_000, gmu=0.90)  # a report for other settings
    await loop.tick(body)
    assert body["status"]["calibration"] == {"observedKvCacheTokens": 401_234}


async def test_cuda_oom_lowers_utilisation_then_succeeds(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    old_args = loop.deployment_args()
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")
    args = loop.deployment_args()
    assert flag(args, "--gpu-memory-utilization") == "0.93"  # headroom 0.05 x 1.2 -> at least +0.02
    st = body["status"]
    assert st["applied"]["gpuMemoryUtilization"] == 0.93
    assert st["failedSettings"] == [{k: v for k, v in st["history"][-1]["from"].items()}]
    assert st["history"][-1]["action"] == "Retuned" and st["history"][-1]["trigger"] == "CudaOOM"
    assert st["rollout"]["settings"]["gpuMemoryUtilization"] == 0.93
    assert condition(body, "RolloutInProgress")["status"] == "True"
    assert {"Retuned", "OOMDetected"} <= set(harness.emitter.reasons)
    assert flag(old_args, "--gpu-memory-utilization") == "0.95"

    # the old pod is gone, the new one starts: waiting, then Ready
    loop.healthy_pods(ready=False)
    loop.window = None
    d = await loop.tick(body)
    assert d.trigger == Trigger.ROLLOUT_IN_PROGRESS
    loop.healthy_pods(ready=True)
    d = await loop.tick(body)
    assert (d.trigger, d.good) == (Trigger.ROLLOUT_PROBATION, None)  # Ready: on probation
    st = body["status"]
    assert (st["rollout"]["phase"], st["rollout"]["probationUntil"]) == ("Probation", rfc3339(loop.now + 300))
    assert condition(body, "RolloutInProgress")["reason"] == "Probation"
    assert "lastGoodSettings" not in st
    d = await loop.tick(body, advance=300)
    assert (d.trigger, d.good.gpu_memory_utilization) == (Trigger.ROLLOUT_SUCCEEDED, 0.93)
    assert "rollout" not in body["status"]
    assert body["status"]["lastGoodSettings"]["gpuMemoryUtilization"] == 0.93
    assert condition(body, "RolloutInProgress")["status"] == "False"
    assert "RolloutSucceeded" in harness.emitter.reasons


async def test_bad_new_settings_roll_back(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)  # steady: 0.95 / 64 seqs are good
    loop.window = window(loop.now + 30, kv=0.3, waiting=10, running=64, prompt=300, output=200)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY)
    assert flag(loop.deployment_args(), "--max-num-seqs") == "80"
    # the new pods crash at start-up
    loop.healthy_pods(
        ready=False, restarts=2, message="RuntimeError: boom", finished=loop.now + 20, crash_loop=True
    )
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    assert flag(loop.deployment_args(), "--max-num-seqs") == "64"
    st = body["status"]
    assert st["failedSettings"][-1]["maxNumSeqs"] == 80
    assert [h["action"] for h in st["history"]] == ["Planned", "Retuned", "RolledBack"]
    assert "RolledBack" in harness.emitter.reasons


async def test_rollout_deadline_rolls_back(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, tuning={"rolloutDeadlineSeconds": 300})
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    loop.window = window(loop.now + 30, kv=0.97, preempt=1.0, running=64, prompt=3000, output=1000)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.KV_PRESSURE)
    loop.healthy_pods(ready=False)  # scheduled and started, but never becomes Ready
    assert (await loop.tick(body, advance=200)).trigger == Trigger.ROLLOUT_IN_PROGRESS
    d = await loop.tick(body, advance=200)
    assert (d.action, d.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    # the configured 300 s, pushed out to 1.5x the predicted cold start of the 8B's ~15 GiB of weights
    # (30 s of download at 0.5 GiB/s + 180 s of load and engine start): issue 32's deadline rule
    assert "not Ready within 315s" in d.reason


async def test_an_unschedulable_surge_pod_never_marks_settings_failed(
    harness: Harness, loop: LoopHarness
) -> None:
    """Issue 10: on a full GPU pool the surge pod stays Pending; after the deadline the loop wrote the
    settings, which never ran, into failedSettings. Pending is not failure: the rollout waits, says why."""
    body = await applied(harness, tuning={"rolloutDeadlineSeconds": 300})
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    loop.window = window(loop.now + 30, kv=0.97, preempt=1.0, running=64, prompt=3000, output=1000)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.KV_PRESSURE)
    loop.healthy_pods(ready=False)
    for p in loop.pods.pods:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    assert (await loop.tick(body, advance=200)).trigger == Trigger.ROLLOUT_IN_PROGRESS  # before the deadline
    for _ in range(3):  # past it, and on: never a failure while the pods cannot start
        d = await loop.tick(body, advance=200)
        assert (d.action, d.trigger, d.failed) == (Action.HOLD, Trigger.ROLLOUT_PENDING, None), d
    assert not body["status"].get("failedSettings")
    assert body["status"]["rollout"] is not None
    assert condition(body, "Ready")["reason"] == "Unschedulable"
    assert any(e[1] == "Held" and "free GPU" in e[2] for e in harness.emitter.events)


async def test_operator_restart_mid_rollout_carries_on(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False)
    await loop.tick(body)
    assert "rollout" in body["status"]
    loop.deps = loop.new_deps()  # a new operator process: nothing in memory, the status is all there is
    loop_deps._deps = None
    loop.healthy_pods(ready=True)
    d = await loop.tick(body)
    assert d.trigger == Trigger.ROLLOUT_PROBATION
    loop.deps = loop.new_deps()  # and again, on probation
    assert (await loop.tick(body, advance=150)).trigger == Trigger.ROLLOUT_PROBATION
    d = await loop.tick(body, advance=150)
    assert d.trigger == Trigger.ROLLOUT_SUCCEEDED
    assert body["status"]["lastGoodSettings"]["gpuMemoryUtilization"] == 0.93


async def _raise_on_probation(harness: Harness, loop: LoopHarness) -> dict:
    """64 seqs are good; the idle rule raises them to 80, and 80 passes readiness: on probation."""
    body = await applied(harness)
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)  # steady: 0.95 / 64 seqs are good
    assert body["status"]["lastGoodSettings"]["maxNumSeqs"] == 64
    loop.window = window(loop.now + 30, kv=0.3, waiting=10, running=64, prompt=300, output=200)
    assert (await loop.tick(body)).trigger == Trigger.IDLE_CAPACITY
    loop.healthy_pods(ready=True)
    assert (await loop.tick(body)).trigger == Trigger.ROLLOUT_PROBATION
    assert body["status"]["rollout"]["phase"] == "Probation"
    return body


@pytest.mark.parametrize("restart_operator", [False, True])
async def test_crash_on_probation_rolls_back(
    harness: Harness, loop: LoopHarness, restart_operator: bool
) -> None:
    """The fleet's bug: a raise passes readiness, then CUDA OOM: back to the known-good 64, 80 failed."""
    body = await _raise_on_probation(harness, loop)
    if restart_operator:
        loop.deps = loop.new_deps()
        loop_deps._deps = None
    # the new pod OOMs at the first real batch, seconds after Ready
    loop.healthy_pods(ready=False, restarts=1, message=OOM, finished=loop.now + 5)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    assert "probation" in d.reason and "CudaOOM" in d.reason
    assert flag(loop.deployment_args(), "--max-num-seqs") == "64"
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.95"  # no utilisation walk
    st = body["status"]
    assert st["failedSettings"][-1]["maxNumSeqs"] == 80
    assert st["lastGoodSettings"]["maxNumSeqs"] == 64
    assert (st["rollout"]["phase"], st["rollout"]["settings"]["maxNumSeqs"]) == ("RollingOut", 64)
    assert "probationUntil" not in st["rollout"]
    assert [h["action"] for h in st["history"]] == ["Planned", "Retuned", "RolledBack"]
    assert "RolledBack" in harness.emitter.reasons


async def test_crash_after_probation_is_a_new_problem(harness: Harness, loop: LoopHarness) -> None:
    body = await _raise_on_probation(harness, loop)
    loop.window = None
    assert (await loop.tick(body, advance=300)).trigger == Trigger.ROLLOUT_SUCCEEDED
    assert body["status"]["lastGoodSettings"]["maxNumSeqs"] == 80
    loop.healthy_pods(ready=False, restarts=1, message=OOM, finished=loop.now + 5)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")  # the normal remedy
    assert flag(loop.deployment_args(), "--max-num-seqs") == "80"


async def test_start_up_kv_failure_shortens_the_context(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, serving={"maxContextLength": 131072, "minContextLength": 8192})
    assert flag(loop.deployment_args(), "--max-model-len") == "131072"
    loop.healthy_pods(restarts=3, message=KV_TOO_SMALL, finished=loop.now + 5, ready=False, crash_loop=True)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, "KvCacheTooSmall")
    assert flag(loop.deployment_args(), "--max-model-len") == "84480"


async def test_start_up_kv_failure_below_the_minimum_is_infeasible(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness, serving={"maxContextLength": 131072, "minContextLength": 100000})
    before = len(harness.kube.applied)
    loop.healthy_pods(restarts=3, message=KV_TOO_SMALL, finished=loop.now + 5, ready=False, crash_loop=True)
    d = await loop.tick(body)
    assert d.action == Action.INFEASIBLE
    assert len(harness.kube.applied) == before
    cond = condition(body, "Infeasible")
    assert (cond["status"], cond["reason"]) == ("True", "KvCacheTooSmall")
    assert "max-model-len <= 84480" in cond["message"]
    assert body["status"]["history"][-1]["action"] == "Infeasible"


async def test_termination_message_empty_reads_the_previous_log(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(restarts=1, message="", finished=loop.now + 10, ready=False)
    loop.pods.logs = {p["metadata"]["name"]: "INFO loading\n" + OOM for p in loop.pods.pods}
    d = await loop.tick(body)
    assert d.trigger == "CudaOOM"
    assert loop.pods.log_reads == 1
    pod_reading.LOGS.clear()


async def test_previous_log_is_read_once_per_restart(harness: Harness, loop: LoopHarness) -> None:
    """Exit code 0 after a run-time engine death: the message is the shutdown, the cause is in the log."""
    body = await applied(harness, tuning={"mode": "Recommend"})
    loop.healthy_pods(
        restarts=1,
        message="INFO: Shutting down\nINFO: Finished server process [1]",
        reason="Completed",
        exit_code=0,
        finished=loop.now + 10,
        ready=False,
    )
    for p in loop.pods.pods:
        loop.pods.logs[p["metadata"]["name"]] = "ERROR EngineCore encountered a fatal error.\n" + OOM
    pod_reading.LOGS.clear()
    assert (await loop.tick(body)).trigger == "CudaOOM"
    assert (await loop.tick(body)).trigger == "CudaOOM"
    assert loop.pods.log_reads == 1
    pod_reading.LOGS.clear()


async def test_host_oom_holds_with_advice(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(restarts=1, reason="OOMKilled", exit_code=137, finished=loop.now + 10, ready=False)
    before = len(harness.kube.applied)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.HOLD, "HostOOMKilled")
    assert "memory limit" in d.reason
    assert len(harness.kube.applied) == before
    assert {"Held", "OOMDetected"} <= set(harness.emitter.reasons)


async def test_recommend_mode_changes_nothing(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, tuning={"mode": "Recommend"}, engine={"pinned": {"maxNumSeqs": 64}})
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.3, waiting=10, running=64, prompt=300, output=200)
    before = len(harness.kube.applied)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY)
    assert len(harness.kube.applied) == before
    st = body["status"]
    assert st["recommendation"]["settings"]["maxNumSeqs"] == 80
    assert st["recommendation"]["trigger"] == "IdleCapacity"
    assert "rollout" not in st and st["applied"]["maxNumSeqs"] == 64
    assert [h["action"] for h in st["history"]] == ["Planned"]
    assert "Recommended" in harness.emitter.reasons
    await loop.tick(body)
    assert harness.emitter.reasons.count("Recommended") == 2  # one from the reconciler, one from the loop


async def test_off_mode_and_unapplied_services_are_skipped(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, tuning={"mode": "Off"})
    assert await loop.tick(body) is None
    assert loop.fetches == 0
    fresh = isvc()
    assert await loop.tick(fresh) is None


async def test_old_replica_set_pods_are_not_evidence(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    old_args = [a if a != "0.95" else "0.97" for a in loop.deployment_args()]
    loop.healthy_pods()
    loop.pods.pods.append(
        pod("llm-old-00000", old_args, restarts=4, message=OOM, finished=loop.now, ready=False)
    )
    loop.window = window(loop.now + 30)
    d = await loop.tick(body)
    assert d.trigger == Trigger.STEADY
    assert "lastGoodSettings" not in body["status"]  # an old pod remains: not all replicas run the settings


async def test_a_foreign_pod_is_never_evidence(harness: Harness, loop: LoopHarness) -> None:
    """Issue 16: another app's pod, named like the service's and running its very args, OOM-looping, became
    the service's worst-pod evidence. Only pods whose ReplicaSet the Deployment owns count."""
    body = await applied(harness)
    loop.healthy_pods()
    foreign = pod("llm-5d8f7c-zzzzz", loop.deployment_args(), restarts=4, message=OOM, finished=loop.now)
    foreign["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "intruder-5d8f7c", "controller": True}
    ]
    bare = pod("llm-5d8f7c-yyyyy", loop.deployment_args(), restarts=4, message=OOM, finished=loop.now)
    del bare["metadata"]["ownerReferences"]
    loop.pods.pods += [foreign, bare]
    loop.window = window(loop.now + 30)
    d = await loop.tick(body)
    assert d is not None and d.trigger == Trigger.STEADY, d
    assert "failedSettings" not in body["status"] or not body["status"]["failedSettings"]


async def test_apply_failure_is_reported_and_retried(harness: Harness, loop: LoopHarness) -> None:
    from kvpilot.operator import errors

    body = await applied(harness)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False)
    old_args = loop.deployment_args()
    harness.kube.fail_apply = errors.ApplyFailed("HTTP 500")
    d = await loop.tick(body)
    assert d.action == Action.RETUNE
    assert "RetuneFailed" in harness.emitter.reasons
    # the change was recorded first (one PATCH), the Deployment did not take it
    assert body["status"]["applied"]["gpuMemoryUtilization"] == 0.93
    assert body["status"]["rollout"]["settings"]["gpuMemoryUtilization"] == 0.93
    assert loop.deployment_args() == old_args
    harness.kube.fail_apply = None
    await loop.tick(body)  # the next tick applies the recorded change; no second decision
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.93"
    assert [h["action"] for h in body["status"]["history"]] == ["Planned", "Retuned"]
    assert harness.emitter.reasons.count("Retuned") == 1


def test_window_scales_with_the_metrics_step() -> None:
    from kvpilot.operator.inferenceservice import desired

    tuning = {"cooldownSeconds": 0, "maxChangesPerHour": 9}
    spec = desired.parse_spec({"model": {"id": "m"}, "tuning": tuning})
    p = loop_settings.build_policy(spec, LoopPace(step_seconds=5.0))
    assert (p.window_seconds, p.staleness_seconds, p.cooldown_seconds, p.max_changes_per_hour) == (
        50,
        60,
        0,
        9,
    )
    assert loop_settings.build_policy(spec).window_seconds == 300
    assert loop_settings.pace_from_env({"KVPILOT_METRICS_STEP_SECONDS": "5"}).step_seconds == 5.0


def test_interval_from_env() -> None:
    assert loop_settings.interval_from_env({}) == 30.0
    assert loop_settings.interval_from_env({"KVPILOT_CLOSED_LOOP_INTERVAL": "2"}) == 2.0
    assert loop_settings.interval_from_env({"KVPILOT_CLOSED_LOOP_INTERVAL": ""}) == 30.0


def test_pace_from_env() -> None:
    from kvpilot.operator.inferenceservice import desired

    assert loop_settings.pace_from_env({}) == LoopPace()
    pace = loop_settings.pace_from_env(
        {
            "KVPILOT_METRICS_STEP_SECONDS": "5",
            "KVPILOT_MIN_CHANGE_INTERVAL": "10",
            "KVPILOT_METRICS_WINDOW_SECONDS": "30",
            "KVPILOT_MIN_SAMPLES": "3",
            "KVPILOT_PROBATION_SECONDS": "0",
        }
    )
    spec = desired.parse_spec({"model": {"id": "m"}})
    p = loop_settings.build_policy(spec, pace)
    assert (p.window_seconds, p.min_change_interval_seconds, p.min_samples, p.probation_seconds) == (
        30,
        10,
        3,
        0,
    )
    d = loop_settings.build_policy(spec)
    assert (d.window_seconds, d.min_change_interval_seconds, d.min_samples, d.probation_seconds) == (
        300,
        60,
        5,
        300,
    )


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (
            {"KVPILOT_CLOSED_LOOP_INTERVAL": "x"},
            "KVPILOT_CLOSED_LOOP_INTERVAL='x': expected a number of seconds > 0",
        ),
        ({"KVPILOT_METRICS_STEP_SECONDS": "0"}, "KVPILOT_METRICS_STEP_SECONDS='0'"),
        ({"KVPILOT_MIN_CHANGE_INTERVAL": "-1"}, "expected a number of seconds >= 0"),
        ({"KVPILOT_MIN_SAMPLES": "2.5"}, "KVPILOT_MIN_SAMPLES='2.5': expected an integer >= 1"),
        ({"KVPILOT_MIN_SAMPLES": "0"}, "expected an integer >= 1"),
        ({"KVPILOT_PROBATION_SECONDS": "nan"}, "KVPILOT_PROBATION_SECONDS"),
        ({"KVPILOT_METRICS_WINDOW_SECONDS": "10", "KVPILOT_METRICS_STEP_SECONDS": "30"}, "shorter than one"),
    ],
)
def test_invalid_pace_is_a_clear_start_up_error(env: dict, words: str) -> None:
    with pytest.raises(loop_settings.LoopConfigError, match=re.escape(words)):
        loop_settings.pace_from_env(env)


def test_an_invalid_interval_stops_the_operator_at_import() -> None:
    """kopf needs the timer interval at registration: the one setting read at import."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KVPILOT_CLOSED_LOOP_INTERVAL": "soon"}
    run = subprocess.run(
        [sys.executable, "-c", "import kvpilot.operator.main"], env=env, capture_output=True, text=True
    )
    assert run.returncode != 0
    words = "LoopConfigError: KVPILOT_CLOSED_LOOP_INTERVAL='soon': expected a number of seconds > 0"
    assert words in run.stderr


def test_an_invalid_pace_stops_the_operator_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rest of the pace is read by the start-up handler; a bad value is a permanent start-up error."""
    import kopf

    from kvpilot.operator import main

    started: list[str] = []
    monkeypatch.setenv("KVPILOT_MIN_SAMPLES", "many")
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: started.append("metrics"))
    words = "KVPILOT_MIN_SAMPLES='many': expected an integer >= 1"
    with pytest.raises(kopf.PermanentError, match=re.escape(words)):
        main.configure(settings=kopf.OperatorSettings())
    assert started == []  # stopped before anything was started


def test_start_up_hands_the_pace_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    from kvpilot.operator import main

    monkeypatch.setenv("KVPILOT_METRICS_STEP_SECONDS", "5")
    monkeypatch.setenv("KVPILOT_PROBATION_SECONDS", "20")
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    monkeypatch.setattr(reconcile_deps, "configure", lambda owners: reconcile_deps.Deps(None, owners=owners))
    monkeypatch.setenv("KVPILOT_PROMETHEUS_URL", "https://prom.example:9090")
    monkeypatch.setenv("KVPILOT_PROMETHEUS_POD_LABEL", "kubernetes_pod_name")
    seen: list[tuple[LoopPace, PrometheusSettings]] = []
    monkeypatch.setattr(loop_deps, "configure", lambda pace, prom, owners: seen.append((pace, prom)))
    main.configure(settings=kopf.OperatorSettings())
    assert seen == [
        (
            LoopPace(step_seconds=5.0, probation_seconds=20.0),
            PrometheusSettings(url="https://prom.example:9090", pod_label="kubernetes_pod_name"),
        )
    ]
    monkeypatch.setenv("KVPILOT_PROMETHEUS_INSECURE_SKIP_VERIFY", "yes")
    with pytest.raises(kopf.PermanentError, match="INSECURE_SKIP_VERIFY"):  # stops at start-up, not mid-loop
        main.configure(settings=kopf.OperatorSettings())


def test_bounds_merge_serving_and_tuning_bounds() -> None:
    from kvpilot.operator.inferenceservice import desired

    spec = desired.parse_spec(
        {
            "model": {"id": "m"},
            "serving": {"minContextLength": 4096, "maxContextLength": 65536},
            "tuning": {
                "allowFp8KvCache": True,
                "bounds": {
                    "maxNumSeqs": {"min": 8, "max": 512},
                    "maxModelLen": {"min": 8192},
                    "gpuMemoryUtilization": {"min": 0.8, "max": 0.93},
                },
            },
        }
    )
    b = loop_settings.build_bounds(spec, fp8_supported=False)
    assert (b.min_max_num_seqs, b.max_max_num_seqs) == (8, 512)
    assert (b.min_max_model_len, b.max_max_model_len) == (8192, 65536)
    assert (b.min_gpu_memory_utilization, b.max_gpu_memory_utilization) == (0.8, 0.93)
    assert b.allow_fp8_kv is False
    assert loop_settings.build_bounds(spec, fp8_supported=True).allow_fp8_kv is True
    assert T0 > 0


def test_timer_is_registered_on_our_resource() -> None:
    import kopf

    from kvpilot.operator import main  # noqa: F401 -- registers everything

    spawning = kopf.get_default_registry()._spawning.get_all_handlers()
    timers = [h for h in spawning if h.fn is closed_loop.closed_loop_tick]
    assert len(timers) == 1
    assert timers[0].selector.group == "kvpilot.io" and timers[0].selector.plural == "inferenceservices"
    assert timers[0].interval == loop_settings.interval_from_env()


async def test_a_failing_tick_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    async def boom(**_: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(closed_loop, "run_once", boom)
    monkeypatch.setattr(closed_loop, "default_deps", lambda: None)
    with caplog.at_level(logging.ERROR):
        await closed_loop.closed_loop_tick(
            body={}, spec={}, meta={}, status={}, patch=None, logger=logging.getLogger("tick")
        )
    assert "tick failed" in caplog.text


async def test_a_spec_change_ends_a_stale_rollout(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False)
    await loop.tick(body)
    assert "rollout" in body["status"]
    body["spec"]["engine"] = {"pinned": {"maxNumSeqs": 32}}  # the user edits the spec: the reconciler replans
    body["metadata"]["generation"] = 2
    await harness.run(body, trigger="SpecChanged")
    assert body["status"]["applied"]["maxNumSeqs"] == 32
    loop.healthy_pods(ready=False)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.HOLD, Trigger.METRICS_UNAVAILABLE)  # no rollout to wait for
    assert "rollout" not in body["status"]
    assert condition(body, "RolloutInProgress")["status"] == "False"


async def test_state_survives_a_round_trip_through_status(harness: Harness, loop: LoopHarness) -> None:
    from kvpilot.operator.loop import loop_state

    body = await applied(harness)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False)
    d = await loop.tick(body)
    state = loop_state.build_loop_state(body["status"])
    assert state.current == d.settings
    assert state.failed == (d.failed,)
    assert state.rollout is not None and state.rollout.settings == d.settings
    assert state.rollout.deadline - state.rollout.started_at == 900
    assert [e.action for e in state.history] == ["Planned", "Retuned"]
    assert state.history[-1].from_settings == d.failed and state.history[-1].to_settings == d.settings
    budget = loop_state.read_budget(body["status"])
    assert budget is not None and budget.kv_cache_tokens == 28672


async def test_recommend_mode_sees_a_queue_at_vllms_own_sequence_limit(
    harness: Harness, loop: LoopHarness
) -> None:
    """maxNumSeqs unpinned on an A100-80GB: vLLM runs 256 sequences (its default there, not the 1024 of an
    H100 of the same size); a queue at 256 is a reason to recommend more, not Steady."""
    body = isvc(gpu={"count": 1, "product": "A100-80GB"}, tuning={"mode": "Recommend"})
    await harness.run(body)
    assert "maxNumSeqs" not in body["status"]["applied"] or body["status"]["applied"]["maxNumSeqs"] is None
    assert flag(loop.deployment_args(), "--max-num-seqs") is None
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.3, running=256, waiting=40, prompt=200, output=100)
    before = len(harness.kube.applied)
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.RETUNE, Trigger.IDLE_CAPACITY), d.reason
    assert d.effective is not None and d.effective.max_num_seqs == 256
    st = body["status"]
    assert st["recommendation"]["trigger"] == "IdleCapacity"
    assert st["recommendation"]["settings"]["maxNumSeqs"] > 256
    assert len(harness.kube.applied) == before  # Recommend: nothing is applied
    assert "rollout" not in st


async def test_a_rollback_is_applied_even_when_the_planner_now_refuses_the_spec(
    harness: Harness, loop: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop applies the decision's settings as they are: no re-plan stands between it and a rollback."""
    from kvpilot.tuner import errors as tuner_errors
    from kvpilot.tuner import plan

    body = await applied(harness)
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)  # steady: 0.95 / 64 seqs are good
    loop.window = window(loop.now + 30, kv=0.3, waiting=10, running=64, prompt=300, output=200)
    assert (await loop.tick(body)).trigger == Trigger.IDLE_CAPACITY
    tp_before = flag(loop.deployment_args(), "--tensor-parallel-size")

    def refuse(*_: object, **__: object) -> object:
        raise tuner_errors.InfeasiblePlan("the planner now says no")

    monkeypatch.setattr(plan, "compute_plan", refuse)
    harness.deps.plan_fn = refuse
    loop.healthy_pods(
        ready=False, restarts=2, message="RuntimeError: boom", finished=loop.now + 20, crash_loop=True
    )
    d = await loop.tick(body)
    assert (d.action, d.trigger) == (Action.ROLLBACK, Trigger.ROLLOUT_FAILED)
    assert "RetuneFailed" not in harness.emitter.reasons
    args = loop.deployment_args()
    assert flag(args, "--max-num-seqs") == "64"
    assert flag(args, "--tensor-parallel-size") == tp_before
    assert body["status"]["applied"]["maxNumSeqs"] == 64
    assert body["status"]["rollout"]["settings"]["maxNumSeqs"] == 64


# --- Ready means serving ----------------------------------------------------------------------------------


async def test_a_serving_replica_makes_ready_serving(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(n=2)
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    st = body["status"]
    assert (st["replicas"], st["readyReplicas"]) == (2, 2)
    assert condition(body, "Available")["status"] == "True"
    assert condition(body, "Degraded")["status"] == "False"
    assert (condition(body, "Ready")["status"], condition(body, "Ready")["reason"]) == ("True", "Serving")


async def test_a_crash_looping_service_is_not_ready(harness: Harness, loop: LoopHarness) -> None:
    """Issue 10: a crash-looping service (serving nothing) showed Ready=True in kubectl get."""
    body = await applied(harness)
    loop.healthy_pods(restarts=5, reason="Error", message="RuntimeError: boom", ready=False, crash_loop=True)
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff"), ready
    assert "boom" in ready["message"]
    assert condition(body, "Degraded")["reason"] == "CrashLoopBackOff"
    assert body["status"]["readyReplicas"] == 0


async def test_a_pending_pod_is_unschedulable_not_a_failure(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness)
    loop.healthy_pods(ready=False)
    loop.pods.pods[0]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]
    loop.window = window(loop.now + 30)
    d = await loop.tick(body)
    assert condition(body, "Ready")["reason"] == "Unschedulable"
    assert d is not None and d.failed is None and not body["status"].get("failedSettings")


async def test_a_reconcile_failure_keeps_its_ready(harness: Harness, loop: LoopHarness) -> None:
    """The pods' view never overrides the reconciler's refusal, nor claims a generation it has not handled."""
    body = await applied(harness)
    for c in body["status"]["conditions"]:
        if c["type"] == "Ready":
            c.update(status="False", reason="InvalidSpec", message="bad")
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    assert condition(body, "Ready")["reason"] == "InvalidSpec"
    body2 = await applied(harness)
    body2["metadata"]["generation"] = (body2["metadata"].get("generation") or 1) + 1  # not reconciled yet
    before = dict(condition(body2, "Ready"))
    await loop.tick(body2)
    assert condition(body2, "Ready")["reason"] == before["reason"]


async def test_off_mode_still_reports_serving(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, tuning={"mode": "Off"})
    loop.healthy_pods()
    d = await loop.tick(body)
    assert d is None  # nothing decided in mode Off
    assert condition(body, "Available")["status"] == "True"
    assert body["status"]["readyReplicas"] == 1


# --- one writer per field: a tick that read the status before a spec update ------------------------------


async def test_a_tick_begun_before_a_spec_update_keeps_the_reconcilers_ready(
    harness: Harness, loop: LoopHarness
) -> None:
    """The tick read generation 1 at resourceVersion 1; the reconciler then handled generation 2 (Ready at 2,
    a history entry: resourceVersion 2). The tick's one PATCH carries the version it read, so the API server
    refuses it (409): nothing of the stale tick lands, nothing is applied, no event; the next tick, on the
    fresh object, serves generation 2."""
    body = await applied(harness)
    key = ("ns1", "llm")
    body["metadata"]["resourceVersion"] = harness.kube.versions[key] = "1"
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    body["metadata"]["resourceVersion"] = harness.kube.versions[key]  # what the watch brings
    ready = condition(body, "Ready")
    assert (ready["reason"], ready["observedGeneration"]) == ("Serving", 1)
    stale = copy.deepcopy(body)  # what the tick reads when it starts
    gen1_args = loop.deployment_args()
    # the spec changes and the reconciler handles it before the tick writes
    body["spec"]["engine"] = {"pinned": {"maxNumSeqs": 7}}
    body["metadata"]["generation"] = 2
    await harness.run(body, trigger=handlers.SPEC_CHANGED)
    version = str(int(harness.kube.versions[key]) + 1)  # the reconciler's write
    body["metadata"]["resourceVersion"] = harness.kube.versions[key] = version
    ready = condition(body, "Ready")
    assert (ready["reason"], ready["observedGeneration"]) == ("Applied", 2)
    reconciled = copy.deepcopy(body["status"])
    applies, events = len(harness.kube.applied), len(harness.emitter.events)
    loop.now += 30
    crashed = dict(restarts=1, message=OOM, finished=loop.now - 5, ready=False, crash_loop=True)
    loop.pods.pods = [pod("llm-5d8f7c-00000", gen1_args, **crashed)]  # generation 1's pod OOMs
    patch = kopf.Patch()
    d = await closed_loop.run_once(
        body=stale,
        spec=stale["spec"],
        meta=stale["metadata"],
        status=stale["status"],
        patch=patch,
        logger=logging.getLogger("test"),
        deps=loop.deps,
    )
    assert d is not None and d.action == Action.RETUNE  # decided on the stale read ...
    assert harness.kube.take_status_patches(*key) == [] and dict(patch) == {} and not patch.fns
    assert len(harness.kube.applied) == applies and len(harness.emitter.events) == events  # ... and dropped
    assert body["status"] == reconciled
    # the next tick, at generation 2: Ready follows the pods again
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    ready = condition(body, "Ready")
    assert (ready["reason"], ready["observedGeneration"]) == ("Serving", 2), ready


async def test_a_vanished_token_secret_is_a_condition_between_reconciles(
    harness: Harness, loop: LoopHarness
) -> None:
    """The reconciler ran once; the Hub config is cached. The Secret then goes: the next tick says so
    (ConfigResolved=False, ConfigNotFound, one Warning), and says so again when it is back."""
    from kvpilot.tuner.model import catalogue as models

    harness.hub_result = models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct")
    harness.kube.secrets[("ns1", "hf")] = {"token": "hf_x"}
    gated = {"id": "acme/gated", "source": "Hub", "hubTokenSecretRef": {"name": "hf"}}
    body = await applied(harness, model=gated)
    assert condition(body, "ConfigResolved")["status"] == "True"
    loop.healthy_pods()
    await loop.tick(body)
    assert condition(body, "ConfigResolved")["status"] == "True"
    del harness.kube.secrets[("ns1", "hf")]
    await loop.tick(body)
    cond = condition(body, "ConfigResolved")
    assert (cond["status"], cond["reason"]) == ("False", "ConfigNotFound") and "hf" in cond["message"]
    await loop.tick(body)
    assert harness.emitter.reasons.count("ConfigNotFound") == 1  # once, not once per tick
    harness.kube.secrets[("ns1", "hf")] = {"wrong-key": "hf_x"}  # the Secret is back, without the key
    await loop.tick(body)
    assert condition(body, "ConfigResolved")["reason"] == "ConfigNotFound"
    harness.kube.secrets[("ns1", "hf")] = {"token": "hf_x"}
    await loop.tick(body)
    assert (condition(body, "ConfigResolved")["status"], condition(body, "ConfigResolved")["reason"]) == (
        "True",
        "Resolved",
    )
    assert len(harness.hub_calls) == 1  # every tick was a cache hit


def test_bounds_keep_what_the_spec_pins() -> None:
    from kvpilot.operator.inferenceservice import desired
    from kvpilot.operator.planning import modes
    from kvpilot.tuner.types import EngineSettings

    spec = desired.parse_spec(
        {
            "model": {"id": "m"},
            "tuning": {"allowFp8KvCache": True},
            "engine": {"pinned": {"gpuMemoryUtilization": 0.95}, "extraArgs": ["--kv-cache-dtype", "auto"]},
        }
    )
    b = loop_settings.build_bounds(spec, fp8_supported=True, pinned=modes.compute_user_args(spec).pinned)
    assert b.clamp(EngineSettings(gpu_memory_utilization=0.9, max_num_seqs=8)).gpu_memory_utilization == 0.95
    assert b.allow_fp8_kv is False  # the KV dtype is pinned in extraArgs
