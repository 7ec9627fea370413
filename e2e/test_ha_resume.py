"""High availability: the leader killed between the closed loop's status write and its Deployment apply.

Issue 14, "no decision is lost or made twice", at the one point where the closed loop's change is half done. A
change (mode Auto) is recorded in one status PATCH (``status.applied``, ``status.rollout``, one ``Retuned``
entry in ``status.history``) and applied to the Deployment after (kvpilot/operator/status/status_write.py). A
leader
killed between the two leaves the record and the old pod template; the next leader's resume handler re-applies
``status.applied`` and its timer continues the rollout from ``status.rollout``.

The window is the few milliseconds between the PATCH's answer and the apply's request: too narrow to kill the
leader in reliably from outside. The test holds it open with the API server itself: a
ValidatingAdmissionPolicy bound to the one Deployment refuses any change of its pod template. The real
leader plans the service (two replicas in a peering, the fleet simulator, Prometheus: e2e/ha.py), its GPU
then hits CUDA OOM, the leader decides the remedy and writes the record, and its apply is refused; the leader
is SIGKILLed as soon as the record shows (its in-memory retry of the apply dies with it), the policy is
deleted, and the follower takes over once the leader's peering record expires. The cluster then holds what
a leader killed between the write and the apply leaves, plus at most a ``RetuneFailed`` event for the refused
apply.

The opposite crash point, killed before the write: the same kind of policy on the InferenceService's
``/status`` refuses any change of ``status.applied``, so the leader's decision is never recorded (and never
applied: the apply follows the record); the leader is SIGKILLed once such a write was refused, and the
follower decides on its own.

Evidence, both ways: the follower resumed the object (its resume handler, not a re-plan); the Deployment's
template changed exactly once, to ``status.applied`` (generation one above the plan's, two ReplicaSets, the
container's vLLM args parse back to ``status.applied``); ``status.history`` is ``Planned, Retuned`` (killed
between: that ``Retuned`` is the leader's own entry, unchanged; killed before: the follower's); no rollback;
the rollout finished under the follower (Ready, probation, ``lastGoodSettings``). The test prints the times
from the kill to the follower's resume, to the template's change and to the end of the rollout.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.ha import (
    LIFETIME_S,
    RESOURCE,
    SLACK_S,
    PlannedService,
    applied,
    closed_loop_service,
    history,
    peering_namespace,
    replica_sets,
    wait_retune_settled,
)
from e2e.waits import wait_for
from kvpilot.operator import api
from kvpilot.tuner.vllm.args import parse_vllm_args

BETWEEN, BEFORE = "between-write-and-apply", "before-write"
MARK = "held by e2e/test_ha_resume.py"
"""In the policies' messages: a refusal the probe sees is theirs."""


@dataclass(frozen=True)
class Hold:
    """What a ValidatingAdmissionPolicy refuses to hold a crash point open, and a dry-run it refuses too."""

    rule: dict[str, Any]
    expression: str
    probe: tuple[str, ...]


def _hold(point: str, name: str) -> Hold:
    if point == BETWEEN:  # the record may land, the Deployment may not follow it
        template = {"spec": {"template": {"metadata": {"annotations": {"kvpilot-e2e/probe": "1"}}}}}
        return Hold(
            {
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["deployments"],
                "resourceNames": [name],
            },
            "object.spec.template == oldObject.spec.template",
            ("deployment", name, "--type=merge", "-p", json.dumps(template)),
        )
    return Hold(  # no change of status.applied may land: the decision is never recorded
        {
            "apiGroups": [api.GROUP],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": [f"{api.PLURAL}/status"],
            "resourceNames": [name],
        },
        "!has(oldObject.status) || !has(oldObject.status.applied) || "
        "(has(object.status.applied) && object.status.applied == oldObject.status.applied)",
        (
            RESOURCE,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"applied": {"maxNumSeqs": 3}}}),
        ),
    )


class Policy:
    """The :class:`Hold` of one crash point, in force between :meth:`enforce` and :meth:`release`."""

    def __init__(self, cluster: LocalCluster, ns: str, hold: Hold) -> None:
        self.cluster, self.ns, self.hold, self.name = cluster, ns, hold, f"kvha-hold-{ns}"

    def _refused(self) -> bool:
        proc = self.cluster.kubectl("patch", "-n", self.ns, "--dry-run=server", *self.hold.probe, check=False)
        assert proc.returncode == 0 or MARK in proc.stderr, proc.stderr  # refused by this policy, or admitted
        return proc.returncode != 0

    def enforce(self) -> None:
        api_version = "admissionregistration.k8s.io/v1"
        namespace = {"matchLabels": {"kubernetes.io/metadata.name": self.ns}}
        policy = {
            "apiVersion": api_version,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": self.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [self.hold.rule], "namespaceSelector": namespace},
                "validations": [{"expression": self.hold.expression, "message": MARK}],
            },
        }
        binding = {
            "apiVersion": api_version,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": self.name},
            "spec": {"policyName": self.name, "validationActions": ["Deny"]},
        }
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([policy, binding]))
        wait_for(self._refused, 60, f"{self.name} to be enforced")  # the API server loads policies lazily

    def release(self) -> None:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            self.cluster.kubectl("delete", kind, self.name, "--ignore-not-found", check=False)
        wait_for(lambda: not self._refused(), 60, f"{self.name} to be lifted")


