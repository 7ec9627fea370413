"""The closed loop end to end: real control plane, real Prometheus, the fleet simulator, the operator.

The operator runs on the host (``kopf run -m kvpilot.operator.main``) with ``KVPILOT_PROMETHEUS_URL``
and the fast pace of ``e2e.fleet.stack.closed_loop_env``: a 2 s closed-loop interval, 10 s metric steps,
10 s between changes and a 20 s probation. Each scenario is one InferenceService in its own namespace, and
the fleet plays its pods against the scenario's own ground truth (``e2e.fleet.truth``), never
kvpilot's memory model. The tests assert decisions (events, ``status.history``) and final
settings, on the Deployment as well as in the status.

Even that pace (5 metric samples at a 10 s step since the last change, a probation after each
rollout) makes one scenario take a minute or two. So the scenarios
that do not disturb each other start together, in the ``loop`` fixture, and each test waits
for its own outcome. The two that disturb everything (Prometheus down, the operator killed
mid-rollout) run after them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.stack import Stack, condition, deployment_args, isvc_events, run_engine_cases
from e2e.fleet.testing import H100_8B
from kvpilot.operator.api import Settings
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import parse_vllm_args

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Closed-loop timings a test can set through the API (the CRD's minimum deadline is 30 s).
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}

LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)


def _gib_for_tokens(tokens: int) -> float:
    return tokens * 131072 / (1 << 30)


@dataclass
class Case:
    serving: dict[str, Any]
    truth: GroundTruth = H100_8B
    workload: Workload = LIGHT
    mode: str = "Auto"
    tuning: dict[str, Any] = field(default_factory=dict)
    ns: str = ""
    planned: dict[str, Any] = field(default_factory=dict)
    """``status.applied`` as first planned (read before the closed loop may change anything)."""


CASES: dict[str, Case] = {
    # CUDA OOM while serving above (planned utilisation - 0.02): armed by the fixture once planned
    "oom": Case({"maxContextLength": 8192, "concurrency": 16}),
    # the KV cache holds 49 152 tokens at 0.95, not the planned 131 072-token context
    "kvfail": Case(
        {"minContextLength": 8192, "maxContextLength": 131072},
        truth=dataclasses.replace(H100_8B, non_kv_gib=round(0.95 * 79.11 - _gib_for_tokens(49152), 4)),
    ),
    # ~24k tokens of KV; long requests at a high rate keep far more sequences running than fit
    "storm": Case(
        {"maxContextLength": 8192},
        truth=dataclasses.replace(H100_8B, non_kv_gib=round(0.95 * 79.11 - _gib_for_tokens(24576), 4)),
        workload=Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500, time_scale=4.0),
    ),
    # four sequences allowed, a long queue, an almost empty KV cache
    "idle": Case(
        {"maxContextLength": 8192, "concurrency": 4},
        workload=Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200),
    ),
    # the same, but more than four sequences hit CUDA OOM at start-up (the sampler warm-up): the raise
    # never becomes Ready and must be rolled back
    "rollback": Case(
        {"maxContextLength": 8192, "concurrency": 4},
        truth=dataclasses.replace(H100_8B, startup_oom_above_max_num_seqs=4),
        workload=Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200),
    ),
    # the same, but more than four sequences start (Ready) and hit CUDA OOM 12 s into serving: the raise
    # must be rolled back from probation, not "cured" by lowering the utilisation
    "probation": Case(
        {"maxContextLength": 8192, "concurrency": 4},
        truth=dataclasses.replace(H100_8B, runtime_oom_above_max_num_seqs=4, oom_after_s=12.0),
        workload=Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200),
    ),
    # Recommend: vLLM's defaults run (0.92) and crash above 0.90; kvpilot may only recommend
    "recommend": Case(
        {"maxContextLength": 8192},
        mode="Recommend",
        truth=dataclasses.replace(H100_8B, runtime_oom_above_utilization=0.90),
    ),
    # steady services for the two disruptive scenarios at the end
    "killed": Case({"maxContextLength": 8192, "concurrency": 16}),
    "promdown": Case({"maxContextLength": 8192, "concurrency": 16}),
}


def isvc_manifest(name: str, ns: str, case: Case) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"id": MODEL, "source": "Catalogue"},
            "gpu": {"count": 1, "product": H100},
            "serving": case.serving,
            "tuning": {"mode": case.mode, **FAST, **case.tuning},
        },
    }


@dataclass
class Loop:
    stack: Stack
    cases: dict[str, Case]
    t0: float

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.stack.kubectl(*args, **kw)

    def get(self, case: str) -> dict[str, Any]:
        return self.stack.isvc(self.cases[case].ns, case)

    def wait(self, case: str, cond: Any, *, timeout: float, what: str) -> dict[str, Any]:
        return self.stack.wait_isvc(self.cases[case].ns, case, cond, timeout=timeout, what=f"{case}: {what}")

    def events(self, case: str) -> list[dict[str, Any]]:
        return isvc_events(self.kubectl, self.cases[case].ns, case)

    def args(self, case: str) -> Any:
        return deployment_args(self.kubectl, self.cases[case].ns, case)

    def pods(self, case: str) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "pods", "-n", self.cases[case].ns, "-l", f"app.kubernetes.io/instance={case}", "-o", "json"
        ).stdout
        return list(json.loads(out)["items"])

    def budget_left(self, seconds: float) -> float:
        """Seconds left of ``seconds`` counted from when the scenarios started."""
        return max(10.0, seconds - (time.monotonic() - self.t0))


def running_settings(loop: Loop, case: str) -> EngineSettings:
    """The tuned settings on the Deployment's vLLM container, parsed as the operator parses pod args."""
    out = loop.kubectl("get", "deployment", case, "-n", loop.cases[case].ns, "-o", "json").stdout
    container = json.loads(out)["spec"]["template"]["spec"]["containers"][0]
    settings, _ = parse_vllm_args([str(a) for a in container.get("args") or ()])
    return settings


