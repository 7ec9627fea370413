"""KWOK's pod stages with one change: a pod labelled :data:`PROBED_LABEL` starts Running but not Ready.

KWOK's ``pod-ready`` stage (``kustomize/stage/pod/fast`` of the pinned module, which ``e2e/build.sh`` copies
verbatim) makes every pod Ready the moment it is bound. A real kubelet does not: a container with a
readiness probe is not Ready until the probe passes, and vLLM's takes a model load. On the local control
plane the fleet (:mod:`e2e.fleet`) plays that kubelet: it adopts a Running pod, reports it starting
(``Ready=False``) and Ready once its engine serves. Between KWOK's stage and the fleet's first patch the
Deployment controller sees a new pod that looks available and takes the next old replica down, so a
one-at-a-time ``Replace`` rollout on a full pool replaced both replicas at once in ``make demo`` (0 of 2
Ready sampled), which no cluster with readiness probes does.

:func:`build_stages` keeps KWOK's stages and splits ``pod-ready``: pods without the label are made Ready as
before (every test that has no fleet relies on it); pods with it get the same status with
``Ready``/``ContainersReady`` False and their containers not ready, and the fleet makes them Ready. The
label is opt-in (a test, the demo) because only a test with a fleet has anyone to make the pod Ready.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

PROBED_LABEL = "e2e.kvpilot.io/kubelet"
"""Pod label (value :data:`PROBED_VALUE`): the pod is Ready only when the fleet says its engine serves."""
PROBED_VALUE = "probes"

READY_STAGE = "pod-ready"
PROBED_STAGE = "pod-ready-probed"

_READY_CONDITIONS = (
    '  status: "True"\n  type: Ready\n',
    '  status: "True"\n  type: ContainersReady\n',
)
_CONTAINERS = "containerStatuses:\n{{ range .spec.containers }}"
_CONTAINER_READY = "  ready: true\n"


class StagesError(RuntimeError):
    """KWOK's stages are not the shape this module splits (the pinned module changed): fail loudly."""


def _label_expression(operator: str) -> dict[str, Any]:
    return {"key": f'.metadata.labels."{PROBED_LABEL}"', "operator": operator, "values": [PROBED_VALUE]}


def _probed_template(template: str) -> str:
    """``pod-ready``'s status template with the pod and its containers not ready (init containers as KWOK
    has them)."""
    out = template
    for condition in _READY_CONDITIONS:
        if condition not in out:
            raise StagesError(f"KWOK's pod-ready template lacks {condition!r}")
        out = out.replace(condition, condition.replace('"True"', '"False"'), 1)
    head, sep, tail = out.partition(_CONTAINERS)
    if not sep or _CONTAINER_READY not in tail:
        raise StagesError("KWOK's pod-ready template lists no containerStatuses with ready: true")
    return head + sep + tail.replace(_CONTAINER_READY, "  ready: false\n  started: false\n", 1)


def build_stages(default_stages: str) -> str:
    """KWOK's default stages (the YAML stream ``e2e/build.sh`` wrote) with ``pod-ready`` split by
    :data:`PROBED_LABEL` (module docstring)."""
    docs = [d for d in yaml.safe_load_all(default_stages) if d]
    ready = next((d for d in docs if d.get("metadata", {}).get("name") == READY_STAGE), None)
    if ready is None:
        raise StagesError(f"KWOK's default stages have no {READY_STAGE!r} stage")
    probed = copy.deepcopy(ready)
    probed["metadata"]["name"] = PROBED_STAGE
    probed["spec"]["selector"]["matchExpressions"].append(_label_expression("In"))
    template = ready["spec"]["next"]["statusTemplate"]
    probed["spec"]["next"]["statusTemplate"] = _probed_template(template)
    ready["spec"]["selector"]["matchExpressions"].append(_label_expression("NotIn"))
    return yaml.safe_dump_all([*docs, probed], sort_keys=False)


def add_probed_label(inference_service: dict[str, Any]) -> dict[str, Any]:
    """``inference_service`` (a manifest, changed in place and returned) with its pods labelled
    :data:`PROBED_LABEL` through ``spec.template.metadata.labels``: for a test whose fleet plays them."""
    template = inference_service.setdefault("spec", {}).setdefault("template", {})
    template.setdefault("metadata", {}).setdefault("labels", {})[PROBED_LABEL] = PROBED_VALUE
    return inference_service
