"""Fakes for the operator's unit tests: a Kubernetes API, a planner, a kopf-like harness."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator.clients.kube import Conflict
from kvpilot.operator.inferenceservice import handlers, reconcile_deps
from kvpilot.operator.planning.model_files import ModelFiles
from kvpilot.operator.pods import leader_worker_set
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget, Plan, ServingBounds

L4_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-L4",
    "nvidia.com/gpu.memory": "23034",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "9",
    "pool": "l4",
}
H100_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "pool": "h100",
}


def node_object(
    name: str, labels: Mapping[str, str], taints: list[dict[str, Any]] | None = None, cordoned: bool = False
) -> dict[str, Any]:
    """A node as the API server lists it, advertising ``nvidia.com/gpu.count`` GPUs."""
    gpus = labels.get("nvidia.com/gpu.count", "0")
    return {
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"taints": taints or [], **({"unschedulable": True} if cordoned else {})},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}},
    }


GPU = "nvidia.com/gpu"


def gpu_pod(node: str, gpus: int, name: str = "other", phase: str = "Running") -> dict[str, Any]:
    """Another app's pod bound to ``node``, holding ``gpus`` GPUs."""
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]},
        "status": {"phase": phase},
    }


class FakeKube:
    """In-memory :class:`kvpilot.operator.clients.kube.Kube`."""

    def __init__(self) -> None:
        self.config_maps: dict[tuple[str, str], dict[str, str]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.nodes: list[dict[str, str]] = [dict(L4_LABELS), dict(H100_LABELS)]
        self.applied: list[dict[str, Any]] = []
        self.node_lists = 0
        self.fail_apply: Exception | None = None
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        """What ``list_active_pods`` returns (pods holding GPUs); none by default: every GPU is spare."""
        self.capacity_error: Exception | None = None
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        """InferenceServices by (namespace, name), for drift repair's owner read."""
        self.autoscalers: list[dict[str, Any]] = []
        """HorizontalPodAutoscalers (raw JSON, with metadata.namespace)."""
        self.autoscaler_error: Exception | None = None
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        """The closed loop's status writes: (namespace, name, merge patch with its resourceVersion)."""
        self.versions: dict[tuple[str, str], str] = {}
        """The objects' current resourceVersion, when a test sets it: a patch carrying another is a 409."""
        self.fail_status: Exception | None = None
        self.foreign: dict[tuple[str, str, str], dict[str, Any]] = {}
        """Objects someone else made, by (kind, namespace, name): ``read_object`` finds them before anything
        applied."""
        self.object_reads = 0
        self.served_kinds: set[str] = set()
        """The custom kinds whose CRD is installed (``serves_kind``): none, as on a bare cluster."""

    def read_config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.config_maps.get((namespace, name))

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.secrets.get((namespace, name))

    def list_node_labels(self, label_selector: str) -> list[dict[str, str]]:
        self.node_lists += 1
        wanted = [
            term.split("=", 1) if "=" in term else (term, None) for term in label_selector.split(",") if term
        ]
        return [n for n in self.nodes if all(k in n and (v is None or n[k] == v) for k, v in wanted)]

    def read_persistent_volume_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A foreign object of that name, else the last one applied (as the API server would return it)."""
        self.object_reads += 1
        if (kind, namespace, name) in self.foreign:
            return copy.deepcopy(self.foreign[(kind, namespace, name)])
        mine = [
            m
            for m in self.applied
            if (m["kind"], m["metadata"]["namespace"], m["metadata"]["name"]) == (kind, namespace, name)
        ]
        return copy.deepcopy(mine[-1]) if mine else None

    def list_nodes(self) -> list[dict[str, Any]]:
        if self.capacity_error is not None:
            raise self.capacity_error
        return [node_object(f"node-{i}", labels) for i, labels in enumerate(self.nodes)]

    def list_active_pods(self) -> list[dict[str, Any]]:
        if self.capacity_error is not None:
            raise self.capacity_error
        return copy.deepcopy(self.pods)

    def serves_kind(self, kind: str) -> bool:
        return kind in self.served_kinds

    def read_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.services.get((namespace, name))

    def list_autoscalers(self, namespace: str) -> list[dict[str, Any]]:
        if self.autoscaler_error is not None:
            raise self.autoscaler_error
        return [copy.deepcopy(h) for h in self.autoscalers if h["metadata"].get("namespace") == namespace]

    def patch_inference_service_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        from kvpilot.operator.clients.kube import Conflict

        if self.fail_status is not None:
            raise self.fail_status
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        current = self.versions.get((namespace, name))
        if wanted is not None and current is not None and wanted != current:
            raise Conflict(f"patching the status of {namespace}/{name}: HTTP 409 Conflict")
        self.status_patches.append((namespace, name, copy.deepcopy(dict(body))))
        if current is not None:
            self.versions[(namespace, name)] = str(int(current) + 1)
        return {"metadata": {"name": name, "namespace": namespace}, "status": dict(body.get("status") or {})}

    def take_status_patches(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The status patches sent for the object since the last call (forgotten here)."""
        mine = [p for ns, n, p in self.status_patches if (ns, n) == (namespace, name)]
        self.status_patches = [w for w in self.status_patches if (w[0], w[1]) != (namespace, name)]
        return mine

    def apply(self, manifest: Mapping[str, Any]) -> None:
        if self.fail_apply is not None:
            raise self.fail_apply
        self.applied.append(copy.deepcopy(dict(manifest)))

    def last(self, kind: str) -> dict[str, Any]:
        return [m for m in self.applied if m["kind"] == kind][-1]


def lws_group_pod(
    lws: Mapping[str, Any],
    group: int,
    index: int,
    *,
    container: str,
    crash: bool = False,
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod of LeaderWorkerSet ``lws`` as LWS makes it: the leader ``<set>-<group>`` of the leaders'
    StatefulSet ``<set>``, worker ``index`` ``<set>-<group>-<index>`` of the group's ``<set>-<group>``, on
    node ``h100-<group>-<index>``; ``container`` running, or in CrashLoopBackOff with ``crash``."""
    name, namespace = lws["metadata"]["name"], lws["metadata"]["namespace"]
    template = copy.deepcopy(
        lws["spec"]["leaderWorkerTemplate"]["leaderTemplate" if index == 0 else "workerTemplate"]
    )
    state = {"waiting": {"reason": "CrashLoopBackOff"}} if crash else {"running": {}}
    metadata: dict[str, Any] = {
        "name": f"{name}-{group}" if index == 0 else f"{name}-{group}-{index}",
        "namespace": namespace,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {
            **template["metadata"]["labels"],
            leader_worker_set.NAME_LABEL: name,
            leader_worker_set.GROUP_INDEX_LABEL: str(group),
            leader_worker_set.WORKER_INDEX_LABEL: str(index),
        },
        "ownerReferences": [
            {"kind": "StatefulSet", "name": name if index == 0 else f"{name}-{group}", "controller": True}
        ],
    }
    if uid is not None:
        metadata["uid"] = uid
    return {
        "metadata": metadata,
        "spec": {**template["spec"], "nodeName": f"h100-{group}-{index}"},
        "status": {
            "conditions": [{"type": "Ready", "status": "False" if crash else "True"}],
            "containerStatuses": [{"name": container, "ready": not crash, "state": state}],
        },
    }


def fake_plan(
    model: Any,
    gpu: GpuSpec,
    gpu_count: int,
    bounds: ServingBounds,
    *,
    pinned: EngineSettings,
    vllm_version: str,
    weights_total_bytes: int | None,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    learned: object = None,
) -> Plan:
    """A planner stand-in: feasible when gpu memory x count >= 40 GiB or the model is small (``engine``, the
    extra args' memory flags, changes nothing here)."""
    length = pinned.max_model_len or bounds.max_context or 8192
    fits = gpu.total_bytes * gpu_count >= 40 * (1 << 30) or (bounds.min_context or 0) < 4096
    settings = EngineSettings(
        max_model_len=length,
        max_num_seqs=pinned.max_num_seqs or 64,
        gpu_memory_utilization=pinned.gpu_memory_utilization or bounds.max_gpu_memory_utilization,
        kv_cache_dtype=pinned.kv_cache_dtype or ("fp8" if bounds.allow_fp8_kv else "auto"),
        tensor_parallel_size=pinned.tensor_parallel_size or gpu_count,
    )
    budget = MemoryBudget(
        gpu_total_gib=gpu.total_gib,
        requested_gib=gpu.total_gib * 0.9,
        weights_gib=15.0,
        activation_gib=1.2,
        non_torch_gib=0.3,
        cuda_graph_gib=0.5,
        available_kv_cache_gib=3.5,
        kv_bytes_per_token=131072,
        num_gpu_blocks=1792,
        kv_cache_tokens=28672,
        max_concurrency=3.5,
        starts=fits,
    )
    return Plan(
        settings=settings,
        budget=budget,
        feasible=fits,
        concurrency_at_max_len=3.5,
        gpu=gpu.name,
        gpu_count=gpu_count,
        vllm_version=vllm_version,
        reasons=() if fits else ("weights need 140 GiB but 4x L4 give 88 GiB", "use 4x H100-SXM"),
        warnings=("fake planner",),
    )


def isvc(name: str = "llm", namespace: str = "ns1", generation: int = 1, **spec: Any) -> dict[str, Any]:
    body_spec = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": 1, "product": "L4"}}
    body_spec.update(spec)
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": generation},
        "spec": body_spec,
        "status": {},
    }


class Harness:
    """Runs :func:`handlers.reconcile` like kopf would, with fakes, and keeps the results."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.emitter = RecordingEmitter()
        self.hub_calls: list[tuple[str, str | None, str | None]] = []
        self.hub_result: Any = {}
        self.clock = iter(f"2026-11-30T10:{m:02d}:00Z" for m in range(60))
        self.deps = reconcile_deps.Deps(
            kube=self.kube,
            emit=self.emitter,
            now=lambda: next(self.clock),
            hub=self._hub,
            plan_fn=fake_plan,
            record_metrics=False,
        )
        self.patch = kopf.Patch()

    def _hub(self, model_id: str, revision: str | None, token: str | None) -> ModelFiles:
        """The Hub's answer: ``hub_result``, a config.json (or the whole ModelFiles), or the error raised."""
        self.hub_calls.append((model_id, revision, token))
        if isinstance(self.hub_result, Exception):
            raise self.hub_result
        return self.hub_result if isinstance(self.hub_result, ModelFiles) else ModelFiles(self.hub_result)

    async def run(
        self, body: dict[str, Any], trigger: str = handlers.CREATED, retry: int = 0, diff: Any = None
    ) -> kopf.Patch:
        self.patch = kopf.Patch()
        try:
            await handlers.reconcile(
                body=body,
                spec=body["spec"],
                meta=body["metadata"],
                status=body.get("status") or {},
                patch=self.patch,
                retry=retry,
                logger=logging.getLogger("test"),
                trigger=trigger,
                deps=self.deps,
                diff=diff,
            )
        finally:
            # what kopf does with the patch: merge it into the object
            body["status"] = apply_patch(body.get("status") or {}, self.patch)
        return self.patch


def apply_patch(status: dict[str, Any], patch: kopf.Patch) -> dict[str, Any]:
    """What kopf does with a handler's patch: merge ``patch.status``, then run ``patch.fns`` on the result."""
    body = {"status": _merge(status, dict(patch.get("status", {})))}
    for fn in patch.fns:
        fn(body)
    return dict(body["status"])


def apply_merge(status: dict[str, Any], merge_patch: Mapping[str, Any]) -> dict[str, Any]:
    """What the API server does with a JSON merge patch of ``/status``."""
    return _merge(status, dict(merge_patch.get("status") or {}))


def _merge(old: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def condition(body: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


# --- TuningProfiles ------------------------------------------------------------------------------------


class FakeStore:
    """Profiles as the API server keeps them: a resourceVersion per write, 409 on a stale one."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.lists = 0
        self.patches = 0
        self.conflicts = 0
        self.before_patch: Any = None
        """Called before each patch is judged (another writer sneaking in)."""

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    def list_profiles(self) -> list[dict[str, Any]]:
        self.lists += 1
        return [copy.deepcopy(o) for o in self.objects.values()]

    def read_profile(self, name: str) -> dict[str, Any] | None:
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    def create_profile(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.objects:
            raise Conflict(f"{name} already exists")
        self.objects[name] = copy.deepcopy(dict(body))
        return self._bump(self.objects[name])

    def patch_profile_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()
        obj = self.objects[name]
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise Conflict("the object has been modified")
        self.patches += 1
        obj["status"] = copy.deepcopy(body["status"])
        return self._bump(obj)


class ProfileKube(FakeKube, FakeStore):
    """The fake API with TuningProfiles: what the real planner's profile reads and the loop's writes use."""

    def __init__(self) -> None:
        FakeKube.__init__(self)
        FakeStore.__init__(self)
