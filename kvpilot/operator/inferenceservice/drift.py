"""Drift repair: what kvpilot owns (the vLLM Deployment or LeaderWorkerSet, and the Service) stays what
kvpilot applied.

kopf watches the Deployments, LeaderWorkerSets and Services carrying kvpilot's labels (:data:`OWNED_LABELS`,
registered in :mod:`kvpilot.operator.main`); on every event of one:

* deleted (and its InferenceService still there, not being deleted): the InferenceService's manifests are
  applied again, so it is recreated within seconds, with a ``DriftDetected`` event;
* otherwise, a field kvpilot manages (:data:`MANAGED_FIELDS`: the replicas, the engine container's image,
  command, args, env and resources, in a LeaderWorkerSet those of the leader's and the workers' templates;
  the Service's type, selector and ports) whose ``managedFields`` owner
  is someone other than kvpilot's field manager and whose value differs from what kvpilot would apply is
  a hand edit: the manifests are applied again (server-side apply, forced: kvpilot takes the fields back)
  and a ``DriftDetected`` Warning names each field, who changed it, and the value put back.

Attribution comes from the API server's ``managedFields``, not from comparing values alone: kvpilot's own
applies (the reconciler's and the closed loop's retunes, which land before ``status.applied`` says so)
are owned by kvpilot's manager and never look like drift, so a retune is never "repaired" back. Pods
that ran the hand-edited settings are told apart by their args (:mod:`kvpilot.operator.pods.pod_view`
compares each pod's args with the applied settings), so their crashes are not the applied settings'.

What is re-applied is what the reconciler would apply for the observed generation, keeping the closed
loop's settings (``status.applied``); while the reconciler has not succeeded for the current generation,
repair waits for it. :func:`compute_drift` is pure; :func:`apply_repair` does the I/O.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import kopf

from kvpilot.operator import api
from kvpilot.operator.clients.kube import CUSTOM_KINDS, FIELD_MANAGER
from kvpilot.operator.inferenceservice import desired, plan_choice
from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import ownership, workloads
from kvpilot.operator.status import events, status_patch
from kvpilot.tuner import engines as tuner_engines
from kvpilot.tuner.vllm import serving

OWNED_LABELS: dict[str, Any] = {
    "app.kubernetes.io/managed-by": "kvpilot",
    api.SERVICE_LABEL: kopf.PRESENT,
}
"""The labels :func:`kvpilot.operator.pods.workloads.build_labels` puts on everything kvpilot owns."""
OWNER_LABEL = api.SERVICE_LABEL
LEADER_WORKER_SETS = CUSTOM_KINDS["LeaderWorkerSet"]
"""(group, version, plural) of the LeaderWorkerSets watched for drift."""
CONTAINER = serving.CONTAINER_NAME
CONTAINERS = tuple(
    dict.fromkeys([CONTAINER, *(e.serving.container_name for e in tuner_engines.ENGINES.values())])
)
"""The engine containers kvpilot renders (``spec.engine.kind``, from the tuner's seam), vLLM's first."""
CONTROLLERS = frozenset({"kube-controller-manager"})
"""Field managers that are not people: the Deployment controller (status, revision annotation) and the
horizontal pod autoscaler (``replicas``, through the scale subresource), which kvpilot leaves alone."""


def _engine(name: str) -> tuple[str, ...]:
    return ("f:spec", "f:template", "f:spec", "f:containers", f'k:{{"name":"{name}"}}')


_VLLM = _engine(CONTAINER)
MANAGED_FIELDS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "Deployment": (
        ("spec.replicas", ("f:spec", "f:replicas")),
        *(
            (f"spec.template.spec.containers[{c}].{f}", (*_engine(c), f"f:{f}"))
            for c in CONTAINERS
            for f in ("image", "command", "args", "env", "resources")
        ),
    ),
    "Service": tuple((f"spec.{f}", ("f:spec", f"f:{f}")) for f in ("type", "selector", "ports")),
    "LeaderWorkerSet": (
        ("spec.replicas", ("f:spec", "f:replicas")),
        *(
            (
                f"spec.leaderWorkerTemplate.{role}.spec.containers[{CONTAINER}].{f}",
                ("f:spec", "f:leaderWorkerTemplate", f"f:{role}", *_VLLM[2:], f"f:{f}"),
            )
            for role in ("leaderTemplate", "workerTemplate")
            for f in ("image", "command", "args", "env", "resources")
        ),
    ),
}
"""Per kind, ``(field, its path in managedFields' fieldsV1)``."""


@dataclass(frozen=True, slots=True)
class Drift:
    field: str
    manager: str
    live: Any
    wanted: Any

    def describe(self) -> str:
        return f"{self.field} was changed by {self.manager} ({_difference(self.live, self.wanted)}); put back"


def _difference(live: Any, wanted: Any) -> str:
    """What differs, short: for lists (args, command) the changed stretches, else both values."""
    if isinstance(live, list) and isinstance(wanted, list):
        parts = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=wanted, b=live, autojunk=False).get_opcodes():
            if op == "insert":
                parts.append(f"added {_short(live[j1:j2])}")
            elif op == "delete":
                parts.append(f"removed {_short(wanted[i1:i2])}")
            elif op == "replace":
                parts.append(f"{_short(wanted[i1:i2])} became {_short(live[j1:j2])}")
        return ", ".join(parts)
    return f"{_short(wanted)} became {_short(live)}"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


def _value(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at a fieldsV1 path (``f:`` keys, ``k:{"name":...}`` list items) of ``obj``."""
    node: Any = obj
    for key in path:
        if key.startswith("f:") and isinstance(node, Mapping):
            node = node.get(key[2:])
        elif key.startswith("k:") and isinstance(node, list):
            want = json.loads(key[2:])
            node = next((i for i in node if all(i.get(k) == v for k, v in want.items())), None)
        else:
            return None
        if node is None:
            return None
    return node


def _owns(fields: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = fields
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX: dict[str | None, Decimal] = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    **{s: Decimal(10) ** (3 * i) for i, s in enumerate(("k", "M", "G", "T", "P", "E"), 1)},
    **{s: Decimal(2) ** (10 * i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def _quantity(value: Any) -> Any:
    """A resource quantity as a number (the API server rewrites ``0.5`` as ``500m``, ``1`` as ``"1"``)."""
    m = _QUANTITY.match(str(value))
    if m is None:
        return value
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        return value


def _normal(field: str, value: Any) -> Any:
    if field.endswith(".resources") and isinstance(value, Mapping):
        return {k: {r: _quantity(q) for r, q in (v or {}).items()} for k, v in value.items() if v}
    if field == "spec.ports" and isinstance(value, list):  # the API server fills in nodePort-free defaults
        return [{k: p.get(k) for k in ("name", "port", "targetPort", "protocol")} for p in value]
    return value if value not in ([], {}) else None


def _foreign_managers(live: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        e
        for e in live.get("metadata", {}).get("managedFields") or ()
        if str(e.get("manager", "")) not in (FIELD_MANAGER, *CONTROLLERS)
    ]


def touched_by_others(kind: str, live: Mapping[str, Any]) -> bool:
    """Whether a manager other than kvpilot (and the controllers) owns a field kvpilot manages: the cheap
    test before building what kvpilot would apply (most events are kvpilot's own or the controller's)."""
    paths = [path for _, path in MANAGED_FIELDS.get(kind, ())]
    return any(_owns(e.get("fieldsV1") or {}, p) for e in _foreign_managers(live) for p in paths)


def compute_drift(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[Drift]:
    """The fields kvpilot manages that someone else last wrote, to a value other than kvpilot's."""
    managed = MANAGED_FIELDS.get(str(wanted.get("kind")), ())
    found: list[Drift] = []
    for field, path in managed:
        have, want = _value(live, path), _value(wanted, path)
        if _normal(field, have) == _normal(field, want):
            continue
        for entry in _foreign_managers(live):
            if _owns(entry.get("fieldsV1") or {}, path):
                found.append(Drift(field, str(entry.get("manager")), have, want))
                break
    return found


def build_repair(
    owner: Mapping[str, Any],
    inputs: resolve.Inputs,
    spec: api.InferenceServiceSpec,
    plan_fn: modes.PlanFn | None = None,
) -> list[dict[str, Any]]:
    """The manifests the reconciler would apply for ``owner``'s observed generation, keeping the closed
    loop's settings (``status.applied``)."""
    keep = plan_choice.read_applied(owner["status"], spec)  # vLLM's settings, or SGLang's or TGI's flags
    built = desired.build_desired(owner["metadata"], spec, inputs, deploy_override=keep, plan_fn=plan_fn)
    return built.manifests


def repairable(owner: Mapping[str, Any] | None) -> bool:
    """Whether kvpilot may put ``owner``'s children back: it exists, is not being deleted, and the
    reconciler's last verdict was "applied" for its current generation."""
    if owner is None or owner.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = owner.get("status") or {}
    return (
        (bool(status.get("applied")) or _plans_itself(owner))
        and status.get("observedGeneration") == owner["metadata"].get("generation")
        and status_patch.reconcile_succeeded(status)
    )


def _plans_itself(owner: Mapping[str, Any]) -> bool:
    """Whether ``owner`` runs another engine than vLLM (``spec.engine.kind``), whose reconcile records no
    ``status.applied``: its verdict alone says the children were applied."""
    try:
        engine = api.Engine.model_validate((owner.get("spec") or {}).get("engine") or {})
    except ValueError:
        return False
    return engine.kind != "vLLM"


async def apply_repair(
    kind: str,
    event_type: str | None,
    body: Mapping[str, Any],
    *,
    kube: Any,
    hub: resolve.HubDownload,
    emit: events.Emitter,
    logger: Any,
    read_owner: Callable[[str, str], Mapping[str, Any] | None],
    owners: ownership.VerifiedOwners,
    plan_fn: modes.PlanFn | None = None,
) -> list[str]:
    """Repair one owned object after a watch event; the fields (or ``"deleted"``) it put back. ``owners``: the
    operator's memory of its objects, which forgets a deleted one."""
    meta = body.get("metadata") or {}
    name, namespace = meta.get("labels", {}).get(OWNER_LABEL), meta.get("namespace") or "default"
    if not name or (event_type != "DELETED" and not touched_by_others(kind, body)):
        return []
    if event_type == "DELETED":  # the next apply reads the name again: someone else may have taken it
        owners.forget(kind, namespace, str(meta.get("name")))
    owner = read_owner(namespace, name)
    if owner is None or not repairable(owner):
        return []
    if event_type != "DELETED" and not ownership.is_controlled_by(body, owner):
        return []  # kvpilot's labels on another's object: never "repaired" (it is not kvpilot's)
    spec = desired.parse_spec(owner["spec"])
    inputs = await resolve.fetch_inputs(spec, namespace, kube, hub)
    manifests = build_repair(owner, inputs, spec, plan_fn)
    if event_type == "DELETED":
        if any((m["kind"], m["metadata"]["name"]) == (kind, meta.get("name")) for m in manifests):
            await workloads.apply_workloads(manifests, kube, owners)
            emit(
                owner,
                events.WARNING,
                "DriftDetected",
                f"{kind} {meta.get('name')} was deleted; kvpilot owns it: recreated",
            )
            logger.warning(f"drift: {kind} {namespace}/{meta.get('name')} deleted; recreated")
            return ["deleted"]
        return []
    key = (kind, meta.get("name"))
    wanted = next((m for m in manifests if (m["kind"], m["metadata"]["name"]) == key), None)
    if wanted is None:
        return []
    drifts = compute_drift(body, wanted)
    if not drifts:
        return []
    await workloads.apply_workloads(manifests, kube, owners)
    message = f"{kind} {meta.get('name')}: " + "; ".join(d.describe() for d in drifts) + " (re-applied)"
    emit(owner, events.WARNING, "DriftDetected", message)
    logger.warning(f"drift: {message}")
    return [d.field for d in drifts]
