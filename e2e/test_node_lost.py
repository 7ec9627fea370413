"""A dead node during a Replace rollout is not a failed setting (issue 31), on the real control plane.

Three KWOK L4 nodes of the test's own (one GPU each): the service's two replicas on nodes 0 and 1, nothing
on node 2. Nodes 0 and 1 are cordoned, so the Replace rollout of a CUDA-OOM retune binds its first new pod
to node 2 (KWOK starts it) and its second one waits, Unschedulable. Then node 2 dies: KWOK lets go of it
(its annotation removed; KWOK's node-initialize stage would post any NotReady node Ready again) and its
Ready condition and its pod's are posted False, as a kubelet that lost its container runtime does;
kube-controller-manager's node lifecycle controller taints the node not-ready. The rollout has not
finished (the new settings never ran on every replica). What the operator must do (the logic's unit tests:
``tests/operator/test_replica_lost.py``): keep the new settings out of ``failedSettings``, not roll back,
and say Degraded=True ReplicaLost naming the pod and the node; and once the node is back and the other
nodes take pods again, finish the rollout on the new settings.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet.kopf_process import OperatorProcess
from e2e.nodes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE, L4, NodePool
from e2e.pods import _now
from e2e.test_rollout import (
    POOL_LABEL,
    TAINT,
    Pool,
    compact,
    condition,
    history,
    rolled_out,
    run_pool_operator,
)
from e2e.waits import wait_for

NS_PREFIX = "e2e-lost-"


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    yield from run_pool_operator(cluster, tmp_path_factory, "node-lost-operator", NS_PREFIX)


@pytest.fixture
def pool(cluster: LocalCluster, operator: OperatorProcess) -> Iterator[Pool]:
    ns = f"{NS_PREFIX}{uuid.uuid4().hex[:6]}"
    base = NodePool(
        f"lost-{ns.removeprefix(NS_PREFIX)}", 3, L4, 1, cpu="8", memory="32Gi", machine="g6.xlarge"
    )
    with cluster.tainted_nodes(base, POOL_LABEL, ns, TAINT), cluster.temporary_namespace(ns):
        yield Pool(cluster, ns, operator)


def _node_ready(pool: Pool, node: str) -> str:
    return str(condition(pool.get("node", node), "Ready").get("status"))


def _post_ready(pool: Pool, node: str, status: str, reason: str) -> None:
    """Post the node's Ready condition as its kubelet would (a strategic merge: by condition type)."""
    ready = {"type": "Ready", "status": status, "reason": reason, "message": f"e2e: {reason}"}
    ready |= {"lastHeartbeatTime": _now(), "lastTransitionTime": _now()}
    patch = json.dumps({"status": {"conditions": [ready]}})
    pool.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)


def _post_pod_ready(pool: Pool, pod: str, ready: bool) -> None:
    """What the node's kubelet posts for its pod: its container and the pod Ready or not."""
    status = pool.get("pod", pod, "-n", pool.ns)["status"]
    for c in status.get("conditions") or ():
        if c["type"] in ("Ready", "ContainersReady"):
            reason = {} if ready else {"reason": "ContainersNotReady"}
            c.pop("reason", None)
            c.update(status=str(ready), lastTransitionTime=_now(), **reason)
    for c in status.get("containerStatuses") or ():
        c["ready"] = ready
    patch = json.dumps({"status": {k: status[k] for k in ("conditions", "containerStatuses")}})
    pool.kubectl("patch", "pod", pod, "-n", pool.ns, "--subresource=status", "--type=merge", "-p", patch)


def _tainted_not_ready(pool: Pool, node: str) -> bool:
    taints = pool.get("node", node)["spec"].get("taints") or ()
    return any(t["key"] == "node.kubernetes.io/not-ready" for t in taints)


def _settings_of(pods: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName") == node]


def test_a_node_lost_under_a_replace_rollouts_new_pod_is_no_failed_setting(pool: Pool) -> None:
    before = pool.create(2, rollout={"strategy": "Replace"})
    nodes = sorted({p["spec"]["nodeName"] for p in pool.pods()})
    spare = next(
        n["metadata"]["name"]
        for n in pool.get("nodes", "-l", f"{POOL_LABEL}={pool.ns}")["items"]
        if n["metadata"]["name"] not in nodes
    )
    for n in nodes:  # the rollout's new pods can only go to the spare node
        pool.kubectl("cordon", n)
    pool.recovered_oom(pool.pods()[0]["metadata"]["name"])

    retuned = pool.wait(lambda o: o["status"].get("rollout"), 60, "a Replace rollout under way")
    new = compact(retuned["status"]["rollout"]["settings"])
    assert retuned["status"]["rollout"]["strategy"] == "Replace"
    assert new != compact(before["status"]["applied"])
    wait_for(lambda: _settings_of(pool.pods(), spare), 60, f"the rollout's new pod bound to {spare}")
    pool.kubectl("annotate", "node", spare, f"{KWOK_ANNOTATION}-")  # KWOK would re-initialise it Ready
    _post_ready(pool, spare, "False", "KubeletNotReady")  # the node dies before the rollout is done
    (lost,) = _settings_of(pool.pods(), spare)
    _post_pod_ready(pool, lost["metadata"]["name"], False)
    wait_for(lambda: _tainted_not_ready(pool, spare), 60, f"{spare} tainted not-ready by the controller")

    def replica_lost(o: dict[str, Any]) -> bool:
        return condition(o, "Degraded").get("reason") == "ReplicaLost"

    degraded = pool.wait(replica_lost, 60, "Degraded=True ReplicaLost")
    message = condition(degraded, "Degraded")["message"]
    assert condition(degraded, "Degraded")["status"] == "True"
    assert lost["metadata"]["name"] in message and spare in message, message
    time.sleep(15)  # ticks go on while the replica is lost: still no verdict against its settings
    held = pool.isvc()
    assert held["status"].get("rollout") and replica_lost(held), held["status"]
    assert new not in [compact(s) for s in held["status"].get("failedSettings") or ()]
    assert not history(held, "RolledBack"), history(held, "RolledBack")
    assert _node_ready(pool, spare) == "False"  # nothing put it back meanwhile (KWOK's heartbeat)

    pool.kubectl("annotate", "node", spare, f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}")  # the node is back:
    wait_for(lambda: _node_ready(pool, spare) == "True", 60, f"{spare} Ready again")  # KWOK initialises it
    _post_pod_ready(pool, lost["metadata"]["name"], True)  # and its kubelet reports the pod Ready again
    for n in nodes:
        pool.kubectl("uncordon", n)
    done = pool.wait(rolled_out, 240, "the rollout finished on the new settings")
    assert compact(done["status"]["applied"]) == new
    assert new not in [compact(s) for s in done["status"].get("failedSettings") or ()]
    assert condition(done, "Degraded").get("status") == "False", condition(done, "Degraded")
