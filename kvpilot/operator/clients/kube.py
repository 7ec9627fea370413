"""The operator's Kubernetes client (kopf has its own; the closed loop reads pods through
:mod:`kvpilot.operator.pods.pod_reading`, on the same ``ApiClient``).

:class:`Kube` is the narrow interface the handlers need; :class:`ClusterKube`
implements it with the ``kubernetes`` client (one shared ``ApiClient``, raw JSON
responses so that 1000 objects do not build 1000 typed models). Methods are
synchronous: :func:`~kvpilot.operator.planning.resolve.fetch_inputs` and
:func:`~kvpilot.operator.pods.workloads.apply_workloads` call them in the shared
``IO_POOL`` threads. Tests pass a fake with the same methods.

Writes use server-side apply (``application/apply-patch+yaml``) with the field
manager :data:`FIELD_MANAGER` and ``force=True``: kvpilot owns the fields it sets,
and another manager's conflicting edit of them is overwritten on the next reconcile.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from urllib3 import BaseHTTPResponse
from urllib3.exceptions import HTTPError

from kvpilot.operator import api, errors
from kvpilot.operator.clients import pod_logs

IO_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="kvpilot-io")
"""Threads for blocking Kubernetes and Hub calls (the default executor has only cpu+4)."""

FIELD_MANAGER = "kvpilot"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
ACTIVE_PODS_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
"""Pods that may hold a node's GPUs (cluster-wide list; docs/install.md, "RBAC", the capacity role)."""
_LWS_GROUP, _LWS_VERSION = api.TARGET_API_VERSIONS["LeaderWorkerSet"].split("/")
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "LeaderWorkerSet": (_LWS_GROUP, _LWS_VERSION, "leaderworkersets")
}
"""Workload kinds another project's CRD defines: (group, version, plural). The LeaderWorkerSet of a replica
over several nodes (sigs.k8s.io/lws, :mod:`kvpilot.operator.pods.leader_worker_set`)."""


def raw_response(response: object) -> BaseHTTPResponse:
    """The unread ``urllib3`` response of a ``kubernetes`` call made with ``_preload_content=False``.

    The client's methods are annotated with the decoded model they return by default; with that flag
    they return ``urllib3``'s response instead (``ApiClient._call_with_legacy_options``).
    """
    return cast(BaseHTTPResponse, response)


class Kube(Protocol):
    def read_config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's ``data``, or ``None`` if it does not exist."""
        ...

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's decoded ``data``, or ``None`` if it does not exist."""
        ...

    def list_node_labels(self, label_selector: str) -> list[dict[str, str]]:
        """The labels of every node matching ``label_selector``."""
        ...

    def read_persistent_volume_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim, or ``None`` if it does not exist."""
        ...

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node (raw JSON): labels, taints, ``spec.unschedulable``, allocatable ``nvidia.com/gpu``."""
        ...

    def list_active_pods(self) -> list[dict[str, Any]]:
        """Every pod in every namespace that has not finished (``status.phase`` not Succeeded or Failed):
        what holds the nodes' GPUs (:mod:`kvpilot.operator.pods.capacity`)."""
        ...

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Deployment, Service, PersistentVolumeClaim, PodDisruptionBudget or one of :data:`CUSTOM_KINDS`;
        ``None`` when absent."""
        ...

    def apply(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply of a Deployment, Service, PersistentVolumeClaim, PodDisruptionBudget or one of
        :data:`CUSTOM_KINDS`."""
        ...

    def serves_kind(self, kind: str) -> bool:
        """Whether the API server serves ``kind`` of :data:`CUSTOM_KINDS` (its CRD is installed), by API
        discovery (``GET /apis/<group>/<version>``, which every authenticated client may read)."""
        ...

    def read_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The InferenceService, or ``None`` if it does not exist (drift repair reads the owner)."""
        ...

    def list_autoscalers(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's HorizontalPodAutoscalers (raw JSON, autoscaling/v2): which of them scale an
        InferenceService (:mod:`kvpilot.operator.inferenceservice.autoscalers`)."""
        ...

    def patch_inference_service_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """A JSON merge patch of the InferenceService's ``/status``; ``body.metadata.resourceVersion`` makes
        it conditional (:class:`Conflict` when the object changed since). ``None`` if the object is gone."""
        ...


