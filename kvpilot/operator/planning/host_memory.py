"""The pod's host memory against what the engine pins there: vLLM's KV offloading tier, LMCache's CPU backend.

kvpilot plans the GPU; a tier of KV blocks in host memory (``--kv-offloading-size``) leaves the GPU budget as
it is but pins its whole size in the pod's memory (:mod:`kvpilot.tuner.vllm.kv_offloading`). LMCache's
connector (``--kv-transfer-config`` with ``LMCacheConnectorV1``) pins ``max_local_cpu_size`` GiB per GPU
worker likewise (:mod:`kvpilot.tuner.vllm.kv_connectors`). A memory limit below them cannot run: the
container is OOM-killed while the tier registers, a restart that costs minutes and explains nothing.
:func:`find_host_memory_shortfall` is the one check, from the engine's arguments, its literal environment and
the container's ``resources.limits.memory``; both kinds hold it before anything else happens:

* an InferenceService's ``spec.engine.extraArgs`` against ``spec.engine.resources.limits.memory``
  (:func:`check_host_memory`: ``Ready=False``, ``InvalidSpec``, before anything renders);
* an EngineTuner's target container's command line against its own limit
  (:mod:`kvpilot.operator.enginetuner.target_host_memory`: ``Planned=False``, before the plan, so no pod is
  rewritten and none evicted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpilot.operator import api, errors
from kvpilot.operator.planning import release
from kvpilot.operator.quantities import parse_quantity
from kvpilot.tuner import vllm
from kvpilot.tuner.vllm import kv_offloading

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class HostMemoryShortfall:
    """A pod's memory limit below what the engine pins in it: its share of the KV offloading tier and
    LMCache's CPU backend."""

    share_bytes: int
    """The tier's bytes each pod of the engine pins (the whole tier with one pod; 0 without a tier)."""
    limit: str
    """The memory limit as written."""
    pods: int
    """The engine's pods (nodes) the tier is spread over."""
    lmcache_bytes: int = 0
    """LMCache's CPU backend in the pod (``max_local_cpu_size`` x its GPU workers; 0 without it)."""
    gpus: int = 1
    """The pod's GPU workers (LMCache's backend is per worker)."""

    def describe(self, args_at: str, limit_at: str) -> str:
        """What is wrong and what to do, naming where the flags (``args_at``) and the limit (``limit_at``)
        are written."""
        if not self.lmcache_bytes:
            flag, gib = kv_offloading.KV_OFFLOADING_SIZE_FLAG, self.share_bytes / GIB
            per_pod = " (its share on each of the replica's pods)" if self.pods > 1 else ""
            return (
                f"{flag} in {args_at} pins {gib:.1f} GiB of host memory for vLLM's KV offloading tier"
                f"{per_pod}, more than {limit_at} ({self.limit}) holds; raise the limit above {gib:.0f}Gi "
                f"plus the engine's own host memory, or lower {flag}"
            )
        share, lmcache = self.share_bytes, self.lmcache_bytes
        both = f" beside the {share / GIB:.1f} GiB KV offloading tier" if share else ""
        return (
            f"{vllm.KV_TRANSFER_CONFIG_FLAG} in {args_at} runs LMCache, whose CPU backend pins "
            f"{lmcache / GIB:.1f} GiB of host memory in each pod (max_local_cpu_size x {self.gpus} "
            f"GPU workers){both}, more than {limit_at} ({self.limit}) holds; raise the limit above "
            f"{(share + lmcache) / GIB:.0f}Gi plus the engine's own host memory, or lower LMCache's "
            "max_local_cpu_size (LMCACHE_MAX_LOCAL_CPU_SIZE, or lmcache.max_local_cpu_size in "
            "kv_connector_extra_config)"
        )


def find_host_memory_shortfall(
    args: Sequence[str],
    limit: object | None,
    *,
    pods: int = 1,
    gpus: int = 1,
    env: Mapping[str, str] | None = None,
) -> HostMemoryShortfall | None:
    """The shortfall when a pod's memory ``limit`` cannot hold its share of the tier that the engine's
    ``args`` ask for (the total of the engine's tensor-parallel ranks, split evenly over its ``pods``) and,
    with LMCache's connector, its CPU backend for the pod's ``gpus`` workers (sized by the pod's literal
    ``env``); ``None`` when it can, or when there is neither, no limit, or a limit that is not a plain
    quantity (nothing to hold it against). A tier size that is not a size in GiB is
    :class:`~kvpilot.tuner.errors.InvalidEngineArgs`."""
    tier = kv_offloading.compute_offloading_host_bytes(args)
    lmcache = vllm.compute_lmcache_host_bytes(vllm.read_kv_connector(args, env), gpus)
    if (tier is None and lmcache is None) or limit is None:
        return None
    try:
        limit_bytes = parse_quantity(str(limit))
    except ValueError:
        return None
    share = 0 if tier is None else tier // max(pods, 1)
    if tier is not None and limit_bytes < share:
        return HostMemoryShortfall(share_bytes=share, limit=str(limit), pods=pods)
    if lmcache is not None and limit_bytes < share + lmcache:
        return HostMemoryShortfall(share, str(limit), pods, lmcache_bytes=lmcache, gpus=gpus)
    return None


def check_host_memory(spec: api.InferenceServiceSpec) -> None:
    """Refuse an InferenceService whose ``spec.engine.resources.limits.memory`` cannot hold what
    ``spec.engine.extraArgs`` pin in host memory (InvalidSpec): the KV offloading tier, in one pod unless
    ``gpu.nodesPerReplica`` spreads it (then each pod holds its share), and LMCache's CPU backend for the
    pod's ``gpu.count`` workers, sized by ``spec.engine.env``'s literal values."""
    limit = ((spec.engine.resources or api.Resources()).limits or {}).get("memory")
    short = find_host_memory_shortfall(
        spec.engine.extra_args,
        limit,
        pods=spec.gpu.nodes_per_replica,
        gpus=spec.gpu.count,
        env=release.literal_env(spec),
    )
    if short is not None:
        raise errors.InvalidSpec(
            short.describe("spec.engine.extraArgs", "spec.engine.resources.limits.memory")
        )