def history(obj: dict[str, Any], action: str | None = None) -> list[dict[str, Any]]:
    h = list(obj.get("status", {}).get("history") or [])
    return [e for e in h if action is None or e.get("action") == action]


def applied(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("applied") or {})


def is_ready(obj: dict[str, Any]) -> bool:
    return condition(obj, "Ready").get("status") == "True"


def rollout_done(obj: dict[str, Any]) -> bool:
    return (
        not obj.get("status", {}).get("rollout")
        and condition(obj, "RolloutInProgress").get("status") != "True"
    )


@pytest.fixture(scope="module")
def loop(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    run_dir = Path(tmp_path_factory.mktemp("closed-loop"))
    cases = {k: dataclasses.replace(v) for k, v in CASES.items()}
    # the operator watches only this module's namespaces (kopf's glob "e2e-cl-*")
    with run_engine_cases(
        cluster, run_dir, "e2e-cl", cases, isvc_manifest, probation_s=None, what="closed-loop"
    ) as stack:
        loop = Loop(stack, cases, time.monotonic())
        for name, c in cases.items():  # the plans, before the closed loop (>= 60 s between changes) acts
            obj = loop.wait(name, applied, timeout=loop.budget_left(90), what="planned and applied")
            c.planned = applied(obj)
        oom = cases["oom"]
        oom.truth = dataclasses.replace(H100_8B, runtime_oom_above_utilization=oom_threshold(oom.planned))
        assert stack.fleet is not None
        stack.fleet.set_scenario(oom.ns, "oom", Scenario(name="oom", truth=oom.truth, workload=oom.workload))
        yield loop


def oom_threshold(planned: dict[str, Any]) -> float:
    """The utilisation above which the scenario's GPU hits CUDA OOM: just below the plan's."""
    return round(float(planned["gpuMemoryUtilization"]) - 0.02, 2)


def _planned(loop: Loop, case: str) -> dict[str, Any]:
    planned = loop.cases[case].planned
    assert planned, f"{case} was never planned"
    first = next(iter(history(loop.get(case), "Planned")), None)
    if first is not None:  # the history agrees with what the fixture saw first
        assert first["to"] == planned, (first, planned)
    return planned


# ----------------------------------------------------------------------------- concurrent scenarios


def test_cuda_oom_lowers_utilisation_then_stays_stable(loop: Loop) -> None:
    planned = _planned(loop, "oom")
    limit = oom_threshold(planned)
    obj = loop.wait(
        "oom",
        lambda o: (
            history(o, "Retuned")
            and is_ready(o)
            and rollout_done(o)
            and applied(o)["gpuMemoryUtilization"] <= limit
        ),
        timeout=loop.budget_left(240),
        what=f"retuned to at most {limit} and Ready",
    )
    first = history(obj, "Retuned")[0]
    assert first["trigger"] == "CudaOOM", first
    assert first["to"]["gpuMemoryUtilization"] < first["from"]["gpuMemoryUtilization"]
    assert (
        first["from"]["gpuMemoryUtilization"] - first["to"]["gpuMemoryUtilization"] <= 0.05 + 1e-9
    )  # bounded
    util = applied(obj)["gpuMemoryUtilization"]
    assert loop.args("oom").gpu_memory_utilization == util
    failed = obj["status"].get("failedSettings") or []
    assert any(f.get("gpuMemoryUtilization") == planned["gpuMemoryUtilization"] for f in failed), failed
    reasons = [e["reason"] for e in loop.events("oom")]
    assert "OOMDetected" in reasons and "Retuned" in reasons
    # stable: the pods on the new settings serve past the time the OOM used to strike, no new change
    time.sleep(H100_8B.oom_after_s + 6)
    later = loop.get("oom")
    assert applied(later) == applied(obj) and len(history(later, "Retuned")) == len(history(obj, "Retuned"))
    for p in loop.pods("oom"):
        if (
            "--gpu-memory-utilization" in " ".join(p["spec"]["containers"][0]["args"])
            and str(util) in p["spec"]["containers"][0]["args"]
        ):
            assert p["status"]["containerStatuses"][0]["restartCount"] == 0, p["status"]


def test_startup_kv_failure_shortens_the_context_until_ready(loop: Loop) -> None:
    planned = _planned(loop, "kvfail")
    assert planned["maxModelLen"] > 49152, f"precondition: the plan must not fit this GPU: {planned}"
    obj = loop.wait(
        "kvfail",
        lambda o: history(o, "Retuned") and is_ready(o) and rollout_done(o),
        timeout=loop.budget_left(240),
        what="retuned and Ready",
    )
    change = history(obj, "Retuned")[0]
    assert change["trigger"] == "KvCacheTooSmall", change
    now = applied(obj)
    assert now["maxModelLen"] <= 49152 or now.get("kvCacheDtype", "auto") != "auto", now
    assert now["maxModelLen"] >= 8192  # never below the user's minimum
    args = loop.args("kvfail")
    assert args.max_model_len == now["maxModelLen"]
    ready_pods = [
        p
        for p in loop.pods("kvfail")
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    assert ready_pods, "a pod on the new settings is Ready"


def test_preemption_storm_lowers_max_num_seqs(loop: Loop) -> None:
    planned = _planned(loop, "storm")
    obj = loop.wait(
        "storm",
        lambda o: history(o, "Retuned"),
        timeout=loop.budget_left(330),
        what="a retune under KV pressure",
    )
    change = history(obj, "Retuned")[0]
    assert change["trigger"] == "KvPressure", change
    assert change["to"]["maxNumSeqs"] < change["from"]["maxNumSeqs"] == planned["maxNumSeqs"]
    # a bounded step down from what actually ran (vLLM could not run all of them: the KV cache is full)
    m = re.search(r"peak running (\d+)", change["reason"])
    peak = int(m.group(1)) if m else change["from"]["maxNumSeqs"]
    assert peak <= change["from"]["maxNumSeqs"]
    assert math.floor(0.75 * peak) - 1 <= change["to"]["maxNumSeqs"] < peak, (peak, change)
    assert loop.args("storm").max_num_seqs == applied(obj)["maxNumSeqs"]
    assert "preempt" in change["reason"].lower(), change["reason"]


def test_idle_capacity_with_a_queue_raises_max_num_seqs(loop: Loop) -> None:
    planned = _planned(loop, "idle")
    assert planned["maxNumSeqs"] == 4, planned
    obj = loop.wait(
        "idle",
        lambda o: history(o, "Retuned"),
        timeout=loop.budget_left(330),
        what="a retune for idle capacity",
    )
    change = history(obj, "Retuned")[0]
    assert change["trigger"] == "IdleCapacity", change
    assert change["to"]["maxNumSeqs"] > change["from"]["maxNumSeqs"] == 4
    obj = loop.wait(
        "idle", lambda o: is_ready(o) and rollout_done(o), timeout=60, what="the raise rolled out"
    )
    assert loop.args("idle").max_num_seqs == applied(obj)["maxNumSeqs"] > 4


def test_bad_new_settings_are_rolled_back(loop: Loop) -> None:
    planned = _planned(loop, "rollback")
    assert planned["maxNumSeqs"] == 4, planned
    obj = loop.wait(
        "rollback",
        lambda o: history(o, "RolledBack"),
        timeout=loop.budget_left(360),
        what="a rollback of the raise that crashed",
    )
    retune = history(obj, "Retuned")[0]
    back = history(obj, "RolledBack")[0]
    assert retune["to"]["maxNumSeqs"] > 4 and back["to"]["maxNumSeqs"] == 4
    assert back["trigger"] == "RolloutFailed" and "CudaOOM" in back["reason"], back
    assert back["from"] == retune["to"]
    failed = obj["status"].get("failedSettings") or []
    assert any(f.get("maxNumSeqs") == retune["to"]["maxNumSeqs"] for f in failed), failed
    obj = loop.wait(
        "rollback",
        lambda o: is_ready(o) and rollout_done(o) and applied(o)["maxNumSeqs"] == 4,
        timeout=90,
        what="back on the known-good settings, Ready",
    )
    assert loop.args("rollback").max_num_seqs == 4
    assert (obj["status"].get("lastGoodSettings") or {}).get("maxNumSeqs") == 4
    assert "RolledBack" in [e["reason"] for e in loop.events("rollback")]


def test_crash_on_probation_is_rolled_back(loop: Loop) -> None:
    """The raise passes readiness, then OOMs while serving: back to the known-good 4, the raise failed."""
    planned = _planned(loop, "probation")
    assert planned["maxNumSeqs"] == 4, planned
    obj = loop.wait(
        "probation",
        lambda o: history(o, "RolledBack") or [h for h in history(o, "Retuned") if h["trigger"] == "CudaOOM"],
        timeout=loop.budget_left(360),
        what="a rollback of the raise that crashed after Ready",
    )
    assert history(obj, "RolledBack"), f"not rolled back: {history(obj)}"
    retune, back = history(obj, "Retuned")[0], history(obj, "RolledBack")[0]
    assert retune["trigger"] == "IdleCapacity" and retune["to"]["maxNumSeqs"] > 4, retune
    assert (back["trigger"], back["from"], back["to"]["maxNumSeqs"]) == ("RolloutFailed", retune["to"], 4), (
        back
    )
    assert "CudaOOM" in back["reason"] and "on probation" in back["reason"], back["reason"]
    failed = obj["status"].get("failedSettings") or []
    assert any(f.get("maxNumSeqs") == retune["to"]["maxNumSeqs"] for f in failed), failed
    assert not [h for h in history(obj, "Retuned") if h["trigger"] == "CudaOOM"], history(obj)
    obj = loop.wait(
        "probation",
        lambda o: is_ready(o) and rollout_done(o) and applied(o)["maxNumSeqs"] == 4,
        timeout=90,
        what="back on the known-good settings, Ready, probation passed",
    )
    assert applied(obj)["gpuMemoryUtilization"] == planned["gpuMemoryUtilization"]  # no utilisation walk
    assert (obj["status"].get("lastGoodSettings") or {}).get("maxNumSeqs") == 4


def test_recommend_mode_changes_nothing(loop: Loop) -> None:
    before = loop.args("recommend")
    assert before.gpu_memory_utilization is None and before.max_num_seqs is None  # vLLM's defaults run
    obj = loop.wait(
        "recommend",
        lambda o: (o["status"].get("recommendation") or {}).get("trigger") == "CudaOOM",
        timeout=loop.budget_left(240),
        what="a recommendation after the CUDA OOMs",
    )
    rec = obj["status"]["recommendation"]
    assert rec["settings"]["gpuMemoryUtilization"] <= 0.90, rec
    assert "Recommended" in [e["reason"] for e in loop.events("recommend")]
    time.sleep(5)
    obj = loop.get("recommend")
    assert loop.args("recommend") == before, "the Deployment must keep the user's settings"
    assert not history(obj, "Retuned") and not history(obj, "RolledBack")
    assert not obj["status"].get("rollout")
    reasons = [e["reason"] for e in loop.events("recommend")]
    assert "Retuned" not in reasons and "RolledBack" not in reasons
    # the crashes go on: nothing was changed for them
    restarts = max(p["status"]["containerStatuses"][0]["restartCount"] for p in loop.pods("recommend"))
    assert restarts >= 2


# ----------------------------------------------------------------------------- disruptive scenarios


def test_prometheus_down_holds(loop: Loop) -> None:
    assert loop.stack.fleet is not None
    planned = _planned(loop, "promdown")
    loop.wait(
        "promdown",
        lambda o: condition(o, "MetricsAvailable").get("status") == "True",
        timeout=loop.budget_left(120),
        what="metrics available",
    )
    # the service would be retuned for idle capacity if kvpilot could see it
    loop.stack.fleet.set_scenario(
        loop.cases["promdown"].ns,
        "promdown",
        Scenario(truth=H100_8B, workload=Workload(arrival_rate=12.0, prompt_tokens=500, output_tokens=300)),
    )
    loop.stack.prom.stop()
    try:
        obj = loop.wait(
            "promdown",
            lambda o: condition(o, "MetricsAvailable").get("status") == "False",
            timeout=30,
            what="MetricsAvailable=False",
        )
        cond = condition(obj, "MetricsAvailable")
        assert cond["reason"] and cond["message"], cond
        held = [h for h in history(obj, "Held") if h["trigger"] == "MetricsUnavailable"]
        assert held, history(obj)
        time.sleep(10)
        still = loop.get("promdown")
        assert applied(still) == planned and not history(still, "Retuned")
        assert loop.args("promdown").max_num_seqs == planned["maxNumSeqs"]
        assert condition(still, "MetricsAvailable").get("status") == "False"
    finally:
        loop.stack.prom.start()
    loop.wait(
        "promdown",
        lambda o: condition(o, "MetricsAvailable").get("status") == "True",
        timeout=60,
        what="MetricsAvailable=True again after Prometheus is back",
    )


def test_operator_killed_mid_rollout_finishes_the_rollout(loop: Loop) -> None:
    stack, ns = loop.stack, loop.cases["killed"].ns
    assert stack.fleet is not None and stack.operator is not None
    planned = _planned(loop, "killed")
    limit = oom_threshold(planned)
    # the GPU now hits CUDA OOM above the plan, and new pods take 12 s to load: a long rollout
    stack.fleet.set_scenario(
        ns,
        "killed",
        Scenario(truth=dataclasses.replace(H100_8B, runtime_oom_above_utilization=limit, startup_s=12.0)),
    )
    obj = loop.wait(
        "killed",
        lambda o: o["status"].get("rollout"),
        timeout=loop.budget_left(150),
        what="a rollout in progress",
    )
    target = obj["status"]["rollout"]["settings"]
    stack.operator.kill()
    killed_at = time.monotonic()
    time.sleep(3)
    stack.operator.start()
    obj = loop.wait(
        "killed",
        lambda o: rollout_done(o) and is_ready(o),
        timeout=90,
        what="the rollout finished by the restarted operator",
    )
    assert time.monotonic() - killed_at > 3
    now = applied(obj)
    assert now == target or all(now.get(k) == v for k, v in target.items()), (now, target)
    assert loop.args("killed").gpu_memory_utilization == now["gpuMemoryUtilization"] <= limit
    assert (obj["status"].get("lastGoodSettings") or {}).get("gpuMemoryUtilization") == now[
        "gpuMemoryUtilization"
    ]
    retunes = history(obj, "Retuned")
    assert len(retunes) == 1 and not history(obj, "RolledBack"), history(obj)
    assert "RolloutSucceeded" in [e["reason"] for e in loop.events("killed")]
    assert stack.operator.starts >= 2


def test_all_deployments_match_their_status(loop: Loop) -> None:
    """Whatever happened, every Auto service's Deployment runs what its status says is applied."""
    for name, case in loop.cases.items():
        if case.mode != "Auto":
            continue
        obj = loop.get(name)
        if obj["status"].get("rollout"):
            continue
        running = running_settings(loop, name)
        wanted = Settings.model_validate({k: v for k, v in applied(obj).items() if v is not None}).to_engine()
        for f in dataclasses.fields(EngineSettings):  # all six tuned fields
            assert getattr(running, f.name) == getattr(wanted, f.name), (name, f.name, running, wanted)
    kinds = {r["reason"] for c in loop.cases for r in loop.events(c)}
    assert {"Planned", "Retuned"} <= kinds
