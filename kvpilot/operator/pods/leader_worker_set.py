"""The LeaderWorkerSet of an InferenceService whose replica spans nodes (``gpu.nodesPerReplica`` > 1).

A replica is a group of ``nodesPerReplica`` pods, one per node, made by the LeaderWorkerSet controller
(``leaderworkerset.x-k8s.io/v1``, sigs.k8s.io/lws): pod 0, the leader, serves the API; the workers run
vLLM ``--headless``. Every pod carries vLLM's node flags (:func:`kvpilot.tuner.vllm.build_node_role_args`):
``--nnodes``, its ``--node-rank`` (``$(LWS_WORKER_INDEX)``, which LWS sets to 0 on the leader and 1.. on the
workers) and ``--master-addr $(LWS_LEADER_ADDRESS)``, the leader's stable name LWS injects.

Built from the Deployment :func:`kvpilot.operator.pods.workloads.build_deployment` renders, so the pod is
the same in both kinds (image, engine arguments, resources, storage, placement, security, ``spec.template``);
only the roles differ. Workers have no API server, hence no HTTP port, probes or scrape annotations: a
dead worker makes the leader fail, and ``RecreateGroupOnPodRestart`` restarts the whole group, as vLLM needs.

The rolling update follows the Deployment's strategy per group: a surge (``maxSurge: 1,
maxUnavailable: 0``) needs a whole spare group of nodes; ``Recreate`` takes every group down at once. Not
applied by the operator yet (an InferenceService over several nodes is refused: ``MultiNodeUnsupported``).
Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvpilot.tuner import vllm
from kvpilot.tuner.vllm import serving

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""The leader pod's address, from the variable LWS's pod webhook puts in every container of the group."""
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
"""The pod's index in its group (0: the leader), from the variable LWS puts in every container."""
LEADER_SELECTOR = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
"""The label LWS puts on each group's leader (``WorkerIndexLabelKey``): a Service selects the API servers."""
RESTART_POLICY = "RecreateGroupOnPodRestart"
"""A pod's restart restarts its group: vLLM's ranks cannot rejoin a running group."""
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def build_leader_worker_set(deployment: Mapping[str, Any], nodes: int) -> dict[str, Any]:
    """The LeaderWorkerSet of groups of ``nodes`` pods (``nodes`` >= 2) in place of ``deployment``."""
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
                "leaderTemplate": _with_role(template, nodes, "0", headless=False),
                "workerTemplate": _with_role(template, nodes, WORKER_INDEX, headless=True),
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


def _with_role(template: Mapping[str, Any], nodes: int, rank: str, *, headless: bool) -> dict[str, Any]:
    """The pod template of one role: the vLLM container's node flags; a worker without port or probes."""
    out = copy.deepcopy(dict(template))
    for container in out["spec"]["containers"]:
        if container["name"] != serving.CONTAINER_NAME:
            continue
        container["args"] = [
            *container["args"], *vllm.build_node_role_args(nodes, rank, LEADER_ADDRESS, headless=headless)
        ]
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