@pytest.fixture
def ns(cluster: LocalCluster) -> Iterator[str]:
    with peering_namespace(cluster) as name:
        yield name


def _template_changed(svc: PlannedService) -> dict[str, Any] | None:
    dep = svc.deployment()
    return dep if dep["metadata"]["generation"] != svc.plan_generation else None


@pytest.mark.parametrize("point", [BETWEEN, BEFORE])
def test_the_follower_completes_a_change_the_killed_leader_left_half_done(
    cluster: LocalCluster, ns: str, tmp_path: Path, point: str
) -> None:
    with closed_loop_service(cluster, ns, tmp_path, "resume") as svc:
        name, leader, pair = svc.name, svc.pair.leader, svc.pair
        policy = Policy(cluster, ns, _hold(point, name))
        try:
            policy.enforce()
            limit = svc.oom()  # the leader's crash remedy: a lower utilisation
            if point == BETWEEN:  # kill once the record shows
                wait_for(lambda: history(svc.isvc(), "Retuned"), 120, "the leader's record of the retune")
            else:  # kill once a write of the decision was refused
                failed = "closed loop: writing the status failed"
                wait_for(lambda: failed in pair.log("leader"), 120, "the leader's refused record")
            leader.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            leader.wait()
            left = svc.isvc()
            dep = svc.deployment()
            assert dep["metadata"]["generation"] == svc.plan_generation, "the template changed: not half done"
            assert "reconciled (" not in pair.log("follower"), "the follower wrote while the leader was alive"
            if point == BETWEEN:  # the complete record: settings, rollout, one entry
                recorded = applied(left)
                assert [h["action"] for h in history(left)] == ["Planned", "Retuned"], history(left)
                assert recorded != svc.plan and float(recorded["gpuMemoryUtilization"]) <= limit, recorded
                rollout = {
                    k: v
                    for k, v in (left["status"].get("rollout") or {}).get("settings", {}).items()
                    if v is not None
                }
                assert rollout == recorded, left["status"].get("rollout")
            else:  # nothing recorded
                assert "HTTP 422" in pair.log("leader")  # refused by the admission policy
                assert [h["action"] for h in history(left)] == ["Planned"], history(left)
                assert applied(left) == svc.plan and not left["status"].get("rollout"), left["status"]
        finally:
            policy.release()
        assert "Resuming operations after the pause" not in pair.log("follower"), "resumed under the policy"
        released_s = time.monotonic() - killed_at

        wait_for(
            lambda: "Resuming operations after the pause" in pair.log("follower"),
            LIFETIME_S + SLACK_S,
            "the follower to resume",
        )
        resumed_s = time.monotonic() - killed_at
        wait_for(lambda: _template_changed(svc), 60, "the follower's change of the Deployment")
        applied_s = time.monotonic() - killed_at

        done = wait_retune_settled(svc.isvc)
        finished_s = time.monotonic() - killed_at
        print(
            f"resume after a SIGKILL {point} (peering lifetime {LIFETIME_S} s): policy lifted "
            f"{released_s:.1f} s after the kill; the follower resumed after {resumed_s:.1f} s, changed the "
            f"template after {applied_s:.1f} s, finished the rollout after {finished_s:.1f} s"
        )

        # no decision lost, none made twice: one retune (the leader's record if it was written), no rollback
        entries = history(done)
        assert [h["action"] for h in entries] == ["Planned", "Retuned"], entries
        assert entries[1]["trigger"] == "CudaOOM", entries
        if point == BETWEEN:
            assert entries == history(left), (entries, history(left))  # the leader's record, untouched
            assert applied(done) == recorded, (done["status"], recorded)
        assert float(applied(done)["gpuMemoryUtilization"]) <= limit, done["status"]
        # the template changed exactly once, to status.applied, and every generation caught up
        dep = svc.deployment()
        assert dep["metadata"]["generation"] == svc.plan_generation + 1, "the template changed more than once"
        assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
        assert dep["status"].get("updatedReplicas") == dep["status"].get("readyReplicas") == 1, dep["status"]
        assert len(replica_sets(cluster, ns, name)) == 2
        assert done["status"]["observedGeneration"] == done["metadata"]["generation"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert parse_vllm_args(args)[0] == api.Settings.model_validate(applied(done)).to_engine(), args
        # the follower resumed the object (no re-plan); it decided the retune only if none was recorded
        follower = pair.log("follower")
        assert f"[{ns}/{name}] reconciled (Resumed)" in follower
        assert f"[{ns}/{name}] reconciled (Created)" not in follower
        decided = "closed loop: retune (CudaOOM)"  # logged once the record is written
        assert (decided in follower) == (point == BEFORE), follower[-3000:]
        if point == BEFORE:
            assert decided not in pair.log("leader")
