"""The vLLM Deployment and Service of an InferenceService: pure builders and their apply.

:func:`build_deployment` and :func:`build_service` return plain manifests (dicts) for
server-side apply; :func:`apply_workloads` writes them. The closed loop reuses
:func:`build_deployment` with other settings, so the operator and the closed loop
always apply the whole object under the same field manager.

Pod choices (docs/operator.md explains each):

* ``vllm serve <model> --revision .. --host 0.0.0.0 --port 8000`` + the tuned flags + extra args;
  ``command`` is set explicitly, so images whose entrypoint is the old API server also work.
* ``nvidia.com/gpu`` limits = requests = gpu.count; ``/dev/shm`` a memory-backed emptyDir
  (NCCL with tensor parallelism needs more than the runtime's 64 MiB).
* Probes on ``/health``: a start-up probe every 10 s whose budget follows the checkpoint's size
  (at least 30 min: download or load, compile, CUDA graphs), then readiness and liveness.
* The weight cache (``spec.model.storage``, :mod:`kvpilot.operator.pods.storage`): a volume mounted as
  ``HF_HOME`` and an init container that downloads the weights before vLLM starts; without it an
  ``ephemeral-storage`` request for the checkpoint.
* ``terminationMessagePolicy: FallbackToLogsOnError``: a crash's last log lines (a CUDA
  out-of-memory error) land in the pod status, where the closed loop reads them.
* Prometheus scrape annotations for ``:8000/metrics``.
* Pods pinned to the planned GPU with ``nvidia.com/gpu.product`` (nodeSelector when one
  product, node affinity when the catalogue entry has several GFD names).
* Security: no privilege escalation, all capabilities dropped, RuntimeDefault seccomp. The
  vLLM image runs as root by default and caches under /root, so runAsNonRoot is not set, unless
  ``spec.podSecurity: Restricted`` (:mod:`kvpilot.operator.pods.pod_template`: the image's ``vllm`` user).
* ``spec.template`` merged last (:func:`kvpilot.operator.pods.pod_template.build_pod_template`): what kvpilot
  owns wins.
* The update strategy of :mod:`kvpilot.operator.pods.rollout_strategy`: a surge (``maxSurge: 1,
  maxUnavailable: 0``: a retune that cannot start leaves the old pod serving) unless the closed loop or the
  reconciler chose Replace or Recreate for a full pool (``spec.rollout``).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import IO_POOL, Kube, fetch_active_pods, fetch_nodes
from kvpilot.operator.clients.kube import build_label_selector as build_label_selector_from
from kvpilot.operator.pods import (
    capacity,
    leader_worker_set,
    ownership,
    pod_template,
    pod_view,
    rollout_strategy,
    storage,
)
from kvpilot.tuner import engines, gpus, plan, vllm
from kvpilot.tuner.types import GIB, EngineSettings
from kvpilot.tuner.vllm import serving

PORT = serving.PORT
VLLM_SERVING = engines.lookup_engine("vLLM").serving


@dataclass(frozen=True, slots=True)
class EngineContainer:
    """Another engine's container (``spec.engine.kind`` SGLang): how it serves, and its arguments."""

    serving: engines.Serving
    args: Sequence[str]


HF_TOKEN_ENV = "HF_TOKEN"
STARTUP_PERIOD_S = storage.STARTUP_PERIOD_S
SHM_SIZE_LIMIT = "16Gi"


def build_labels(name: str) -> dict[str, str]:
    """Labels of the Deployment, its pods and the Service (api-contract.md)."""
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "kvpilot",
        api.SERVICE_LABEL: name,
    }


INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The selector label that names the InferenceService a pod serves (the pod cache is keyed by it)."""


def build_selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", INSTANCE_LABEL: name}


def build_label_selector(name: str) -> str:
    """:func:`build_selector` as a string (``status.selector``: what the ``/scale`` subresource reports)."""
    return build_label_selector_from(build_selector(name))


def build_owner_reference(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The controller owner reference (garbage collection deletes the children); none without a uid."""
    if not metadata.get("uid"):
        return []
    return [
        {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": api.KIND,
            "name": metadata["name"],
            "uid": metadata["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def build_engine_args(
    spec: api.InferenceServiceSpec,
    settings: EngineSettings,
    extra: Sequence[str],
    layout: plan.Layout | None = None,
) -> list[str]:
    """``vllm serve`` arguments: model, revision, port, tuned flags, the group's parallelism, the weight
    loader (``spec.model.loader``), extra args. The parallelism: ``layout``'s data-parallel and expert flags
    (a DP x EP group, :mod:`kvpilot.operator.planning.layouts`), else the pipeline stages the GPUs left
    over by the tensor-parallel size make (stages span nodes)."""
    args = [spec.model.id]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    args += ["--host", "0.0.0.0", "--port", str(PORT)]
    tp = settings.tensor_parallel_size or 1
    pp_extra: list[str] = []
    pp = plan.compute_pipeline_parallel(spec.gpu.count * spec.gpu.nodes_per_replica, tp)
    if layout is not None and layout.data_parallel_size > 1:
        pp_extra = list(layout.parallel_args())
    elif pp > 1 and not vllm.find_flag_values(extra, vllm.PIPELINE_PARALLEL_FLAG):
        pp_extra = [vllm.PIPELINE_PARALLEL_FLAG, str(pp)]
    loader: list[str] = []  # the streaming loader, unless the user's own --load-format says otherwise
    if not vllm.find_flag_values(extra, vllm.LOAD_FORMAT_FLAG):
        loader = list(vllm.build_loader_args(spec.model.loader == "RunaiStreamer"))
    return [*args, *vllm.build_vllm_args(settings, [*pp_extra, *loader, *extra])]


def _node_placement(products: Sequence[str], node_selector: Mapping[str, str]) -> dict[str, Any]:
    selector = dict(node_selector)
    placement: dict[str, Any] = {}
    if len(products) == 1:
        selector[gpus.PRODUCT_LABEL] = products[0]
    elif products and gpus.PRODUCT_LABEL not in selector:
        placement["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": gpus.PRODUCT_LABEL, "operator": "In", "values": sorted(products)}
                            ]
                        }
                    ]
                }
            }
        }
    if selector:
        placement["nodeSelector"] = selector
    return placement


def _env(spec: api.InferenceServiceSpec) -> list[dict[str, Any]]:
    env = [e.wire() for e in spec.engine.env]
    ref = spec.model.hub_token_secret_ref
    if ref is not None and not any(e["name"] == HF_TOKEN_ENV for e in env):
        env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def _resources(spec: api.InferenceServiceSpec, ephemeral_bytes: int | None) -> dict[str, Any]:
    res = spec.engine.resources or api.Resources()
    gpu: dict[str, int | str] = {capacity.GPU_RESOURCE: spec.gpu.count}
    requests: dict[str, int | str] = {**(res.requests or {}), **gpu}
    if ephemeral_bytes and "ephemeral-storage" not in requests:
        requests["ephemeral-storage"] = f"{-(-ephemeral_bytes // GIB)}Gi"
    return {"limits": {**(res.limits or {}), **gpu}, "requests": requests}


def _probe(failures: int, period: int, path: str = serving.HEALTH_PATH) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


CONTAINER_SECURITY = pod_template.CONTAINER_HARDENING


def build_pod_storage(
    metadata: Mapping[str, Any], spec: api.InferenceServiceSpec, checkpoint_bytes: int | None
) -> storage.PodStorage:
    """The weight cache's fragments of this service's pods (:mod:`kvpilot.operator.pods.storage`)."""
    token = [e for e in _env(spec) if e["name"] == HF_TOKEN_ENV]
    return storage.build_pod_storage(
        metadata,
        spec,
        checkpoint_bytes,
        image=spec.engine.image,
        token_env=token,
        security_context=CONTAINER_SECURITY,
    )


