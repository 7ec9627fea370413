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

Here the leader is killed once the record and the Deployment both carry the retune. The two crash points
inside the change, killed between the status write and the Deployment apply and killed before the write, are
e2e/test_ha_resume.py's (an admission policy holds each open). The replicas, the peering namespace and the
planned closed-loop service come from e2e/ha.py.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.fleet.pod import SERVING
from e2e.ha import (
    LIFETIME_S,
    RESOURCE,
    SLACK_S,
    applied,
    closed_loop_service,
    get,
    history,
    peering_namespace,
    replica_sets,
    replicas,
    wait_retune_settled,
)
from e2e.waits import wait_for

FLEET = 40


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
    with peering_namespace(cluster) as name:
        yield name


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_follower_takes_over_when_the_leader_is_killed(
    cluster: LocalCluster, ns: str, tmp_path: Path, sig: signal.Signals
) -> None:
    with replicas(cluster, ns, tmp_path, {}) as pair:
        leader, logs = pair.leader, pair.logs
        # Both keep themselves alive in the peering; the follower's watches start paused, and stay so.
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

        wait_for(
            lambda: "Resuming operations after the pause" in logs["follower"].read_text(),
            LIFETIME_S + SLACK_S,
            "the follower to resume",
        )
        resumed_s = time.monotonic() - killed_at
        wait_for(
            lambda: "reconciled (Created)" in logs["follower"].read_text(),
            LIFETIME_S + SLACK_S,
            "the follower's first decision",
        )
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


# ------------------------------------------------------------------------------------------- mid-rollout

SLOW_START_S = 35.0
"""How long a new pod takes to load in the rollout: past the follower's takeover (the lifetime and its slack
at worst), so the follower inherits a rollout whose pod is not Ready yet."""


def test_the_follower_finishes_the_rollout_the_killed_leader_started(
    cluster: LocalCluster, ns: str, tmp_path: Path
) -> None:
    with closed_loop_service(cluster, ns, tmp_path, "roll") as svc:
        name, leader, logs = svc.name, svc.pair.leader, svc.pair.logs
        isvc, plan_generation = svc.isvc, svc.plan_generation
        # the GPU now OOMs at the planned utilisation, and new pods load slowly: the leader's remedy rolls out
        limit = svc.oom(startup_s=SLOW_START_S)

        def retuning() -> dict[str, Any] | None:
            # status.rollout, the settings and the history entry land in one PATCH (operator/status_write.py)
            obj = isvc()
            return obj if obj.get("status", {}).get("rollout") and history(obj, "Retuned") else None

        rolling = wait_for(retuning, 120, "the leader's retune rolling out")
        target = {k: v for k, v in rolling["status"]["rollout"]["settings"].items() if v is not None}

        # the record comes first and the Deployment follows it (milliseconds later): kill once it has
        def retuned_template() -> dict[str, Any] | None:
            dep = svc.deployment()
            return dep if dep and dep["metadata"]["generation"] == plan_generation + 1 else None

        dep = wait_for(retuned_template, 30, "the retune on the Deployment's template")
        revision = "deployment.kubernetes.io/revision"
        # the fleet decides when a pod is Ready (KWOK's pod-ready stage marks a new pod Ready for a moment,
        # until the fleet's next poll writes it back as loading), so ask the fleet, not the ReplicaSet
        new_sets = [
            rs["metadata"]["name"]
            for rs in replica_sets(cluster, ns, name)
            if rs["metadata"]["annotations"].get(revision) == "2"
        ]
        assert svc.stack.fleet is not None
        serving = [
            p["pod"]
            for p in svc.stack.fleet.pods(ns, name)
            if p["state"] == SERVING and any(p["pod"].startswith(f"{rs}-") for rs in new_sets)
        ]
        assert not serving, f"the new pod was serving before the kill: not mid-rollout ({serving})"
        assert "reconciled (" not in logs["follower"].read_text(), "the follower wrote before the kill"
        leader.send_signal(signal.SIGKILL)  # mid-rollout: the new ReplicaSet's pod is still loading
        killed_at = time.monotonic()
        leader.wait()

        wait_for(
            lambda: "Resuming operations after the pause" in logs["follower"].read_text(),
            LIFETIME_S + SLACK_S,
            "the follower to resume",
        )
        resumed_s = time.monotonic() - killed_at
        mid = isvc()["status"].get("rollout")
        done = wait_retune_settled(isvc)
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
        assert applied(done) == target, (done["status"], target)
        assert float(target["gpuMemoryUtilization"]) <= limit, target
        # none made twice: one retune in the record, no rollback, the template changed once, all caught up
        retunes = history(done, "Retuned")
        assert len(retunes) == 1 and retunes[0]["trigger"] == "CudaOOM", done["status"].get("history")
        assert not history(done, "RolledBack"), done["status"].get("history")
        assert len(history(done, "Planned")) == 1, done["status"].get("history")
        dep = svc.deployment()
        assert dep["metadata"]["generation"] == plan_generation + 1, "the follower changed the template again"
        assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
        assert dep["status"].get("updatedReplicas") == dep["status"].get("readyReplicas") == 1, dep["status"]
        assert len(replica_sets(cluster, ns, name)) == 2
        assert done["status"]["observedGeneration"] == done["metadata"]["generation"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert float(args[args.index("--gpu-memory-utilization") + 1]) == target["gpuMemoryUtilization"]
        follower_log = logs["follower"].read_text()
        assert f"[{ns}/{name}] reconciled (Resumed)" in follower_log  # resumed, not planned again
        assert f"[{ns}/{name}] reconciled (Created)" not in follower_log
