"""What the operator applies for an InferenceService of another engine than vLLM (``spec.engine.kind``).

:func:`build_engine_manifests` asks :mod:`kvpilot.operator.planning.engines` for the engine's plan and
container (SGLang and TGI: each its own memory model and flags) and renders the same
Service, Deployment, weight cache and PodDisruptionBudget as for vLLM
(:func:`kvpilot.operator.pods.workloads.build_deployment` with the engine's container). The Service keeps
port 8000 (named ``http``), which reaches the engine's own port in the pod, so clients do not change with
the engine. In mode Auto the flags the closed loop rolled out (``status.appliedEngineArgs``) replace the
plan's where the reconciler keeps them (:func:`kvpilot.operator.inferenceservice.plan_choice.read_kept`).
Pure: applies nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.planning import engines, resolve
from kvpilot.operator.planning.engines import EnginePlan
from kvpilot.operator.pods import workloads
from kvpilot.tuner.types import EngineSettings

__all__ = ["EnginePlan", "build_engine_manifests", "plans_itself"]


def plans_itself(spec: api.InferenceServiceSpec) -> bool:
    """Whether ``spec``'s engine has a planner of its own (:data:`..planning.engines.PLANNERS`)."""
    return spec.engine.kind in engines.PLANNERS


def build_engine_manifests(
    metadata: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    kept: engines.EngineFlags | None = None,
) -> tuple[EnginePlan, list[dict[str, Any]]]:
    """The engine's plan and the manifests in apply order (claim, Service, Deployment, budget); raises
    EngineNotSupported, InvalidSpec or InfeasiblePlan before anything is built. ``kept``: the flags the
    closed loop rolled out, rendered in mode Auto instead of the plan's."""
    plan = engines.compute_engine_plan(spec, inputs, kept)
    checkpoint = resolve.compute_checkpoint_bytes(inputs.model)
    deployment = workloads.build_deployment(
        metadata,
        spec,
        EngineSettings(),
        (),
        inputs.gpu.products,
        checkpoint_bytes=checkpoint,
        engine=workloads.EngineContainer(plan.serving, plan.args),
    )
    return plan, workloads.build_replica_manifests(metadata, spec, deployment, checkpoint)