def build_deployment(
    metadata: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    settings: EngineSettings,
    extra: Sequence[str],
    products: Sequence[str],
    *,
    checkpoint_bytes: int | None = None,
    rollout: rollout_strategy.RolloutChoice | None = None,
    engine: EngineContainer | None = None,
    layout: plan.Layout | None = None,
) -> dict[str, Any]:
    """The Deployment running vLLM with ``settings`` on nodes of one of ``products`` (``layout``: a DP x EP
    group's split, :func:`build_engine_args`).

    ``checkpoint_bytes`` sizes the weight cache, the ``ephemeral-storage`` request and the start-up
    probe's budget (:mod:`kvpilot.operator.pods.storage`); ``rollout`` is the update strategy
    (:mod:`kvpilot.operator.pods.rollout_strategy`; ``None``: the one the spec declares). ``engine``:
    another engine's container (``spec.engine.kind``: its serving facts from the tuner's seam and its
    arguments, :mod:`kvpilot.operator.planning.engines`), which ``settings`` and ``extra`` then do not shape.
    """
    name = metadata["name"]
    labels = build_labels(name)
    args = build_engine_args(spec, settings, extra, layout) if engine is None else list(engine.args)
    served = engine.serving if engine is not None else VLLM_SERVING
    cache = build_pod_storage(metadata, spec, checkpoint_bytes)
    user_env = _env(spec)
    env = [*user_env, *(e for e in cache.env if all(u["name"] != e["name"] for u in user_env))]
    container = {
        "name": served.container_name,
        "image": spec.engine.image,
        "command": list(served.command),
        "args": args,
        "ports": [{"name": "http", "containerPort": served.port, "protocol": "TCP"}],
        "env": env,
        "resources": _resources(spec, cache.ephemeral_storage_bytes),
        "volumeMounts": [{"name": pod_template.SHM_VOLUME, "mountPath": "/dev/shm"}, *cache.mounts],
        "startupProbe": _probe(cache.startup_failure_threshold, STARTUP_PERIOD_S, served.health_path),
        "readinessProbe": _probe(3, 10, served.health_path),
        "livenessProbe": _probe(6, 15, served.health_path),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    if not container["env"]:
        del container["env"]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        **({"initContainers": cache.init_containers} if cache.init_containers else {}),
        "volumes": [
            {"name": pod_template.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}},
            *cache.volumes,
        ],
        "terminationGracePeriodSeconds": 60,
        **_node_placement(products, spec.node_selector),
    }
    tolerations = [t.wire() for t in spec.engine.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _object_metadata(metadata, labels),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": build_selector(name)},
            "strategy": rollout_strategy.build_deployment_strategy(
                rollout or rollout_strategy.compute_declared_choice(spec.rollout, spec.replicas)
            ),
            "progressDeadlineSeconds": 1800,
            "revisionHistoryLimit": 5,
            "template": pod_template.build_pod_template(
                {
                    "metadata": {
                        "labels": labels,
                        "annotations": {
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(served.port),
                            "prometheus.io/path": served.metrics_path,
                        },
                    },
                    "spec": pod_spec,
                },
                spec.template,
                spec.pod_security,
            ),
        },
    }


def build_workload(deployment: dict[str, Any], spec: api.InferenceServiceSpec) -> dict[str, Any]:
    """What runs the pods: ``deployment`` itself, or for a replica over several nodes the LeaderWorkerSet
    made from it (:mod:`kvpilot.operator.pods.leader_worker_set`)."""
    nodes = spec.gpu.nodes_per_replica
    if nodes == 1:
        return deployment
    return leader_worker_set.build_leader_worker_set(
        deployment, nodes, leader_worker_set.ROLES[spec.engine.kind]
    )


def build_replica_manifests(
    metadata: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    deployment: dict[str, Any],
    checkpoint: int | None,
) -> list[dict[str, Any]]:
    """Everything a service applies around its rendered ``deployment``, in apply order: the weight cache's
    claims, the Service, what runs the pods (:func:`build_workload`) and the disruption budget. For a replica
    over several nodes the Service reaches each group's leader, which serves the API, and the budget
    counts so that groups are the unit."""
    service = build_service(metadata, spec)
    if spec.gpu.nodes_per_replica > 1:
        service["spec"]["selector"] = {**service["spec"]["selector"], **leader_worker_set.LEADER_SELECTOR}
    return [
        *build_claims(metadata, spec, checkpoint),
        service,
        build_workload(deployment, spec),
        *build_pod_disruption_budget(metadata, spec),
    ]


