"""SGLang's closed loop end to end: real control plane, real Prometheus, the fleet playing SGLang pods.

Each scenario is one ``spec.engine.kind: SGLang`` InferenceService in mode Auto (Llama-3.1-8B on an H100)
in its own namespace; the fleet plays its pods as SGLang 0.5.23 (:mod:`e2e.fleet.sglang_truth`: the pool
SGLang sizes, its failure texts, its ``/metrics``) against the scenario's ground truth, never kvpilot's
memory model. The operator runs on the host with the closed-loop pace of
:func:`e2e.fleet.stack.closed_loop_env` (2 s ticks, 10 s metric steps and change interval), with a 12 s
probation (:data:`PROBATION_S`: still longer than any scenario's OOM delay plus a few ticks).

* ``oom``: once planned, the GPU hits CUDA OOM while serving above (planned ``--mem-fraction-static`` -
  0.02): the loop lowers the fraction (``Retuned``; ``appliedEngineArgs`` and the Deployment follow), the new
  pods pass probation (``lastGoodEngineArgs``) and stay up past the time the OOM struck.
* ``short``: the scenario's weights (66 GiB, not the 15 kvpilot's model counts) exceed the planned share:
  every start fails with SGLang's "Loaded weights leave no GPU memory for the KV cache ... Raise
  --mem-fraction-static above X"; the loop raises the fraction past SGLang's minimum (``StartMemoryShort``),
  and the new pods start, serve and pass probation.
* ``storm``: the scenario's weights leave the planned share a ~24K-token pool, and long requests at a high
  rate fill it: SGLang retracts (``sglang:num_retracted_requests_total``) with the token usage near 1 and a
  queue behind the pool (SGLang's admission reserves the running requests' outputs), and the loop retunes
  for ``KvPressure`` (retractions) or ``KvBound`` (the queue behind a full pool): a larger pool, or fewer
  ``--max-running-requests``, which rolls out and passes probation.

* ``recommend``: mode Recommend, SGLang's own defaults run (0.835 on an H100) and crash above 0.80: the loop
  recommends a lower fraction (``status.recommendation``, a ``Recommended`` event) and changes nothing.
* ``probation``: four running requests (``serving.concurrency``) and a queue: the loop raises
  ``--max-running-requests`` (``IdleCapacity``); the GPU runs out of memory 6 s into serving with more than
  four, on probation: the loop rolls back to the last good flags (``RolledBack``; ``failedEngineArgs``).

* ``killed`` (last: it disrupts the others): the GPU starts running out of memory at the plan and new pods
  take 3 s to load; the operator is killed mid-rollout and restarted: the restarted operator finishes the
  rollout it recorded (no other change, no rollback, ``lastGoodEngineArgs``).

All run at once (about two minutes); nothing is skipped: a missing binary or venv fails the fixture.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.stack import Stack, condition, isvc_events, run_engine_cases
from e2e.fleet.testing import H100_8B
from e2e.fleet.truth import GiB
from kvpilot.tuner import sglang

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)
STORM = Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500, time_scale=4.0)
STORM_POOL_TOKENS = 24576
PROBATION_S = 12.0
"""Probation in this module: longer than the fleet's OOM delays (3 s, the probation scenario's 6 s) plus a few
2 s ticks, shorter than the suite's 20 s to keep the module within three minutes."""
PLANNED_FRACTION = 0.835
"""kvpilot's plan for the 8B model on an H100 at 8K (``kvpilot plan --engine sglang``); the fixture reads
the real one from the status and the scenarios depend on it only through the fleet's arming."""


def _storm_truth(fraction: float) -> GroundTruth:
    """Weights that leave ``fraction`` of the free memory a pool of :data:`STORM_POOL_TOKENS` tokens."""
    pre = H100_8B.gpu_memory_gib - H100_8B.sglang_cuda_context_gib
    weights = pre * fraction - STORM_POOL_TOKENS * H100_8B.kv_bytes_per_token / GiB
    return dataclasses.replace(H100_8B, sglang_weights_gib=round(weights, 4))


