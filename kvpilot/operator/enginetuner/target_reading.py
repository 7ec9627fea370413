"""What an EngineTuner's reconcile reads and plans: its spec, the target, what runs there, the plan.

The reading half of :func:`kvpilot.operator.enginetuner.target_handlers.reconcile`: :func:`fetch_target`
(the spec parsed and checked by the tenant guard, the target, its pods, their nodes and ConfigMaps read
in :data:`~kvpilot.operator.clients.kube.IO_POOL`: :mod:`.target_observed`; what runs there discovered and
held to its memory limit, :mod:`.target_host_memory`; the InferenceService planner's answer for it) and
:func:`build_found` (what the status says of it: :class:`~kvpilot.operator.status.tuner_status.TunerFound`).
A target whose container runs SGLang or TGI is an :class:`~.target_engine_reading.EngineTarget`
(:mod:`.target_engine_plan` discovers it, :mod:`.target_engine_reading` plans it). The target is never
written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.clients.kube import IO_POOL, TargetKube
from kvpilot.operator.enginetuner import target, target_engine_reading, target_host_memory, target_loop
from kvpilot.operator.enginetuner.target_engine_reading import EngineTarget
from kvpilot.operator.enginetuner.target_observed import (
    Observed,
    parse_spec,
    read_observed,
    read_target_model,
)
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.status.tuner_status import TunerFound
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings, MemoryBudget, Plan


@dataclass(frozen=True)
class Target:
    """One reconcile's reading of its target: the spec, what was read and discovered, the plan."""

    spec: api.EngineTunerSpec
    namespace: str
    generation: int | None
    observed: Observed
    found: target.Discovery
    plan: Plan
    model: resolve.ResolvedModel
    loop_inputs: target_loop.LoopInputs

    @property
    def mode(self) -> str:
        return self.spec.update_mode


async def fetch_target(
    kube: TargetKube | None, spec: Mapping[str, Any], meta: Mapping[str, Any], hub: resolve.HubDownload
) -> Target | EngineTarget:
    """The spec, the target read and discovered, and the plan for it (an :class:`EngineTarget` when its
    container runs SGLang or TGI); raises what fails (the reconcile reports it)."""
    namespace = str(meta.get("namespace") or "default")
    generation = meta.get("generation")
    parsed = parse_spec(spec)
    io = asyncio.get_running_loop()
    observed = await io.run_in_executor(IO_POOL, read_observed, kube, namespace, parsed)
    gen = int(generation) if generation is not None else None
    other = await target_engine_reading.fetch_engine_target(parsed, namespace, gen, observed, kube, hub)
    if other is not None:  # its container runs SGLang or TGI
        return other
    found = target.build_discovery(parsed, observed.workload, observed.node_labels, observed.config_maps)
    target_host_memory.check_target_host_memory(observed.workload, found)  # before the plan: no rewrite
    plan, model, loop_inputs = await io.run_in_executor(
        IO_POOL, read_plan, parsed, found, namespace, kube, hub
    )
    return Target(parsed, namespace, gen, observed, found, plan, model, loop_inputs)


def read_plan(
    spec: api.EngineTunerSpec, found: target.Discovery, namespace: str, kube: Any, hub: resolve.HubDownload
) -> tuple[Plan, resolve.ResolvedModel, target_loop.LoopInputs]:
    """The InferenceService planner's answer for the target (blocking: the model may come from a ConfigMap or
    the Hub), and what the closed loop needs of it. A catalogue miss for an id read from the arguments is
    looked up on the Hub."""
    runner_v2 = vllm.parse_v2_runner_env(found.vllm_env.get(vllm.V2_RUNNER_ENV))
    flags = vllm.build_engine_flags(found.command.flags, runner_v2)  # the target's own flags
    plan_spec, model = read_target_model(
        spec, target.build_plan_spec(spec, found), namespace, kube, hub, flags.speculative
    )
    flags = model.with_draft(flags)  # with its drafter's config.json, read as the model's
    gpu = target.compute_gpu(found)
    user = modes.compute_user_args(plan_spec)
    release = vllm.resolve_image_version(plan_spec.engine.image, None)
    plan = modes.compute_feasible_plan(
        plan_spec,
        model.spec,
        gpu,
        user,
        image=release,
        engine=flags,
        weights_total_bytes=model.checkpoint_bytes,
        owner_layout=True,
    )
    loop = target_loop.LoopInputs(
        plan_spec, plan, model.spec, gpu, release.version, model.checkpoint_bytes, engine=flags
    )
    return plan, model, loop


def build_found(read: Target, recommended: EngineSettings, budget: MemoryBudget, now: float) -> TunerFound:
    """What the status says of the target: its discovery in wire form (how many pods run ``recommended``),
    the plan and ``budget`` (the recommendation's)."""
    found, parsed, observed = read.found, read.spec, read.observed
    tuned = sum(1 for p in observed.pods if target.pod_carries(p, found.container, recommended))
    discovered = api.Discovered(
        container=found.container,
        model=found.model.id,
        model_origin=read.model.origin,
        args_origin=found.args_origin,
        gpu_product=found.gpu_product,
        gpu_count=found.gpu_count,
        settings=api.Settings.from_engine(found.settings),
        vllm_env=dict(list(found.vllm_env.items())[:32]),
        pods=len(observed.pods),
        pods_tuned=tuned,
    )
    message = (
        f"container {found.container} ({found.command.form}, flags in {found.args_origin}) runs "
        f"{vllm.describe_settings(found.settings)}; model {found.model.id} from {found.model_origin}; "
        f"{found.gpu_count}x {found.gpu_product or read.plan.gpu}"
    )
    return TunerFound(
        generation=read.generation,
        now=now,
        mode=read.mode,
        target=f"{parsed.target_ref.kind} {parsed.target_ref.name}",
        discovered=discovered,
        discovered_message=message,
        plan=read.plan,
        budget=budget,
        current=found.settings,
        serving=target_loop.compute_target_serving(observed.pods, found.container),
    )
