"""What an EngineTuner's reconcile reads from the cluster (and the Hub): its spec checked, the target, its
pods, their nodes' labels and the ConfigMaps they mount, and the model of a plan spec.

Blocking reads (:func:`read_observed`, :func:`read_target_model`): the reconcile runs them in
:data:`~kvpilot.operator.clients.kube.IO_POOL`. Shared by a vLLM target
(:mod:`.target_reading`) and an SGLang or TGI one (:mod:`.target_engine_reading`). The target is never
written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import TargetKube, build_label_selector
from kvpilot.operator.enginetuner import target
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import tenant_guard, tenant_settings
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm


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


def read_observed(kube: TargetKube | None, namespace: str, spec: api.EngineTunerSpec) -> Observed:
    """The target, its pods, their nodes' labels and the ConfigMaps its pods mount (sync); ApplyFailed
    without a Kubernetes client."""
    if kube is None:
        raise errors.ApplyFailed("no Kubernetes client configured")
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


def read_target_model(
    spec: api.EngineTunerSpec,
    plan_spec: api.InferenceServiceSpec,
    namespace: str,
    kube: Any,
    hub: resolve.HubDownload,
    speculative: vllm.SpeculativeFlags | None = None,
) -> tuple[api.InferenceServiceSpec, resolve.ResolvedModel]:
    """The plan spec's model (blocking: it may come from a ConfigMap or the Hub), with the config.json of
    the drafter the target's ``speculative`` decoding loads (:mod:`kvpilot.operator.planning.drafts`); a
    catalogue miss for an id read from the arguments is looked up on the Hub (the plan spec returned says
    so)."""
    try:
        return plan_spec, resolve.read_model(plan_spec.model, namespace, kube, hub, speculative)
    except tuner_errors.UnknownModel:
        if spec.model is not None:
            raise
    hub_ref = plan_spec.model.model_copy(update={"source": "Hub"})
    plan_spec = plan_spec.model_copy(update={"model": hub_ref})
    return plan_spec, resolve.read_model(hub_ref, namespace, kube, hub, speculative)
