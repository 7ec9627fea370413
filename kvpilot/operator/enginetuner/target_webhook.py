"""The EngineTuner's actuator: a mutating admission webhook that puts the recommendation on new pods.

The operator serves it (kopf's admission support, :func:`build_server`) when ``KVPILOT_WEBHOOK_PORT`` is
set. The chart renders the ``MutatingWebhookConfiguration`` (``failurePolicy: Ignore``, a short timeout, an
``objectSelector`` leaving out pods labelled ``kvpilot.io/exclude=true``), its Service and the TLS certificate
(charts/kvpilot/templates/enginetuner-mutatingwebhook.yaml, docs/enginetuner.md); with ``Ignore``, pods are
created untouched when kvpilot is down.

For a pod being created, :func:`compute_pod_patch` finds the target that owns it (its owner chain: a
ReplicaSet named ``<deployment>-<pod-template-hash>``, a StatefulSet, or a LeaderWorkerSet's StatefulSets,
whose leader and worker pods both get the settings: every rank of a group runs the same engine), the
EngineTuner of that target in mode Initial or Auto (from the :func:`index_tuner` kopf index, built from the
EngineTuners' status, so it survives restarts), and rewrites the tuned flags of the engine's container and
nothing else: vLLM's (:func:`kvpilot.tuner.vllm.command.rewrite_tuned_flags`), SGLang's or TGI's
(``status.recommendation.engineArgs``, by the engine's own rewrite:
:func:`kvpilot.operator.enginetuner.target_engines.rewrite_container`; for TGI also the environment
variables of the flags it sets). Pure apart from :func:`build_server`, which reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.enginetuner import target, target_engines
from kvpilot.operator.enginetuner.target import Recommended
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import leader_worker_set
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import flags, vllm
from kvpilot.tuner.vllm import command as vllm_command

PORT_ENV = "KVPILOT_WEBHOOK_PORT"
"""The port the webhook listens on; unset: no webhook (modes Initial and Auto then change no pod)."""
CERT_DIR_ENV = "KVPILOT_WEBHOOK_CERT_DIR"
"""The directory of ``tls.crt`` and ``tls.key`` (a kubernetes.io/tls Secret's keys; the chart mounts it)."""
ADDR_ENV = "KVPILOT_WEBHOOK_ADDR"
"""The address to listen on (default: every address)."""
ACTUATING_MODES = frozenset({"Initial", "Auto"})


@dataclass(frozen=True, slots=True)
class Actuation:
    """What the webhook puts on a target's new pods: from one EngineTuner's status."""

    tuner: str
    container: str
    settings: Recommended
    """vLLM's settings, or another engine's flags (:class:`~.target_engines.EngineArgs`)."""


def index_tuner(
    namespace: str | None,
    name: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> dict[tuple[str, str, str], Actuation] | None:
    """The kopf index entry of an EngineTuner: ``(namespace, kind, target name) -> Actuation``, only in
    modes Initial and Auto and only while its status holds a recommendation for its current generation (vLLM's
    ``settings``; SGLang's or TGI's ``engineArgs``, the engine ``status.discovered.engine``)."""
    ref = spec.get("targetRef") or {}
    recommendation = (status or {}).get("recommendation") or {}
    rec, args = recommendation.get("settings"), recommendation.get("engineArgs")
    discovered = (status or {}).get("discovered") or {}
    container, engine = discovered.get("container"), discovered.get("engine")
    other = engine in ("SGLang", "TGI")
    if spec.get("updateMode") not in ACTUATING_MODES or not (args if other else rec) or not container:
        return None
    ready = conditions.find_condition((status or {}).get("conditions"), conditions.READY) or {}
    if (status or {}).get("observedGeneration") != meta.get("generation") or ready.get("status") != "True":
        return None
    settings: Recommended
    try:
        if engine == "SGLang" or engine == "TGI":
            settings = EngineArgs(engine, tuple(str(a) for a in args or ()))
            settings.settings()  # they parse
        else:
            settings = api.Settings.model_validate(rec).to_engine()
    except (ValueError, tuner_errors.TunerError):
        return None
    key = (namespace or "default", str(ref.get("kind")), str(ref.get("name")))
    return {key: Actuation(name, str(container), settings)}


def compute_target_keys(pod: Mapping[str, Any], namespace: str) -> list[tuple[str, str, str]]:
    """The ``(namespace, kind, name)`` of the workloads that may own the pod, from its controller (a
    LeaderWorkerSet's pod: the set its label names, when one of the set's StatefulSets controls it)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    template_hash = labels.get("pod-template-hash")
    group = str(labels.get(leader_worker_set.NAME_LABEL) or "")
    keys = []
    if group and target.pod_belongs(pod, leader_worker_set.KIND, group):
        keys.append((namespace, leader_worker_set.KIND, group))
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller"):
            continue
        name = str(ref.get("name") or "")
        if ref.get("kind") == "StatefulSet":
            keys.append((namespace, "StatefulSet", name))
        elif ref.get("kind") == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
            keys.append((namespace, "Deployment", name[: -len(template_hash) - 1]))
    return keys


def compute_pod_patch(
    pod: Mapping[str, Any], namespace: str, lookup: Mapping[tuple[str, str, str], Iterable[Actuation]]
) -> tuple[list[dict[str, Any]], Actuation] | None:
    """The pod's ``spec.containers`` with the recommendation on its vLLM container, and the actuation
    used; ``None`` when the pod is not a tuned target's, is excluded, or already runs the settings."""
    if target.is_excluded(pod):
        return None
    for key in compute_target_keys(pod, namespace):
        if key not in lookup:
            continue
        for actuation in lookup[key]:
            changed = _rewrite(pod, actuation)
            if changed is not None:
                return changed, actuation
    return None


def _rewrite(pod: Mapping[str, Any], actuation: Actuation) -> list[dict[str, Any]] | None:
    containers = [dict(c) for c in (pod.get("spec") or {}).get("containers") or ()]
    for i, c in enumerate(containers):
        if c.get("name") != actuation.container:
            continue
        if isinstance(actuation.settings, EngineArgs):
            rewritten = target_engines.rewrite_container(c, actuation.settings)
            if rewritten is None:
                return None
            containers[i] = rewritten
            return containers
        command, args = list(c.get("command") or ()), list(c.get("args") or ())
        found = vllm_command.find_vllm_command(command, args)
        if found is None:
            return None
        try:
            new_command, new_args = vllm_command.rewrite_tuned_flags(command, args, found, actuation.settings)
        except tuner_errors.InvalidEngineArgs:
            return None
        if (new_command, new_args) == (command, args):
            return None
        if new_command or "command" in c:
            c["command"] = new_command
        if new_args or "args" in c:
            c["args"] = new_args
        return containers
    return None


def compute_refusal(workload: Mapping[str, Any], container: str, recommended: Recommended) -> str | None:
    """Why the webhook cannot put ``recommended`` on the target's new pods, naming the container and what
    to change; ``None`` when it can (or the templates run it already). Each pod template whose ``container``
    runs the recommendation's engine is rewritten as a new pod of it would be (:func:`_rewrite`, the
    webhook's own) and must then carry the recommendation (:func:`.target.pod_carries`): a shell script that
    does not pass ``"$@"`` is left alone by SGLang's and TGI's rewrite, and ignores the flags vLLM's rewrite
    appends to its ``args``, so evicting its pods would replace them with the same settings, again and
    again."""
    actuation = Actuation("", container, recommended)
    for template in target.pod_templates(workload):
        pod = {"spec": template}
        if not target.runs_engine(pod, container, recommended) or target.pod_carries(
            pod, container, recommended
        ):
            continue  # a group's Ray worker; or new pods run the recommendation already
        rewritten = _rewrite(pod, actuation)
        if rewritten is not None and target.pod_carries(
            {"spec": {"containers": rewritten}}, container, recommended
        ):
            continue
        return _why_not(template, container, recommended)
    return None


def _why_not(template: Mapping[str, Any], container: str, recommended: Recommended) -> str:
    engine = recommended.kind if isinstance(recommended, EngineArgs) else "vLLM"
    c: Mapping[str, Any] = next(
        (c for c in template.get("containers") or () if c.get("name") == container), {}
    )
    script = flags.read_shell_script(
        [str(w) for w in c.get("command") or ()], [str(a) for a in c.get("args") or ()]
    )
    exec_form = (
        f"run {engine} in exec form (its executable in command, its flags in command or args), or end the "
        f'script\'s {engine} command line with "$@"'
    )
    if script is not None and not script.passes:
        return (
            f'container {container} runs {engine} from a shell script that does not pass "$@": the flags the '
            f"webhook puts in its args would not reach {engine}, so its pods cannot run the recommendation; "
            f"{exec_form}"
        )
    return (
        f"the webhook's rewrite of container {container}'s command line does not give {engine} the "
        f"recommendation, so its pods cannot run it; {exec_form}"
    )


def describe(actuation: Actuation) -> str:
    """The pod annotation's value: which EngineTuner, and the settings."""
    settings = actuation.settings
    if isinstance(settings, EngineArgs):
        return f"{actuation.tuner}: {settings.kind} {' '.join(settings.args)}"
    return f"{actuation.tuner}: {vllm.describe_settings(settings)}"


def enabled() -> bool:
    return bool(os.environ.get(PORT_ENV))


def build_server() -> Any:
    """The kopf webhook server from the environment (TLS from ``KVPILOT_WEBHOOK_CERT_DIR``, reloaded in place
    when the files change: :mod:`kvpilot.operator.enginetuner.webhook_tls`)."""
    import kopf

    from kvpilot.operator.enginetuner.webhook_tls import ReloadingWebhookServer

    cert_dir = os.environ.get(CERT_DIR_ENV)
    if not cert_dir:
        raise kopf.PermanentError(
            f"{PORT_ENV} is set but {CERT_DIR_ENV} is not: the webhook needs tls.crt and tls.key (the chart "
            "mounts them)"
        )
    return ReloadingWebhookServer(
        addr=os.environ.get(ADDR_ENV) or None,
        port=int(os.environ[PORT_ENV]),
        certfile=os.path.join(cert_dir, "tls.crt"),
        pkeyfile=os.path.join(cert_dir, "tls.key"),
    )
