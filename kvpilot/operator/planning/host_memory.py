"""The pod's host memory against what the engine pins there: vLLM's KV offloading tier.

kvpilot plans the GPU; a tier of KV blocks in host memory (``--kv-offloading-size``) leaves the GPU budget as
it is but pins its whole size in the pod's memory (:mod:`kvpilot.tuner.vllm.kv_offloading`). A memory limit
below it cannot run: the container is OOM-killed while the tier registers, a restart that costs minutes and
explains nothing. :func:`find_host_memory_shortfall` is the one check, from the engine's arguments and the
container's ``resources.limits.memory``; both kinds hold it before anything else happens:

* an InferenceService's ``spec.engine.extraArgs`` against ``spec.engine.resources.limits.memory``
  (:func:`check_host_memory`: ``Ready=False``, ``InvalidSpec``, before anything renders);
* an EngineTuner's target container's command line against its own limit
  (:mod:`kvpilot.operator.enginetuner.target_host_memory`: ``Planned=False``, before the plan, so no pod is
  rewritten and none evicted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.operator import api, errors
from kvpilot.operator.quantities import parse_quantity
from kvpilot.tuner.vllm import kv_offloading

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class HostMemoryShortfall:
    """A pod's memory limit below its share of the KV offloading tier."""

    share_bytes: int
    """The tier's bytes each pod of the engine pins (the whole tier with one pod)."""
    limit: str
    """The memory limit as written."""
    pods: int
    """The engine's pods (nodes) the tier is spread over."""

    def describe(self, args_at: str, limit_at: str) -> str:
        """What is wrong and what to do, naming where the flag (``args_at``) and the limit (``limit_at``)
        are written."""
        flag, gib = kv_offloading.KV_OFFLOADING_SIZE_FLAG, self.share_bytes / GIB
        per_pod = " (its share on each of the replica's pods)" if self.pods > 1 else ""
        return (
            f"{flag} in {args_at} pins {gib:.1f} GiB of host memory for vLLM's KV offloading tier{per_pod}, "
            f"more than {limit_at} ({self.limit}) holds; raise the limit above {gib:.0f}Gi plus the "
            f"engine's own host memory, or lower {flag}"
        )


def find_host_memory_shortfall(
    args: Sequence[str], limit: object | None, *, pods: int = 1
) -> HostMemoryShortfall | None:
    """The shortfall when a pod's memory ``limit`` cannot hold its share of the tier that the engine's
    ``args`` ask for (the total of the engine's tensor-parallel ranks, split evenly over its ``pods``);
    ``None`` when it can, or when there is no tier, no limit, or a limit that is not a plain quantity
    (nothing to hold it against). A tier size that is not a size in GiB is
    :class:`~kvpilot.tuner.errors.InvalidEngineArgs`."""
    tier = kv_offloading.compute_offloading_host_bytes(args)
    if tier is None or limit is None:
        return None
    try:
        limit_bytes = parse_quantity(str(limit))
    except ValueError:
        return None
    share = tier // max(pods, 1)
    if limit_bytes >= share:
        return None
    return HostMemoryShortfall(share_bytes=share, limit=str(limit), pods=pods)


def check_host_memory(spec: api.InferenceServiceSpec) -> None:
    """Refuse an InferenceService whose ``spec.engine.resources.limits.memory`` cannot hold the KV
    offloading tier of ``spec.engine.extraArgs`` (InvalidSpec); the tier is in one pod unless
    ``gpu.nodesPerReplica`` spreads it (then each pod holds its share)."""
    limit = ((spec.engine.resources or api.Resources()).limits or {}).get("memory")
    short = find_host_memory_shortfall(spec.engine.extra_args, limit, pods=spec.gpu.nodes_per_replica)
    if short is not None:
        raise errors.InvalidSpec(
            short.describe("spec.engine.extraArgs", "spec.engine.resources.limits.memory")
        )