@dataclass
class Case:
    serving: dict[str, Any]
    truth: GroundTruth = H100_8B
    workload: Workload = LIGHT
    mode: str = "Auto"
    ns: str = ""
    planned: list[str] = dataclasses.field(default_factory=list)


SHORT_WEIGHTS_GIB = 66.0
"""At the planned 0.835 these weights leave no KV pool (SGLang's minimum: 1 - (78.61 - 66) / 78.61 =
0.840)."""

CASES: dict[str, Case] = {
    "oom": Case({"maxContextLength": 8192}),
    "short": Case(
        {"maxContextLength": 8192}, truth=dataclasses.replace(H100_8B, sglang_weights_gib=SHORT_WEIGHTS_GIB)
    ),
    "probation": Case(
        {"maxContextLength": 8192, "concurrency": 4},
        truth=dataclasses.replace(H100_8B, runtime_oom_above_max_num_seqs=4, oom_after_s=6.0),
        workload=Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200),
    ),
    "recommend": Case(
        {"maxContextLength": 8192},
        truth=dataclasses.replace(H100_8B, runtime_oom_above_mem_fraction_static=0.80),
        mode="Recommend",
    ),
    "killed": Case({"maxContextLength": 8192}),
    "storm": Case({"maxContextLength": 8192}, truth=_storm_truth(PLANNED_FRACTION), workload=STORM),
}


def isvc_manifest(name: str, ns: str, case: Case) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"id": MODEL, "source": "Catalogue"},
            "gpu": {"count": 1, "product": H100},
            "engine": {"kind": "SGLang", "image": "lmsysorg/sglang:v0.5.23"},
            "serving": case.serving,
            "tuning": {"mode": case.mode, **FAST},
        },
    }


def flags(args: list[str] | None) -> sglang.SglangSettings:
    """SGLang's flags parsed as the operator parses them."""
    return sglang.parse_sglang_args([str(a) for a in args or ()])


@dataclass
class Loop:
    stack: Stack
    cases: dict[str, Case]
    t0: float

    def get(self, case: str) -> dict[str, Any]:
        return self.stack.isvc(self.cases[case].ns, case)

    def wait(self, case: str, cond: Any, *, timeout: float, what: str) -> dict[str, Any]:
        return self.stack.wait_isvc(self.cases[case].ns, case, cond, timeout=timeout, what=f"{case}: {what}")

    def events(self, case: str) -> list[dict[str, Any]]:
        return isvc_events(self.stack.kubectl, self.cases[case].ns, case)

    def deployment_flags(self, case: str) -> sglang.SglangSettings:
        out = self.stack.kubectl("get", "deployment", case, "-n", self.cases[case].ns, "-o", "json").stdout
        container = json.loads(out)["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python3", "-m", "sglang.launch_server"], container["command"]
        return flags(container.get("args"))

    def pods(self, case: str) -> list[dict[str, Any]]:
        out = self.stack.kubectl(
            "get", "pods", "-n", self.cases[case].ns, "-l", f"app.kubernetes.io/instance={case}", "-o", "json"
        ).stdout
        return list(json.loads(out)["items"])

    def budget_left(self, seconds: float) -> float:
        return max(10.0, seconds - (time.monotonic() - self.t0))


