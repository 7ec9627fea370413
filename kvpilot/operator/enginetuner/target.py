"""Target mode (an EngineTuner): what a workload someone else owns runs, and what kvpilot would run instead.

Pure: the workload (a Deployment, StatefulSet or LeaderWorkerSet as JSON), its pods, their nodes' labels and
the ConfigMaps it mounts come in; a :class:`Discovery` and the plan's spec go out. The vLLM command-line facts
are :mod:`kvpilot.tuner.vllm.command`'s; the plan is the InferenceService's (:func:`build_plan_spec` makes the
equivalent ``InferenceServiceSpec`` and :mod:`kvpilot.operator.planning.modes` plans it), so both kinds plan
alike. A target that runs SGLang or TGI instead is :mod:`.target_engine_plan`'s (discovery and plan) and
:mod:`.target_engines`' (its container, flags and rewrite); the pod-level questions here (does a pod run the
recommendation, which pods are stale) take either engine's recommendation (:data:`Recommended`).

A LeaderWorkerSet's replica is a group of ``leaderWorkerTemplate.size`` pods, one per node, that serve one
engine: its vLLM command is read from the leader's template (the workers' when it has none), its GPUs are the
group's, its layout (tensor x pipeline parallel over the nodes) is the owner's and is planned as it is.

What cannot be found raises :class:`DiscoveryIncomplete` with what to set in the EngineTuner's spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from kvpilot.operator import api, conditions, errors
from kvpilot.operator.enginetuner import target_engines
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import capacity, leader_worker_set
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import gpus, vllm
from kvpilot.tuner.types import EngineSettings, GpuSpec
from kvpilot.tuner.vllm import command as vllm_command

EXCLUDE_LABEL = "kvpilot.io/exclude"
"""A pod with this label or annotation set to ``"true"`` is never rewritten by the webhook."""
TUNED_ANNOTATION = "kvpilot.io/tuned"
"""Put on a pod the webhook rewrote: the EngineTuner's name and the settings, for people."""
MODEL_ENV_FALLBACKS = ("MODEL_ID", "MODEL_DIR")
"""Environment a shell-form command takes its model from when its ``$VAR`` is set in the script itself
(KServe's vLLM runtime: ``MODEL=${MODEL_DIR:-$MODEL_ID}``)."""


class TargetNotFound(errors.OperatorError):
    reason = "TargetNotFound"
    condition = conditions.TARGET_FOUND
    retry = True
    delay_s = 30.0


class DiscoveryIncomplete(errors.OperatorError):
    reason = "DiscoveryIncomplete"
    condition = conditions.DISCOVERED
    retry = True
    delay_s = 60.0


class UnsupportedEngine(errors.OperatorError):
    """The target runs an engine kvpilot knows in a layout an EngineTuner does not tune (SGLang or TGI over
    a LeaderWorkerSet's nodes): said by name, with the way kvpilot does run it."""

    reason = "UnsupportedEngine"
    condition = conditions.DISCOVERED
    retry = True  # the owner may change the workload: look again, seldom
    delay_s = 300.0


Recommended = EngineSettings | EngineArgs
"""What a target's pods should run: vLLM's settings, or another engine's flags in its own spelling."""


@dataclass(frozen=True, slots=True)
class Discovery:
    container: str
    command: vllm_command.VllmCommand
    settings: EngineSettings
    model: api.ModelRef
    model_origin: str
    args_origin: str
    image: str
    gpu_count: int
    vllm_env: dict[str, str] = field(default_factory=dict)
    gpu_product: str | None = None
    """From ``spec.gpu.product`` or the pods' nodes; ``None``: not yet known (no pod on a labelled node)."""
    gpu_labels: Mapping[str, str] | None = None
    """The GFD labels of a node the pods run on, when the product came from them."""
    nodes: int = 1
    """Pods (nodes) of one replica: a LeaderWorkerSet's group size; ``gpu_count`` GPUs each."""
    config_args: tuple[str, ...] = ()
    """The flags of the ``--config`` file, as arguments (the command line's own override them)."""


