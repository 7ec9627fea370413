"""GPU capacity of the cluster for one service's pods: spare ``nvidia.com/gpu`` now, and whether any node
could ever take one. Pure; the reads are :func:`kvpilot.operator.clients.kube.fetch_nodes` and
:func:`kvpilot.operator.clients.kube.fetch_active_pods`.

A node *matches* a pod shape (:class:`PodShape`, read from the Deployment kvpilot renders, so the check
follows exactly what the scheduler is asked) when its labels satisfy the pod's ``nodeSelector`` and
required node affinity (the GPU product: :data:`kvpilot.tuner.gpus.PRODUCT_LABEL`) and the pod tolerates
every ``NoSchedule`` / ``NoExecute`` taint on it. Its spare GPUs are its allocatable ``nvidia.com/gpu``
minus what the bound, non-terminal pods on it request (a container's request, or its limit: the two are
equal for extended resources; an init container's request when larger). This is the scheduler's
``NodeResourcesFit`` and ``TaintToleration`` filters for the one resource a GPU pool runs out of; other
resources (CPU, memory, pods per node) are not checked.

* :func:`compute_fits_now`: one more replica of the shape fits on the schedulable nodes now (Auto's surge
  test, :mod:`kvpilot.operator.pods.rollout_strategy`);
* :func:`compute_schedulable`: the nodes, cordoned or not, have enough allocatable GPUs at all (the
  ``Schedulable`` condition: ``False`` with the reason when they never could).

A replica over several nodes (a LeaderWorkerSet, :mod:`kvpilot.operator.pods.leader_worker_set`) is a whole
group of ``group_size`` pods of the same shape: a surge needs room for every pod of a group at once, one
group's pods on distinct nodes or sharing one where its spare GPUs hold several (the scheduler is asked for
no spreading), so the count is the pods of the shape the nodes' spare GPUs hold, ``sum(spare // gpus)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's extended resource: what a vLLM pod requests and a GPU node advertises."""
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    allocatable_gpus: int
    cordoned: bool
    """``spec.unschedulable``: no new pod goes there now (it may come back)."""


@dataclass(frozen=True, slots=True)
class PodShape:
    """What the scheduler is asked for one pod of the service."""

    node_selector: Mapping[str, str]
    match_expressions: tuple[tuple[Mapping[str, Any], ...], ...]
    """Required node affinity: terms (ORed) of match expressions (ANDed); empty = no affinity."""
    tolerations: tuple[Mapping[str, Any], ...]
    gpus: int
    group_size: int = 1
    """Pods of one replica: 1 for a Deployment, ``leaderWorkerTemplate.size`` for a LeaderWorkerSet."""


@dataclass(frozen=True, slots=True)
class Schedulability:
    """The ``Schedulable`` condition."""

    schedulable: bool
    reason: str
    message: str


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0  # a fractional or suffixed GPU count is not something the device plugin advertises


def build_node_view(node: Mapping[str, Any]) -> NodeView:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    return NodeView(
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        taints=tuple(spec.get("taints") or ()),
        allocatable_gpus=_quantity((status.get("allocatable") or {}).get(GPU_RESOURCE, 0)),
        cordoned=bool(spec.get("unschedulable")),
    )


def compute_gpu_request(pod_spec: Mapping[str, Any]) -> int:
    """GPUs a pod holds: the sum over its containers, or its largest init container when larger."""

    def one(container: Mapping[str, Any]) -> int:
        res = container.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        return _quantity(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0)))

    main = sum(one(c) for c in pod_spec.get("containers") or ())
    init = max((one(c) for c in pod_spec.get("initContainers") or ()), default=0)
    return max(main, init)


def build_pod_shape(workload: Mapping[str, Any]) -> PodShape:
    """The shape of a Deployment's pods (its template's placement and GPU request), or of a LeaderWorkerSet's
    groups (the leader template's, which kvpilot renders with the workers' placement and GPUs)."""
    group = (workload.get("spec") or {}).get("leaderWorkerTemplate")
    if group is not None:
        template = group.get("leaderTemplate") or group["workerTemplate"]
        return _shape(template["spec"], int(group.get("size") or 1))
    return _shape(workload["spec"]["template"]["spec"], 1)


def _shape(pod: Mapping[str, Any], group_size: int) -> PodShape:
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = tuple(tuple(t.get("matchExpressions") or ()) for t in required.get("nodeSelectorTerms") or ())
    return PodShape(
        node_selector=dict(pod.get("nodeSelector") or {}),
        match_expressions=terms,
        tolerations=tuple(pod.get("tolerations") or ()),
        gpus=compute_gpu_request(pod),
        group_size=group_size,
    )


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or ())
    if op == "In":
        return key in labels and labels[str(key)] in values
    if op == "NotIn":
        return key not in labels or labels[str(key)] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # Gt / Lt: kvpilot renders none


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
        taint.get("value") or ""
    )


