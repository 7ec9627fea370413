"""The EngineTuner's closed loop for SGLang and TGI targets: the shared engine loop (each engine's own rules,
rollout, probation, rollback) reading the target's pods, its memory in the EngineTuner's status.

Each case: a Deployment made outside kvpilot, an EngineTuner in Recommend or Auto, pods that run the
recommendation (the owner adopted it, or the webhook's own rewrite put it on Auto's replacements), and
either the pods' metrics in the engine's own series (a fake of the closed loop's per-tick snapshot) or a
crash in the engine's own words; with an in-memory API and the real planner and policies."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
from closed_loop_fakes import window
from test_enginetuner import NS, FakeTargetKube, cond
from test_enginetuner_engines import sglang_deployment, tgi_deployment

from kvpilot.operator.enginetuner import target_deps, target_engines, target_handlers, target_webhook
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import pod_status
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.operator.status.status_patch import format_time
from kvpilot.tuner import engines, sglang, tgi
from kvpilot.tuner.loop import ObservationWindow, PolicyConfig, sglang_fit, tgi_fit

T0 = 1.8e9
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


class Target:
    """A target, its pods, the metrics the snapshot gives its pods, and an EngineTuner reconciled on it."""

    def __init__(self, workload: dict[str, Any], container: str, mode: str, **spec: Any) -> None:
        pod_status.LOGS.clear()
        self.kube = FakeTargetKube()
        self.workload = workload
        self.name = workload["metadata"]["name"]
        self.container = container
        self.kube.workloads[(NS, "Deployment", self.name)] = workload
        self.now = T0
        self.window: ObservationWindow | None = None
        self.fetched: list[tuple[tuple[str, ...], Any]] = []
        self.emitter = RecordingEmitter()
        self.body = {
            "apiVersion": "kvpilot.io/v1alpha1",
            "kind": "EngineTuner",
            "metadata": {"name": "t", "namespace": NS, "generation": 1, "uid": "u1"},
            "spec": {"targetRef": {"kind": "Deployment", "name": self.name}, "updateMode": mode, **spec},
            "status": {},
        }
        self.owner_pods(2)

    async def fetch_window(self, *args: Any, pods: tuple[str, ...], series: Any = None, **kw: Any) -> Any:
        self.fetched.append((pods, series))
        return self.window or ObservationWindow.unavailable("none", self.now)

    async def run(self, advance: float = 30.0) -> None:
        self.now += advance
        patch = kopf.Patch()
        deps = target_deps.TargetDeps(
            kube=self.kube, emit=self.emitter, clock=lambda: self.now, fetch_window=self.fetch_window
        )
        await target_handlers.reconcile(
            body=self.body,
            spec=self.body["spec"],
            meta=self.body["metadata"],
            status=self.body["status"],
            patch=patch,
            logger=logging.getLogger("test"),
            deps=deps,
        )
        status = self.body["status"]
        for key, value in (patch.get("status") or {}).items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        for fn in patch.fns:
            fn(self.body)

    @property
    def status(self) -> dict[str, Any]:
        return self.body["status"]

    @property
    def recommended(self) -> list[str]:
        return list(self.status["recommendation"]["engineArgs"])

    def pod(self, name: str, containers: list[dict[str, Any]], **state: Any) -> dict[str, Any]:
        """A pod of the target running ``containers``: Ready unless said, created ``age`` seconds ago, its
        last restart ``message`` (a crash) at ``finished``."""
        ready, restarts = state.get("ready", True), int(state.get("restarts", 0))
        status: dict[str, Any] = {
            "name": self.container,
            "ready": ready,
            "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}} if state.get("crash") else {"running": {}},
        }
        if restarts:
            status["lastState"] = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": state.get("message", ""),
                    "finishedAt": format_time(state.get("finished", self.now)),
                }
            }
        labels = self.workload["spec"]["template"]["metadata"]["labels"]
        return {
            "metadata": {
                "name": name,
                "namespace": NS,
                "creationTimestamp": format_time(self.now - state.get("age", 600.0)),
                "labels": {**labels, "pod-template-hash": "abc12"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": f"{self.name}-abc12", "controller": True}],
            },
            "spec": {"containers": containers, "nodeName": "l4-0"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [status],
            },
        }

    def template(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.workload["spec"]["template"]["spec"]["containers"])

    def owner_pods(self, n: int, **state: Any) -> None:
        """Pods with the owner's flags."""
        self.kube.pods = [self.pod(f"{self.name}-abc12-o{i}", self.template(), **state) for i in range(n)]

    def tuned_pods(self, n: int = 2, args: list[str] | None = None, **state: Any) -> None:
        """Pods running ``args`` (the recommendation by default) as the webhook's rewrite puts them on a new
        pod: the owner's adopted recommendation, or Auto's replacements."""
        kind = self.status["discovered"]["engine"]
        wanted = EngineArgs(kind, tuple(args if args is not None else self.recommended))
        containers = self.template()
        (c,) = containers
        rewritten = target_engines.rewrite_container(c, wanted)
        assert rewritten is not None
        self.kube.pods = [self.pod(f"{self.name}-abc12-t{i}", [rewritten], **state) for i in range(n)]
        self.workload["spec"]["replicas"] = n  # the Deployment's count, as its pods run it (a count that
        # differs is a replica change, which holds metrics-driven retunes)