def _group(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return (workload.get("spec") or {}).get("leaderWorkerTemplate")


def pod_template(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod spec that runs the API server: the template's, or a LeaderWorkerSet's leader template (its
    worker template when it has none, as LWS does)."""
    group = _group(workload)
    if group is not None:
        template = group.get("leaderTemplate") or group.get("workerTemplate") or {}
        return template.get("spec") or {}
    return ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}


def pod_templates(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every pod spec the workload creates pods from (a LeaderWorkerSet's leader and worker templates)."""
    group = _group(workload)
    if group is None:
        return [pod_template(workload)]
    templates = (group.get("leaderTemplate"), group.get("workerTemplate"))
    return [t.get("spec") or {} for t in templates if t]


def group_size(workload: Mapping[str, Any]) -> int:
    """Pods of one replica: a LeaderWorkerSet's ``leaderWorkerTemplate.size`` (default 1), else 1."""
    group = _group(workload)
    return int((group or {}).get("size") or 1)


def is_group_kind(kind: str) -> bool:
    """Whether a target of ``kind`` runs each replica as a group of pods over nodes (a LeaderWorkerSet)."""
    return kind == leader_worker_set.KIND


def refuse_a_groups_part(workload: Mapping[str, Any], kind: str, name: str) -> None:
    """Raise :class:`DiscoveryIncomplete` for a StatefulSet a LeaderWorkerSet made (LWS labels it with the
    set's name): tuning it alone would give the group's leaders, or one group's workers, settings that the
    rest of the group's ranks do not share."""
    if is_group_kind(kind):
        return
    labels = (workload.get("metadata") or {}).get("labels") or {}
    owner = labels.get(leader_worker_set.NAME_LABEL)
    if owner:
        raise DiscoveryIncomplete(
            f"{kind} {name} is part of LeaderWorkerSet {owner}, whose pods are one group's ranks and must "
            f"share their settings: target the LeaderWorkerSet (kind: LeaderWorkerSet, name: {owner})"
        )


def pod_selector(workload: Mapping[str, Any], kind: str, name: str) -> dict[str, str]:
    """The labels every pod of the workload carries: its selector, or LWS's set label."""
    if is_group_kind(kind):
        return {leader_worker_set.NAME_LABEL: name}
    sel = (workload.get("spec") or {}).get("selector") or {}
    return dict(sel.get("matchLabels") or {})


def find_vllm_container(
    pod_spec: Mapping[str, Any], name: str | None
) -> tuple[Mapping[str, Any], vllm_command.VllmCommand]:
    """The vLLM container (``spec.containerName``, or the one whose command runs vLLM) and its command."""
    containers = list(pod_spec.get("containers") or ())
    for c in containers:
        if name is not None and c.get("name") != name:
            continue
        found = vllm_command.find_vllm_command(c.get("command") or (), c.get("args") or ())
        if found is not None:
            return c, found
        if name is not None:
            raise DiscoveryIncomplete(
                f"container {name!r} runs no engine kvpilot reads: vLLM (vllm serve MODEL, python -m "
                f"{vllm_command.API_SERVER_MODULE}), SGLang (python -m sglang.launch_server, sglang serve) "
                "or TGI (text-generation-launcher, or TGI's image), or a shell script running one of them"
            )
    names = ", ".join(str(c.get("name")) for c in containers) or "none"
    if name is not None:
        raise DiscoveryIncomplete(f"the target's pods have no container {name!r} (containers: {names})")
    raise DiscoveryIncomplete(
        f"no container of the target runs vLLM, SGLang or TGI in a form kvpilot reads (containers: {names}); "
        "set spec.containerName, and give the container an exec-form command (vllm serve MODEL ..., python "
        "-m sglang.launch_server --model-path MODEL ..., text-generation-launcher --model-id MODEL ...)"
    )


def runs_vllm_container(pod_spec: Mapping[str, Any], name: str | None) -> bool:
    """Whether the container an EngineTuner would tune runs vLLM: ``name``'s, or any when ``None`` (a vLLM
    container is picked before another engine's)."""
    return any(
        (name is None or c.get("name") == name)
        and vllm_command.find_vllm_command(c.get("command") or (), c.get("args") or ()) is not None
        for c in pod_spec.get("containers") or ()
    )


def find_config_map_file(
    pod_spec: Mapping[str, Any], container: Mapping[str, Any], path: str
) -> tuple[str, str] | None:
    """``(ConfigMap name, key)`` of the file at ``path`` in the container, if a ConfigMap volume holds it."""
    volumes = {v.get("name"): v for v in pod_spec.get("volumes") or ()}
    for mount in container.get("volumeMounts") or ():
        root = str(mount.get("mountPath") or "").rstrip("/")
        cm = (volumes.get(mount.get("name")) or {}).get("configMap")
        if not cm or not root:
            continue
        if mount.get("subPath"):
            if path == root:
                return str(cm["name"]), _key_for(cm, str(mount["subPath"]))
            continue
        if path.startswith(root + "/"):
            return str(cm["name"]), _key_for(cm, path[len(root) + 1 :])
    return None


def _key_for(cm: Mapping[str, Any], file: str) -> str:
    for item in cm.get("items") or ():
        if item.get("path") == file:
            return str(item["key"])
    return file


def compute_vllm_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's ``VLLM_*`` variables with literal values (the last one of a name wins)."""
    env: dict[str, str] = {}
    for var in container.get("env") or ():
        name = str(var.get("name") or "")
        if name.startswith("VLLM_") and "value" in var and name != "VLLM_API_KEY":
            env[name] = str(var["value"])
    return env


def compute_model_ref(
    spec: api.EngineTunerSpec,
    model: str | None,
    revision: str | None,
    container: Mapping[str, Any],
    *,
    engine: str = "vLLM",
    origin: str = "the container's arguments",
) -> tuple[api.ModelRef, str]:
    """The model to plan for and where it was read: ``spec.model``, else the command's model argument
    ``model`` (a Hugging Face id, read from ``origin``), expanded from the container's environment when it is
    a shell ``$VAR``; ``revision``: the command's."""
    if spec.model is not None:
        return spec.model, "spec.model"
    env = target_engines.literal_env(container)
    if model is not None and model.startswith("$"):
        var = model.strip("${}\"'")
        model = env.get(var) or next((env[v] for v in MODEL_ENV_FALLBACKS if env.get(v)), None)
        origin = f"the container's environment (${var})"
    if model is None:
        raise DiscoveryIncomplete(
            f"the {engine} command names no model kvpilot can read; set spec.model.id (a Hugging Face id) "
            "or spec.model with source ConfigMap"
        )
    if model.startswith("/") or model.startswith("."):
        raise DiscoveryIncomplete(
            f"the model is the mounted path {model!r}, whose config.json kvpilot cannot read; set spec.model "
            "(id: its Hugging Face id, or source: ConfigMap with configMapRef to its config.json)"
        )
    try:
        ref = api.ModelRef(id=model, revision=revision, source="Catalogue")
    except ValueError:
        raise DiscoveryIncomplete(
            f"the model argument {model!r} is not a Hugging Face id; set spec.model"
        ) from None
    return ref, origin


def compute_gpu_product(
    spec: api.EngineTunerSpec, node_labels: Sequence[Mapping[str, str]]
) -> tuple[str | None, Mapping[str, str] | None]:
    """``spec.gpu.product``, else the GFD product of the nodes the pods run on (``None`` when no pod runs on
    a labelled node yet). Several products: DiscoveryIncomplete."""
    if spec.gpu.product:
        return spec.gpu.product, None
    labelled = [dict(n) for n in node_labels if n.get(gpus.PRODUCT_LABEL)]
    products = sorted({n[gpus.PRODUCT_LABEL] for n in labelled})
    if len(products) > 1:
        raise DiscoveryIncomplete(
            f"the target's pods run on nodes of several GPU products ({', '.join(products)}); one plan fits "
            "one GPU: set spec.gpu.product to the one to plan for"
        )
    return (products[0], labelled[0]) if products else (None, None)


def build_discovery(
    spec: api.EngineTunerSpec,
    workload: Mapping[str, Any],
    node_labels: Sequence[Mapping[str, str]],
    config_maps: Mapping[str, Mapping[str, str]],
) -> Discovery:
    """Everything read from the target; ``config_maps`` holds the data of the ConfigMaps it names."""
    refuse_a_groups_part(workload, spec.target_ref.kind, spec.target_ref.name)
    pod_spec = pod_template(workload)
    container, found = find_vllm_container(pod_spec, spec.container_name)
    origin = "args" if container.get("args") and found.in_args else "command"
    config_args: tuple[str, ...] = ()
    if found.config_file is not None:
        ref = find_config_map_file(pod_spec, container, found.config_file)
        if ref is None:
            raise DiscoveryIncomplete(
                f"--config {found.config_file} is not a file of a ConfigMap volume, so kvpilot cannot read "
                "the settings it holds; mount it from a ConfigMap or pass the flags on the command line"
            )
        data = config_maps.get(ref[0])
        if data is None or ref[1] not in data:
            raise DiscoveryIncomplete(f"ConfigMap {ref[0]} with key {ref[1]!r} (--config) does not exist")
        loaded = yaml.safe_load(data[ref[1]]) or {}
        if not isinstance(loaded, dict):
            raise DiscoveryIncomplete(f"--config {found.config_file} is not a YAML mapping of flags")
        config_args = vllm_command.build_config_file_args(loaded)
        origin += f" and --config (ConfigMap {ref[0]} key {ref[1]})"
    try:
        settings = vllm_command.compute_command_settings(found, config_args)
    except tuner_errors.InvalidEngineArgs as exc:
        raise DiscoveryIncomplete(f"the target's vLLM arguments do not parse: {exc.message}") from None
    revision = vllm.find_flag_values(found.flags, "--revision")
    model, model_origin = compute_model_ref(spec, found.model, revision[-1] if revision else None, container)
    product, labels = compute_gpu_product(spec, node_labels)
    nodes = group_size(workload)
    count = spec.gpu.count or compute_gpus_per_node([*config_args, *found.flags], settings, nodes)
    return Discovery(
        container=str(container.get("name")),
        command=found,
        settings=settings,
        model=model,
        model_origin=model_origin,
        args_origin=origin,
        image=str(container.get("image") or api.DEFAULT_IMAGE),
        gpu_count=count,
        vllm_env=compute_vllm_env(container),
        gpu_product=product,
        gpu_labels=labels,
        nodes=nodes,
        config_args=config_args,
    )


def compute_gpus_per_node(flags: Sequence[str], settings: EngineSettings, nodes: int) -> int:
    """The GPUs each pod runs: tensor x pipeline parallel over the group's ``nodes``, times the data-parallel
    engines a one-node pod starts (``--data-parallel-size``, ``-dpl``: the plan is one engine's,
    :func:`kvpilot.tuner.plan.compute_rank_gpus`). A group whose ranks do not split evenly over its nodes, or
    that runs data-parallel engines over several nodes, is one kvpilot does not plan for a target (its layout
    is the owner's): DiscoveryIncomplete says what to set."""
    tp, pp = settings.tensor_parallel_size or 1, vllm.find_last_int(flags, vllm.PIPELINE_PARALLEL_FLAG) or 1
    if nodes == 1:
        dp = vllm.read_data_parallel(flags)
        return tp * pp * (dp.local if dp is not None else 1)
    if (vllm.find_last_int(flags, vllm.DATA_PARALLEL_SIZE_FLAG) or 1) > 1:
        raise DiscoveryIncomplete(
            f"the group runs data-parallel engines ({vllm.DATA_PARALLEL_SIZE_FLAG}), a layout kvpilot "
            "does not tune in a workload it does not own; an InferenceService with gpu.nodesPerReplica "
            "plans and runs it"
        )
    if (tp * pp) % nodes:
        raise DiscoveryIncomplete(
            f"tensor x pipeline parallel {tp} x {pp} does not split over the group's {nodes} nodes; set "
            "spec.gpu.count to the GPUs of each pod"
        )
    return tp * pp // nodes


def build_plan_spec(spec: api.EngineTunerSpec, found: Discovery) -> api.InferenceServiceSpec:
    """The InferenceService spec that plans this target: its model, GPUs, serving and tuning bounds, and
    the tensor-parallel size it runs (the pod's shape is the owner's, not kvpilot's to change)."""
    tuning = api.Tuning(mode="Recommend", **spec.tuning.model_dump())
    env = [api.EnvVar(name=k, value=v) for k, v in found.vllm_env.items() if k == vllm.V2_RUNNER_ENV]
    image = found.image if len(found.image) <= 512 else api.DEFAULT_IMAGE
    return api.InferenceServiceSpec(
        model=found.model,
        gpu=api.GpuRequest(
            count=found.gpu_count,
            tensor_parallel_size=found.settings.tensor_parallel_size or 1,
            nodes_per_replica=found.nodes,
        ),
        serving=spec.serving,
        engine=api.Engine(image=image, env=env),
        tuning=tuning,
    )


class _GpuFound(Protocol):
    @property
    def gpu_product(self) -> str | None: ...

    @property
    def gpu_labels(self) -> Mapping[str, str] | None: ...


def compute_gpu(found: _GpuFound) -> GpuSpec:
    """The GPU to plan for: the node's GFD labels, else the catalogue entry of ``spec.gpu.product``."""
    if found.gpu_labels is not None:
        return gpus.build_gpu_from_labels(found.gpu_labels)
    if found.gpu_product is None:
        raise DiscoveryIncomplete(
            "no pod of the target runs on a node with a GPU Feature Discovery label "
            f"({gpus.PRODUCT_LABEL}), so kvpilot cannot tell which GPU to plan for; set spec.gpu.product"
        )
    return gpus.lookup_gpu(found.gpu_product)


def tuned_part(settings: EngineSettings) -> dict[str, object]:
    """The settings a recommendation changes (all tuned fields but the tensor-parallel size)."""
    return {k: v for k, v in settings.as_dict().items() if k != "tensor_parallel_size"}


def _container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((c for c in (pod.get("spec") or {}).get("containers") or () if c.get("name") == name), None)


def runs_vllm(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the pod's ``container`` runs vLLM (a Ray worker of a group runs ``ray start`` instead)."""
    c = _container(pod, container)
    return (
        c is not None
        and vllm_command.find_vllm_command(c.get("command") or (), c.get("args") or ()) is not None
    )


def runs_engine(pod: Mapping[str, Any], container: str, recommended: Recommended) -> bool:
    """Whether the pod's ``container`` runs the recommendation's engine."""
    if not isinstance(recommended, EngineArgs):
        return runs_vllm(pod, container)
    c = _container(pod, container)
    found = target_engines.find_engine_command(c) if c is not None else None
    return found is not None and found.kind == recommended.kind


def pod_carries(pod: Mapping[str, Any], container: str, recommended: Recommended) -> bool:
    """Whether the pod's engine container runs the recommendation (its command line says so; another
    engine's: :func:`.target_engines.container_carries`)."""
    if isinstance(recommended, EngineArgs):
        c = _container(pod, container)
        return c is not None and target_engines.container_carries(c, recommended)
    for c in (pod.get("spec") or {}).get("containers") or ():
        if c.get("name") != container:
            continue
        found = vllm_command.find_vllm_command(c.get("command") or (), c.get("args") or ())
        if found is None:
            return False
        try:
            settings = vllm_command.compute_command_settings(found)
        except tuner_errors.InvalidEngineArgs:
            return False
        return tuned_part(settings) == tuned_part(recommended)
    return False


def pod_belongs(pod: Mapping[str, Any], kind: str, name: str) -> bool:
    """Whether the pod is the target's (by the owner chain: a Deployment's ReplicaSet is named
    ``<deployment>-<pod-template-hash>``; a StatefulSet owns its pods itself; a LeaderWorkerSet's are its
    StatefulSets', ``<name>`` the leaders' and ``<name>-<group>`` each group's workers)."""
    if is_group_kind(kind):
        return leader_worker_set.is_group_pod(pod, name)
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller"):
            continue
        if kind == "StatefulSet":
            return bool(ref.get("kind") == "StatefulSet" and ref.get("name") == name)
        template_hash = (meta.get("labels") or {}).get("pod-template-hash")
        return bool(
            ref.get("kind") == "ReplicaSet" and template_hash and ref.get("name") == f"{name}-{template_hash}"
        )
    return False


def is_excluded(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return "true" in (
        (meta.get("labels") or {}).get(EXCLUDE_LABEL),
        (meta.get("annotations") or {}).get(EXCLUDE_LABEL),
    )


def compute_stale_pods(
    pods: Sequence[Mapping[str, Any]], container: str, recommended: Recommended
) -> list[Mapping[str, Any]]:
    """The pods to replace so that every engine runs ``recommended``: those whose engine container does not;
    of a LeaderWorkerSet, each group's leader when a pod of its group does not (a group is one engine, and
    evicting its leader replaces the whole group: LWS makes the workers' StatefulSet the leader pod's). Pods
    that do not run vLLM (a group's Ray workers) and pods being deleted are never stale."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    stale = [
        p
        for p in live
        if runs_engine(p, container, recommended) and not pod_carries(p, container, recommended)
    ]
    if not any(leader_worker_set.is_group_member(p) for p in live):
        return stale
    groups = {group_key(p) for p in stale} - {None}
    return [p for p in live if not leader_worker_set.is_worker(p) and group_key(p) in groups]


def group_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(set, group index)`` of a LeaderWorkerSet's pod; ``None`` for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not leader_worker_set.is_group_member(pod):
        return None
    return str(labels[leader_worker_set.NAME_LABEL]), str(labels.get(leader_worker_set.GROUP_INDEX_LABEL))


def pod_shape(workload: Mapping[str, Any]) -> capacity.PodShape:
    return capacity.build_pod_shape(workload)


CONDITION_TYPES = (
    conditions.READY,
    conditions.TARGET_FOUND,
    conditions.DISCOVERED,
    conditions.CONFIG_RESOLVED,
    conditions.PLANNED,
)
"""The conditions an EngineTuner's status carries."""
