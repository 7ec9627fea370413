"""The operator's tenant guard: the admission policy's checks, enforced by kvpilot when no policy runs.

The chart's ValidatingAdmissionPolicies (``charts/kvpilot/templates/inferenceservice-admissionpolicy.yaml``,
``enginetuner-admissionpolicy.yaml``) keep a requester who may not create pods from escalating through an
InferenceService or an EngineTuner. With ``admissionPolicy.enabled=false``, or before Kubernetes 1.30, none
runs; then ``admissionPolicy.operatorEnforcement`` (:mod:`.tenant_settings`) has the operator refuse such a
spec itself: Ready=False, reason ``Forbidden``, a Warning event, nothing applied.

No admission ran, so the operator does not know who wrote the spec: it makes, on every object, each check of
the policy that needs no identity (with the policy's wording where it can), and refuses what needs one:

* images outside the allow-list (spec.engine.image, template containers and image volumes), command, args and
  exec probes of template containers;
* the node: spec.model.storage.hostPath; hostIPC, hostPath/csi/nfs volumes, hostPort, privileged, privilege
  escalation, capabilities beyond NET_BIND_SERVICE, procMount, seLinuxOptions, Unconfined profiles, sysctls,
  Windows host processes;
* identity: a ServiceAccount outside the list, projected ServiceAccount tokens and pod certificates;
* scheduling (priority, runtime class, scheduler, tolerations) and pod annotations outside the lists;
* code-loading engine flags, keys of JSON flags and environment (:mod:`kvpilot.tuner.vllm.code_loading`),
  and an ``envFrom`` without a prefix that keeps its keys off the code-loading names (its Secret's or
  ConfigMap's keys are not read here);
* a claimTemplate outside ``admissionPolicy.claimTemplate``;
* in ``Strict`` (not ``TrustNamespace``): every Secret, ConfigMap and claim ``spec.template`` names (whether
  its requester may read it is her identity's question), and an EngineTuner's updateMode Initial or Auto
  (whether she may update its target is too).

Not refused in any mode: spec.model's hubTokenSecretRef, configMapRef and persistentVolumeClaim and
spec.engine.env's valueFrom (docs/operator.md, "Operator enforcement", says what that leaves open).
:func:`compute_violations` and :func:`compute_tuner_violations` are pure: the typed spec and the settings in,
the problems out. ``tests/operator/test_tenant_guard.py`` runs them over e2e/test_tenants.py's hostile cases.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.pods import storage
from kvpilot.operator.pods.tenant_settings import TenantSettings, current
from kvpilot.tuner import vllm

T = "spec.template.spec"
_VLLM = f"{T}.containers[vllm]"
_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t")
_KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "persistentvolumeclaims": "PersistentVolumeClaim"}


def describe_enforcer(settings: TenantSettings) -> str:
    """Who refuses, in place of the policy's ``<user> may not create pods in namespace <ns>``."""
    return (
        f"kvpilot enforces the tenant policy itself (admissionPolicy.operatorEnforcement={settings.mode}: no"
        " admission policy runs) and cannot tell whether the requester may create pods"
    )


def compute_current_violations(spec: api.InferenceServiceSpec) -> list[str]:
    """:func:`compute_violations` with the settings the operator read at start-up."""
    return compute_violations(spec, current())