WORKLOAD_KINDS = ("Deployment", leader_worker_set.KIND)


@dataclass(frozen=True, slots=True)
class Workload:
    """What runs a service's pods, read alike from a Deployment and a LeaderWorkerSet (read_workload)."""

    kind: str
    namespace: str
    name: str
    replicas: int
    """Replicas: pods of a Deployment, groups of a LeaderWorkerSet."""
    selector: Mapping[str, str]
    """Labels every pod of the workload carries: a Deployment's ``matchLabels``; LWS's set-name label, which
    it puts on each pod of the set."""
    pod_labels: Mapping[str, str]
    """The pod template's labels (of a LeaderWorkerSet: the leaders', as the workers' are kvpilot's same)."""
    pod_template: Mapping[str, Any]
    """The pod template (of a LeaderWorkerSet: the leaders'; the workers share volumes, placement, GPUs)."""
    group_size: int = 1
    """Pods per replica: ``leaderWorkerTemplate.size`` of a LeaderWorkerSet."""


def read_workload(manifest: Mapping[str, Any]) -> Workload:
    """The :class:`Workload` of a Deployment or LeaderWorkerSet manifest (or object read back)."""
    meta, spec = manifest["metadata"], manifest["spec"]
    group = spec.get("leaderWorkerTemplate")
    if manifest["kind"] == leader_worker_set.KIND and group is not None:
        template: Mapping[str, Any] = group.get("leaderTemplate") or group["workerTemplate"]
        selector = {leader_worker_set.NAME_LABEL: meta["name"]}
        size = int(group.get("size") or 1)
    elif manifest["kind"] == "Deployment":
        template, selector, size = spec["template"], dict(spec["selector"]["matchLabels"]), 1
    else:
        raise ValueError(f"{manifest['kind']} is not a workload kind ({', '.join(WORKLOAD_KINDS)})")
    return Workload(
        kind=manifest["kind"],
        namespace=meta.get("namespace") or "default",
        name=meta["name"],
        replicas=int(spec.get("replicas", 1)),
        selector=selector,
        pod_labels=dict((template.get("metadata") or {}).get("labels") or {}),
        pod_template=template,
        group_size=size,
    )


async def fetch_workload_served(kube: Kube, spec: api.InferenceServiceSpec) -> None:
    """Raise ``LeaderWorkerSetNotInstalled`` when the spec's workload kind is not served (a replica over
    several nodes without the LWS CRD); a Deployment always is."""
    if spec.gpu.nodes_per_replica > 1:
        await leader_worker_set.fetch_served(kube)


def _object_metadata(owner: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": owner["name"],
        "namespace": owner.get("namespace") or "default",
        "labels": dict(labels),
    }
    refs = build_owner_reference(owner)
    if refs:
        meta["ownerReferences"] = refs
    return meta


def build_claims(
    metadata: Mapping[str, Any], spec: api.InferenceServiceSpec, checkpoint_bytes: int | None
) -> list[dict[str, Any]]:
    """The PersistentVolumeClaim kvpilot owns for a ``claimTemplate`` (none otherwise), owned by the
    InferenceService so the garbage collector deletes it with it."""
    claims = build_pod_storage(metadata, spec, checkpoint_bytes).claims
    refs = build_owner_reference(metadata)
    for claim in claims:
        claim["metadata"]["labels"] = build_labels(metadata["name"])
        if refs:
            claim["metadata"]["ownerReferences"] = refs
    return claims


def build_service(metadata: Mapping[str, Any], spec: api.InferenceServiceSpec) -> dict[str, Any]:
    """The ClusterIP Service in front of the vLLM pods (port 8000, named http); headless (``clusterIP:
    None``, no virtual IP allocated) when ``spec.service.headless``."""
    name = metadata["name"]
    out: dict[str, Any] = {"type": "ClusterIP"}
    if spec.service.headless:
        out["clusterIP"] = "None"
    out["selector"] = build_selector(name)
    out["ports"] = [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _object_metadata(metadata, build_labels(name)),
        "spec": out,
    }


