"""An EngineTuner's vLLM target held to the host memory its KV offloading tier (and LMCache's CPU backend,
per GPU worker, sized by the container's literal environment) pins.

The InferenceService's check (:func:`kvpilot.operator.planning.host_memory.find_host_memory_shortfall`), fed
what the target runs: the vLLM container's ``--kv-offloading-size`` (its command line, after the flags of a
``--config`` file, as vLLM reads them) against that container's ``resources.limits.memory`` in each pod
template that runs it (a LeaderWorkerSet's leader and workers: each pod holds its share of the group's
tier). A limit that cannot hold it is :class:`HostMemoryTooSmall` (``Planned=False`` and ``Ready=False``,
a Warning event) before anything is planned: the status then carries no recommendation the webhook could
put on new pods (it actuates only while ``Ready=True``), and Auto evicts nothing. The target is not written:
its owner raises the limit or lowers the tier, and the next reconcile (the timer's) sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import conditions, errors
from kvpilot.operator.enginetuner import target
from kvpilot.operator.planning import host_memory
from kvpilot.operator.pods.capacity import GPU_RESOURCE
from kvpilot.tuner import errors as tuner_errors


class HostMemoryTooSmall(errors.OperatorError):
    """The target's vLLM container cannot hold the KV offloading tier its command line asks for: it would be
    OOM-killed while the tier registers, whatever kvpilot recommended."""

    reason = "HostMemoryTooSmall"
    condition = conditions.PLANNED
    retry = True  # the owner may raise the limit or lower the tier: look again
    delay_s = 60.0


def check_target_host_memory(workload: Mapping[str, Any], found: target.Discovery) -> None:
    """Raise :class:`HostMemoryTooSmall` when a pod template's ``found.container`` (one that runs vLLM) has
    a memory limit below its share of the tier; a tier size that is not a size in GiB is
    :class:`~.target.DiscoveryIncomplete`, as any vLLM argument of the target that does not parse."""
    args = (*found.config_args, *found.command.flags)
    name = found.container
    for template in target.pod_templates(workload):
        container = next((c for c in template.get("containers") or () if c.get("name") == name), None)
        if container is None or not target.runs_vllm({"spec": template}, name):
            continue  # a group's Ray worker: no vLLM command, its tier is the leader's
        limits = (container.get("resources") or {}).get("limits") or {}
        env = {e["name"]: e.get("value") or "" for e in container.get("env") or () if "name" in e}
        try:
            short = host_memory.find_host_memory_shortfall(
                args, limits.get("memory"), pods=found.nodes, gpus=_gpus(limits), env=env
            )
        except tuner_errors.InvalidEngineArgs as exc:
            raise target.DiscoveryIncomplete(
                f"the target's vLLM arguments do not parse: {exc.message}"
            ) from None
        if short is not None:
            raise HostMemoryTooSmall(
                short.describe(f"container {name} of the target", "that container's resources.limits.memory")
            )


def _gpus(limits: Mapping[str, Any]) -> int:
    """The container's GPU workers (``nvidia.com/gpu``; 1 when not a whole number): LMCache pins its CPU
    backend once per worker."""
    try:
        return max(1, int(str(limits.get(GPU_RESOURCE, 1))))
    except ValueError:
        return 1