def compute_violations(spec: api.InferenceServiceSpec, settings: TenantSettings) -> list[str]:
    """Each way ``spec`` escalates past ``settings`` (empty when it does not, or the mode is ``Off``)."""
    if not settings.enforced:
        return []
    who = describe_enforcer(settings)
    t = spec.template or api.PodTemplate()
    pod = t.spec
    containers = _containers(pod)
    added = [(p, c) for p, c in containers if p != _VLLM]
    out: list[str] = []
    images = settings.images
    if not _matches(spec.engine.image, images):
        out.append(
            f"spec.engine.image {spec.engine.image} is not an allowed image ({', '.join(images)}): {who},"
            " so an"
            " InferenceService may only run an allowed image"
        )
    denied = [
        f"{p}.image {c['image']}"
        for p, c in added
        if c.get("image") and not _matches(str(c["image"]), images)
    ] + [
        f"{T}.volumes[{v.get('name')}].image {ref}"
        for v in pod.volumes
        if (ref := (v.get("image") or {}).get("reference")) and not _matches(ref, images)
    ]
    if denied:
        out.append(
            f"{', '.join(denied)} not an allowed image ({', '.join(images)}): {who}, so the pod template"
            " may only"
            " add containers and image volumes of an allowed image"
        )
    commands = [f"{p}.{f}" for f in ("command", "args") for p, c in added if f in c] + [
        f"{p}.{probe}.exec"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
        for p, c in containers
        if "exec" in (c.get(probe) or {})
    ]
    if commands:
        out.append(
            f"{', '.join(commands)}: {who}, so a template container runs only its allowed image's own"
            " entrypoint"
            " (no command, args or exec probes)"
        )
    if settings.mode == "Strict":
        out += _reference_problems(pod, containers, who)
    if spec.model.storage is not None and spec.model.storage.host_path is not None:
        out.append(
            f"spec.model.storage.hostPath mounts a directory of the node: {who}, so an InferenceService"
            " may not"
            " use hostPath storage"
        )
    host = list(_host_fields(pod, containers))
    if host:
        out.append(
            f"{', '.join(host)}: {who}, so the pod template may not reach the node (host namespaces, ports"
            " and"
            " volumes, csi or nfs volumes, privilege, unconfined profiles, sysctls)"
        )
    identity = list(_identity(pod, settings))
    if identity:
        out.append(
            f"{', '.join(identity)}: {who}, so the pods run as an allowed ServiceAccount and may not mount"
            " ServiceAccount tokens or pod certificates for other audiences"
        )
    scheduling = list(_scheduling(pod, settings))
    if scheduling:
        out.append(
            f"{', '.join(scheduling)}: {who}, so the pods may only use the priority, runtime and scheduler"
            " the"
            " chart allows"
        )
    annotations = [k for k in t.metadata.annotations if not _matches(k, settings.allowed_pod_annotations)]
    if annotations:
        allowed = ", ".join(settings.allowed_pod_annotations) or "none"
        out.append(
            f"spec.template.metadata.annotations {', '.join(annotations)} not allowed ({allowed}): {who}, and"
            " annotations drive injectors (sidecars, secrets, profiles)"
        )
    flags = vllm.compute_code_loading_flags(spec.engine.extra_args, settings.allowed_engine_args)
    if flags:
        out.append(
            f"spec.engine.extraArgs {', '.join(flags)} would load code or files the spec chooses"
            f" ({', '.join(vllm.CODE_LOADING_FLAGS)}, or a unique prefix of one): {who}, so vLLM may only run"
            " the image's own code"
        )
    keys = vllm.compute_code_loading_keys(spec.engine.extra_args, settings.allowed_engine_args)
    if keys:
        out.append(
            f"spec.engine.extraArgs {', '.join(keys)}: a JSON flag's key that would load code the spec"
            f" chooses ({', '.join(vllm.ANY_FLAG_CODE_KEYS)} in any, and {_describe_keys()}): {who}, so vLLM"
            " may only run the image's own code"
        )
    unprefixed = [
        f"{p}.envFrom"
        for p, c in containers
        if any(not vllm.is_code_safe_env_prefix(str(e.get("prefix") or "")) for e in c.get("envFrom") or ())
    ]
    if unprefixed:
        out.append(
            f"{', '.join(unprefixed)} without a prefix: {who}, and the keys of a Secret or ConfigMap are not"
            " seen here (LD_PRELOAD or PYTHONPATH among them would load code), so an envFrom needs a prefix"
            " that no code-loading name starts with (e.g. APP_)"
        )
    env = [("spec.engine.env", e.name) for e in spec.engine.env] + [
        (f"{p}.env", str(e.get("name"))) for p, c in containers for e in c.get("env") or ()
    ]
    env_denied = [
        f"{f} {n}" for f, n in env if n not in settings.allowed_engine_env and vllm.is_code_loading_env(n)
    ]
    if env_denied:
        out.append(
            f"{', '.join(env_denied)} would load code into the pod (LD_*, PYTHON*,"
            f" {', '.join(vllm.CODE_LOADING_ENV)}): {who}, so such variables are refused"
        )
    claim = _claim_problems(spec, settings)
    if claim:
        out.append(
            f"spec.model.storage.claimTemplate {', '.join(claim)}: {who} or claims, so kvpilot creates only"
            " claims within the chart's bounds"
        )
    tolerations = [_describe_toleration(x) for x in spec.engine.tolerations if not _tolerated(x, settings)]
    if tolerations:
        out.append(
            f"spec.engine.tolerations {', '.join(tolerations)} not covered by the allowed tolerations:"
            f" {who}, so"
            " an InferenceService may only tolerate the taints the chart allows"
        )
    return out


