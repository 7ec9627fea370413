"""The pod's host memory against what the engine pins there: vLLM's KV offloading tier.

kvpilot plans the GPU; a tier of KV blocks in host memory (``--kv-offloading-size`` in
``spec.engine.extraArgs``) leaves the GPU budget as it is but pins its whole size in the pod's memory
(:mod:`kvpilot.tuner.vllm.kv_offloading`). A ``spec.engine.resources.limits.memory`` below it cannot run:
the container is OOM-killed while the tier registers, a restart that costs minutes and explains nothing.
Refused here by name with what to do, before anything renders (``Ready=False``, ``InvalidSpec``).
"""

from __future__ import annotations

from kvpilot.operator import api, errors
from kvpilot.operator.quantities import parse_quantity
from kvpilot.tuner.vllm import kv_offloading

GIB = 1 << 30


def check_host_memory(spec: api.InferenceServiceSpec) -> None:
    """Refuse a memory limit that cannot hold the KV offloading tier (InvalidSpec); the tier is the total of
    the engine's tensor-parallel ranks, all in one pod unless ``gpu.nodesPerReplica`` spreads them (then
    each pod holds its share). No limit, or one that is not a plain quantity: nothing to hold it against."""
    tier = kv_offloading.compute_offloading_host_bytes(spec.engine.extra_args)
    limit = ((spec.engine.resources or api.Resources()).limits or {}).get("memory")
    if tier is None or limit is None:
        return
    try:
        limit_bytes = parse_quantity(str(limit))
    except ValueError:
        return
    share = tier // spec.gpu.nodes_per_replica
    if limit_bytes < share:
        per_pod = " (its share on each of the replica's pods)" if spec.gpu.nodes_per_replica > 1 else ""
        raise errors.InvalidSpec(
            f"{kv_offloading.KV_OFFLOADING_SIZE_FLAG} in spec.engine.extraArgs pins {share / GIB:.1f} GiB of "
            f"host memory for vLLM's KV offloading tier{per_pod}, more than spec.engine.resources.limits."
            f"memory ({limit}) holds; raise the limit above {share / GIB:.0f}Gi plus the engine's own host "
            f"memory, or lower {kv_offloading.KV_OFFLOADING_SIZE_FLAG}"
        )
