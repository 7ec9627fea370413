"""Resolve what the planner needs: the model's config and the GPU it will run on.

* Model config (``spec.model.source``): the built-in catalogue
  (:func:`kvpilot.tuner.model.lookup_model_config`), a ConfigMap's ``config.json``
  (:mod:`.model_files`), or the Hugging Face Hub (:mod:`.hub`; optionally with a token from a Secret;
  the token is never logged, cached on disk by us, or written to status). A multimodal model's
  processor files come with its config from the ConfigMap or the Hub (:class:`.model_files.ModelFiles`);
  the catalogue has none, so its models get transformers' default pixel budgets. An ``eagle3`` or
  ``draft_model`` ``--speculative-config`` in the engine's arguments: its drafter's config.json comes from
  the same source (:mod:`.drafts`: the ConfigMap's ``draft_config.json``, the draft's Hub id), is checked,
  and is part of the model key.
* GPU: ``spec.gpu.product`` through the catalogue (:func:`kvpilot.tuner.gpus.lookup_gpu`),
  else discovered from the GPU Feature Discovery labels of the nodes matching
  ``spec.nodeSelector`` (:func:`kvpilot.tuner.gpus.build_gpu_from_labels`).

The sync ``read_*`` functions do the I/O through a :class:`~kvpilot.operator.clients.kube.Kube`;
:func:`fetch_inputs` runs them in a worker thread. Caches keep 1000 objects of a
few models from costing 1000 Hub downloads, spec builds or node listings:
Hub models by (id, revision, token digest), ModelSpecs by the files' content, node labels for
:data:`NODE_CACHE_TTL_S` per selector.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import IO_POOL, Kube, build_label_selector
from kvpilot.operator.planning import drafts
from kvpilot.operator.planning.hub import download_hub_draft_config, download_hub_files
from kvpilot.operator.planning.model_files import (
    DRAFT_CONFIG_KEY,
    ModelFiles,
    compute_draft_key,
    compute_files_key,
    read_config_map_files,
)
from kvpilot.tuner import gpus, memory, vllm
from kvpilot.tuner.model import (
    ModelSpec,
    apply_processor_files,
    build_model_spec,
    lookup_checkpoint_bytes,
    lookup_model_config,
)
from kvpilot.tuner.types import GpuSpec

NODE_CACHE_TTL_S = 30.0

HubDownload = Callable[[str, str | None, str | None], ModelFiles]
"""``(model id, revision, token) -> the model's files`` (:func:`.hub.download_hub_files`); raises operator
or tuner errors."""
DraftDownload = Callable[[str, str | None, str | None], Mapping[str, Any] | None]
"""``(draft id, revision, token) -> the drafter's config.json`` (:func:`.hub.download_hub_draft_config`;
``None``: offline, none cached)."""


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    spec: ModelSpec
    config_key: str
    """Digest of the files the plan read (:func:`.model_files.compute_files_key`): the ModelSpec cache's and
    the TuningProfiles' model key."""
    origin: str
    """Where the config came from, for people: ``catalogue``, ``ConfigMap ns/name``, ``Hugging Face Hub``."""
    checkpoint_bytes: int | None = None
    draft_config: Mapping[str, Any] | None = field(default=None, hash=False)
    """The drafter's config.json, for an ``eagle3`` or ``draft_model`` speculative config (:mod:`.drafts`;
    part of :attr:`config_key`); ``None``: none asked for, or none read (then :attr:`draft_hint`)."""
    draft_hint: str | None = None
    """How to give the drafter's config.json with this source, where it was asked for and not read."""

    def with_draft(self, flags: vllm.EngineFlags) -> vllm.EngineFlags:
        """``flags`` whose speculative decoding carries this model's drafter config.json (or, where it was
        not read, the advice :attr:`draft_hint`): what every budget of the service plans with."""
        return drafts.with_draft_config(flags, self.draft_config, self.draft_hint)


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
"""ModelSpec per files content key (:func:`.model_files.compute_files_key`)."""
_CATALOGUE = _Lru[tuple[str, int | None], ResolvedModel](256)
"""The resolved catalogue model per (model id, checkpoint bytes)."""
_HUB_DRAFTS = _Lru[tuple[str, str | None, str | None, str], Mapping[str, Any]](64)
"""Drafters' config.json downloaded from the Hub and checked, by (draft id, revision, SHA-256 of the token or
None, method): the tuner reads the document itself (:attr:`ResolvedModel.draft_config`), so fewer entries,
each at most :data:`kvpilot.tuner.model.MAX_CONFIG_BYTES` (published ones are a few KB)."""


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


def build_model(files: ModelFiles, origin: str, checkpoint_bytes: int | None = None) -> ResolvedModel:
    """The tuner's ModelSpec for ``files``: config.json's, with the processor files' pixel budgets, as
    ``kvpilot plan --config FOLDER`` builds it (cached by content); InvalidModelConfig if unaccountable."""
    key = compute_files_key(files)
    spec = _MODEL_SPECS.get(key)
    if spec is None:
        spec = apply_processor_files(build_model_spec(files.config), files.processors)
        _MODEL_SPECS.put(key, spec)
    return ResolvedModel(spec, key, origin, checkpoint_bytes, files.draft)


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