def compute_tuner_violations(spec: api.EngineTunerSpec, settings: TenantSettings) -> list[str]:
    """Each way an EngineTuner's ``spec`` escalates past ``settings`` (empty in mode ``Off``)."""
    if not settings.enforced:
        return []
    who = describe_enforcer(settings)
    out = []
    if spec.update_mode in ("Initial", "Auto") and settings.mode == "Strict":
        out.append(
            f"updateMode {spec.update_mode} rewrites {spec.target_ref.kind} {spec.target_ref.name}'s pods'"
            " engine"
            f" arguments with kvpilot's rights: {who} or update it, so only Off and Recommend are allowed (an"
            " administrator may allow them: admissionPolicy.operatorEnforcement=TrustNamespace)"
        )
    m = spec.model
    if m is not None and m.storage is not None and m.storage.host_path is not None:
        out.append(f"spec.model.storage: {who}, so an EngineTuner may name no hostPath")
    return out


# --------------------------------------------------------------------------- the parts


def _describe_keys() -> str:
    return "; ".join(f"{', '.join(keys)} in {flag}" for flag, keys in vllm.CODE_LOADING_KEYS.items())


def _containers(pod: api.PodTemplateSpec) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{T}.containers[{c.get('name')}]", c) for c in pod.containers] + [
        (f"{T}.initContainers[{c.get('name')}]", c) for c in pod.init_containers
    ]


def _matches(value: str, patterns: Iterable[str]) -> bool:
    """``value`` is one of ``patterns``, or starts with one ending in ``*``."""
    return any(value.startswith(p[:-1]) if p.endswith("*") else value == p for p in patterns)


def _references(
    pod: api.PodTemplateSpec, containers: list[tuple[str, dict[str, Any]]]
) -> Iterator[tuple[str, str, str]]:
    """Every (resource, name, field) of a Secret, ConfigMap or claim the template names, in the policy's
    order."""
    for p, c in containers:
        for e in c.get("env") or ():
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                yield "secrets", str(ref.get("name", "")), f"{p}.env[{e.get('name')}].valueFrom.secretKeyRef"
    for p, c in containers:
        for e in c.get("env") or ():
            ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                yield (
                    "configmaps",
                    str(ref.get("name", "")),
                    f"{p}.env[{e.get('name')}].valueFrom.configMapKeyRef",
                )
    for key, kind in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
        for p, c in containers:
            for s in c.get("envFrom") or ():
                if key in s:
                    yield kind, str((s[key] or {}).get("name", "")), f"{p}.envFrom.{key}"
    for key, kind, name_key in (
        ("secret", "secrets", "secretName"),
        ("configMap", "configmaps", "name"),
        ("persistentVolumeClaim", "persistentvolumeclaims", "claimName"),
    ):
        for v in pod.volumes:
            if key in v:
                yield kind, str((v[key] or {}).get(name_key, "")), f"{T}.volumes[{v.get('name')}].{key}"
    for key, kind in (("secret", "secrets"), ("configMap", "configmaps")):
        for v in pod.volumes:
            for s in (v.get("projected") or {}).get("sources") or ():
                if key in s:
                    path = f"{T}.volumes[{v.get('name')}].projected.sources.{key}"
                    yield kind, str((s[key] or {}).get("name", "")), path
    for r in pod.image_pull_secrets:
        yield "secrets", str(r.get("name", "")), f"{T}.imagePullSecrets"


def _reference_problems(
    pod: api.PodTemplateSpec, containers: list[tuple[str, dict[str, Any]]], who: str
) -> list[str]:
    fields: dict[tuple[str, str], list[str]] = {}
    for kind, name, field in _references(pod, containers):
        fields.setdefault((kind, name), []).append(field)
    return [
        f"{', '.join(paths)} names {_KINDS[kind]} {name}, which kvpilot cannot check its requester may get:"
        f" {who},"
        " so the pod template may name no Secret, ConfigMap or claim (an administrator may allow them:"
        " admissionPolicy.operatorEnforcement=TrustNamespace)"
        for (kind, name), paths in fields.items()
    ]


