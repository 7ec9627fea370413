"""What the operator would apply for an InferenceService, without a cluster.

:func:`build_desired` is the pure heart of a reconciliation, shared with the
handlers: spec + resolved inputs -> plan -> mode decision -> Service and
Deployment manifests. :func:`build_manifests` is ``kvpilot render -f isvc.yaml``:
it parses a manifest as the API server would (defaults, then the CEL rules), resolves
the model from the catalogue and the GPU from ``spec.gpu.product`` (or a
``nvidia.com/gpu.product`` node selector), and returns the manifests. Anything it
cannot do offline (ConfigMap or Hub configs, GPU discovery) raises :class:`RenderError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pydantic

from kvpilot.operator import api, errors, planning, resolve, workloads


class RenderError(Exception):
    """Why an InferenceService cannot be rendered: a CamelCase ``reason`` and a message for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


@dataclass(frozen=True, slots=True)
class Desired:
    decision: planning.Decision
    user: planning.UserArgs
    manifests: list[dict[str, Any]]
    """Service first, then Deployment: the apply order."""


def parse_spec(spec: Mapping[str, Any]) -> api.InferenceServiceSpec:
    """The typed spec; InvalidSpec naming every schema or CEL-equivalent problem."""
    try:
        parsed = api.InferenceServiceSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}{_got(e.get('input'))}"
            for e in exc.errors(include_url=False)
        )
        raise errors.InvalidSpec(problems) from None
    problems = parsed.semantic_errors()
    if problems:
        raise errors.InvalidSpec("; ".join(problems))
    return parsed


def _got(value: object) -> str:
    """`` (got 'x')`` for a scalar the schema refused, as the API server names an unsupported value."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        text = repr(value)
        return f" (got {text[:80]}{'...' if len(text) > 80 else ''})"
    return ""


def build_desired(
    metadata: Mapping[str, Any], spec: api.InferenceServiceSpec, inputs: resolve.Inputs,
    *, deploy_override: api.Settings | None = None, plan_fn: planning.PlanFn | None = None,
) -> Desired:  # fmt: skip
    """Plan, decide per mode and build the manifests. Raises tuner or operator errors, applies nothing.

    ``deploy_override`` replaces the settings deployed in mode Auto: on resume, the settings
    the closed loop has put in ``status.applied`` are kept instead of the initial plan.
    """
    user = planning.compute_user_args(spec)
    plan = planning.compute_plan(
        spec, inputs.model.spec, inputs.gpu.gpu, user,
        weights_total_bytes=inputs.model.checkpoint_bytes, plan_fn=plan_fn,
    )  # fmt: skip
    decision = planning.compute_decision(spec, plan, user)
    if deploy_override is not None and decision.mode == "Auto":
        keep = deploy_override.to_engine().replace(tensor_parallel_size=plan.settings.tensor_parallel_size)
        decision = replace(decision, deploy=keep)
    manifests = [
        workloads.build_service(metadata),
        workloads.build_deployment(metadata, spec, decision.deploy, user.extra, inputs.gpu.products),
    ]
    return Desired(decision, user, manifests)


def build_manifests(
    isvc: Mapping[str, Any], *, gpu_product: str | None = None, plan_fn: planning.PlanFn | None = None
) -> list[dict[str, Any]]:
    """The Service and Deployment the operator would apply for ``isvc`` (a parsed YAML manifest).

    ``gpu_product`` stands in for GPU discovery (a catalogue name or GFD product), for specs that
    leave the GPU to the cluster's node labels; ``spec.gpu.product`` wins when both are given.
    """
    if isvc.get("kind") not in (None, api.KIND):
        raise RenderError("InvalidSpec", f"kind is {isvc.get('kind')!r}, expected {api.KIND}")
    metadata = dict(isvc.get("metadata") or {})
    metadata.setdefault("name", "inferenceservice")
    metadata.setdefault("namespace", "default")
    try:
        spec = parse_spec(isvc.get("spec") or {})
        if gpu_product and not spec.gpu.product:
            spec = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"product": gpu_product})})
        inputs = resolve.Inputs(
            resolve.read_model(spec.model, metadata["namespace"], None), resolve.read_gpu(spec, None)
        )
        return build_desired(metadata, spec, inputs, plan_fn=plan_fn).manifests
    except Exception as exc:
        failure = errors.classify(exc)
        if failure.reason == "InternalError":
            raise
        raise RenderError(failure.reason, failure.message) from None