def compute_label_match(shape: PodShape, node: NodeView) -> bool:
    """The node's labels satisfy the pod's nodeSelector and required node affinity."""
    if any(node.labels.get(k) != v for k, v in shape.node_selector.items()):
        return False
    if not shape.match_expressions:
        return True
    return any(all(_expression_holds(e, node.labels) for e in term) for term in shape.match_expressions)


def compute_tolerated(shape: PodShape, node: NodeView) -> bool:
    """The pod tolerates every taint that keeps pods off the node (``NoSchedule``, ``NoExecute``)."""
    return all(
        any(_tolerates(t, taint) for t in shape.tolerations)
        for taint in node.taints
        if taint.get("effect") in _BLOCKING_EFFECTS
        and taint.get("key") != "node.kubernetes.io/unschedulable"  # a cordon: NodeView.cordoned says it
    )


def compute_used_gpus(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs requested per node by bound pods that have not finished (terminating pods still hold theirs)."""
    used: dict[str, int] = {}
    for pod in pods:
        spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        used[node] = used.get(node, 0) + compute_gpu_request(spec)
    return used


def compute_spare_gpus(
    shape: PodShape, nodes: Sequence[NodeView], pods: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """Spare GPUs on every schedulable node the shape's pods may use (cordoned nodes are left out)."""
    used = compute_used_gpus(pods)
    return {
        n.name: max(0, n.allocatable_gpus - used.get(n.name, 0))
        for n in nodes
        if not n.cordoned and compute_label_match(shape, n) and compute_tolerated(shape, n)
    }


def compute_fits_now(shape: PodShape, nodes: Sequence[NodeView], pods: Sequence[Mapping[str, Any]]) -> bool:
    """One more replica of ``shape`` fits now (a surge pod, or a surge group's every pod, would be
    scheduled)."""
    return _pods_held(shape, compute_spare_gpus(shape, nodes, pods).values()) >= shape.group_size


def _pods_held(shape: PodShape, gpus_per_node: Iterable[int]) -> int:
    """Pods of ``shape`` that nodes with these GPUs hold (any number of GPU-less pods: a large count)."""
    if shape.gpus <= 0:
        return 1 << 30
    return sum(gpus // shape.gpus for gpus in gpus_per_node)


def _placement_words(shape: PodShape) -> str:
    words = [f"{k}={v}" for k, v in sorted(shape.node_selector.items())]
    for term in shape.match_expressions[:1]:
        words += [f"{e.get('key')} in ({', '.join(e.get('values') or ())})" for e in term]
    return ", ".join(words) or "any labels"


def compute_schedulable(shape: PodShape, nodes: Sequence[NodeView]) -> Schedulability:
    """Whether some node could ever take one pod of ``shape`` (enough allocatable GPUs, labels, taints)."""
    labelled = [n for n in nodes if compute_label_match(shape, n)]
    where = _placement_words(shape)
    if not labelled:
        return Schedulability(False, "NoMatchingNode", f"no node with {where}")
    tolerated = [n for n in labelled if compute_tolerated(shape, n)]
    if not tolerated:
        return Schedulability(
            False,
            "TaintsNotTolerated",
            f"{len(labelled)} node(s) with {where}, all with taints the pods do not tolerate "
            "(spec.engine.tolerations)",
        )
    largest = max(n.allocatable_gpus for n in tolerated)
    held = _pods_held(shape, (n.allocatable_gpus for n in tolerated))
    if largest >= shape.gpus and held < shape.group_size:
        return Schedulability(
            False,
            "InsufficientNodes",
            f"a replica is a group of {shape.group_size} pods of {shape.gpus} {GPU_RESOURCE}, and the "
            f"{len(tolerated)} node(s) with {where} hold {held} such pods in all; lower "
            "gpu.nodesPerReplica or add nodes",
        )
    if largest < shape.gpus:
        return Schedulability(
            False,
            "InsufficientGpus",
            f"no node with {where} and {shape.gpus} allocatable {GPU_RESOURCE} in total (the largest of "
            f"{len(tolerated)} has {largest}); lower gpu.count or add larger nodes",
        )
    fitting = [n for n in tolerated if n.allocatable_gpus >= shape.gpus]
    return Schedulability(
        True, "NodesFit", f"{len(fitting)} node(s) with {where} have {shape.gpus} allocatable {GPU_RESOURCE}"
    )
