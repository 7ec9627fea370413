"""``kvpilot render -f isvc.yaml``: the manifests the operator would apply, without a cluster.

:func:`build_manifests` parses a manifest as the API server would (defaults, then the CEL
rules), resolves the model from the catalogue and the GPU from ``spec.gpu.product`` (or a
``nvidia.com/gpu.product`` node selector), and returns what
:func:`kvpilot.operator.inferenceservice.desired.build_desired`
builds. Anything it cannot do offline (ConfigMap or Hub configs, GPU discovery) raises :class:`RenderError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import modes, resolve


class RenderError(Exception):
    """Why an InferenceService cannot be rendered: a CamelCase ``reason`` and a message for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


def build_manifests(
    isvc: Mapping[str, Any], *, gpu_product: str | None = None, plan_fn: modes.PlanFn | None = None
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
        spec = desired.parse_spec(isvc.get("spec") or {})
        if gpu_product and not spec.gpu.product:
            spec = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"product": gpu_product})})
        inputs = resolve.Inputs(
            resolve.read_spec_model(spec, metadata["namespace"], None), resolve.read_gpu(spec, None)
        )
        return desired.build_desired(metadata, spec, inputs, plan_fn=plan_fn).manifests
    except Exception as exc:
        failure = errors.classify(exc)
        if failure.reason == "InternalError":
            raise
        raise RenderError(failure.reason, failure.message) from None