def status(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


def rollout_done(obj: dict[str, Any]) -> bool:
    return not status(obj).get("rollout") and condition(obj, "RolloutInProgress").get("status") != "True"


@pytest.fixture(scope="module")
def loop(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    run_dir = Path(tmp_path_factory.mktemp("sglang-loop"))
    cases = {k: dataclasses.replace(v) for k, v in CASES.items()}
    with run_engine_cases(
        cluster, run_dir, "e2e-sg", cases, isvc_manifest, probation_s=PROBATION_S, what="SGLang loop"
    ) as stack:
        loop = Loop(stack, cases, time.monotonic())
        for name, c in cases.items():
            if c.mode != "Auto":  # SGLang's own defaults run: no flags applied
                continue
            obj = loop.wait(
                name,
                lambda o: status(o).get("appliedEngineArgs"),
                timeout=loop.budget_left(90),
                what="planned and applied",
            )
            c.planned = list(status(obj)["appliedEngineArgs"])
        # the OOM scenario's GPU runs out of memory while serving just below the planned share
        oom = cases["oom"]
        fraction = flags(oom.planned).mem_fraction_static
        assert fraction is not None, oom.planned
        oom.truth = dataclasses.replace(
            H100_8B, runtime_oom_above_mem_fraction_static=round(fraction - 0.02, 3)
        )
        assert stack.fleet is not None
        stack.fleet.set_scenario(oom.ns, "oom", Scenario(name="oom", truth=oom.truth, workload=oom.workload))
        yield loop


def test_a_runtime_oom_lowers_the_fraction_and_the_new_flags_pass_probation(loop: Loop) -> None:
    planned = flags(loop.cases["oom"].planned)
    assert planned.mem_fraction_static is not None and planned.context_length == 8192, planned
    limit = loop.cases["oom"].truth.runtime_oom_above_mem_fraction_static
    assert limit is not None
    obj = loop.wait(
        "oom",
        lambda o: (
            (applied := status(o).get("appliedEngineArgs"))
            and (flags(applied).mem_fraction_static or 1.0) <= limit
            and flags(status(o).get("lastGoodEngineArgs")) == flags(applied)
            and rollout_done(o)
        ),
        timeout=loop.budget_left(150),
        what=f"--mem-fraction-static lowered to at most {limit}, on probation, then good",
    )
    now = flags(status(obj)["appliedEngineArgs"])
    assert now.mem_fraction_static is not None and planned.mem_fraction_static is not None
    assert planned.mem_fraction_static - now.mem_fraction_static <= 0.05 + 1e-9, (
        planned,
        now,
    )  # a bounded step
    assert loop.deployment_flags("oom") == now
    failed = status(obj).get("failedEngineArgs") or []
    assert any(
        f["failure"] == "runtime_oom" and flags(f["args"]).mem_fraction_static == planned.mem_fraction_static
        for f in failed
    ), failed
    history = [h for h in status(obj).get("history") or () if h.get("action") == "Retuned"]  # the audit trail
    assert history and flags(history[-1]["toEngineArgs"]) == now, status(obj).get("history")
    assert flags(history[-1]["fromEngineArgs"]).mem_fraction_static == planned.mem_fraction_static
    reasons = [e["reason"] for e in loop.events("oom")]
    assert "Retuned" in reasons and "RolloutSucceeded" in reasons, reasons
    retuned = next(e for e in loop.events("oom") if e["reason"] == "Retuned")
    assert "--mem-fraction-static" in retuned["message"] or "fraction" in retuned["message"], retuned[
        "message"
    ]
    # the new pods serve past the time the OOM struck, and nothing else changes
    time.sleep(loop.cases["oom"].truth.oom_after_s + 4)
    later = loop.get("oom")
    assert status(later)["appliedEngineArgs"] == status(obj)["appliedEngineArgs"]
    for pod in loop.pods("oom"):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        assert flags(pod["spec"]["containers"][0]["args"]) == now
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]


def test_a_start_that_leaves_no_pool_raises_the_fraction_until_it_serves(loop: Loop) -> None:
    planned = flags(loop.cases["short"].planned)
    assert planned.mem_fraction_static is not None
    minimum = 1 - (H100_8B.gpu_memory_gib - 0.5 - SHORT_WEIGHTS_GIB) / (H100_8B.gpu_memory_gib - 0.5)
    assert planned.mem_fraction_static < minimum, f"precondition: the plan must not start here: {planned}"
    obj = loop.wait(
        "short",
        lambda o: (
            (applied := status(o).get("appliedEngineArgs"))
            and flags(status(o).get("lastGoodEngineArgs")) == flags(applied)
            and rollout_done(o)
        ),
        timeout=loop.budget_left(150),
        what="the fraction raised, the new pods serving past probation",
    )
    now = flags(status(obj)["appliedEngineArgs"])
    assert now.mem_fraction_static is not None and now.mem_fraction_static > minimum, (planned, now)
    assert loop.deployment_flags("short") == now
    failed = status(obj).get("failedEngineArgs") or []
    assert any(f["failure"] == "start_memory_short" and flags(f["args"]) == planned for f in failed), failed
    assert loop.stack.fleet is not None
    crashes = loop.stack.fleet.events_for(loop.cases["short"].ns, "StartupFailed")
    assert crashes and "Loaded weights leave no GPU memory" in crashes[0].detail, crashes
    assert "Retuned" in [e["reason"] for e in loop.events("short")]
    serving = [
        p
        for p in loop.pods("short")
        if not p["metadata"].get("deletionTimestamp") and p["status"]["containerStatuses"][0].get("ready")
    ]
    assert serving and all(flags(p["spec"]["containers"][0]["args"]) == now for p in serving)


def test_retractions_in_a_full_pool_retune_the_pool_or_the_running_requests(loop: Loop) -> None:
    planned = flags(loop.cases["storm"].planned)
    fleet = loop.stack.fleet
    assert fleet is not None
    fleet.wait_for(
        lambda: any((p["preemptions"] or 0) > 0 for p in fleet.pods(loop.cases["storm"].ns)),
        timeout=loop.budget_left(90),
        what="SGLang retracting requests in the storm's pool",
    )
    obj = loop.wait(
        "storm",
        lambda o: any(e["reason"] == "Retuned" for e in loop.events("storm")) and status(o).get("rollout"),
        timeout=loop.budget_left(170),
        what="a retune for the full pool",
    )
    now = flags(status(obj)["appliedEngineArgs"])
    assert now != planned
    more_pool = (now.mem_fraction_static or 0) > (planned.mem_fraction_static or 0)
    fewer_running = now.max_running_requests is not None and (
        planned.max_running_requests is None or now.max_running_requests < planned.max_running_requests
    )
    assert more_pool or fewer_running, (planned, now)
    retuned = next(e for e in loop.events("storm") if e["reason"] == "Retuned")
    said = retuned["message"]
    assert "retractions/s" in said or "holds them back" in said, said
    peak = re.search(r"peak running (\d+)", retuned["message"])
    if fewer_running and peak:  # a bounded step down from what ran
        assert now.max_running_requests is not None and now.max_running_requests < int(peak.group(1))
    assert loop.deployment_flags("storm") == now
    loop_cond = condition(obj, "ClosedLoop")
    assert (loop_cond.get("status"), loop_cond.get("reason")) == ("True", "Tuning"), loop_cond
    # the retune rolls out: the pods run it, Ready and crash-free through probation
    obj = loop.wait(
        "storm",
        lambda o: flags(status(o).get("lastGoodEngineArgs")) == now,
        timeout=loop.budget_left(170),
        what="the retune past probation",
    )
    assert "RolloutSucceeded" in [e["reason"] for e in loop.events("storm")]


def test_a_raise_that_crashes_on_probation_is_rolled_back(loop: Loop) -> None:
    planned = flags(loop.cases["probation"].planned)
    assert planned.max_running_requests == 4, planned
    obj = loop.wait(
        "probation",
        lambda o: any(e["reason"] == "RolledBack" for e in loop.events("probation")),
        timeout=loop.budget_left(240),
        what="a rollback of the raise that crashed on probation",
    )
    reasons = [e["reason"] for e in loop.events("probation")]
    assert reasons.index("Retuned") < reasons.index("RolledBack"), reasons
    failed = status(obj).get("failedEngineArgs") or []
    raised = [flags(f["args"]) for f in failed if (flags(f["args"]).max_running_requests or 0) > 4]
    assert raised, failed
    obj = loop.wait(
        "probation",
        lambda o: flags(status(o).get("appliedEngineArgs")).max_running_requests == 4 and rollout_done(o),
        timeout=loop.budget_left(300),
        what="back on the last good flags",
    )
    assert flags(status(obj)["lastGoodEngineArgs"]).max_running_requests == 4
    assert loop.deployment_flags("probation").max_running_requests == 4
    back = next(e for e in loop.events("probation") if e["reason"] == "RolledBack")
    assert "probation" in back["message"] or "crash" in back["message"].lower(), back["message"]


def test_recommend_mode_recommends_a_lower_fraction_and_changes_nothing(loop: Loop) -> None:
    before = loop.deployment_flags("recommend")
    assert before.mem_fraction_static is None and before.max_running_requests is None, before  # SGLang's own
    obj = loop.wait(
        "recommend",
        lambda o: (status(o).get("recommendation") or {}).get("engineArgs"),
        timeout=loop.budget_left(240),
        what="a recommendation after the CUDA OOMs",
    )
    rec = status(obj)["recommendation"]
    fraction = flags(rec["engineArgs"]).mem_fraction_static
    assert fraction is not None and fraction <= 0.80, rec
    assert "Recommended" in [e["reason"] for e in loop.events("recommend")]
    time.sleep(3)
    assert loop.deployment_flags("recommend") == before, "Recommend must leave the Deployment alone"
    obj = loop.get("recommend")
    assert not status(obj).get("appliedEngineArgs") and not status(obj).get("rollout"), status(obj)
    reasons = [e["reason"] for e in loop.events("recommend")]
    assert "Retuned" not in reasons and "RolledBack" not in reasons, reasons


def test_operator_killed_mid_rollout_finishes_the_sglang_rollout(loop: Loop) -> None:
    stack, case = loop.stack, loop.cases["killed"]
    assert stack.fleet is not None and stack.operator is not None
    planned = flags(case.planned)
    assert planned.mem_fraction_static is not None
    limit = round(planned.mem_fraction_static - 0.02, 3)
    stack.fleet.set_scenario(
        case.ns,
        "killed",
        Scenario(
            name="killed",
            truth=dataclasses.replace(H100_8B, runtime_oom_above_mem_fraction_static=limit, startup_s=3.0),
            workload=case.workload,
        ),
    )
    obj = loop.wait(
        "killed",
        lambda o: status(o).get("rollout"),
        timeout=loop.budget_left(150),
        what="a rollout in progress",
    )
    target = flags(status(obj)["rollout"]["engineArgs"])
    assert target.mem_fraction_static is not None and target.mem_fraction_static <= limit, target
    changed_at = status(obj)["lastChangeTime"]
    stack.operator.kill()
    killed_at = time.monotonic()
    time.sleep(3)
    stack.operator.start()
    obj = loop.wait(
        "killed",
        lambda o: rollout_done(o) and flags(status(o).get("lastGoodEngineArgs")) == target,
        timeout=120,
        what="the rollout finished by the restarted operator",
    )
    assert time.monotonic() - killed_at > 3 and stack.operator.starts >= 2
    assert flags(status(obj)["appliedEngineArgs"]) == target
    assert loop.deployment_flags("killed") == target
    # one change, the one recorded before the kill (SGLang's record is the status: it has no history; the
    # Retuned event, posted after the status write, may die with the operator)
    assert status(obj)["lastChangeTime"] == changed_at, (changed_at, status(obj))
    reasons = [e["reason"] for e in loop.events("killed")]
    assert reasons.count("Retuned") <= 1 and "RolledBack" not in reasons, reasons
    assert "RolloutSucceeded" in reasons, reasons
