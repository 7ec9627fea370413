"""What an EngineTuner's reconcile reads and plans for a target whose container runs SGLang or TGI.

The engine half of :func:`kvpilot.operator.enginetuner.target_reading.fetch_target`: an :class:`EngineTarget`
(what :mod:`.target_engine_plan` discovered, and the InferenceService planner's plan for that engine:
:func:`read_engine_plan`) and what the status says of it (:func:`build_engine_found`:
:class:`~kvpilot.operator.status.engine_tuner_status.EngineTunerFound`). The target is never written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.clients.kube import IO_POOL
from kvpilot.operator.enginetuner import target, target_engine_plan, target_loop
from kvpilot.operator.enginetuner.target_engine_plan import EngineDiscovery
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.enginetuner.target_observed import Observed, read_target_model
from kvpilot.operator.planning import engines, resolve
from kvpilot.operator.planning.engines import EnginePlan
from kvpilot.operator.status.engine_tuner_status import EngineTunerFound
from kvpilot.tuner.types import GIB


@dataclass(frozen=True)
class EngineTarget:
    """One reconcile's reading of a target whose container runs SGLang or TGI: the spec, what was read and
    discovered, the plan (the InferenceService planner's for that engine)."""

    spec: api.EngineTunerSpec
    namespace: str
    generation: int | None
    observed: Observed
    found: EngineDiscovery
    plan: EnginePlan
    model: resolve.ResolvedModel
    gpu: resolve.ResolvedGpu
    plan_spec: api.InferenceServiceSpec
    """The InferenceService spec the target plans as (its bounds, SLO and policy are the closed loop's)."""

    @property
    def mode(self) -> str:
        return self.spec.update_mode

    @property
    def planned(self) -> EngineArgs:
        """The plan's flags, in the engine's own spelling."""
        return EngineArgs(self.found.kind, self.plan.planned)


async def fetch_engine_target(
    spec: api.EngineTunerSpec,
    namespace: str,
    generation: int | None,
    observed: Observed,
    kube: Any,
    hub: resolve.HubDownload,
) -> EngineTarget | None:
    """The target discovered and planned when the container the EngineTuner tunes runs SGLang or TGI
    (:func:`.target_engine_plan.find_target_engine`); ``None`` otherwise (vLLM's, or what says why not)."""
    other = target_engine_plan.find_target_engine(spec, observed.workload)
    if other is None:
        return None
    found = target_engine_plan.build_engine_discovery(spec, observed.workload, observed.node_labels, *other)
    plan, model, gpu, plan_spec = await asyncio.get_running_loop().run_in_executor(
        IO_POOL, read_engine_plan, spec, found, namespace, kube, hub
    )
    return EngineTarget(spec, namespace, generation, observed, found, plan, model, gpu, plan_spec)


def read_engine_plan(
    spec: api.EngineTunerSpec, found: EngineDiscovery, namespace: str, kube: Any, hub: resolve.HubDownload
) -> tuple[EnginePlan, resolve.ResolvedModel, resolve.ResolvedGpu, api.InferenceServiceSpec]:
    """The InferenceService planner's answer for an SGLang or TGI target (blocking, as
    :func:`.target_reading.read_plan`):
    :func:`kvpilot.operator.planning.engines.compute_engine_plan` for the spec
    :func:`.target_engine_plan.build_engine_plan_spec` makes."""
    plan_spec = target_engine_plan.build_engine_plan_spec(spec, found)
    plan_spec, model = read_target_model(spec, plan_spec, namespace, kube, hub)
    origin = "spec.gpu.product" if found.gpu_labels is None else "the labels of the pods' nodes"
    products = (found.gpu_product,) if found.gpu_product else ()
    gpu = resolve.ResolvedGpu(target.compute_gpu(found), products, origin)
    return engines.compute_engine_plan(plan_spec, resolve.Inputs(model, gpu)), model, gpu, plan_spec


def build_engine_found(read: EngineTarget, recommended: EngineArgs, now: float) -> EngineTunerFound:
    """What the status says of an SGLang or TGI target: its discovery in wire form (how many pods run the
    ``recommended`` flags: the plan's, as the closed loop changed them since), the recommendation, the plan's
    summary and budget explanation."""
    found, observed = read.found, read.observed
    tuned = sum(1 for p in observed.pods if target.pod_carries(p, found.container, recommended))
    discovered = api.Discovered(
        container=found.container,
        engine=found.kind,
        model=found.model.id,
        model_origin=read.model.origin,
        args_origin=found.args_origin,
        gpu_product=found.gpu_product,
        gpu_count=found.gpu_count,
        engine_args=list(found.args),
        pods=len(observed.pods),
        pods_tuned=tuned,
    )
    runs = " ".join(found.args) or f"{found.kind}'s defaults"
    message = (
        f"container {found.container} ({found.kind}, {found.command.form}, flags in {found.args_origin}) "
        f"runs {runs}; model {found.model.id} from {found.model_origin}; {found.gpu_count}x "
        f"{found.gpu_product or read.gpu.gpu.name}"
    )
    ref = read.spec.target_ref
    return EngineTunerFound(
        generation=read.generation,
        now=now,
        mode=read.mode,
        target=f"{ref.kind} {ref.name}",
        discovered=discovered,
        discovered_message=message,
        current=found.args,
        recommended=recommended.args,
        summary=read.plan.summary,
        explanation=read.plan.explanation,
        gpu_name=read.gpu.gpu.name,
        gpu_memory_gib=read.gpu.gpu.total_bytes / GIB,
        warnings=read.gpu.warnings,
        serving=target_loop.compute_target_serving(observed.pods, found.container),
    )
