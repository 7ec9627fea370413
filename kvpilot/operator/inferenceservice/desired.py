"""What the operator applies for an InferenceService: the pure heart of a reconciliation.

:func:`parse_spec` types a spec (schema and CEL-equivalent checks, then the operator's tenant guard);
:func:`build_desired` takes the spec and its resolved inputs through the planner
(:func:`kvpilot.operator.planning.modes.compute_feasible_plan`)
and the tuning modes (:func:`kvpilot.operator.planning.modes.compute_mode_decision`) to the Service and
Deployment
manifests. The handlers apply them; ``kvpilot render`` (:mod:`kvpilot.operator.inferenceservice.render`)
prints them.
Raises tuner or operator errors; applies nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pydantic

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice import engine_desired
from kvpilot.operator.planning import modes, release, resolve
from kvpilot.operator.pods import pod_template, tenant_guard, workloads
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.plan.profiles import Learned


@dataclass(frozen=True, slots=True)
class Desired:
    decision: modes.ModeDecision | None
    """vLLM's plan and what each mode deploys; ``None`` for another engine (``engine_plan``)."""
    user: modes.UserArgs | None
    manifests: list[dict[str, Any]]
    """The apply order: a weight-cache claim (``storage.claimTemplate``), the Service, the Deployment, its
    PodDisruptionBudget (2 or more replicas)."""
    engine_plan: engine_desired.EnginePlan | None = None
    """Another engine's plan and container (``spec.engine.kind`` SGLang: :mod:`.engine_desired`)."""


def parse_spec(spec: Mapping[str, Any]) -> api.InferenceServiceSpec:
    """The typed spec; InvalidSpec naming every schema or CEL-equivalent problem, then PolicyViolation
    (reason Forbidden) naming every escalation the operator's tenant guard refuses
    (:mod:`kvpilot.operator.pods.tenant_guard`, with the settings read at start-up)."""
    try:
        parsed = api.InferenceServiceSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        schema = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}{_got(e.get('input'))}"
            for e in exc.errors(include_url=False)
        )
        raise errors.InvalidSpec(schema) from None
    problems = parsed.semantic_errors()
    problems += pod_template.compute_template_problems(parsed, tuple(workloads.build_labels("-")))
    if problems:
        raise errors.InvalidSpec("; ".join(problems))
    violations = tenant_guard.compute_current_violations(parsed)
    if violations:
        raise errors.PolicyViolation("; ".join(violations))
    return parsed


def _got(value: object) -> str:
    """`` (got 'x')`` for a scalar the schema refused, as the API server names an unsupported value."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        text = repr(value)
        return f" (got {text[:80]}{'...' if len(text) > 80 else ''})"
    return ""


Kept = api.Settings | sglang.SglangSettings | tgi.TgiSettings
"""Settings the closed loop rolled out, in the engine's own type: vLLM's ``status.applied``, SGLang's and
TGI's ``status.appliedEngineArgs``."""


def build_desired(
    metadata: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    inputs: resolve.Inputs,
    *,
    deploy_override: Kept | None = None,
    plan_fn: modes.PlanFn | None = None,
    learned: Learned | None = None,
) -> Desired:
    """Plan, decide per mode and build the manifests. Raises tuner or operator errors, applies nothing.

    ``deploy_override`` replaces the settings deployed in mode Auto: on resume, the settings
    the closed loop has put in ``status.applied`` (another engine's: ``status.appliedEngineArgs``) are kept
    instead of the initial plan. ``learned``: the
    matching TuningProfile's lesson, which the planner starts from
    (:mod:`kvpilot.operator.planning.profiles`).
    """
    if engine_desired.plans_itself(spec):  # another engine plans and renders its own container
        kept = deploy_override if not isinstance(deploy_override, api.Settings) else None
        engine_plan, manifests = engine_desired.build_engine_manifests(metadata, spec, inputs, kept)
        return Desired(None, None, manifests, engine_plan)
    user = modes.compute_user_args(spec)
    engine = release.resolve_release(spec, inputs.model)
    plan = modes.compute_feasible_plan(
        spec,
        inputs.model.spec,
        inputs.gpu.gpu,
        user,
        weights_total_bytes=inputs.model.checkpoint_bytes,
        image=engine.image,
        engine=engine.flags,
        learned=learned,
        plan_fn=plan_fn,
    )
    decision = modes.compute_mode_decision(spec, plan, user)
    if isinstance(deploy_override, api.Settings) and decision.mode == "Auto":
        keep = deploy_override.to_engine().replace(tensor_parallel_size=plan.settings.tensor_parallel_size)
        decision = replace(decision, deploy=keep)
    checkpoint = resolve.compute_checkpoint_bytes(inputs.model)
    deployment = workloads.build_deployment(
        metadata,
        spec,
        decision.deploy,
        user.extra,
        inputs.gpu.products,
        checkpoint_bytes=checkpoint,
        layout=modes.compute_group_layout(spec, inputs, user),
    )
    manifests = workloads.build_replica_manifests(metadata, spec, deployment, checkpoint)
    return Desired(decision, user, manifests)