def build_pod_disruption_budget(
    metadata: Mapping[str, Any], spec: api.InferenceServiceSpec
) -> list[dict[str, Any]]:
    """The PodDisruptionBudget of a service with 2 or more replicas (``maxUnavailable`` from
    ``spec.rollout.maxUnavailable``), owned by the InferenceService; none below 2 replicas. One left from
    when there were more replicas is not deleted (kvpilot has no delete verb): on one replica a budget of
    at least one unavailable blocks nothing, and garbage collection deletes it with the service.

    Of a LeaderWorkerSet (a group is the unit: one evicted pod restarts its whole group) the budget is
    :func:`kvpilot.operator.pods.leader_worker_set.build_budget_spec`."""
    if spec.replicas < 2:
        return []
    name = metadata["name"]
    budget: dict[str, Any] = {
        "maxUnavailable": spec.rollout.max_unavailable,
        "selector": {"matchLabels": build_selector(name)},
    }
    if spec.gpu.nodes_per_replica > 1:
        budget = leader_worker_set.build_budget_spec(budget)
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _object_metadata(metadata, build_labels(name)),
            "spec": budget,
        }
    ]


async def fetch_rollout_strategy(
    kube: Kube, spec: api.InferenceServiceSpec, manifests: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``manifests`` with the workload's update strategy chosen for the cluster as it is now
    (:func:`fetch_rollout_choice`): a reconciler's change of the pods rolls out like the closed loop's. A
    held choice renders a surge (the pod waits for a GPU; the old ones keep serving). A LeaderWorkerSet's
    is the same choice counted in groups (:func:`leader_worker_set.build_rollout_strategy`)."""
    out = [dict(m) for m in manifests]
    for i, m in enumerate(out):
        if m["kind"] in WORKLOAD_KINDS:
            out[i] = build_rollout_strategy(m, await fetch_rollout_choice(kube, spec, m, serving=None))
    return out


def build_rollout_strategy(
    workload: Mapping[str, Any], choice: rollout_strategy.RolloutChoice
) -> dict[str, Any]:
    """``workload`` (a Deployment or a LeaderWorkerSet) with ``choice`` as its update strategy (a
    LeaderWorkerSet's counted in groups: :func:`leader_worker_set.build_rollout_strategy`)."""
    rendered = rollout_strategy.build_deployment_strategy(choice)
    if workload["kind"] == "Deployment":
        return {**workload, "spec": {**workload["spec"], "strategy": rendered}}
    group = leader_worker_set.build_rollout_strategy(rendered, read_workload(workload).replicas)
    return {**workload, "spec": {**workload["spec"], "rolloutStrategy": group}}


def _claims_in_use(manifests: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, claim) of every existing claim a Deployment mounts that is not applied with it."""
    ours = {
        (m["metadata"]["namespace"], m["metadata"]["name"])
        for m in manifests
        if m["kind"] == "PersistentVolumeClaim"
    }
    used = []
    for m in manifests:
        if m["kind"] not in WORKLOAD_KINDS:
            continue
        namespace = m["metadata"]["namespace"]
        for volume in read_workload(m).pod_template["spec"].get("volumes") or ():
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and (namespace, claim) not in ours:
                used.append((namespace, claim))
    return used


async def fetch_capacity(
    kube: Kube,
) -> tuple[list[capacity.NodeView], list[dict[str, Any]]] | None:
    """Every node and every unfinished pod of the cluster, or ``None`` when they cannot be read (RBAC:
    ``rbac.clusterWidePods``, an API hiccup): the caller then does not know the spare GPUs."""
    try:
        nodes, pods = await asyncio.gather(fetch_nodes(kube), fetch_active_pods(kube))
    except errors.OperatorError:
        return None
    return [capacity.build_node_view(n) for n in nodes], pods


async def fetch_rollout_choice(
    kube: Kube,
    spec: api.InferenceServiceSpec,
    deployment: Mapping[str, Any],
    *,
    serving: bool | None,
    not_serving_why: str = "",
    cluster: tuple[list[capacity.NodeView], list[dict[str, Any]]] | None = None,
) -> rollout_strategy.RolloutChoice:
    """How ``deployment`` (about to be applied) rolls out (:func:`rollout_strategy.compute_rollout_choice`):
    the nodes and pods are read only for ``Auto`` (``cluster``: already read). ``serving`` (a replica is
    Ready) ``None``: read from the Deployment's own pods in that list (the reconciler has no pod view)."""
    fits = None
    if spec.rollout.strategy == "Auto":
        cluster = cluster or await fetch_capacity(kube)
        if cluster is not None:
            fits = capacity.compute_fits_now(capacity.build_pod_shape(deployment), *cluster)
    if serving is None:
        meta = deployment["metadata"]
        own = [
            pod_view.build_pod_view(p)
            for p in (cluster[1] if cluster else ())
            if (p.get("metadata") or {}).get("namespace") == meta["namespace"]
            and pod_view.owned_by(p, meta["name"])
        ]
        serving = cluster is None or any(v.ready and not v.terminating for v in own)
    return rollout_strategy.compute_rollout_choice(
        spec.rollout, spec.replicas, fits_now=fits, serving=serving, not_serving_why=not_serving_why
    )


@dataclass(frozen=True, slots=True)
class RolloutCosts:
    """What a change's rollout costs (:func:`fetch_rollout_costs`), and the choice it was weighed on, for the
    workload to be rendered with (:func:`build_rollout_strategy`) without reading the cluster again."""

    lost_fraction: float
    blocked: str | None
    choice: rollout_strategy.RolloutChoice


async def fetch_rollout_costs(
    kube: Kube,
    spec: api.InferenceServiceSpec,
    deployment: Mapping[str, Any],
    *,
    serving: bool,
    not_serving_why: str = "",
) -> RolloutCosts:
    """What a rollout of ``deployment`` costs under the strategy the cluster allows now
    (:func:`fetch_rollout_choice`, as :func:`fetch_rollout_strategy` renders it;
    :func:`rollout_strategy.compute_costs`): the share of the service's capacity it loses while a pod
    restarts (0 surge or while nothing serves, ``k/N`` replace, 1 recreate), and why it cannot roll out at all
    (one replica, no spare GPU, no ``allowDowntime``: :data:`rollout_strategy.HELD_MESSAGE`; else ``None``):
    what SGLang's and TGI's loops weigh a change against, as vLLM's
    (:func:`kvpilot.operator.inferenceservice.loop_actions.fetch_rollout`)."""
    choice = await fetch_rollout_choice(
        kube, spec, deployment, serving=serving, not_serving_why=not_serving_why
    )
    lost, blocked = rollout_strategy.compute_costs(choice, spec.replicas, serving=serving)
    return RolloutCosts(lost, blocked, choice)


async def apply_workloads(
    manifests: Sequence[Mapping[str, Any]], kube: Kube, owners: ownership.VerifiedOwners
) -> None:
    """Server-side apply each manifest in order (a weight-cache claim, the Service, the Deployment, its
    PodDisruptionBudget), none of them when an object of a wanted name is another's
    (:func:`ownership.check_ownership` with the operator's memory ``owners``: NameConflict)."""

    def _apply_all() -> None:
        ownership.check_ownership(manifests, kube, owners)
        for claim in _claims_in_use(manifests):
            if kube.read_persistent_volume_claim(*claim) is None:
                raise errors.ConfigNotFound(
                    f"PersistentVolumeClaim {claim[0]}/{claim[1]} (spec.model.storage.persistentVolumeClaim) "
                    "does not exist; create it (a claim bound to the volume with the weights) or use "
                    "storage.claimTemplate to have kvpilot create one. Retrying."
                )
        for manifest in manifests:
            kube.apply(manifest)

    await asyncio.get_running_loop().run_in_executor(IO_POOL, _apply_all)
