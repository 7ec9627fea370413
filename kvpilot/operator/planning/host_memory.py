"""The pod's host memory against what the engine pins there: vLLM's KV offloading tier, LMCache's CPU backend.

kvpilot plans the GPU; a tier of KV blocks in host memory (``--kv-offloading-size`` in
``spec.engine.extraArgs``) leaves the GPU budget as it is but pins its whole size in the pod's memory
(:mod:`kvpilot.tuner.vllm.kv_offloading`). A ``spec.engine.resources.limits.memory`` below it cannot run:
the container is OOM-killed while the tier registers, a restart that costs minutes and explains nothing.
LMCache's connector (``--kv-transfer-config``) pins ``max_local_cpu_size`` GiB per GPU worker likewise
(:mod:`kvpilot.tuner.vllm.kv_connectors`). Refused here by name with what to do, before anything renders
(``Ready=False``, ``InvalidSpec``).
"""

from __future__ import annotations

from kvpilot.operator import api, errors
from kvpilot.operator.planning import release
from kvpilot.operator.quantities import parse_quantity
from kvpilot.tuner import vllm
from kvpilot.tuner.vllm import kv_offloading

GIB = 1 << 30


def check_host_memory(spec: api.InferenceServiceSpec) -> None:
    """Refuse a memory limit that cannot hold what the engine pins in host memory (InvalidSpec): the KV
    offloading tier, the total of the engine's tensor-parallel ranks, all in one pod unless
    ``gpu.nodesPerReplica`` spreads them (then each pod holds its share), and LMCache's CPU backend
    (``--kv-transfer-config`` with ``LMCacheConnectorV1``: ``max_local_cpu_size`` GiB per GPU worker, so
    ``gpu.count`` of them in each pod). No limit, or one that is not a plain quantity: nothing to hold it
    against."""
    tier = kv_offloading.compute_offloading_host_bytes(spec.engine.extra_args)
    connector = vllm.read_kv_connector(spec.engine.extra_args, release.literal_env(spec))
    lmcache = vllm.compute_lmcache_host_bytes(connector, spec.gpu.count)
    limit = ((spec.engine.resources or api.Resources()).limits or {}).get("memory")
    if (tier is None and lmcache is None) or limit is None:
        return
    try:
        limit_bytes = parse_quantity(str(limit))
    except ValueError:
        return
    share = 0 if tier is None else tier // spec.gpu.nodes_per_replica
    if tier is not None and limit_bytes < share:
        per_pod = " (its share on each of the replica's pods)" if spec.gpu.nodes_per_replica > 1 else ""
        raise errors.InvalidSpec(
            f"{kv_offloading.KV_OFFLOADING_SIZE_FLAG} in spec.engine.extraArgs pins {share / GIB:.1f} GiB of "
            f"host memory for vLLM's KV offloading tier{per_pod}, more than spec.engine.resources.limits."
            f"memory ({limit}) holds; raise the limit above {share / GIB:.0f}Gi plus the engine's own host "
            f"memory, or lower {kv_offloading.KV_OFFLOADING_SIZE_FLAG}"
        )
    if lmcache is not None and limit_bytes < share + lmcache:
        both = f" beside the {share / GIB:.1f} GiB KV offloading tier" if share else ""
        raise errors.InvalidSpec(
            f"{vllm.KV_TRANSFER_CONFIG_FLAG} in spec.engine.extraArgs runs LMCache, whose CPU backend pins "
            f"{lmcache / GIB:.1f} GiB of host memory in each pod (max_local_cpu_size x {spec.gpu.count} "
            f"GPU workers){both}, more than spec.engine.resources.limits.memory ({limit}) holds; raise the "
            f"limit above {(share + lmcache) / GIB:.0f}Gi plus the engine's own host memory, or lower "
            f"LMCache's max_local_cpu_size (LMCACHE_MAX_LOCAL_CPU_SIZE, or lmcache.max_local_cpu_size in "
            f"kv_connector_extra_config)"
        )