def read_model(
    model: api.ModelRef,
    namespace: str,
    kube: Kube | None,
    hub: HubDownload = download_hub_files,
    speculative: vllm.SpeculativeFlags | None = None,
    draft_hub: DraftDownload = download_hub_draft_config,
) -> ResolvedModel:
    """The resolved model of ``spec.model`` (sync; I/O through ``kube``, ``hub`` and ``draft_hub``).
    ``speculative``: the engine's speculative decoding; the config.json of a drafter it loads comes from
    the same source (:mod:`.drafts`)."""
    drafted = speculative if drafts.needs_draft_config(speculative) else None
    if model.source == "Catalogue":
        cached = _CATALOGUE.get((model.id, model.checkpoint_bytes))
        if cached is None:
            config = lookup_model_config(model.id)
            checkpoint = model.checkpoint_bytes or lookup_checkpoint_bytes(model.id)
            cached = build_model(ModelFiles(config), "the built-in catalogue", checkpoint)
            _CATALOGUE.put((model.id, model.checkpoint_bytes), cached)
        return cached if drafted is None else _without_draft(cached, model, namespace, drafted)
    if kube is None:
        raise errors.InvalidSpec(f"source {model.source} needs a cluster; without one use source: Catalogue")
    if model.source == "ConfigMap":
        assert model.config_map_ref is not None  # CEL / semantic_errors guarantee it
        ref = model.config_map_ref
        files = read_config_map_files(ref, namespace, kube, with_draft=drafted is not None)
        origin = f"ConfigMap {namespace}/{ref.name}"
        if drafted is not None and files.draft is not None:
            origin += f" (the draft's config.json under {DRAFT_CONFIG_KEY!r})"
            where = f"the draft's config.json in ConfigMap {namespace}/{ref.name} key {DRAFT_CONFIG_KEY!r}"
            drafts.check_draft_config(drafted, files.draft, where)
        resolved = build_model(files, origin, model.checkpoint_bytes)
        if drafted is None or files.draft is not None:
            return resolved
        return _without_draft(resolved, model, namespace, drafted)
    # The token is read on every resolve, so a deleted Secret or key is reported even on a cache hit, and
    # the cache is keyed on a digest of it: one tenant's access never serves a request made without it.
    token = read_hub_token(model.hub_token_secret_ref, namespace, kube)
    token_key = hashlib.sha256(token.encode()).hexdigest() if token else None
    cache_key = (model.id, model.revision, token_key)
    cached = _HUB_MODELS.get((*cache_key, model.checkpoint_bytes))
    if cached is None:
        files = hub(model.id, model.revision, token)
        cached = build_model(files, "the Hugging Face Hub", model.checkpoint_bytes)
        _HUB_MODELS.put((*cache_key, model.checkpoint_bytes), cached)
    if drafted is None:
        return cached
    draft_id = drafts.find_hub_draft(drafted)
    if draft_id is None:  # a path in the pod: nothing to download
        return _without_draft(cached, model, namespace, drafted)
    revision = drafted.draft_revision
    draft_key = (draft_id, revision, token_key, drafted.method)
    draft_config = _HUB_DRAFTS.get(draft_key)
    if draft_config is None:
        drafts.check_hub_draft(draft_id, revision)
        draft_config = draft_hub(draft_id, revision, token)
        if draft_config is None:  # offline, not cached: planned without it, the plan warns
            return _without_draft(cached, model, namespace, drafted)
        where = f"the config.json of the draft model {draft_id}@{revision or 'main'}"
        drafts.check_draft_config(drafted, draft_config, where)
        _HUB_DRAFTS.put(draft_key, draft_config)
    key = compute_draft_key(cached.config_key, draft_config)
    origin = f"{cached.origin} (and the draft model {draft_id}@{revision or 'main'}'s config.json)"
    return dataclasses.replace(cached, config_key=key, origin=origin, draft_config=draft_config)


def _without_draft(
    resolved: ResolvedModel, model: api.ModelRef, namespace: str, speculative: vllm.SpeculativeFlags
) -> ResolvedModel:
    """``resolved`` noting how to give the drafter's config.json it could not read (the plan warns)."""
    return dataclasses.replace(resolved, draft_hint=drafts.describe_draft_hint(model, namespace, speculative))


def read_engine_speculative(spec: api.InferenceServiceSpec) -> vllm.SpeculativeFlags | None:
    """The speculative decoding of a vLLM service's ``spec.engine.extraArgs`` (``None``: none, or another
    engine's arguments)."""
    if spec.engine.kind != "vLLM":
        return None
    return vllm.read_speculative_flags(spec.engine.extra_args)


def read_spec_model(
    spec: api.InferenceServiceSpec, namespace: str, kube: Kube | None, hub: HubDownload = download_hub_files
) -> ResolvedModel:
    """:func:`read_model` of ``spec.model``, with the drafter of ``spec.engine``'s speculative decoding."""
    return read_model(spec.model, namespace, kube, hub, read_engine_speculative(spec))


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
    spec: api.InferenceServiceSpec, namespace: str, kube: Kube | None, hub: HubDownload = download_hub_files
) -> Inputs:
    """Resolve model and GPU in a worker thread (the kubernetes client and the Hub are blocking)."""

    def _both() -> Inputs:
        return Inputs(read_spec_model(spec, namespace, kube, hub), read_gpu(spec, kube))

    return await asyncio.get_running_loop().run_in_executor(IO_POOL, _both)


def clear_caches() -> None:
    """Forget cached Hub models, ModelSpecs and node labels (tests)."""
    _HUB_MODELS.data.clear()
    _MODEL_SPECS.data.clear()
    _CATALOGUE.data.clear()
    _HUB_DRAFTS.data.clear()
    NODES.clear()
