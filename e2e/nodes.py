"""Simulated GPU node pools for the e2e cluster (KWOK nodes).

Each node is a plain ``v1.Node`` that KWOK manages because of the
``kwok.x-k8s.io/node: fake`` annotation. Labels follow NVIDIA GPU Feature
Discovery (``nvidia.com/gpu.product`` is the NVML name with spaces replaced by
``-``, ``nvidia.com/gpu.memory`` is NVML total MiB, compute capability as
``gpu.compute.major``/``minor``), and ``nvidia.com/gpu`` is advertised in
capacity/allocatable as the NVIDIA device plugin does, so the real
kube-scheduler places pods by GPU.

Label values: ../shared/research/vllm_reference.md section 7.1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"


@dataclasses.dataclass(frozen=True)
class GPUModel:
    product: str  # nvidia.com/gpu.product
    memory_mib: int  # nvidia.com/gpu.memory
    compute_major: int
    compute_minor: int
    family: str  # nvidia.com/gpu.family


H100_80GB_HBM3 = GPUModel("NVIDIA-H100-80GB-HBM3", 81559, 9, 0, "hopper")
A100_SXM4_80GB = GPUModel("NVIDIA-A100-SXM4-80GB", 81920, 8, 0, "ampere")
L4 = GPUModel("NVIDIA-L4", 23034, 8, 9, "ada-lovelace")


@dataclasses.dataclass(frozen=True)
class NodePool:
    name: str  # node name prefix, e.g. "h100" -> h100-0, h100-1, ...
    count: int
    gpu: GPUModel
    gpus_per_node: int
    cpu: str
    memory: str
    machine: str  # nvidia.com/gpu.machine / node.kubernetes.io/instance-type
    pods: str = "110"


DEFAULT_POOLS: tuple[NodePool, ...] = (
    NodePool("h100", 4, H100_80GB_HBM3, 8, cpu="192", memory="2048Gi", machine="p5.48xlarge"),
    NodePool("a100", 4, A100_SXM4_80GB, 8, cpu="96", memory="1152Gi", machine="p4de.24xlarge"),
    NodePool("l4", 8, L4, 1, cpu="8", memory="32Gi", machine="g6.2xlarge"),
)


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    name = f"{pool.name}-{index}"
    g = pool.gpu
    labels = {
        "type": "kwok",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": pool.machine,
        "kvpilot.dev/e2e-pool": pool.name,
        # NVIDIA GPU Feature Discovery / GPU operator labels
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": g.product,
        "nvidia.com/gpu.memory": str(g.memory_mib),
        "nvidia.com/gpu.count": str(pool.gpus_per_node),
        "nvidia.com/gpu.family": g.family,
        "nvidia.com/gpu.compute.major": str(g.compute_major),
        "nvidia.com/gpu.compute.minor": str(g.compute_minor),
        "nvidia.com/gpu.machine": pool.machine,
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true" if g.compute_major >= 8 and g.family != "ada-lovelace" else "false",
        "nvidia.com/cuda.driver-version.major": "570",
        "nvidia.com/cuda.driver-version.minor": "124",
        "nvidia.com/cuda.driver-version.revision": "06",
        "nvidia.com/cuda.driver-version.full": "570.124.06",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "8",
        "nvidia.com/cuda.runtime-version.full": "12.8",
    }
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": pool.pods,
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": str(pool.gpus_per_node),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": labels,
        },
        # No kwok NoSchedule taint: test pods need no toleration, and the real
        # scheduler decides placement from labels and nvidia.com/gpu alone.
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
        },
    }


def node_manifests(pools: Iterable[NodePool] = DEFAULT_POOLS) -> list[dict[str, Any]]:
    return [node_manifest(p, i) for p in pools for i in range(p.count)]


def total_gpus(pools: Iterable[NodePool] = DEFAULT_POOLS) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pools:
        out[p.gpu.product] = out.get(p.gpu.product, 0) + p.count * p.gpus_per_node
    return out


if __name__ == "__main__":  # print the default pools as YAML
    import yaml

    print(yaml.safe_dump_all(node_manifests(), sort_keys=False), end="")
