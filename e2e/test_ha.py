"""High availability: two operator replicas with kopf peering; the active one is killed mid-rollout.

Two ``kopf run --peering`` processes of the operator on the host share one ``KopfPeering`` in the test's
namespace: the one of higher priority acts, the other pauses (kopf's peering, as the chart runs it with
``peering.enabled``). Half of a fleet of InferenceServices is created; while the leader is planning them
it is killed with SIGKILL (no goodbye to the peering: the hard case, a lost node) or stopped with SIGTERM
(a rollout of the operator: kopf finishes its handlers and leaves the peering), and the rest of the fleet is
created during the outage. Evidence required by issue 14:

* the follower made no write while the leader lived (its watches start paused and stay so);
* it takes over within the bound the peering lifetime sets (``KVPILOT_PEERING_LIFETIME_SECONDS``; a dead
  peer blocks the others until its record expires), and the test prints the failover time;
* no decision is lost: every InferenceService is Planned, with its Deployment;
* none is made twice: each has exactly one ``status.history`` record, its Deployment is at generation 1
  (the follower's re-apply of an already planned object changed nothing), the follower resumed the
  leader's objects without re-planning them, and each has at most one ``Planned`` event (two only for an
  object both planned: the same plan, recorded once; none for an object whose event the old leader still
  had queued, after SIGKILL or SIGTERM: events are best effort, ``status.history`` is the record).

Then the same, mid-rollout (``test_the_follower_finishes_the_rollout_the_killed_leader_started``): the
fleet simulator plays the pods (``e2e.fleet``) and Prometheus scrapes them, so the closed loop runs in both
replicas (paused in the follower). A service is planned and Ready; its GPU then hits CUDA OOM at the planned
utilisation and new pods take ``SLOW_START_S`` to load, so the leader's crash remedy starts a long rollout:
the Deployment's template changes, a new ReplicaSet surges, ``status.rollout`` is written. The leader is
SIGKILLed while that pod is still loading; the follower takes over and finishes the rollout from
``status.rollout`` (wait for Ready, probation, ``lastGoodSettings``). Evidence: one ``Retuned`` record in
``status.history``, no rollback, the Deployment's template changed exactly once (its generation one above
the plan's, two ReplicaSets), every observedGeneration caught up, and the failover time printed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.fleet import Scenario, Workload
from e2e.fleet.stack import Stack, closed_loop_env, condition
from e2e.fleet.testing import H100_8B, catalogue_isvc
from e2e.waits import spawn_host_operator, stop_host_operator, wait_established, wait_for

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"
PEERING_CRDS = ROOT / "charts" / "kvpilot" / "crds" / "kopf-peering.yaml"
RESOURCE = "inferenceservices.kvpilot.io"
PEERING = "kvpilot-ha"
LIFETIME_S = 15
"""The peering lifetime the replicas run with (the chart's default is kopf's 60 s)."""
SLACK_S = 45.0
"""On top of the lifetime: the follower's re-listing and first reconcile on a loaded 2-core machine."""
FLEET = 40


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def planned(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    items = (get(cluster, RESOURCE, "-n", ns) or {"items": []})["items"]
    return {
        o["metadata"]["name"]: o
        for o in items
        if any(
            c["type"] == "Planned" and c["status"] == "True"
            for c in o.get("status", {}).get("conditions", [])
        )
    }


def peers(cluster: LocalCluster, ns: str) -> set[str]:
    return set((get(cluster, "kopfpeering", PEERING, "-n", ns) or {}).get("status") or {})


def isvc(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": f"ha-{i:02d}"},
        "spec": {
            "model": {"id": "Qwen/Qwen2.5-1.5B-Instruct"},
            "gpu": {"count": 1, "product": "NVIDIA-L4"},
            "replicas": 0,
            "serving": {"maxContextLength": 8192 + 1024 * (i % 4)},
        },
    }


def create(cluster: LocalCluster, ns: str, indices: range) -> None:
    docs = "---\n".join(yaml.safe_dump(isvc(i)) for i in indices)
    cluster.kubectl("create", "-n", ns, "-f", "-", input=docs)


def reconciled(log: Path, trigger: str) -> set[str]:
    """The objects whose reconcile the replica logged (``[ns/name] reconciled (Trigger): ...``)."""
    return set(re.findall(rf"\[[^/\]]+/([^\]]+)\] reconciled \({trigger}\)", log.read_text()))


@pytest.fixture
def ns(cluster: LocalCluster) -> Iterator[str]:
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(PEERING_CRDS))
    for crd in (RESOURCE, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        wait_established(cluster.kubectl, f"crd/{crd}")  # kubectl wait fails at once on a CRD this new
    name = f"kvha-{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(name):
        peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
        cluster.kubectl("apply", "-n", name, "-f", "-", input=yaml.safe_dump(peering))
        yield name


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_follower_takes_over_when_the_leader_is_killed(
    cluster: LocalCluster, ns: str, tmp_path: Path, sig: signal.Signals
) -> None:
    env = {"KVPILOT_PEERING_LIFETIME_SECONDS": str(LIFETIME_S)}
    logs = {"leader": tmp_path / "leader" / "kopf.log", "follower": tmp_path / "follower" / "kopf.log"}
    for log in logs.values():
        log.parent.mkdir()
    leader = spawn_host_operator(cluster, logs["leader"], ns, {**env, "POD_ID": "kvha-leader"},
                                 mode=(f"--peering={PEERING}", "--priority=200"))  # fmt: skip
    follower = None
    try:
        follower = spawn_host_operator(cluster, logs["follower"], ns, {**env, "POD_ID": "kvha-follower"},
                                       mode=(f"--peering={PEERING}", "--priority=100"))  # fmt: skip
        # Both keep themselves alive in the peering; the follower's watches start paused, and stay so.
        wait_for(lambda: {"kvha-leader", "kvha-follower"} <= peers(cluster, ns), 60, "both in the peering")
        paused = f"Starting the watch-stream for inferenceservices.v1alpha1.kvpilot.io in '{ns}' (paused)"
        assert paused in logs["follower"].read_text()
        half = FLEET // 2
        create(cluster, ns, range(half))
        wait_for(lambda: planned(cluster, ns), 120, "the leader's first decision")
        follower_log = logs["follower"].read_text()
        leader.send_signal(sig)  # mid-rollout: the leader is still planning the first half
        killed_at = time.monotonic()
        leader.wait()
        # planned by the leader: after SIGTERM kopf leaves the peering before its handlers finish, and the
        # follower may plan the leader's last objects before the leader's process has exited
        before = {n: o for n, o in planned(cluster, ns).items() if n in reconciled(logs["leader"], "Created")}
        assert "reconciled (" not in follower_log, "the follower wrote while the leader was alive"
        assert len(before) < FLEET
        create(cluster, ns, range(half, FLEET))  # created during the outage

        wait_for(lambda: "Resuming operations after the pause" in logs["follower"].read_text(),
                 LIFETIME_S + SLACK_S, "the follower to resume")  # fmt: skip
        resumed_s = time.monotonic() - killed_at
        wait_for(lambda: "reconciled (Created)" in logs["follower"].read_text(), LIFETIME_S + SLACK_S,
                 "the follower's first decision")  # fmt: skip
        first_decision_s = time.monotonic() - killed_at
        wait_for(lambda: len(planned(cluster, ns)) == FLEET, 180, "every InferenceService Planned")
        done = planned(cluster, ns)
        all_planned_s = time.monotonic() - killed_at
        print(
            f"failover ({sig.name}, peering lifetime {LIFETIME_S} s): the follower resumed after "
            f"{resumed_s:.1f} s, made its first decision after {first_decision_s:.1f} s; all {FLEET} "
            f"planned after {all_planned_s:.1f} s ({len(before)} of the first {half} by the leader)"
        )
        assert resumed_s <= LIFETIME_S + SLACK_S
        if sig == signal.SIGTERM:  # the leader left the peering: no wait for its record to expire
            assert resumed_s < LIFETIME_S, resumed_s

        deployments = {d["metadata"]["name"]: d for d in get(cluster, "deployments", "-n", ns)["items"]}
        for name, obj in done.items():
            history = obj["status"].get("history") or []
            assert [h["action"] for h in history] == ["Planned"], f"{name}: {history}"
            dep = deployments[name]
            assert dep["metadata"]["generation"] == 1, f"{name}: its Deployment was changed after the plan"
            args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
            applied = obj["status"]["applied"]
            assert args[args.index("--max-model-len") + 1] == str(applied["maxModelLen"])
        # The leader's objects were resumed by the follower (kept, not re-planned): no second decision. An
        # object the leader was mid-way through is created anew by the follower: its status was not written
        # yet (SIGKILL), or kopf had already left the peering while that last handler ran (SIGTERM: kopf says
        # goodbye before its running handlers finish). Both then plan the same, and history has it once.
        created, resumed = reconciled(logs["follower"], "Created"), reconciled(logs["follower"], "Resumed")
        overlap = reconciled(logs["leader"], "Created") & created
        print(f"objects both replicas reconciled (the leader's last, in flight): {sorted(overlap)}")
        assert set(before) <= resumed | overlap and not created & resumed
        assert created | resumed == set(done)

        # At most one Planned event per object (two only for an object both reconciled); every object the
        # follower planned has its event. One the old leader planned may have none: kopf posts events from a
        # queue, and drops what is queued on SIGKILL and, measured, on SIGTERM too. status.history is the
        # durable record (checked above).
        def planned_events() -> dict[str, int]:
            counts = dict.fromkeys(done, 0)
            for e in (get(cluster, "events", "-n", ns) or {"items": []})["items"]:
                if e.get("reason") == "Planned" and e["involvedObject"]["name"] in counts:
                    counts[e["involvedObject"]["name"]] += e.get("count") or 1
            return counts

        def follower_events_posted() -> dict[str, int] | None:
            counts = planned_events()
            return counts if all(counts[n] for n in created) else None

        counts = wait_for(follower_events_posted, 60, "the follower's Planned events")
        assert {n for n, c in counts.items() if c > 1} <= overlap, counts
        lost = sorted(n for n, c in counts.items() if not c)
        print(f"Planned events lost with the killed leader's queue: {lost}")
        assert set(lost) <= set(before) - created, counts
    finally:
        for proc, log in ((leader, logs["leader"]), (follower, logs["follower"])):
            if proc is not None:
                stop_host_operator(proc, log)


# ------------------------------------------------------------------------------------------- mid-rollout

SLOW_START_S = 35.0
"""How long a new pod takes to load in the rollout: past the follower's takeover (the lifetime and its slack
at worst), so the follower inherits a rollout whose pod is not Ready yet."""
ROLLOUT_DEADLINE_S = 180
"""``spec.tuning.rolloutDeadlineSeconds``: the slow pod, the failover and the probation fit well inside."""
H100 = "NVIDIA-H100-80GB-HBM3"


def _history(obj: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [h for h in obj.get("status", {}).get("history") or () if h.get("action") == action]


def _applied(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (obj.get("status", {}).get("applied") or {}).items() if v is not None}


def _settled(obj: dict[str, Any]) -> bool:
    """Planned, Ready, no rollout, and the applied settings passed probation."""
    st = obj.get("status", {})
    good = {k: v for k, v in (st.get("lastGoodSettings") or {}).items() if v is not None}
    return (
        condition(obj, "Ready").get("status") == "True"
        and not st.get("rollout")
        and condition(obj, "RolloutInProgress").get("status") != "True"
        and bool(good) and good == _applied(obj)
    )  # fmt: skip


def _replica_sets(cluster: LocalCluster, ns: str, deployment: str) -> list[dict[str, Any]]:
    items = (get(cluster, "replicasets", "-n", ns) or {"items": []})["items"]
    owned = (rs for rs in items if rs["metadata"].get("ownerReferences"))
    return [rs for rs in owned if any(o.get("name") == deployment for o in rs["metadata"]["ownerReferences"])]


def test_the_follower_finishes_the_rollout_the_killed_leader_started(
    cluster: LocalCluster, ns: str, tmp_path: Path
) -> None:
    name = "roll"
    light = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)
    stack = Stack(cluster, tmp_path / "stack", namespaces=[ns],
                  scenarios={(ns, name): Scenario(name=name, truth=H100_8B, workload=light)})  # fmt: skip
    stack.start(operator=False)  # Prometheus and the fleet; the two replicas are started below
    env = {**closed_loop_env(stack.prom.url), "KVPILOT_PEERING_LIFETIME_SECONDS": str(LIFETIME_S)}
    logs = {"leader": tmp_path / "leader" / "kopf.log", "follower": tmp_path / "follower" / "kopf.log"}
    for log in logs.values():
        log.parent.mkdir()
    leader = follower = None
    try:
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        leader = spawn_host_operator(cluster, logs["leader"], ns, {**env, "POD_ID": "kvha-leader"},
                                     mode=(f"--peering={PEERING}", "--priority=200"))  # fmt: skip
        follower = spawn_host_operator(cluster, logs["follower"], ns, {**env, "POD_ID": "kvha-follower"},
                                       mode=(f"--peering={PEERING}", "--priority=100"))  # fmt: skip
        wait_for(lambda: {"kvha-leader", "kvha-follower"} <= peers(cluster, ns), 60, "both in the peering")
        tuning = {"mode": "Auto", "cooldownSeconds": 0, "maxChangesPerHour": 60,
                  "rolloutDeadlineSeconds": ROLLOUT_DEADLINE_S}  # fmt: skip
        cluster.apply([catalogue_isvc(name, ns, "meta-llama/Llama-3.1-8B-Instruct", H100,
                                      {"maxContextLength": 8192}, tuning)])  # fmt: skip

        def isvc() -> dict[str, Any]:
            return dict(get(cluster, RESOURCE, name, "-n", ns) or {})

        wait_for(lambda: _settled(isvc()), 180, f"{name} planned, Ready and past probation")
        first = isvc()
        planned = _applied(first)
        plan_generation = get(cluster, "deployment", name, "-n", ns)["metadata"]["generation"]
        assert len(_replica_sets(cluster, ns, name)) == 1
        # the GPU now OOMs at the planned utilisation, and new pods load slowly: the leader's remedy rolls out
        limit = round(float(planned["gpuMemoryUtilization"]) - 0.02, 2)
        truth = dataclasses.replace(H100_8B, runtime_oom_above_utilization=limit, startup_s=SLOW_START_S)
        assert stack.fleet is not None
        stack.fleet.set_scenario(ns, name, Scenario(name=name, truth=truth, workload=light))
        def retuning() -> dict[str, Any] | None:
            # status.rollout, the settings and the history entry land in one PATCH (operator/status_write.py)
            obj = isvc()
            return obj if obj.get("status", {}).get("rollout") and _history(obj, "Retuned") else None

        rolling = wait_for(retuning, 120, "the leader's retune rolling out")
        target = {k: v for k, v in rolling["status"]["rollout"]["settings"].items() if v is not None}
        # the record comes first and the Deployment follows it (milliseconds later): kill once it has
        def retuned_template() -> dict[str, Any] | None:
            dep = get(cluster, "deployment", name, "-n", ns)
            return dep if dep and dep["metadata"]["generation"] == plan_generation + 1 else None

        dep = wait_for(retuned_template, 30, "the retune on the Deployment's template")
        revision = "deployment.kubernetes.io/revision"
        new_ready = [
            rs for rs in _replica_sets(cluster, ns, name)
            if rs["metadata"]["annotations"].get(revision) == "2" and rs["status"].get("readyReplicas")
        ]  # fmt: skip
        assert not new_ready, "the new pod was Ready before the kill: not mid-rollout"
        assert "reconciled (" not in logs["follower"].read_text(), "the follower wrote before the kill"
        leader.send_signal(signal.SIGKILL)  # mid-rollout: the new ReplicaSet's pod is still loading
        killed_at = time.monotonic()
        leader.wait()

        wait_for(lambda: "Resuming operations after the pause" in logs["follower"].read_text(),
                 LIFETIME_S + SLACK_S, "the follower to resume")  # fmt: skip
        resumed_s = time.monotonic() - killed_at
        mid = isvc()["status"].get("rollout")
        def finished() -> dict[str, Any] | None:
            obj = isvc()
            return obj if _settled(obj) and _history(obj, "Retuned") else None

        done = wait_for(finished, ROLLOUT_DEADLINE_S, "the follower to finish the rollout")
        finished_s = time.monotonic() - killed_at
        print(
            f"failover mid-rollout (SIGKILL, peering lifetime {LIFETIME_S} s, new pods load in "
            f"{SLOW_START_S:.0f} s): the follower resumed after {resumed_s:.1f} s with the rollout "
            f"{'still in progress' if mid else 'already over'}, and finished it {finished_s:.1f} s after the "
            "kill"
        )
        assert mid, "the rollout was over before the follower took over: not a mid-rollout failover"
        assert resumed_s <= LIFETIME_S + SLACK_S

        # no decision lost: the leader's target is what runs, passed probation under the follower
        assert _applied(done) == target, (done["status"], target)
        assert float(target["gpuMemoryUtilization"]) <= limit, target
        # none made twice: one retune in the record, no rollback, the template changed once, all caught up
        retunes = _history(done, "Retuned")
        assert len(retunes) == 1 and retunes[0]["trigger"] == "CudaOOM", done["status"].get("history")
        assert not _history(done, "RolledBack"), done["status"].get("history")
        assert len(_history(done, "Planned")) == 1, done["status"].get("history")
        dep = get(cluster, "deployment", name, "-n", ns)
        assert dep["metadata"]["generation"] == plan_generation + 1, "the follower changed the template again"
        assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
        assert dep["status"].get("updatedReplicas") == dep["status"].get("readyReplicas") == 1, dep["status"]
        assert len(_replica_sets(cluster, ns, name)) == 2
        assert done["status"]["observedGeneration"] == done["metadata"]["generation"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert float(args[args.index("--gpu-memory-utilization") + 1]) == target["gpuMemoryUtilization"]
        follower_log = logs["follower"].read_text()
        assert f"[{ns}/{name}] reconciled (Resumed)" in follower_log  # resumed, not planned again
        assert f"[{ns}/{name}] reconciled (Created)" not in follower_log
    finally:
        for proc, log in ((leader, logs["leader"]), (follower, logs["follower"])):
            if proc is not None:
                stop_host_operator(proc, log)
        stack.stop()
