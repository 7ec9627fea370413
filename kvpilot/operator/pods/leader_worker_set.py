"""The LeaderWorkerSet of an InferenceService whose replica spans nodes (``gpu.nodesPerReplica`` > 1).

A replica is a group of ``nodesPerReplica`` pods, one per node, made by the LeaderWorkerSet controller
(``leaderworkerset.x-k8s.io/v1``, sigs.k8s.io/lws): pod 0, the leader, serves the API; the workers run
vLLM ``--headless``. Every pod carries vLLM's node flags (:func:`kvpilot.tuner.vllm.build_node_role_args`):
``--nnodes``, its ``--node-rank`` (``$(LWS_WORKER_INDEX)``, which LWS sets to 0 on the leader and 1.. on the
workers) and ``--master-addr $(LWS_LEADER_ADDRESS)``, the leader's stable name LWS injects. SGLang's pods
carry SGLang's (:func:`kvpilot.tuner.sglang.serving.build_node_role_args`: ``--nnodes``, ``--node-rank``,
``--dist-init-addr $(LWS_LEADER_ADDRESS):20000``); its ranks >= 1 serve no API by themselves (:data:`ROLES`).

Built from the Deployment :func:`kvpilot.operator.pods.workloads.build_deployment` renders, so the pod is
the same in both kinds (image, engine arguments, resources, storage, placement, security, ``spec.template``);
only the roles differ. Workers have no API server, hence no HTTP port, probes or scrape annotations: a
dead worker makes the leader fail, and ``RecreateGroupOnPodRestart`` restarts the whole group, as vLLM needs.

The rolling update follows the Deployment's strategy per group: a surge (``maxSurge: 1,
maxUnavailable: 0``) needs a whole spare group of nodes (:mod:`kvpilot.operator.pods.capacity` counts whole
groups); ``Recreate`` takes every group down at once.

The operator applies it as it does a Deployment (:func:`kvpilot.operator.pods.workloads.apply_workloads`:
ownership, NameConflict) when the API server serves the kind (:func:`fetch_served`; otherwise
``LeaderWorkerSetNotInstalled``). The pods LWS makes carry the template's labels, so the closed loop's pod
view finds them by the same selector; :func:`is_group_pod` says which are this set's, and
:func:`is_worker` which serve no API (a group is one replica: its leader counts). The builders are pure.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import errors
from kvpilot.operator.clients.kube import CUSTOM_KINDS, IO_POOL, Kube
from kvpilot.tuner import vllm
from kvpilot.tuner.sglang import serving as sglang_serving
from kvpilot.tuner.vllm import serving

KIND = "LeaderWorkerSet"
API_VERSION = "/".join(CUSTOM_KINDS[KIND][:2])
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""The leader pod's address, from the variable LWS's pod webhook puts in every container of the group."""
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""The label LWS puts on every pod of a set (``SetNameLabelKey``): the set's name."""
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
"""The pod's index in its group (``WorkerIndexLabelKey``): ``0`` on the leader."""
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
"""The pod's group in its set (``GroupIndexLabelKey``)."""
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
"""The pod's index in its group (0: the leader), from the variable LWS puts in every container."""
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}
"""The label LWS puts on each group's leader (``WorkerIndexLabelKey``): a Service selects the API servers."""
RESTART_POLICY = "RecreateGroupOnPodRestart"
"""A pod's restart restarts its group: vLLM's ranks cannot rejoin a running group."""
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass(frozen=True, slots=True)
class NodeRoles:
    """How one engine's pods of a group know their roles: the engine's container, and its node flags for
    ``(nodes, rank, node 0's address, headless)`` (from the engine's own package)."""

    container: str
    build_args: Callable[[int, str, str, bool], tuple[str, ...]]


def _vllm_roles(nodes: int, rank: str, leader: str, headless: bool) -> tuple[str, ...]:
    return vllm.build_node_role_args(nodes, rank, leader, headless=headless)


def _sglang_roles(nodes: int, rank: str, leader: str, headless: bool) -> tuple[str, ...]:
    return sglang_serving.build_node_role_args(nodes, rank, leader)  # the rank alone makes a rank headless


ROLES: Mapping[str, NodeRoles] = {
    "vLLM": NodeRoles(serving.CONTAINER_NAME, _vllm_roles),
    "SGLang": NodeRoles(sglang_serving.CONTAINER_NAME, _sglang_roles),
}
"""The engines (``spec.engine.kind``) whose replica may span nodes. TGI shards within one node."""


def build_leader_worker_set(
    deployment: Mapping[str, Any], nodes: int, roles: NodeRoles = ROLES["vLLM"]
) -> dict[str, Any]:
    """The LeaderWorkerSet of groups of ``nodes`` pods (``nodes`` >= 2) in place of ``deployment``, whose
    engine container (``roles``) takes each node's flags."""
    if nodes < 2:
        raise ValueError(f"a LeaderWorkerSet group spans at least 2 nodes, got {nodes}")
    spec = deployment["spec"]
    template = spec["template"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": copy.deepcopy(deployment["metadata"]),
        "spec": {
            "replicas": spec["replicas"],
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": build_rollout_strategy(spec["strategy"], spec["replicas"]),
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": _with_role(template, nodes, "0", roles, headless=False),
                "workerTemplate": _with_role(template, nodes, WORKER_INDEX, roles, headless=True),
            },
        },
    }


