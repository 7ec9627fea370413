"""Resolve what the planner needs: the model's config and the GPU it will run on.

* Model config (``spec.model.source``): the built-in catalogue
  (:func:`kvpilot.tuner.model.lookup_model_config`), a ConfigMap's ``config.json``,
  or the Hugging Face Hub (optionally with a token from a Secret; the token is never
  logged, cached on disk by us, or written to status).
* GPU: ``spec.gpu.product`` through the catalogue (:func:`kvpilot.tuner.gpus.lookup_gpu`),
  else discovered from the GPU Feature Discovery labels of the nodes matching
  ``spec.nodeSelector`` (:func:`kvpilot.tuner.gpus.build_gpu_from_labels`).

The sync ``read_*`` functions do the I/O through a :class:`~kvpilot.operator.clients.kube.Kube`;
:func:`fetch_inputs` runs them in a worker thread. Caches keep 1000 objects of a
few models from costing 1000 Hub downloads, spec builds or node listings:
Hub configs by (id, revision, token digest), ModelSpecs by config content, node labels for
:data:`NODE_CACHE_TTL_S` per selector.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import IO_POOL, Kube, build_label_selector
from kvpilot.operator.clients.prometheus_errors import redact_text
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import gpus, memory
from kvpilot.tuner.model import (
    MAX_CONFIG_BYTES,
    QUANT_SIDECAR,
    ModelSpec,
    build_config_with_quant_sidecar,
    build_model_spec,
    is_quantization_in_config,
    lookup_checkpoint_bytes,
    lookup_model_config,
    parse_config_json,
)
from kvpilot.tuner.types import GpuSpec

logger = logging.getLogger(__name__)

NODE_CACHE_TTL_S = 30.0
HUB_TIMEOUT_S = 10.0

HubDownload = Callable[[str, str | None, str | None], dict[str, Any]]
"""``(model id, revision, token) -> config.json``; raises operator or tuner errors."""


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    spec: ModelSpec
    config_key: str
    """Digest of the config.json content (cache key)."""
    origin: str
    """Where the config came from, for people: ``catalogue``, ``ConfigMap ns/name``, ``Hugging Face Hub``."""
    checkpoint_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ResolvedGpu:
    gpu: GpuSpec
    products: tuple[str, ...]
    """``nvidia.com/gpu.product`` values the pods may land on (empty: no GPU product selector)."""
    origin: str
    warnings: tuple[str, ...] = ()


_K = TypeVar("_K")
_V = TypeVar("_V")


class _Lru(Generic[_K, _V]):
    """A small thread-safe LRU map (the handlers run concurrently)."""

    def __init__(self, size: int) -> None:
        self.size, self.data, self.lock = size, OrderedDict[_K, _V](), threading.Lock()

    def get(self, key: _K) -> _V | None:
        with self.lock:
            if key in self.data:
                self.data.move_to_end(key)
                return self.data[key]
            return None

    def put(self, key: _K, value: _V) -> None:
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)


_HUB_MODELS = _Lru[tuple[str, str | None, str | None, int | None], ResolvedModel](256)
"""Models resolved from the Hub by (model id, revision, SHA-256 of the token or None, checkpoint bytes): what
the memory model needs (a ModelSpec of a few KB), never the config documents, so the operator's memory is
bounded by entries of a known size whatever configs the tenants name."""
_MODEL_SPECS = _Lru[str, ModelSpec](256)
"""ModelSpec per config content key (:func:`compute_config_key`)."""
_CATALOGUE = _Lru[tuple[str, int | None], ResolvedModel](256)
"""The resolved catalogue model per (model id, checkpoint bytes)."""


@dataclass
class NodeCache:
    """Node labels per selector, for ``ttl_s`` seconds (``clock`` is injectable for tests)."""

    ttl_s: float = NODE_CACHE_TTL_S
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, tuple[float, list[dict[str, str]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _flights: dict[str, threading.Lock] = field(default_factory=dict)

    def list(self, kube: Kube, selector: str) -> list[dict[str, str]]:
        """Cached labels; concurrent misses for one selector wait for a single listing."""
        with self._lock:
            flight = self._flights.setdefault(selector, threading.Lock())
        with flight:
            now = self.clock()
            with self._lock:
                hit = self._entries.get(selector)
                if hit is not None and now - hit[0] < self.ttl_s:
                    return hit[1]
            labels = kube.list_node_labels(selector)
            with self._lock:
                self._entries[selector] = (self.clock(), labels)
            return labels

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


NODES = NodeCache()


# --------------------------------------------------------------------------- model


def compute_checkpoint_bytes(model: ResolvedModel) -> int:
    """The checkpoint's size on disk: the recorded one (catalogue or ``spec.model.checkpointBytes``), else
    the memory model's weight bytes of the whole model. It sizes the weight cache and the start-up
    probe's budget (the reconciler and the closed loop render the same Deployment from it)."""
    return model.checkpoint_bytes or memory.compute_weight_bytes(model.spec)