def _host_fields(pod: api.PodTemplateSpec, containers: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    if pod.host_ipc:
        yield f"{T}.hostIPC"
    for v in pod.volumes:
        kind = next((k for k in ("hostPath", "csi", "nfs") if k in v), None)
        if kind:
            yield f"{T}.volumes[{v.get('name')}].{kind}"
    for p, c in containers:
        if any(port.get("hostPort") for port in c.get("ports") or ()):
            yield f"{p}.ports.hostPort"
    for p, c in containers:
        sc = c.get("securityContext")
        if sc:
            yield from _security_context(f"{p}.securityContext", sc, container=True)
    yield from _security_context(f"{T}.securityContext", pod.security_context or {}, container=False)


def _security_context(where: str, sc: dict[str, Any], *, container: bool) -> Iterator[str]:
    if container:
        if sc.get("privileged"):
            yield f"{where}.privileged"
        if sc.get("allowPrivilegeEscalation"):
            yield f"{where}.allowPrivilegeEscalation"
        if any(cap != "NET_BIND_SERVICE" for cap in (sc.get("capabilities") or {}).get("add") or ()):
            yield f"{where}.capabilities.add"
        if sc.get("procMount", "Default") != "Default":
            yield f"{where}.procMount"
    se = sc.get("seLinuxOptions")
    if se is not None and ("user" in se or "role" in se or se.get("type", "") not in _SELINUX_TYPES):
        yield f"{where}.seLinuxOptions"
    for profile in ("seccompProfile", "appArmorProfile"):
        if (sc.get(profile) or {}).get("type") == "Unconfined":
            yield f"{where}.{profile} Unconfined"
    if not container and sc.get("sysctls"):
        yield f"{where}.sysctls"
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        yield f"{where}.windowsOptions.hostProcess"


def _identity(pod: api.PodTemplateSpec, settings: TenantSettings) -> Iterator[str]:
    account = pod.service_account_name
    if account and account != "default" and account not in settings.allowed_service_accounts:
        allowed = "".join(f", {a}" for a in settings.allowed_service_accounts)
        yield f"{T}.serviceAccountName {account} (allowed: default{allowed})"
    for kind in ("serviceAccountToken", "podCertificate"):
        for v in pod.volumes:
            for s in (v.get("projected") or {}).get("sources") or ():
                if kind in s:
                    yield f"{T}.volumes[{v.get('name')}].projected.sources.{kind}"


def _scheduling(pod: api.PodTemplateSpec, settings: TenantSettings) -> Iterator[str]:
    for field, value, allowed in (
        ("priorityClassName", pod.priority_class_name, settings.allowed_priority_classes),
        ("runtimeClassName", pod.runtime_class_name, settings.allowed_runtime_classes),
        ("schedulerName", pod.scheduler_name, ("default-scheduler", *settings.allowed_schedulers)),
    ):
        if value and value not in allowed:
            yield f"{T}.{field} {value} (allowed: {', '.join(allowed) or 'none'})"


def _claim_problems(spec: api.InferenceServiceSpec, settings: TenantSettings) -> list[str]:
    claim = spec.model.storage.claim_template if spec.model.storage is not None else None
    if claim is None:
        return []
    bounds = settings.claim_template
    out = []
    if claim.size is None:
        out.append("no size (required: the default follows the checkpoint)")
    elif bounds.max_bytes is not None and storage.parse_quantity_bytes(claim.size) > bounds.max_bytes:
        out.append(f"size {claim.size} above {bounds.max_size}")
    if claim.access_mode not in bounds.allowed_access_modes:
        out.append(f"accessMode {claim.access_mode} (allowed: {', '.join(bounds.allowed_access_modes)})")
    if (
        claim.storage_class_name is not None
        and claim.storage_class_name not in bounds.allowed_storage_classes
    ):
        classes = "".join(f", {c}" for c in bounds.allowed_storage_classes)
        out.append(f"storageClassName {claim.storage_class_name} (allowed: the default class{classes})")
    return out


def _tolerated(t: api.Toleration, settings: TenantSettings) -> bool:
    """An allowed toleration tolerates at least as much as ``t`` (the policy's rule)."""
    key, value, effect = t.key or "", t.value or "", t.effect or ""
    return any(
        (a.key == key or (a.key == "" and a.operator == "Exists"))
        and (a.operator == "Exists" or ((t.operator or "Equal") == "Equal" and a.value == value))
        and (a.effect == "" or a.effect == effect)
        for a in settings.allowed_tolerations
    )


def _describe_toleration(t: api.Toleration) -> str:
    key = t.key or "<every taint>"
    op = " Exists" if t.operator == "Exists" else f"={t.value or ''}"
    return f"{key}{op}{':' + t.effect if t.effect else ' (any effect)'}"