class TargetKube(Kube, Protocol):
    """What an EngineTuner reads and does besides: the workload it targets, that workload's pods, and the
    Eviction API (:mod:`kvpilot.operator.enginetuner.target_handlers`)."""

    def read_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The apps/v1 Deployment or StatefulSet, or ``None`` if it does not exist."""
        ...

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods of ``namespace`` matching ``label_selector``."""
        ...

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Evict the pod (policy/v1 Eviction); ``False`` when a PodDisruptionBudget refuses it now."""
        ...

    def read_previous_log(
        self, namespace: str, pod: str, container: str, tail_lines: int
    ) -> str | pod_logs.UnreadLog | None:
        """The tail of ``container``'s previous log (:func:`fetch_previous_log`), or why not."""
        ...


def build_label_selector(labels: Mapping[str, str], exists: tuple[str, ...] = ()) -> str:
    """``k=v,...`` plus bare keys for "label exists"."""
    return ",".join([*(f"{k}={v}" for k, v in sorted(labels.items())), *exists])


class ClusterKube:
    """:class:`Kube` over the ``kubernetes`` client; one instance (one connection pool) per process."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            configuration = client.Configuration.get_default_copy()
            configuration.connection_pool_maxsize = 64
            api_client = client.ApiClient(configuration)
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @staticmethod
    def _json(response: object) -> dict[str, Any]:
        raw = raw_response(response)
        try:
            obj: dict[str, Any] = json.loads(raw.data)
            return obj
        finally:
            raw.release_conn()

    def _read(self, fn: Callable[..., object], namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._json(fn(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise errors.ApplyFailed(f"reading {name} failed: HTTP {exc.status} {exc.reason}") from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"reading {name}", exc) from None

    def read_config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        obj = self._read(self.core.read_namespaced_config_map, namespace, name)
        return None if obj is None else dict(obj.get("data") or {})

    def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        obj = self._read(self.core.read_namespaced_secret, namespace, name)
        if obj is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}

    def read_persistent_volume_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_persistent_volume_claim, namespace, name)

    def read_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kvpilot.operator import api

        def get(name_: str, namespace_: str, **kw: Any) -> object:
            return self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace_, api.PLURAL, name_, **kw
            )

        return self._read(get, namespace, name)

    def patch_inference_service_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        from kvpilot.operator import api

        try:
            return self._json(
                self.custom.patch_namespaced_custom_object_status(
                    api.GROUP,
                    api.VERSION,
                    namespace,
                    api.PLURAL,
                    name,
                    dict(body),
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(f"patching the status of {namespace}/{name}: HTTP 409 {exc.reason}") from None
            raise errors.ApplyFailed(
                f"patching the status of {namespace}/{name} failed: HTTP {exc.status} {exc.reason}"
            ) from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"patching the status of {namespace}/{name}", exc) from None

    def list_node_labels(self, label_selector: str) -> list[dict[str, str]]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self._json(self.core.list_node(label_selector=label_selector, _preload_content=False))
        except ApiException as exc:
            raise errors.ApplyFailed(f"listing nodes failed: HTTP {exc.status} {exc.reason}") from None
        except (OSError, HTTPError) as exc:
            raise _unreachable("listing nodes", exc) from None
        return [dict(item["metadata"].get("labels") or {}) for item in obj.get("items", [])]

    def _list(self, what: str, fn: Callable[..., object], **kwargs: Any) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self._json(fn(_preload_content=False, **kwargs))
        except ApiException as exc:
            raise errors.ApplyFailed(f"listing {what} failed: HTTP {exc.status} {exc.reason}") from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"listing {what}", exc) from None
        return list(obj.get("items") or [])

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._list("nodes", self.core.list_node)

    def list_autoscalers(self, namespace: str) -> list[dict[str, Any]]:
        from kubernetes import client

        hpa = client.AutoscalingV2Api(self.api_client).list_namespaced_horizontal_pod_autoscaler
        return self._list("horizontalpodautoscalers", hpa, namespace=namespace)

    def list_active_pods(self) -> list[dict[str, Any]]:
        return self._list(
            "pods", self.core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS_FIELD_SELECTOR
        )

    def read_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        return self.read_object(kind, namespace, name)

    def _custom(self, kind: str, verb: str) -> Callable[..., object]:
        """A custom object's ``get`` or ``patch``, called as the typed APIs are (name, namespace)."""
        group, version, plural = CUSTOM_KINDS[kind]
        call = getattr(self.custom, f"{verb}_namespaced_custom_object")

        def fn(name: str, namespace: str, *args: Any, **kw: Any) -> object:
            return cast(object, call(group, version, namespace, plural, name, *args, **kw))

        return fn

    def serves_kind(self, kind: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        group, version, plural = CUSTOM_KINDS[kind]
        try:
            found = self._json(self.custom.get_api_resources(group, version, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise errors.ApplyFailed(
                f"discovering {group}/{version} failed: HTTP {exc.status} {exc.reason}"
            ) from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"discovering {group}/{version}", exc) from None
        return any(r.get("name") == plural for r in found.get("resources") or ())

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind in CUSTOM_KINDS:
            return self._read(self._custom(kind, "get"), namespace, name)
        fn = {
            "Deployment": self.apps.read_namespaced_deployment,
            "StatefulSet": self.apps.read_namespaced_stateful_set,
            "Service": self.core.read_namespaced_service,
            "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim,
            "PodDisruptionBudget": self.policy.read_namespaced_pod_disruption_budget,
        }[kind]
        return self._read(fn, namespace, name)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._list(
            "pods", self.core.list_namespaced_pod, namespace=namespace, label_selector=label_selector
        )

    def read_previous_log(
        self, namespace: str, pod: str, container: str, tail_lines: int
    ) -> str | pod_logs.UnreadLog | None:
        return fetch_previous_log(self.core, namespace, pod, container, tail_lines)

    def evict_pod(self, namespace: str, name: str) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            response = raw_response(
                self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
            )
            response.drain_conn()
            response.release_conn()
        except ApiException as exc:
            if exc.status == 429:  # a PodDisruptionBudget allows no disruption now
                return False
            if exc.status == 404:
                return True
            raise errors.ApplyFailed(f"evicting pod {name} failed: HTTP {exc.status} {exc.reason}") from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"evicting pod {name}", exc) from None
        return True

    def apply(self, manifest: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        kind, meta = manifest["kind"], manifest["metadata"]
        fn = (
            self._custom(kind, "patch")
            if kind in CUSTOM_KINDS
            else {
                "Deployment": self.apps.patch_namespaced_deployment,
                "Service": self.core.patch_namespaced_service,
                "PersistentVolumeClaim": self.core.patch_namespaced_persistent_volume_claim,
                "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
            }[kind]
        )
        try:
            response = raw_response(
                fn(
                    meta["name"],
                    meta["namespace"],
                    dict(manifest),
                    field_manager=FIELD_MANAGER,
                    force=True,
                    _content_type=APPLY_CONTENT_TYPE,
                    _preload_content=False,
                )
            )
            response.drain_conn()  # an unread body would poison the pooled connection
            response.release_conn()
        except ApiException as exc:
            detail = exc.body if isinstance(exc.body, str) else exc.reason
            if exc.status in (400, 422):
                raise errors.ApplyRejected(
                    f"the API server refused {kind} {meta['name']}: HTTP {exc.status} {detail}"
                ) from None
            raise errors.ApplyFailed(
                f"applying {kind} {meta['name']} failed: HTTP {exc.status} {detail}"
            ) from None
        except (OSError, HTTPError) as exc:  # connection refused / reset / protocol errors
            raise _unreachable(f"applying {kind} {meta['name']}", exc) from None


class Conflict(errors.ApplyFailed):
    """HTTP 409: the object changed since it was read (a stale ``resourceVersion``), or it already exists."""


PROFILE_PLURAL = "tuningprofiles"
"""The cluster-scoped TuningProfile kind (crds/tuningprofiles.kvpilot.io.yaml; :mod:`.profiles`)."""


class ClusterProfiles:
    """TuningProfiles over the ``kubernetes`` client: list, read, create, and a merge patch of the status
    that carries the ``resourceVersion`` read (the API server refuses it with 409 if another writer came
    between: :class:`Conflict`). Shares :class:`ClusterKube`'s ``ApiClient``."""

    def __init__(self, kube: ClusterKube) -> None:
        self.kube = kube

    def _call(self, what: str, fn: Callable[..., object], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        from kvpilot.operator import api

        try:
            return self.kube._json(
                fn(api.GROUP, api.VERSION, PROFILE_PLURAL, *args, _preload_content=False, **kwargs)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(f"{what}: HTTP 409 {exc.reason}") from None
            raise errors.ApplyFailed(f"{what} failed: HTTP {exc.status} {exc.reason}") from None
        except (OSError, HTTPError) as exc:
            raise _unreachable(f"{what}", exc) from None

    def list_profiles(self) -> list[dict[str, Any]]:
        obj = self._call("listing tuningprofiles", self.kube.custom.list_cluster_custom_object)
        return list((obj or {}).get("items") or [])

    def read_profile(self, name: str) -> dict[str, Any] | None:
        return self._call(f"reading tuningprofile {name}", self.kube.custom.get_cluster_custom_object, name)

    def create_profile(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        obj = self._call(
            f"creating tuningprofile {name}", self.kube.custom.create_cluster_custom_object, dict(body)
        )
        if obj is None:
            raise errors.ApplyFailed(f"creating tuningprofile {name}: the CRD is not installed (HTTP 404)")
        return obj

    def patch_profile_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A JSON merge patch of ``/status``; ``body.metadata.resourceVersion`` makes it conditional."""
        return self._call(
            f"patching tuningprofile {name}",
            self.kube.custom.patch_cluster_custom_object_status,
            name,
            dict(body),
            _content_type="application/merge-patch+json",
        )


async def fetch_nodes(kube: Kube) -> list[dict[str, Any]]:
    """Every node, read in a worker thread."""
    return await asyncio.to_thread(kube.list_nodes)


class NodeList:
    """Every node (:func:`fetch_nodes`), kept for ``ttl_s`` seconds; concurrent misses wait for one listing.

    For the closed loop's "could this pod ever fit" check, which each tick of a service with a pending pod
    makes: at 1000 services, one LIST of every node per service per tick otherwise (docs/operator.md,
    "Scale"). What a node can ever hold changes rarely; a rollout's capacity check reads fresh nodes."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._nodes: tuple[float, list[dict[str, Any]]] | None = None
        self._lock: asyncio.Lock | None = None

    async def fetch(self, kube: Kube, now: float) -> list[dict[str, Any]]:
        """The nodes, listed again when the last listing is ``ttl_s`` older than ``now`` (the caller's
        clock: the closed loop's)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._nodes is None or not 0 <= now - self._nodes[0] < self.ttl_s:
                self._nodes = (now, await fetch_nodes(kube))
            return self._nodes[1]


async def fetch_active_pods(kube: Kube) -> list[dict[str, Any]]:
    """Every unfinished pod of the cluster, read in a worker thread."""
    return await asyncio.to_thread(kube.list_active_pods)


_lock = threading.Lock()
_default: ClusterKube | None = None


def get_kube() -> ClusterKube:
    """The process-wide :class:`ClusterKube`, created on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = ClusterKube()
        return _default


def _unreachable(what: str, exc: BaseException) -> errors.ApplyFailed:
    """A transport failure (connection refused or reset, a protocol error) as tenant-visible text: the kind of
    failure only; the exception's own words (addresses, the API server's answer) go to the operator's log."""
    logging.getLogger(__name__).warning(f"{what} failed: {exc!r}")
    return errors.ApplyFailed(
        f"{what} failed: {type(exc).__name__} talking to the API server (details in the operator's log)"
    )


def fetch_previous_log(
    core: Any, namespace: str, pod: str, container: str, tail_lines: int
) -> str | pod_logs.UnreadLog:
    """The tail of ``container``'s previous log in ``pod`` (``core``: a ``CoreV1Api``,
    ``pods/log?previous=true``), or why it could not be read (:func:`.pod_logs.compute_unread_log`)."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = raw_response(
            core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                previous=True,
                tail_lines=tail_lines,
                _preload_content=False,
            )
        )
    except ApiException as exc:
        status = int(exc.status) if exc.status else None
        return pod_logs.compute_unread_log(status, str(exc.body or ""), namespace)
    except (OSError, HTTPError) as exc:
        return pod_logs.compute_unread_log(None, type(exc).__name__, namespace)
    try:
        return bytes(response.data).decode("utf-8", "replace")
    finally:
        response.release_conn()