def build_rollout_strategy(strategy: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The Deployment's ``spec.strategy`` as LWS's ``rolloutStrategy``, counted in groups (LWS refuses
    ``maxUnavailable`` 0 with ``maxSurge`` 0, so ``Recreate`` is every group unavailable at once)."""
    if strategy.get("type") == "Recreate":
        rolling = {"maxUnavailable": max(1, replicas), "maxSurge": 0}
    else:
        given = strategy.get("rollingUpdate") or {}
        rolling = {"maxUnavailable": given.get("maxUnavailable", 1), "maxSurge": given.get("maxSurge", 0)}
    return {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling}


def build_budget_spec(budget: Mapping[str, Any]) -> dict[str, Any]:
    """The disruption budget of groups: at most ``maxUnavailable`` groups down by evictions, never a wedged
    drain.

    One budget over every pod of every group, ``maxUnavailable`` counted in pods: each eviction the API
    allows spends one of the budget's ``maxUnavailable`` at once, and takes down at most one group, so at
    most ``maxUnavailable`` groups go down however the evictions fall; a group that restarts counts its
    ``size`` pods, so while it recovers fewer (one at a time once ``size`` >= ``maxUnavailable``) may follow.
    The alternatives let more groups down: a budget of leaders only leaves the workers free to evict (each
    takes its group), one budget per group bounds nothing across groups, and ``minAvailable`` of whole groups
    (``(replicas - maxUnavailable) x size`` pods) allows ``maxUnavailable x size`` evictions, in as many
    groups. ``unhealthyPodEvictionPolicy: AlwaysAllow``: a pod that is not Ready belongs to a group that
    serves nothing (the leader is Ready only once every rank joined; a worker has no probe), so evicting it
    disrupts nothing more, whereas the default refuses it while the budget is spent, and a group stuck
    starting or Pending would block every drain of its nodes."""
    return {**budget, "unhealthyPodEvictionPolicy": "AlwaysAllow"}


def _with_role(
    template: Mapping[str, Any], nodes: int, rank: str, roles: NodeRoles, *, headless: bool
) -> dict[str, Any]:
    """The pod template of one role: the engine container's node flags; a worker without port or probes."""
    out = copy.deepcopy(dict(template))
    for container in out["spec"]["containers"]:
        _quantities_as_strings(container)
        if container["name"] != roles.container:
            continue
        container["args"] = [*container["args"], *roles.build_args(nodes, rank, LEADER_ADDRESS, headless)]
        if headless:
            container.pop("ports", None)
            for probe in PROBES:
                container.pop(probe, None)
    if headless:
        annotations = out.get("metadata", {}).get("annotations") or {}
        for key in SCRAPE_ANNOTATIONS:
            annotations.pop(key, None)
        if "annotations" in out.get("metadata", {}) and not annotations:
            del out["metadata"]["annotations"]
    return out


def _quantities_as_strings(container: dict[str, Any]) -> None:
    """Resource quantities as strings, as the API server stores them. A CRD keeps an integer as sent, but
    LWS's webhook writes ``8`` back as ``"8"`` on create and not on update, so an integer flips at every apply
    and each re-apply of the same set bumped its generation (seen on the real controller, v0.10.0)."""
    for bound in ("limits", "requests"):
        values = (container.get("resources") or {}).get(bound)
        if values:
            container["resources"][bound] = {k: str(v) for k, v in values.items()}


def is_group_member(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is any LeaderWorkerSet's (LWS's set label is on it)."""
    return NAME_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def is_group_pod(pod: Mapping[str, Any], name: str) -> bool:
    """Whether the pod is one of the LeaderWorkerSet ``name``'s: LWS's set label names it, and its controller
    is a StatefulSet of the set (the leaders' ``<name>``, a group's workers' ``<name>-<group>``)."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(NAME_LABEL) != name:
        return False
    return any(
        ref.get("kind") == "StatefulSet"
        and ref.get("controller")
        and (ref.get("name") == name or str(ref.get("name") or "").startswith(f"{name}-"))
        for ref in meta.get("ownerReferences") or ()
    )


def is_worker(pod: Mapping[str, Any]) -> bool:
    """A group's worker (index 1..): it serves no API, so it is no replica of its own."""
    index = ((pod.get("metadata") or {}).get("labels") or {}).get(WORKER_INDEX_LABEL)
    return index is not None and index != "0"


async def fetch_served(kube: Kube) -> None:
    """Raise :class:`~kvpilot.operator.errors.LeaderWorkerSetNotInstalled` when the API server does not serve
    the LeaderWorkerSet kind (its CRD is not installed)."""
    served = await asyncio.get_running_loop().run_in_executor(IO_POOL, kube.serves_kind, KIND)
    if not served:
        raise errors.LeaderWorkerSetNotInstalled(
            f"a replica over several nodes (spec.gpu.nodesPerReplica > 1) runs as a {KIND} ({API_VERSION}), "
            "which this cluster does not serve: install LeaderWorkerSet (sigs.k8s.io/lws: its CRD and "
            "controller) and give kvpilot its RBAC (the chart's multiNode.enabled=true); nothing was "
            "deployed. Retrying."
        )