def compute_config_key(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_model(config: Mapping[str, Any], origin: str, checkpoint_bytes: int | None = None) -> ResolvedModel:
    """The tuner's ModelSpec for ``config`` (cached by content); InvalidModelConfig if unaccountable."""
    key = compute_config_key(config)
    spec = _MODEL_SPECS.get(key)
    if spec is None:
        spec = build_model_spec(config)
        _MODEL_SPECS.put(key, spec)
    return ResolvedModel(spec, key, origin, checkpoint_bytes)


def _parse_config_json(text: str | bytes, where: str) -> dict[str, Any]:
    """The config.json object; not JSON, over 1 MiB or nested too deep: InvalidModelConfig (not retried)."""
    return parse_config_json(text, where)


def read_config_map_config(ref: api.ConfigMapRef, namespace: str, kube: Kube) -> dict[str, Any]:
    data = kube.read_config_map_data(namespace, ref.name)
    if data is None:
        raise errors.ConfigNotFound(
            f"ConfigMap {namespace}/{ref.name} (spec.model.configMapRef) does not exist; create it with the "
            f"model's config.json under key {ref.key!r}: kubectl create configmap {ref.name} "
            f"--from-file={ref.key}=config.json"
        )
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise errors.ConfigNotFound(
            f"ConfigMap {namespace}/{ref.name} has no key {ref.key!r} (keys: {keys}); put config.json there "
            "or set spec.model.configMapRef.key"
        )
    config = _parse_config_json(data[ref.key], f"ConfigMap {namespace}/{ref.name} key {ref.key!r}")
    if QUANT_SIDECAR not in data or ref.key == QUANT_SIDECAR:
        return config
    where = f"ConfigMap {namespace}/{ref.name} key {QUANT_SIDECAR!r}"
    sidecar = _parse_config_json(data[QUANT_SIDECAR], where)
    return dict(build_config_with_quant_sidecar(config, sidecar))


def read_hub_token(ref: api.SecretRef | None, namespace: str, kube: Kube) -> str | None:
    if ref is None:
        return None
    data = kube.read_secret_data(namespace, ref.name)
    if data is None or ref.key not in data:
        raise errors.ConfigNotFound(
            f"Secret {namespace}/{ref.name} with key {ref.key!r} (spec.model.hubTokenSecretRef) "
            "does not exist; "
            f"create it: kubectl create secret generic {ref.name} --from-literal={ref.key}=<hf token>"
        )
    return data[ref.key].strip()


def download_hub_config(model_id: str, revision: str | None, token: str | None) -> dict[str, Any]:
    """config.json from the Hugging Face Hub (``huggingface_hub``), errors mapped to retry or not.

    ``huggingface_hub`` retries connection errors itself (about 25 s) before it gives up; then the
    reconciliation fails with ``HubUnreachable`` and kopf retries with back-off.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise errors.InvalidSpec(
            "source: Hub needs the huggingface_hub package, which this operator image lacks; use source: "
            "ConfigMap or Catalogue, or install kvpilot with huggingface_hub"
        ) from None
    try:
        path = hf_hub_download(
            model_id, "config.json", revision=revision, token=token or False, etag_timeout=HUB_TIMEOUT_S
        )
    except Exception as exc:
        _log_hub_error(exc, model_id)
        raise compute_hub_error(exc, model_id, revision) from None
    config = _read_hub_json(path, f"config.json of {model_id}@{revision or 'main'}")
    if is_quantization_in_config(config):
        return config  # a quantization_config of its own: vLLM does not look for the sidecar
    try:  # ModelOpt's older exports keep the quantization beside config.json; most checkpoints have none
        path = hf_hub_download(
            model_id, QUANT_SIDECAR, revision=revision, token=token or False, etag_timeout=HUB_TIMEOUT_S
        )
    except Exception as exc:
        _log_hub_error(exc, model_id)
        mapped = compute_hub_error(exc, model_id, revision)
        if isinstance(mapped, tuner_errors.InvalidModelConfig) or _hub_offline():
            return config  # not on the Hub, or offline (HF_HUB_OFFLINE) with only config.json cached: none
        raise mapped from None
    sidecar = _read_hub_json(path, f"{QUANT_SIDECAR} of {model_id}@{revision or 'main'}")
    return dict(build_config_with_quant_sidecar(config, sidecar))


def _log_hub_error(exc: Exception, model_id: str) -> None:
    """The Hub's words for the operator's owner only: redacted (no token, no userinfo), truncated."""
    logger.info("Hub request for %s failed: %s: %s", model_id, type(exc).__name__, redact_text(str(exc)))


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE``, as ``huggingface_hub`` read it: a cache-only operator never reaches the Hub."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _read_hub_json(path: str, where: str) -> dict[str, Any]:
    with open(path, "rb") as fh:  # bytes: parse_config_json refuses oversize and non-UTF-8 text itself
        raw = fh.read(MAX_CONFIG_BYTES + 1)  # one byte past the limit is enough to refuse a huge file
    return _parse_config_json(raw, where)


def compute_hub_error(exc: Exception, model_id: str, revision: str | None) -> Exception:
    """The operator or tuner error for a ``huggingface_hub`` failure (order matters: see the MRO notes)."""
    from huggingface_hub import errors as hf

    where = f"{model_id}@{revision or 'main'}"
    unreachable = errors.HubUnreachable(
        f"the Hugging Face Hub cannot be reached for {where} ({type(exc).__name__}); retrying with "
        "back-off. Without Hub access use source: ConfigMap or Catalogue"
    )
    # LocalEntryNotFoundError (no connection, nothing cached) is also an EntryNotFoundError: check it first.
    if isinstance(exc, hf.LocalEntryNotFoundError | hf.OfflineModeIsEnabled):
        return unreachable
    if isinstance(exc, hf.GatedRepoError):  # a RepositoryNotFoundError: check it first
        return errors.HubAccessDenied(
            f"{model_id} is gated on the Hugging Face Hub; accept its licence there and put a token with "
            "access in the Secret named by spec.model.hubTokenSecretRef"
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return tuner_errors.UnknownModel(
            f"Model {model_id!r} was not found on the Hugging Face Hub (or is private: then set "
            "spec.model.hubTokenSecretRef). Check spec.model.id."
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return tuner_errors.UnknownModel(
            f"Revision {revision!r} of {model_id} does not exist on the Hugging Face Hub; "
            "fix spec.model.revision"
        )
    if isinstance(exc, hf.EntryNotFoundError):
        return tuner_errors.InvalidModelConfig(
            f"{where} has no config.json on the Hub; give the config through a ConfigMap (source: ConfigMap)"
        )
    if isinstance(exc, hf.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return errors.HubAccessDenied(
                f"the Hugging Face Hub refused access to {where} (HTTP {status}); check the token Secret"
            )
        return errors.HubUnreachable(f"the Hugging Face Hub failed for {where} (HTTP {status}); retrying")
    if isinstance(exc, OSError) and exc.filename is not None:  # the local cache, not the network
        return errors.HubCacheUnwritable(
            f"the operator cannot write its Hugging Face cache to download {where} "
            f"({errno.errorcode.get(exc.errno or 0, type(exc).__name__)}); the platform team must give the "
            "operator a writable HF_HOME (the chart mounts an emptyDir there, hubCacheSizeLimit); retrying"
        )
    if isinstance(exc, OSError | TimeoutError) or "httpx" in type(exc).__module__:
        return unreachable
    # anything else: its text may quote the Hub's answer (status goes to the tenant): the class name only;
    # the operator's log has the text, redacted (download_hub_config)
    return errors.HubUnreachable(
        f"the Hugging Face Hub request for {where} failed ({type(exc).__name__}); retrying with back-off"
    )


def read_model(
    model: api.ModelRef, namespace: str, kube: Kube | None, hub: HubDownload = download_hub_config
) -> ResolvedModel:
    """The resolved model of ``spec.model`` (sync; I/O through ``kube`` and ``hub``)."""
    if model.source == "Catalogue":
        cached = _CATALOGUE.get((model.id, model.checkpoint_bytes))
        if cached is None:
            config = lookup_model_config(model.id)
            checkpoint = model.checkpoint_bytes or lookup_checkpoint_bytes(model.id)
            cached = build_model(config, "the built-in catalogue", checkpoint)
            _CATALOGUE.put((model.id, model.checkpoint_bytes), cached)
        return cached
    if kube is None:
        raise errors.InvalidSpec(f"source {model.source} needs a cluster; without one use source: Catalogue")
    if model.source == "ConfigMap":
        assert model.config_map_ref is not None  # CEL / semantic_errors guarantee it
        config = read_config_map_config(model.config_map_ref, namespace, kube)
        origin = f"ConfigMap {namespace}/{model.config_map_ref.name}"
        return build_model(config, origin, model.checkpoint_bytes)
    # The token is read on every resolve, so a deleted Secret or key is reported even on a cache hit, and
    # the cache is keyed on a digest of it: one tenant's access never serves a request made without it.
    token = read_hub_token(model.hub_token_secret_ref, namespace, kube)
    token_key = hashlib.sha256(token.encode()).hexdigest() if token else None
    cache_key = (model.id, model.revision, token_key)
    cached = _HUB_MODELS.get((*cache_key, model.checkpoint_bytes))
    if cached is None:
        config = hub(model.id, model.revision, token)
        cached = build_model(config, "the Hugging Face Hub", model.checkpoint_bytes)
        _HUB_MODELS.put((*cache_key, model.checkpoint_bytes), cached)
    return cached


# --------------------------------------------------------------------------- GPU


def _same_gpu(a: GpuSpec, b: GpuSpec) -> bool:
    return a.name == b.name


def read_gpu(spec: api.InferenceServiceSpec, kube: Kube | None, nodes: NodeCache = NODES) -> ResolvedGpu:
    """The GPU to plan for (sync; lists nodes only when spec.gpu.product is absent)."""
    selected = spec.node_selector.get(gpus.PRODUCT_LABEL)
    if spec.gpu.product:
        gpu = gpus.lookup_gpu(spec.gpu.product)
        if selected and not _same_gpu(gpus.lookup_gpu(selected), gpu):
            raise errors.InvalidSpec(
                f"spec.gpu.product {spec.gpu.product!r} and nodeSelector {gpus.PRODUCT_LABEL}={selected!r} "
                "name different GPUs; drop one of them"
            )
        if selected:
            products: tuple[str, ...] = (selected,)
        elif spec.gpu.product in gpu.gfd_products:
            products = (spec.gpu.product,)
        else:
            products = gpu.gfd_products
        return ResolvedGpu(gpu, products, "spec.gpu.product")
    if kube is None:
        if selected:
            return ResolvedGpu(
                gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: selected}),
                (selected,),
                f"nodeSelector {gpus.PRODUCT_LABEL}",
            )
        raise errors.InvalidSpec(
            "without a cluster the GPU cannot be discovered from node labels; set spec.gpu.product"
        )
    selector = build_label_selector(spec.node_selector, exists=(gpus.PRODUCT_LABEL,))
    labels = nodes.list(kube, selector)
    if not labels:
        raise errors.NoMatchingNodes(
            f"no node matches nodeSelector {dict(spec.node_selector) or '{}'} and carries a "
            f"{gpus.PRODUCT_LABEL} label (GPU Feature Discovery), so kvpilot cannot tell which GPU to plan "
            "for; fix spec.nodeSelector, "
            "set spec.gpu.product, or add GPU nodes. Retrying."
        )
    by_product: dict[str, list[dict[str, str]]] = {}
    for node in labels:
        by_product.setdefault(node[gpus.PRODUCT_LABEL], []).append(node)
    if len(by_product) > 1:
        seen = ", ".join(f"{p} ({len(n)} nodes)" for p, n in sorted(by_product.items()))
        raise errors.AmbiguousGpu(
            f"nodes matching nodeSelector carry several GPU products: {seen}; set spec.gpu.product or narrow "
            f"spec.nodeSelector (e.g. {gpus.PRODUCT_LABEL}: <one of them>)"
        )
    ((product, group),) = by_product.items()
    gpu = gpus.build_gpu_from_labels(group[0])
    warnings: tuple[str, ...] = ()
    most = max((gpus.gpu_count_from_labels(n) or 0) for n in group)
    if most and most < spec.gpu.count:
        warnings = (
            f"no {product} node has {spec.gpu.count} GPUs (at most {most}); the pods will not schedule",
        )
    return ResolvedGpu(gpu, (product,), f"GFD labels of {len(group)} matching node(s)", warnings)


# --------------------------------------------------------------------------- async entry point


@dataclass(frozen=True, slots=True)
class Inputs:
    model: ResolvedModel
    gpu: ResolvedGpu


async def fetch_inputs(
    spec: api.InferenceServiceSpec, namespace: str, kube: Kube | None, hub: HubDownload = download_hub_config
) -> Inputs:
    """Resolve model and GPU in a worker thread (the kubernetes client and the Hub are blocking)."""

    def _both() -> Inputs:
        return Inputs(read_model(spec.model, namespace, kube, hub), read_gpu(spec, kube))

    return await asyncio.get_running_loop().run_in_executor(IO_POOL, _both)


def clear_caches() -> None:
    """Forget cached Hub configs, ModelSpecs and node labels (tests)."""
    _HUB_MODELS.data.clear()
    _MODEL_SPECS.data.clear()
    _CATALOGUE.data.clear()
    NODES.clear()
