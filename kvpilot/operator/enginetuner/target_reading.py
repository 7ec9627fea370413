"""What an EngineTuner's reconcile reads and plans: its spec, the target, what runs there, the plan.

The reading half of :func:`kvpilot.operator.enginetuner.target_handlers.reconcile`: :func:`fetch_target`
(the spec parsed and checked by the tenant guard, the target, its pods, their nodes and ConfigMaps read
in :data:`~kvpilot.operator.clients.kube.IO_POOL`, what runs there discovered, the InferenceService
planner's answer for it) and :func:`build_found` (what the status says of it:
:class:`~kvpilot.operator.status.tuner_status.TunerFound`). The target is never written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import IO_POOL, TargetKube, build_label_selector
from kvpilot.operator.enginetuner import target, target_loop
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import tenant_guard, tenant_settings
from kvpilot.operator.status.tuner_status import TunerFound
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings, MemoryBudget, Plan


def parse_spec(spec: Mapping[str, Any]) -> api.EngineTunerSpec:
    try:
        parsed = api.EngineTunerSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        text = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise errors.InvalidSpec(text) from None
    m = parsed.model
    if m is not None and m.source == "ConfigMap" and m.config_map_ref is None:
        raise errors.InvalidSpec("spec.model: configMapRef is required when source is ConfigMap")
    violations = tenant_guard.compute_tuner_violations(parsed, tenant_settings.current())
    if violations:
        raise errors.PolicyViolation("; ".join(violations))
    return parsed


@dataclass(frozen=True, slots=True)
class Observed:
    workload: dict[str, Any]
    pods: list[dict[str, Any]]
    node_labels: list[dict[str, str]]
    config_maps: dict[str, dict[str, str]]


def read_observed(kube: TargetKube, namespace: str, spec: api.EngineTunerSpec) -> Observed:
    """The target, its pods, their nodes' labels and the ConfigMaps its pods mount (sync)."""
    ref = spec.target_ref
    group = target.is_group_kind(ref.kind)
    try:
        workload = kube.read_workload(namespace, ref.kind, ref.name)
    except errors.ApplyFailed as exc:
        if not group:
            raise
        raise errors.ApplyFailed(
            f"{exc.message}; the operator reads LeaderWorkerSets when the chart has leaderWorkerSet.enabled"
        ) from None
    if workload is None:
        installed = " (and LeaderWorkerSet, sigs.k8s.io/lws, is installed)" if group else ""
        raise target.TargetNotFound(
            f"{ref.kind} {namespace}/{ref.name} (spec.targetRef) does not exist; create it or fix the "
            f"name{installed}"
        )
    selector = build_label_selector(target.pod_selector(workload, ref.kind, ref.name))
    pods = [p for p in kube.list_pods(namespace, selector) if target.pod_belongs(p, ref.kind, ref.name)]
    nodes = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in kube.list_nodes()}
    labels = [nodes[n] for p in pods if (n := (p.get("spec") or {}).get("nodeName")) in nodes]
    maps: dict[str, dict[str, str]] = {}
    volumes = [v for template in target.pod_templates(workload) for v in template.get("volumes") or ()]
    for volume in volumes:
        name = (volume.get("configMap") or {}).get("name")
        if name and name not in maps:
            data = kube.read_config_map_data(namespace, name)
            if data is not None:
                maps[name] = data
    return Observed(workload, pods, labels, maps)


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
) -> Target:
    """The spec, the target read and discovered, and the plan for it; raises what fails (the reconcile
    reports it)."""
    namespace = str(meta.get("namespace") or "default")
    generation = meta.get("generation")
    parsed = parse_spec(spec)
    if kube is None:
        raise errors.ApplyFailed("no Kubernetes client configured")
    io = asyncio.get_running_loop()
    observed = await io.run_in_executor(IO_POOL, read_observed, kube, namespace, parsed)
    found = target.build_discovery(parsed, observed.workload, observed.node_labels, observed.config_maps)
    plan, model, loop_inputs = await io.run_in_executor(
        IO_POOL, read_plan, parsed, found, namespace, kube, hub
    )
    gen = int(generation) if generation is not None else None
    return Target(parsed, namespace, gen, observed, found, plan, model, loop_inputs)


def read_plan(
    spec: api.EngineTunerSpec, found: target.Discovery, namespace: str, kube: Any, hub: resolve.HubDownload
) -> tuple[Plan, resolve.ResolvedModel, target_loop.LoopInputs]:
    """The InferenceService planner's answer for the target (blocking: the model may come from a ConfigMap or
    the Hub), and what the closed loop needs of it. A catalogue miss for an id read from the arguments is
    looked up on the Hub."""
    plan_spec = target.build_plan_spec(spec, found)
    try:
        model = resolve.read_model(plan_spec.model, namespace, kube, hub)
    except tuner_errors.UnknownModel:
        if spec.model is not None:
            raise
        hub_ref = plan_spec.model.model_copy(update={"source": "Hub"})
        plan_spec = plan_spec.model_copy(update={"model": hub_ref})
        model = resolve.read_model(hub_ref, namespace, kube, hub)
    gpu = target.compute_gpu(found)
    user = modes.compute_user_args(plan_spec)
    release = vllm.resolve_image_version(plan_spec.engine.image, None)
    runner_v2 = vllm.parse_v2_runner_env(found.vllm_env.get(vllm.V2_RUNNER_ENV))
    flags = vllm.build_engine_flags(found.command.flags, runner_v2)  # the target's own flags
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
    )
