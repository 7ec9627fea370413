"""``spec.template`` and ``spec.podSecurity``: the pod a team shapes, merged into the pod kvpilot renders.

:func:`build_pod_template` takes the Deployment's pod template as :mod:`kvpilot.operator.pods.workloads`
renders
it and returns it with the user's fragment merged in and, for ``podSecurity: Restricted``, made to pass
the ``restricted`` Pod Security Standard. :func:`compute_template_problems` names every field of a template
that contradicts what kvpilot owns (the CRD's CEL rules refuse most of them first; these are their
equivalents for ``kvpilot render`` and the unit tests, plus the checks CEL cannot express). Pure.

What kvpilot owns, and so wins: its labels (the Deployment's selector), the vLLM container's image, command,
args (the tuned flags), env, ports, probes and resources (the GPUs), the ``dshm`` and weight-cache volumes,
the weight-download init container. What merges:

* labels and annotations: added (kvpilot's own keys win: the Prometheus scrape annotations too);
* ``affinity``: the template's; with kvpilot's GPU-product node affinity (a product with several GFD names)
  both must hold: kvpilot's expression is added to each of the template's required node selector terms;
* the pod ``securityContext``: the template's; under Restricted over the image user's (UID 2000);
* ``volumes``, ``initContainers`` (before kvpilot's download), ``containers`` (sidecars, after vLLM): added;
* a ``containers`` entry named ``vllm`` patches the vLLM container: ``securityContext`` over kvpilot's
  hardening, ``volumeMounts`` and ``envFrom`` added;
* the scalars (priorityClassName, runtimeClassName, serviceAccountName, automountServiceAccountToken,
  schedulerName, dnsPolicy, hostIPC, imagePullSecrets): set. ``automountServiceAccountToken`` is False unless
  the template sets it: vLLM never calls the API server, so its pods carry no token to steal.

Restricted (the image's ``vllm`` user, :data:`kvpilot.tuner.vllm.IMAGE_USER_UID`): ``runAsNonRoot``,
``runAsUser`` 2000, ``runAsGroup`` and ``fsGroup`` 0 (the image's group-0-writable convention, so a weight
cache claim is writable), RuntimeDefault seccomp; ``HOME`` (``/home/vllm``: the Hugging Face, vLLM, Triton
and Inductor caches) and ``/tmp`` on emptyDir volumes; every container (sidecars included, where the template
does not say) without privilege escalation and with every capability dropped.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.pods import storage
from kvpilot.tuner import vllm
from kvpilot.tuner.vllm import serving

VLLM_CONTAINER = serving.CONTAINER_NAME
SHM_VOLUME = "dshm"
VLLM_PATCH_FIELDS = ("name", "securityContext", "volumeMounts", "envFrom")
"""What a ``containers`` entry named ``vllm`` may set; the CRD's CEL rule lists the others it refuses."""
RESERVED_VOLUMES = (SHM_VOLUME, storage.VOLUME, "home", "tmp")
"""Volume names kvpilot renders (shared memory, the weight cache, Restricted's two)."""
RESERVED_INIT_CONTAINERS = (VLLM_CONTAINER, storage.INIT_CONTAINER)
"""Init container names kvpilot renders (the weight download)."""
HOME_MOUNT = vllm.IMAGE_USER_HOME
TMP_MOUNT = "/tmp"
CONTAINER_HARDENING: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Every container kvpilot renders has it (and, under Restricted, every sidecar the template does not
harden itself)."""
RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": vllm.IMAGE_USER_UID,
    "runAsGroup": vllm.IMAGE_USER_GID,
    "fsGroup": vllm.IMAGE_USER_GID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
_ALLOWED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
"""The one capability the restricted standard lets a container add."""


# --------------------------------------------------------------------------- problems


def compute_template_problems(spec: api.InferenceServiceSpec, owned_labels: Sequence[str]) -> list[str]:
    """Each field of ``spec.template`` (and of ``spec.podSecurity``) that contradicts what kvpilot owns or the
    restricted standard; empty when the template merges cleanly."""
    t = spec.template or api.PodTemplate()
    problems = [
        f"spec.template.metadata.labels[{key}]: the label is kvpilot's (the Deployment's selector)"
        for key in t.metadata.labels if key in owned_labels
    ]  # fmt: skip
    for c in t.spec.containers:
        if c.get("name") == VLLM_CONTAINER:
            problems += [
                f"spec.template.spec.containers[vllm].{f}: kvpilot owns the vLLM container's {f} (a vllm "
                f"entry "
                f"may set only {', '.join(VLLM_PATCH_FIELDS[1:])})"
                for f in c if f not in VLLM_PATCH_FIELDS
            ]  # fmt: skip
    problems += [f"spec.template.spec.volumes[{v.get('name')}]: the volume name is kvpilot's"
                 for v in t.spec.volumes if v.get("name") in RESERVED_VOLUMES]  # fmt: skip
    problems += [f"spec.template.spec.initContainers[{c.get('name')}]: the init container name is kvpilot's"
                 for c in t.spec.init_containers if c.get("name") in RESERVED_INIT_CONTAINERS]  # fmt: skip
    taken = {"/dev/shm", *((spec.model.storage.mount_path,) if spec.model.storage else ())}
    if spec.pod_security == "Restricted":
        taken |= {HOME_MOUNT, TMP_MOUNT}
    for m in _vllm_patch(t).get("volumeMounts") or ():
        if m.get("mountPath") in taken:
            problems.append(
                f"spec.template.spec.containers[vllm].volumeMounts[{m.get('name')}]: mountPath "
                f"{m.get('mountPath')} is kvpilot's"
            )
    if spec.pod_security == "Restricted":
        problems += _restricted_problems(spec, t)
    return problems


def _vllm_patch(t: api.PodTemplate) -> dict[str, Any]:
    return next((dict(c) for c in t.spec.containers if c.get("name") == VLLM_CONTAINER), {})


def _restricted_problems(spec: api.InferenceServiceSpec, t: api.PodTemplate) -> list[str]:
    why = "spec.podSecurity is Restricted"
    out = []
    if spec.model.storage is not None and spec.model.storage.host_path is not None:
        out.append(f"spec.model.storage.hostPath: {why}, which admits no hostPath volume")
    if t.spec.host_ipc:
        out.append(f"spec.template.spec.hostIPC: {why}, which forbids the host's IPC namespace")
    out += [f"spec.template.spec.volumes[{v.get('name')}].hostPath: {why}, which admits no hostPath volume"
            for v in t.spec.volumes if "hostPath" in v]  # fmt: skip
    pod = t.spec.security_context or {}
    if pod.get("runAsNonRoot") is False or pod.get("runAsUser") == 0:
        out.append(f"spec.template.spec.securityContext: {why}; the pods must run as non-root")
    if (pod.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append(f"spec.template.spec.securityContext.seccompProfile: {why}; Unconfined is refused")
    for kind, containers in (("containers", t.spec.containers), ("initContainers", t.spec.init_containers)):
        for c in containers:
            sc = c.get("securityContext") or {}
            where = f"spec.template.spec.{kind}[{c.get('name')}].securityContext"
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation"):
                out.append(f"{where}: {why}; no privileged container or privilege escalation")
            if sc.get("runAsNonRoot") is False or sc.get("runAsUser") == 0:
                out.append(f"{where}: {why}; the containers must run as non-root")
            added = set((sc.get("capabilities") or {}).get("add") or ()) - _ALLOWED_CAPABILITIES
            if added:
                out.append(f"{where}.capabilities.add: {why}; only NET_BIND_SERVICE may be added")
            if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
                out.append(f"{where}.seccompProfile: {why}; Unconfined is refused")
    return out


# --------------------------------------------------------------------------- merge


def build_pod_template(
    rendered: Mapping[str, Any], template: api.PodTemplate | None, pod_security: api.PodSecurity
) -> dict[str, Any]:
    """``rendered`` (a Deployment's ``spec.template``, kvpilot's) with ``template`` merged in and, for
    Restricted, hardened to the restricted standard. ``rendered`` is not modified."""
    out = copy.deepcopy(dict(rendered))
    out["spec"].setdefault("automountServiceAccountToken", False)  # vLLM needs no API token
    if template is not None:
        _merge(out, template)
    if pod_security == "Restricted":
        _restrict(out["spec"])
    return out


def _merge(out: dict[str, Any], template: api.PodTemplate) -> None:
    meta, spec, t = out.setdefault("metadata", {}), out["spec"], template.spec
    meta["labels"] = {**template.metadata.labels, **(meta.get("labels") or {})}
    if template.metadata.annotations:
        meta["annotations"] = {**template.metadata.annotations, **(meta.get("annotations") or {})}
    if t.affinity is not None:
        spec["affinity"] = build_affinity(spec.get("affinity"), t.affinity)
    scalars = {"priorityClassName": t.priority_class_name, "runtimeClassName": t.runtime_class_name,
               "serviceAccountName": t.service_account_name, "schedulerName": t.scheduler_name,
               "dnsPolicy": t.dns_policy, "hostIPC": t.host_ipc,
               "automountServiceAccountToken": t.automount_service_account_token}  # fmt: skip
    spec.update({k: v for k, v in scalars.items() if v is not None})
    for key, items in (("topologySpreadConstraints", t.topology_spread_constraints),
                       ("imagePullSecrets", t.image_pull_secrets), ("volumes", t.volumes)):  # fmt: skip
        if items:
            spec[key] = [*(spec.get(key) or ()), *copy.deepcopy(items)]
    if t.security_context:
        spec["securityContext"] = {**(spec.get("securityContext") or {}), **copy.deepcopy(t.security_context)}
    if t.init_containers:
        spec["initContainers"] = [*copy.deepcopy(t.init_containers), *(spec.get("initContainers") or ())]
    vllm_container = next(c for c in spec["containers"] if c["name"] == VLLM_CONTAINER)
    patch = _vllm_patch(template)
    if "securityContext" in patch:
        vllm_container["securityContext"] = {**vllm_container.get("securityContext", {}),
                                             **copy.deepcopy(patch["securityContext"])}  # fmt: skip
    for key in ("volumeMounts", "envFrom"):
        if patch.get(key):
            vllm_container[key] = [*(vllm_container.get(key) or ()), *copy.deepcopy(patch[key])]
    spec["containers"] += [copy.deepcopy(c) for c in t.containers if c.get("name") != VLLM_CONTAINER]


def build_affinity(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any]) -> dict[str, Any]:
    """The template's affinity, with kvpilot's required node affinity (the GPU product) kept: its match
    expressions are added to each of the template's required node selector terms (terms are ORed, the
    expressions in one term ANDed), so a pod lands on a node both allow."""
    out = copy.deepcopy(dict(theirs))
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    our_terms = ((ours or {}).get("nodeAffinity") or {}).get(key, {}).get("nodeSelectorTerms") or []
    if not our_terms:
        return out
    ours_exprs = [e for term in our_terms for e in term.get("matchExpressions") or ()]
    node = out.setdefault("nodeAffinity", {})
    their_terms = (node.get(key) or {}).get("nodeSelectorTerms") or [{}]
    node[key] = {"nodeSelectorTerms": [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or ()), *copy.deepcopy(ours_exprs)]}
        for term in their_terms
    ]}  # fmt: skip
    return out


def _restrict(spec: dict[str, Any]) -> None:
    spec["securityContext"] = {**RESTRICTED_POD_SECURITY, **(spec.get("securityContext") or {})}
    spec["volumes"] = [*(spec.get("volumes") or ()), {"name": "home", "emptyDir": {}},
                       {"name": "tmp", "emptyDir": {}}]  # fmt: skip
    ours = {VLLM_CONTAINER, *RESERVED_INIT_CONTAINERS}
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or ():
            sc = c.setdefault("securityContext", {})
            for key, value in CONTAINER_HARDENING.items():
                sc.setdefault(key, copy.deepcopy(value))
            sc["capabilities"].setdefault("drop", ["ALL"])
            if c["name"] in ours:
                c["volumeMounts"] = [*(c.get("volumeMounts") or ()),
                                     {"name": "home", "mountPath": HOME_MOUNT},
                                     {"name": "tmp", "mountPath": TMP_MOUNT}]  # fmt: skip
                c["env"] = [*(e for e in c.get("env") or () if e["name"] != "HOME"),
                            {"name": "HOME", "value": HOME_MOUNT}]  # fmt: skip
