"""What the high-availability e2e tests share (e2e/test_ha.py, e2e/test_ha_resume.py).

Two ``kopf run --peering`` replicas of the operator on the host in one ``KopfPeering`` of the test's namespace
(:func:`replicas`: the one of priority 200 leads, the one of 100 follows), and a closed-loop service planned,
Ready and past probation under them, with the fleet simulator and Prometheus (:func:`closed_loop_service`),
whose GPU can then be made to hit CUDA OOM at the planned utilisation (:meth:`PlannedService.oom`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
ROLLOUT_DEADLINE_S = 180
"""``spec.tuning.rolloutDeadlineSeconds`` of the closed-loop service: a slow pod (test_ha's 35 s), the
failover and the probation fit well inside."""
H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def peers(cluster: LocalCluster, ns: str) -> set[str]:
    return set((get(cluster, "kopfpeering", PEERING, "-n", ns) or {}).get("status") or {})


def history(obj: dict[str, Any], action: str | None = None) -> list[dict[str, Any]]:
    """``status.history``'s entries (of ``action`` only, if given)."""
    entries = obj.get("status", {}).get("history") or ()
    return [h for h in entries if action is None or h.get("action") == action]


def applied(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (obj.get("status", {}).get("applied") or {}).items() if v is not None}


def settled(obj: dict[str, Any]) -> bool:
    """Planned, Ready, no rollout, and the applied settings passed probation."""
    st = obj.get("status", {})
    good = {k: v for k, v in (st.get("lastGoodSettings") or {}).items() if v is not None}
    return (
        condition(obj, "Ready").get("status") == "True"
        and not st.get("rollout")
        and condition(obj, "RolloutInProgress").get("status") != "True"
        and bool(good)
        and good == applied(obj)
    )


def wait_retune_settled(isvc: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The InferenceService once a retune is recorded and its rollout passed probation (within
    :data:`ROLLOUT_DEADLINE_S`)."""

    def finished() -> dict[str, Any] | None:
        obj = isvc()
        return obj if settled(obj) and history(obj, "Retuned") else None

    done: dict[str, Any] = wait_for(finished, ROLLOUT_DEADLINE_S, "the follower to finish the rollout")
    return done


def replica_sets(cluster: LocalCluster, ns: str, deployment: str) -> list[dict[str, Any]]:
    items = (get(cluster, "replicasets", "-n", ns) or {"items": []})["items"]
    owned = (rs for rs in items if rs["metadata"].get("ownerReferences"))
    return [rs for rs in owned if any(o.get("name") == deployment for o in rs["metadata"]["ownerReferences"])]


@contextlib.contextmanager
def peering_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace with the CRDs installed and an empty ``KopfPeering`` in it; deleted afterwards."""
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(PEERING_CRDS))
    for crd in (RESOURCE, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        wait_established(cluster.kubectl, f"crd/{crd}")  # kubectl wait fails at once on a CRD this new
    name = f"kvha-{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(name):
        peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
        cluster.kubectl("apply", "-n", name, "-f", "-", input=yaml.safe_dump(peering))
        yield name


@dataclass
class Replicas:
    leader: subprocess.Popen[bytes]
    follower: subprocess.Popen[bytes]
    logs: dict[str, Path]
    """``leader`` and ``follower``: each replica's kopf log."""

    def log(self, which: str) -> str:
        return self.logs[which].read_text()


@contextlib.contextmanager
def replicas(cluster: LocalCluster, ns: str, tmp_path: Path, env: dict[str, str]) -> Iterator[Replicas]:
    """The leader (priority 200) and the follower (100), with ``env`` and the peering lifetime
    :data:`LIFETIME_S`, both keeping themselves alive in the peering; stopped afterwards (SIGTERM)."""
    env = {**env, "KVPILOT_PEERING_LIFETIME_SECONDS": str(LIFETIME_S)}
    logs = {"leader": tmp_path / "leader" / "kopf.log", "follower": tmp_path / "follower" / "kopf.log"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for which, priority in (("leader", 200), ("follower", 100)):
            logs[which].parent.mkdir()
            procs[which] = spawn_host_operator(
                cluster,
                logs[which],
                ns,
                {**env, "POD_ID": f"kvha-{which}"},
                mode=(f"--peering={PEERING}", f"--priority={priority}"),
            )
        wait_for(lambda: {"kvha-leader", "kvha-follower"} <= peers(cluster, ns), 60, "both in the peering")
        yield Replicas(procs["leader"], procs["follower"], logs)
    finally:
        for which, proc in procs.items():
            stop_host_operator(proc, logs[which])


@dataclass
class PlannedService:
    """A closed-loop service (mode Auto) planned, Ready and past probation under :attr:`pair`."""

    cluster: LocalCluster
    stack: Stack
    pair: Replicas
    ns: str
    name: str
    plan: dict[str, Any]
    """The planned settings (``status.applied`` then)."""
    plan_generation: int
    """The Deployment's generation then."""

    def isvc(self) -> dict[str, Any]:
        return dict(get(self.cluster, RESOURCE, self.name, "-n", self.ns) or {})

    def deployment(self) -> dict[str, Any]:
        return dict(get(self.cluster, "deployment", self.name, "-n", self.ns) or {})

    def oom(self, **truth: Any) -> float:
        """From now on the GPU OOMs above 0.02 below the planned utilisation (and ``truth``'s other changes
        to the ground truth apply): the closed loop's crash remedy retunes. Returns that limit."""
        limit = round(float(self.plan["gpuMemoryUtilization"]) - 0.02, 2)
        changed = dataclasses.replace(H100_8B, runtime_oom_above_utilization=limit, **truth)
        assert self.stack.fleet is not None
        self.stack.fleet.set_scenario(
            self.ns, self.name, Scenario(name=self.name, truth=changed, workload=LIGHT)
        )
        return limit


@contextlib.contextmanager
def closed_loop_service(
    cluster: LocalCluster, ns: str, tmp_path: Path, name: str
) -> Iterator[PlannedService]:
    """Prometheus, the fleet and :func:`replicas` with a fast closed loop; ``name`` (Llama-3.1-8B on one H100,
    mode Auto, no cooldown, :data:`ROLLOUT_DEADLINE_S`) created and waited for until it is planned, Ready and
    past probation under the leader."""
    stack = Stack(
        cluster,
        tmp_path / "stack",
        namespaces=[ns],
        scenarios={(ns, name): Scenario(name=name, truth=H100_8B, workload=LIGHT)},
    )
    stack.start(operator=False)  # Prometheus and the fleet; the two replicas are started below
    try:
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        with replicas(cluster, ns, tmp_path, closed_loop_env(stack.prom.url)) as pair:
            tuning = {
                "mode": "Auto",
                "cooldownSeconds": 0,
                "maxChangesPerHour": 60,
                "rolloutDeadlineSeconds": ROLLOUT_DEADLINE_S,
            }
            cluster.apply([catalogue_isvc(name, ns, MODEL, H100, {"maxContextLength": 8192}, tuning)])
            service = PlannedService(cluster, stack, pair, ns, name, {}, 0)
            obj = wait_for(
                lambda: o if settled(o := service.isvc()) else None,
                180,
                f"{name} planned, Ready and past probation",
            )
            service.plan = applied(obj)
            service.plan_generation = service.deployment()["metadata"]["generation"]
            assert len(replica_sets(cluster, ns, name)) == 1
            yield service
    finally:
        stack.stop()
