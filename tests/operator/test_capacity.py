"""Spare GPUs and schedulability, from node and pod views (kvpilot.operator.pods.capacity)."""

from __future__ import annotations

from typing import Any

from kvpilot.operator import api
from kvpilot.operator.pods import capacity, leader_worker_set, workloads
from kvpilot.tuner.types import EngineSettings
from tests.operator.operator_fakes import H100_LABELS, L4_LABELS, gpu_pod, node_object


def shape(
    gpus: int = 1, products: tuple[str, ...] = ("NVIDIA-L4",), tolerations: list[dict[str, Any]] | None = None
) -> capacity.PodShape:
    body = {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpu": {"count": gpus},
        "engine": {"tolerations": tolerations or []},
    }
    parsed = api.InferenceServiceSpec.model_validate(body)
    deployment = workloads.build_deployment({"name": "llm"}, parsed, EngineSettings(), [], products)
    return capacity.build_pod_shape(deployment)


def nodes(*objs: dict[str, Any]) -> list[capacity.NodeView]:
    return [capacity.build_node_view(o) for o in objs]


L4_POOL = nodes(
    node_object("l4-0", L4_LABELS), node_object("l4-1", L4_LABELS), node_object("h100", H100_LABELS)
)


def test_the_shape_is_read_from_the_rendered_deployment() -> None:
    s = shape(2, tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert s.gpus == 2
    assert s.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert s.tolerations == ({"key": "gpu", "operator": "Exists"},)


def test_a_free_matching_node_fits_and_a_full_pool_does_not() -> None:
    assert capacity.compute_fits_now(shape(), L4_POOL, [])
    full = [gpu_pod("l4-0", 1, "a"), gpu_pod("l4-1", 1, "b")]
    assert capacity.compute_spare_gpus(shape(), L4_POOL, full) == {"l4-0": 0, "l4-1": 0}
    assert not capacity.compute_fits_now(shape(), L4_POOL, full)  # the free H100s do not match the product


def test_finished_and_unbound_pods_hold_no_gpu() -> None:
    pods = [
        gpu_pod("l4-0", 1, "done", phase="Succeeded"),
        {
            **gpu_pod("", 1, "pending"),
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        },
    ]
    assert capacity.compute_spare_gpus(shape(), L4_POOL, pods) == {"l4-0": 1, "l4-1": 1}


def test_cordoned_and_untolerated_nodes_take_no_new_pod() -> None:
    pool = nodes(
        node_object("l4-0", L4_LABELS, cordoned=True),
        node_object("l4-1", L4_LABELS, taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}]),
    )
    assert not capacity.compute_fits_now(shape(), pool, [])
    tolerant = shape(tolerations=[{"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}])
    assert capacity.compute_spare_gpus(tolerant, pool, []) == {"l4-1": 1}
    prefer = nodes(node_object("l4-2", L4_LABELS, taints=[{"key": "x", "effect": "PreferNoSchedule"}]))
    assert capacity.compute_fits_now(shape(), prefer, [])


def test_node_affinity_over_several_products() -> None:
    s = shape(products=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"))
    assert s.match_expressions and not s.node_selector
    assert capacity.compute_spare_gpus(s, L4_POOL, [gpu_pod("h100", 3)]) == {"h100": 5}


def test_schedulable_says_why_no_node_ever_could() -> None:
    assert capacity.compute_schedulable(shape(), L4_POOL).schedulable
    too_big = capacity.compute_schedulable(shape(2), L4_POOL)
    assert (too_big.schedulable, too_big.reason) == (False, "InsufficientGpus")
    assert "nvidia.com/gpu.product=NVIDIA-L4 and 2 allocatable nvidia.com/gpu" in too_big.message
    none = capacity.compute_schedulable(shape(products=("NVIDIA-B200",)), L4_POOL)
    assert none.reason == "NoMatchingNode"
    assert none.message == "no node with nvidia.com/gpu.product=NVIDIA-B200"
    tainted = nodes(node_object("l4-0", L4_LABELS, taints=[{"key": "t", "effect": "NoExecute"}]))
    assert capacity.compute_schedulable(shape(), tainted).reason == "TaintsNotTolerated"
    # a cordoned node may come back: it can still take the pod one day
    cordoned = nodes(node_object("c", L4_LABELS, cordoned=True))
    assert capacity.compute_schedulable(shape(), cordoned).schedulable


def test_init_containers_count_when_larger() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}],
    }
    assert capacity.compute_gpu_request(spec) == 4


def group_shape(nodes_per_replica: int = 2, gpus: int = 8) -> capacity.PodShape:
    """The shape of a LeaderWorkerSet of ``nodes_per_replica`` pods of ``gpus`` H100s each."""
    body = {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpu": {"count": gpus, "nodesPerReplica": nodes_per_replica},
    }
    parsed = api.InferenceServiceSpec.model_validate(body)
    deployment = workloads.build_deployment(
        {"name": "llm"}, parsed, EngineSettings(), [], ("NVIDIA-H100-80GB-HBM3",)
    )
    return capacity.build_pod_shape(leader_worker_set.build_leader_worker_set(deployment, nodes_per_replica))


H100_PAIR = nodes(node_object("h100-0", H100_LABELS), node_object("h100-1", H100_LABELS))


def test_a_groups_shape_is_read_from_the_rendered_leader_worker_set() -> None:
    s = group_shape(3)
    assert (s.group_size, s.gpus) == (3, 8)
    assert s.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_a_surge_group_needs_nodes_per_replica_spare_nodes() -> None:
    assert capacity.compute_fits_now(group_shape(2), H100_PAIR, [])
    one_busy = [gpu_pod("h100-1", 1)]  # 7 spare GPUs on h100-1 hold no pod of 8
    assert capacity.compute_fits_now(group_shape(2, gpus=4), H100_PAIR, one_busy)  # 2 + 1 pods of 4
    assert not capacity.compute_fits_now(group_shape(2), H100_PAIR, one_busy)
    assert not capacity.compute_fits_now(group_shape(3), H100_PAIR, [])
    # the same spare node count is plenty for a single-node replica of the same pod
    assert capacity.compute_fits_now(shape(8, products=("NVIDIA-H100-80GB-HBM3",)), H100_PAIR, one_busy)


def test_a_group_larger_than_the_pool_is_never_schedulable() -> None:
    assert capacity.compute_schedulable(group_shape(2), H100_PAIR).schedulable
    verdict = capacity.compute_schedulable(group_shape(3), H100_PAIR)
    assert (verdict.schedulable, verdict.reason) == (False, "InsufficientNodes")
    assert "a group of 3 pods of 8 nvidia.com/gpu" in verdict.message
    assert "hold 2 such pods" in verdict.message
    # a pod larger than any node is still the InsufficientGpus it always was
    assert capacity.compute_schedulable(group_shape(2, gpus=16), H100_PAIR).reason == "InsufficientGpus"