def history(t: Target) -> list[tuple[str, str]]:
    return [(e["action"], e["trigger"]) for e in t.status.get("history") or ()]


def _sglang_runs(args: list[str]) -> sglang.SglangSettings:
    return sglang.parse_sglang_args(args)


def _tgi_runs(args: list[str]) -> tgi.TgiSettings:
    return tgi.parse_tgi_args(args)


# --- SGLang ------------------------------------------------------------------------------------------------


async def test_recommend_retunes_an_sglang_target_from_its_metrics_once_the_owner_runs_the_plan() -> None:
    t = Target(sglang_deployment(), "vllm", "Recommend", serving={"maxContextLength": 16384})
    await t.run()
    planned = t.recommended
    assert history(t) == [("Planned", "Discovered")]
    assert t.status["history"][0]["toEngineArgs"] == planned
    assert t.status["history"][0]["fromEngineArgs"] == t.status["discovered"]["engineArgs"]
    # the owner's pods, under pressure too, judge nothing
    t.window = window(t.now, kv=0.97, preempt=0.5, running=40, waiting=5)
    await t.run()
    assert t.recommended == planned and t.fetched == []
    assert cond(t.body, "MetricsAvailable")["reason"] == "RecommendationNotRunning"
    # the owner adopts the plan: its pods are the evidence; calm, they make the plan good
    t.tuned_pods()
    t.window = window(t.now + 400, kv=0.5, waiting=0)
    await t.run(advance=400)  # past the plan's probation
    assert t.status["lastGoodEngineArgs"] == planned
    assert t.fetched[-1] == (
        (f"{t.name}-abc12-t0", f"{t.name}-abc12-t1"),
        engines.lookup_engine("SGLang").metrics,
    )
    assert cond(t.body, "ClosedLoop")["status"] == "True"
    # retractions under pressure: SGLang's own rule retunes the recommendation
    t.window = window(t.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await t.run()
    new = t.recommended
    assert new != planned and t.status["recommendation"]["trigger"] == "KvPressure"
    grown = _sglang_runs(new)
    assert grown.chunked_prefill_size is not None and grown.mem_fraction_static is not None
    assert history(t)[-1] == ("Retuned", "KvPressure")
    assert t.status["history"][-1]["fromEngineArgs"] == planned
    assert t.status["history"][-1]["toEngineArgs"] == new
    assert t.status["rollout"]["engineArgs"] == new and t.status["rollout"]["phase"] == "RollingOut"
    assert {"Retuned", "Recommended"} <= set(t.emitter.reasons)
    assert t.kube.writes == 0 and t.kube.evicted == []  # Recommend: the status only
    assert "appliedEngineArgs" not in t.status and "lastChangeTime" not in t.status
    # the next reconcile stands by it (the history says so) and waits for the owner's rollout
    events = len(t.emitter.events)
    await t.run()
    assert t.recommended == new and len(t.emitter.events) == events
    assert cond(t.body, "RolloutInProgress")["reason"] == "Waiting"


async def test_an_sglang_oom_of_the_recommendation_lowers_it_from_the_previous_log() -> None:
    t = Target(sglang_deployment(), "vllm", "Recommend", serving={"maxContextLength": 16384})
    await t.run()
    planned = t.recommended
    t.window = window(t.now + 120, kv=0.5, waiting=0)
    # a crash the termination message does not explain: SGLang's own texts classify its previous log
    t.tuned_pods(1, restarts=2, message="", finished=t.now + 100, ready=False, crash=True)
    t.kube.logs[f"{t.name}-abc12-t0"] = "Traceback (most recent call last):\n" + OOM
    await t.run(advance=120)  # past the minimum interval since the plan
    assert t.kube.log_reads == [(f"{t.name}-abc12-t0", "vllm")]
    st = t.status
    assert (
        st["recommendation"]["trigger"] == "RuntimeOOM"
        and "CUDA out of memory" in st["recommendation"]["reason"]
    )
    before = sglang_fit.fraction_of(sglang_fit.compute_effective(_sglang_runs(planned), _memory(t)))
    after = sglang_fit.fraction_of(sglang_fit.compute_effective(_sglang_runs(t.recommended), _memory(t)))
    assert after <= before and t.recommended != planned
    (failed,) = st["failedEngineArgs"]
    assert failed["failure"] == "runtime_oom" and failed["runningRequests"] == 40
    assert {"RuntimeOOM", "Retuned"} <= set(t.emitter.reasons)
    # the owner's pods crashing with other flags judge nothing
    t2 = Target(sglang_deployment(), "vllm", "Recommend", serving={"maxContextLength": 16384})
    await t2.run()
    t2.owner_pods(1, restarts=2, message=OOM, finished=t2.now + 10, ready=False, crash=True)
    await t2.run()
    assert "failedEngineArgs" not in t2.status and history(t2) == [("Planned", "Discovered")]


def _memory(t: Target) -> Any:
    from kvpilot.tuner import gpus
    from kvpilot.tuner.loop import SglangMemory
    from kvpilot.tuner.model import build_model_spec, lookup_model_config

    model = build_model_spec(lookup_model_config(t.status["discovered"]["model"]))
    return SglangMemory(gpus.lookup_gpu("L4"), model, None)


async def test_auto_rolls_an_sglang_retune_out_by_eviction_and_rolls_a_failed_one_back() -> None:
    t = Target(sglang_deployment(), "vllm", "Auto", serving={"maxContextLength": 16384})
    await t.run()
    planned = t.recommended
    await t.run()  # published: one owner's pod evicted; the webhook's rewrite puts the plan on its successor
    assert t.kube.evicted == [f"{t.name}-abc12-o0"]
    t.tuned_pods()
    t.window = window(t.now + 400, kv=0.5, waiting=0)
    await t.run(advance=400)  # past the plan's probation
    assert t.status["lastGoodEngineArgs"] == planned
    t.window = window(t.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await t.run()
    new = t.recommended
    assert new != planned and history(t)[-1] == ("Retuned", "KvPressure")
    assert cond(t.body, "ClosedLoop")["reason"] == "Tuning"
    # the status holds it now: the webhook's index gives it to new pods, and Auto evicts a stale one
    index = target_webhook.index_tuner(NS, "t", t.body["spec"], t.status, t.body["metadata"])
    assert index is not None and next(iter(index.values())).settings == EngineArgs("SGLang", tuple(new))
    evicted = len(t.kube.evicted)
    await t.run(advance=60)
    assert len(t.kube.evicted) == evicted + 1
    # the replacements run it and are Ready: on probation
    t.tuned_pods(age=5)
    await t.run()
    assert t.status["rollout"]["phase"] == "Probation"
    # not Ready past the rollout's end, no crash the texts explain: back to the last good flags
    t.tuned_pods(ready=False, age=5)
    await t.run(advance=PolicyConfig().rollout_deadline_seconds + 30)
    st = t.status
    assert t.recommended == planned and history(t)[-1] == ("RolledBack", "RolloutFailed")
    assert {"args": new, "failure": "rollout_failed"} in st["failedEngineArgs"]
    assert "RolledBack" in t.emitter.reasons and st["rollout"]["engineArgs"] == planned
    assert t.kube.writes == 0  # the target is never written


async def test_a_rollout_waits_while_no_pod_runs_it_and_counts_from_the_newest_that_does() -> None:
    t = Target(sglang_deployment(), "vllm", "Recommend", serving={"maxContextLength": 16384})
    await t.run()
    t.tuned_pods()
    t.window = window(t.now + 400, kv=0.5, waiting=0)
    await t.run(advance=400)  # past the plan's probation
    t.window = window(t.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await t.run()
    new = t.recommended
    # the owner takes long to adopt it: past the deadline with no pod running it is no failure
    await t.run(advance=PolicyConfig().rollout_deadline_seconds * 2)
    assert t.recommended == new and cond(t.body, "RolloutInProgress")["reason"] == "Waiting"
    t.tuned_pods(ready=False, age=10)  # adopted now, starting
    await t.run()
    assert t.recommended == new and cond(t.body, "RolloutInProgress")["status"] == "True"
    assert "failedEngineArgs" not in t.status


# --- TGI ---------------------------------------------------------------------------------------------------


async def test_recommend_retunes_a_tgi_target_whose_admission_limit_binds() -> None:
    t = Target(tgi_deployment(), "tgi", "Recommend", serving={"maxContextLength": 8192, "concurrency": 16})
    await t.run()
    planned = t.recommended
    t.tuned_pods(1)
    t.window = window(t.now + 400, kv=0.5, running=4, waiting=0)
    await t.run(advance=400)  # past the plan's probation
    assert t.status["lastGoodEngineArgs"] == planned
    assert t.fetched[-1][1] == engines.lookup_engine("TGI").metrics
    t.window = window(t.now + 400, kv=0.4, running=12, waiting=4)  # the admission limit binds
    await t.run(advance=400)
    new = t.recommended
    assert (
        _tgi_runs(new).max_concurrent_requests == 26
    )  # the room the window measured (tgi_idle) and history(t)[-1][0] == "Retuned"
    assert t.status["history"][-1]["toEngineArgs"] == new
    assert {"Retuned", "Recommended"} <= set(t.emitter.reasons)
    # the webhook would set the flag and drop its variable, the owner's other ones kept
    (c,) = t.template()
    rewritten = target_engines.rewrite_container(c, EngineArgs("TGI", tuple(new)))
    assert rewritten is not None and "MAX_TOTAL_TOKENS" not in [e["name"] for e in rewritten["env"]]


async def test_a_tgi_warmup_failure_of_the_recommendation_lowers_its_prefill() -> None:
    t = Target(tgi_deployment(), "tgi", "Recommend", serving={"maxContextLength": 8192, "concurrency": 16})
    await t.run()
    planned = t.recommended
    ran = tgi_fit.compute_effective(_tgi_runs(planned), _tgi_memory(t))
    assert ran.max_batch_prefill_tokens is not None
    text = "ERROR warmup\n" + tgi.prefill_tokens_error(ran.max_batch_prefill_tokens)
    t.window = window(t.now + 120, kv=0.5, running=4, waiting=0)
    t.tuned_pods(1, restarts=1, message=text, finished=t.now + 100, ready=False, crash=True)
    await t.run(advance=120)  # past the minimum interval since the plan
    st = t.status
    assert st["recommendation"]["trigger"] == "StartOOM"
    lowered = _tgi_runs(t.recommended).max_batch_prefill_tokens
    assert lowered is not None and lowered < ran.max_batch_prefill_tokens
    (failed,) = st["failedEngineArgs"]
    assert failed["failure"] == "start_oom"
    assert t.kube.log_reads == []  # the message explained it


def _tgi_memory(t: Target) -> Any:
    from kvpilot.tuner import gpus
    from kvpilot.tuner.loop import TgiMemory
    from kvpilot.tuner.model import build_model_spec, lookup_model_config

    model = build_model_spec(lookup_model_config(t.status["discovered"]["model"]))
    return TgiMemory(gpus.lookup_gpu("L4"), model, None)


async def test_auto_rolls_a_tgi_retune_back_after_a_cuda_oom_on_probation() -> None:
    t = Target(tgi_deployment(), "tgi", "Auto", serving={"maxContextLength": 8192, "concurrency": 16})
    await t.run()
    planned = t.recommended
    t.tuned_pods(1)
    t.window = window(t.now + 400, kv=0.5, running=4, waiting=0)
    await t.run(advance=400)  # past the plan's probation
    assert t.status["lastGoodEngineArgs"] == planned
    t.window = window(t.now + 400, kv=0.4, running=12, waiting=4)
    await t.run(advance=400)
    new = t.recommended
    assert _tgi_runs(new).max_concurrent_requests == 26  # the room the window measured (tgi_idle)
    t.tuned_pods(1, age=5)  # Auto's replacement, rewritten by the webhook
    await t.run()
    assert t.status["rollout"]["phase"] == "Probation"
    t.tuned_pods(1, age=35, restarts=1, message=OOM, finished=t.now + 5, ready=False, crash=True)
    await t.run()
    st = t.status
    assert t.recommended == planned and history(t)[-1][0] == "RolledBack"
    (failed,) = st["failedEngineArgs"]
    assert (failed["failure"], failed["runningRequests"]) == ("runtime_oom", 12)
    assert _tgi_runs(failed["args"]).max_concurrent_requests == 26  # the room the window measured (tgi_idle)
    assert "RolledBack" in t.emitter.reasons and st["lastGoodEngineArgs"] == planned
    # rolled back, the recommendation is the last good one: Auto evicts the pod running the failed flags
    await t.run(advance=60)
    assert t.kube.evicted[-1] == f"{t.name}-abc12-t0"
