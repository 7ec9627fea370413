"""The TuningProfile edge: the profile a service matches, read for the planner and written from observations.

The math is pure in :mod:`kvpilot.tuner.plan.profiles`, whose profile a service reads and teaches in
:mod:`.profile_scope`; this module turns objects into its types and back, and does the I/O (through
:class:`ProfileStore`, which :class:`kvpilot.operator.clients.kube.ClusterProfiles` implements):

* **read** (:func:`fetch_learned`): every reconcile that plans looks its key up in one cluster-wide list,
  cached for :data:`LIST_TTL_S` (a thousand services created at once cost a handful of LISTs, not a GET
  each); a deleted profile stops being used within that time;
* **write** (:func:`apply_samples`): read the profile fresh, add the sample, merge-patch ``/status`` with the
  ``resourceVersion`` read; another writer in between makes the API server answer 409 and the whole
  read-add-patch repeats (:data:`WRITE_ATTEMPTS`). An absent profile is created first (a racing creator's
  409 is the same retry).
* **batched** (:func:`record_samples`): the samples the ticks of many services bring for one profile within
  :data:`BATCH_WINDOW_S` of the first are written together, in one read-add-patch: a thousand services that
  start at once (each with a start-up sample) cost a few writes per profile, not a read, a patch and a
  conflict or two per service.
* **bounded** (:func:`record_observations`): a KV report above what the GPU could hold
  (:func:`kvpilot.tuner.plan.profiles.compute_kv_ceiling`) is refused, logged and counted
  (``kvpilot_profile_samples_refused_total``), never learned;
* **frozen**: a profile whose ``spec.frozen`` an administrator set is still read, never written.

Failures here never fail a reconcile or a tick: a plan without the profile is the memory model's plan, and
a lost sample is one sample.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvpilot.operator import api, errors
from kvpilot.operator.clients import metrics
from kvpilot.operator.clients.kube import PROFILE_PLURAL, Conflict
from kvpilot.operator.planning.profile_legacy import build_legacy_message, compute_legacy_matches
from kvpilot.operator.planning.profile_scope import Keys, choose_learned
from kvpilot.tuner.plan.profiles import (
    HealthySample,
    KvSample,
    Learned,
    OomSample,
    ProfileKey,
    ProfileRecord,
    StartupSample,
    add_healthy,
    add_kv_sample,
    add_oom,
    add_startup,
    compute_kv_ceiling,
    compute_learned,
)
from kvpilot.tuner.types import EngineSettings, MemoryBudget

KIND = "TuningProfile"
LIST_TTL_S = 10.0
WRITE_ATTEMPTS = 5
BATCH_WINDOW_S = 2.0
"""How long the first sample for a profile waits for others before they are written together."""
LABEL_PREFIX = "profiles.kvpilot.io/"
Update = Callable[[ProfileRecord], ProfileRecord]


@runtime_checkable
class ProfileStore(Protocol):
    def list_profiles(self) -> list[dict[str, Any]]: ...

    def read_profile(self, name: str) -> dict[str, Any] | None: ...

    def create_profile(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def patch_profile_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...


_stores: dict[int, ProfileStore] = {}


def store_for(kube: object) -> ProfileStore | None:
    """The profile store beside a :class:`~kvpilot.operator.clients.kube.Kube`: the cluster's on its
    ``ApiClient``, or
    the object itself when it has the store's methods (tests), else ``None`` (profiles unused)."""
    from kvpilot.operator.clients.kube import ClusterKube, ClusterProfiles

    if isinstance(kube, ClusterKube):
        if id(kube) not in _stores:
            _stores[id(kube)] = ClusterProfiles(kube)
        return _stores[id(kube)]
    return kube if isinstance(kube, ProfileStore) else None


# --- key, object, wire format ---------------------------------------------------------------------------


SCOPE_NAMESPACE, SCOPE_SHARED = "Namespace", "Shared"


def build_labels(key: ProfileKey) -> dict[str, str]:
    """The readable key (label values: the digest is hex, the GPU a catalogue name, versions dotted); the
    scope and the namespace, so ``kubectl get kvtp -l profiles.kvpilot.io/namespace=team-a`` lists one
    tenant's profiles."""
    scope = {f"{LABEL_PREFIX}scope": SCOPE_SHARED if key.shared else SCOPE_NAMESPACE}
    if not key.shared:
        scope[f"{LABEL_PREFIX}namespace"] = key.namespace
    return {
        "app.kubernetes.io/managed-by": "kvpilot",
        **scope,
        f"{LABEL_PREFIX}engine-digest": key.engine_digest,
        f"{LABEL_PREFIX}model-digest": key.model_digest,
        f"{LABEL_PREFIX}gpu": key.gpu,
        f"{LABEL_PREFIX}vllm-version": key.vllm_version,
        f"{LABEL_PREFIX}kv-cache-dtype": key.kv_cache_dtype,
        f"{LABEL_PREFIX}tensor-parallel-size": str(key.tensor_parallel_size),
        f"{LABEL_PREFIX}pipeline-parallel-size": str(key.pipeline_parallel_size),
        f"{LABEL_PREFIX}memory-model-version": key.memory_model_version,
    }


def build_profile(key: ProfileKey, model_id: str) -> dict[str, Any]:
    """A new, empty profile object for ``key``."""
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": KIND,
        "metadata": {"name": key.name, "labels": build_labels(key)},
        "spec": {
            "scope": SCOPE_SHARED if key.shared else SCOPE_NAMESPACE,
            **({} if key.shared else {"namespace": key.namespace}),
            "engineDigest": key.engine_digest,
            "modelDigest": key.model_digest,
            "modelId": model_id,
            "gpu": key.gpu,
            "vllmVersion": key.vllm_version,
            "kvCacheDtype": key.kv_cache_dtype,
            "tensorParallelSize": key.tensor_parallel_size,
            "pipelineParallelSize": key.pipeline_parallel_size,
            "memoryModelVersion": key.memory_model_version,
        },
    }


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def read_record(status: Mapping[str, Any] | None, shared: bool = False) -> ProfileRecord:
    """The samples of a profile's ``status`` (``shared``: a shared profile's); KeyError / TypeError /
    ValueError on an entry the CRD schema would not have let through (a hand-edited object on an older
    CRD)."""
    s = status or {}
    kv, ooms, healthy, startups = [], [], [], []
    for e in s.get("kvSamples") or ():
        kv.append(KvSample(str(e["source"]), int(e["predictedTokens"]), int(e["observedTokens"])))
    for e in s.get("oomSamples") or ():
        ooms.append(
            OomSample(
                str(e["source"]),
                float(e["gpuMemoryUtilization"]),
                _opt_int(e.get("maxNumSeqs")),
                _opt_int(e.get("maxNumBatchedTokens")),
            )
        )
    for e in s.get("healthySamples") or ():
        healthy.append(
            HealthySample(str(e["source"]), float(e["gpuMemoryUtilization"]), _opt_int(e.get("maxNumSeqs")))
        )
    for e in s.get("startupSamples") or ():
        startups.append(StartupSample(str(e["source"]), float(e["seconds"])))
    return ProfileRecord(tuple(kv), tuple(ooms), tuple(healthy), tuple(startups), shared=shared)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def build_status(record: ProfileRecord, name: str, now: str) -> dict[str, Any]:
    """The whole ``status`` of a profile: its samples and what they teach."""
    learned = compute_learned(record, name)
    return {
        "kvSamples": [
            {"source": s.source, "predictedTokens": s.predicted_tokens, "observedTokens": s.observed_tokens}
            for s in record.kv
        ],
        "oomSamples": [
            _drop_none(
                {
                    "source": s.source,
                    "gpuMemoryUtilization": s.gpu_memory_utilization,
                    "maxNumSeqs": s.max_num_seqs,
                    "maxNumBatchedTokens": s.max_num_batched_tokens,
                }
            )
            for s in record.ooms
        ],
        "healthySamples": [
            _drop_none(
                {
                    "source": s.source,
                    "gpuMemoryUtilization": s.gpu_memory_utilization,
                    "maxNumSeqs": s.max_num_seqs,
                }
            )
            for s in record.healthy
        ],
        "startupSamples": [{"source": s.source, "seconds": s.seconds} for s in record.startups],
        "contributors": list(record.sources),
        "learned": _drop_none(
            {
                "kvRatio": learned.kv_ratio,
                "kvSamples": learned.kv_samples,
                "kvServices": learned.kv_services,
                "oomSamples": learned.oom_samples,
                "namespaces": learned.namespaces,
                "lowestOomUtilization": learned.lowest_oom_utilization,
                "utilizationCeiling": learned.utilization_ceiling,
                "startupSeconds": round(learned.startup_seconds, 1)
                if learned.startup_seconds is not None
                else None,
                "message": learned.describe(),
            }
        ),
        "lastUpdateTime": now,
    }


def build_learned(obj: Mapping[str, Any], key: ProfileKey) -> Learned | None:
    """What a profile object teaches; ``None`` when its spec is not ``key`` (a hand-made object that only
    shares the name) or its status cannot be read."""
    spec = obj.get("spec") or {}
    if (
        spec.get("modelDigest") != key.model_digest
        or spec.get("memoryModelVersion") != key.memory_model_version
        or spec.get("engineDigest") != key.engine_digest
        or spec.get("scope") != (SCOPE_SHARED if key.shared else SCOPE_NAMESPACE)
        or (not key.shared and spec.get("namespace") != key.namespace)
    ):
        return None
    try:
        record = read_record(obj.get("status"), key.shared)
    except (KeyError, TypeError, ValueError):
        return None
    return compute_learned(record, key.name)


# --- read: one cached cluster-wide list -------------------------------------------------------------------


@dataclass
class _Cache:
    at: float = float("-inf")
    by_name: dict[str, dict[str, Any]] | None = None
    lock: asyncio.Lock | None = None


_cache = _Cache()


def clear_cache() -> None:
    _cache.at, _cache.by_name = float("-inf"), None


async def _profiles(store: ProfileStore, clock: Callable[[], float]) -> dict[str, dict[str, Any]]:
    if _cache.lock is None:
        _cache.lock = asyncio.Lock()
    async with _cache.lock:
        if _cache.by_name is None or clock() - _cache.at > LIST_TTL_S:
            items = await asyncio.to_thread(store.list_profiles)
            _cache.by_name = {str(o["metadata"]["name"]): o for o in items}
            _cache.at = clock()
        return _cache.by_name


async def fetch_learned(
    store: ProfileStore | None,
    key: ProfileKey,
    logger: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> Learned | None:
    """The matching profile's lesson, or ``None`` (no store, no profile, or the list failed: logged)."""
    if store is None:
        return None
    try:
        obj = (await _profiles(store, clock)).get(key.name)
    except errors.OperatorError as exc:
        if logger is not None:
            logger.warning(f"tuning profiles: {exc}; planning from the memory model alone")
        return None
    return build_learned(obj, key) if obj is not None else None


async def fetch_plan_learned(
    store: ProfileStore | None, keys: Keys, logger: Any = None, clock: Callable[[], float] = time.monotonic
) -> Learned | None:
    """What a plan of the service with ``keys`` starts from: its namespace's profile when that teaches
    something, else the shared one it may read (:func:`~.profile_scope.choose_learned`). A profile an older
    kvpilot wrote for the same model and layout is never read; a warning on ``logger`` names it
    (:mod:`.profile_legacy`)."""
    learned = await fetch_learned(store, keys.own, logger, clock)
    if (learned is None or not learned.used) and keys.shared is not None:
        learned = choose_learned(learned, await fetch_learned(store, keys.shared, logger, clock))
    if store is not None and logger is not None and _cache.by_name is not None:
        for name, why in compute_legacy_matches(_cache.by_name.values(), keys.own):
            logger.warning(build_legacy_message(name, why))  # kopf posts it as a Warning event
    return learned


# --- write: read, add, conditional patch; retry on conflict ------------------------------------------------


def is_frozen(obj: Mapping[str, Any]) -> bool:
    """Whether an administrator froze the profile (``spec.frozen``): read, never written."""
    return (obj.get("spec") or {}).get("frozen") is True


async def apply_samples(
    store: ProfileStore, key: ProfileKey, model_id: str, update: Update, now: str
) -> dict[str, Any] | None:
    """Add samples to ``key``'s profile (created when absent) with optimistic concurrency; the new status,
    or ``None`` when the profile is frozen (nothing written).

    Raises :class:`~kvpilot.operator.errors.ApplyFailed` after :data:`WRITE_ATTEMPTS` conflicts in a row."""
    for _ in range(WRITE_ATTEMPTS):
        obj = await asyncio.to_thread(store.read_profile, key.name)
        if obj is None:
            try:
                obj = await asyncio.to_thread(store.create_profile, build_profile(key, model_id))
            except Conflict:  # another service created it first: read theirs
                continue
        if is_frozen(obj):
            return None
        try:
            record = read_record(obj.get("status"), key.shared)
        except (KeyError, TypeError, ValueError) as exc:
            raise errors.ApplyFailed(f"tuningprofile {key.name} has a malformed status: {exc!r}") from None
        status = build_status(update(record), key.name, now)
        body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status}
        try:
            await asyncio.to_thread(store.patch_profile_status, key.name, body)
        except Conflict:
            continue
        _cache.by_name = None  # the next plan reads the new lesson
        return status
    raise errors.ApplyFailed(f"tuningprofile {key.name}: {WRITE_ATTEMPTS} write conflicts in a row")


def build_update(
    source: str,
    *,
    kv: tuple[int, int] | None = None,
    oom: EngineSettings | None = None,
    healthy: EngineSettings | None = None,
    startup_seconds: float | None = None,
) -> Update | None:
    """What one closed-loop tick adds to its profile: ``kv`` = (predicted, observed) tokens of a new vLLM
    report; ``oom`` = the settings (as vLLM ran them) that hit CUDA OOM; ``healthy`` = settings that passed
    probation; ``startup_seconds`` = a new start-up time. ``None``: nothing to add (no write)."""
    if (
        kv is None
        and startup_seconds is None
        and (oom is None or oom.gpu_memory_utilization is None)
        and (healthy is None or healthy.gpu_memory_utilization is None)
    ):
        return None

    def update(record: ProfileRecord) -> ProfileRecord:
        if kv is not None:
            record = add_kv_sample(record, KvSample(source, kv[0], kv[1]))
        if oom is not None and oom.gpu_memory_utilization is not None:
            sample = OomSample(
                source, oom.gpu_memory_utilization, oom.max_num_seqs, oom.max_num_batched_tokens
            )
            record = add_oom(record, sample)
        if healthy is not None and healthy.gpu_memory_utilization is not None:
            record = add_healthy(
                record, HealthySample(source, healthy.gpu_memory_utilization, healthy.max_num_seqs)
            )
        if startup_seconds is not None:
            record = add_startup(record, StartupSample(source, round(startup_seconds, 1)))
        return record

    return update


@dataclass
class _Batch:
    """The samples waiting for one profile's next write."""

    model_id: str
    updates: list[Update]
    now: str


_batches: dict[tuple[int, str], _Batch] = {}
"""By (store, profile name): the batch whose first sample's tick is waiting to write it."""


def _compose(updates: list[Update]) -> Update:
    def update(record: ProfileRecord) -> ProfileRecord:
        for one in updates:
            record = one(record)
        return record

    return update


async def record_samples(
    kube: object,
    key: ProfileKey,
    model_id: str,
    update: Update | None,
    now: str,
    logger: Any,
    window_s: float = BATCH_WINDOW_S,
) -> None:
    """Add ``update`` to the profile's batch: the first sample's caller waits ``window_s`` for others, then
    writes them all (:func:`apply_samples`); a later one joins the batch and returns at once. A failure is
    logged, never raised (the batch's samples are lost, as is a batch whose tick is cancelled while it waits:
    a lost sample is one sample)."""
    store = store_for(kube)
    if update is None or store is None:
        return
    slot = (id(store), key.name)
    batch = _batches.get(slot)
    if batch is not None:
        batch.updates.append(update)
        batch.now = now
        return
    batch = _batches[slot] = _Batch(model_id, [update], now)
    try:
        await asyncio.sleep(window_s)
    finally:
        del _batches[slot]  # a sample from now on starts the next batch
    try:
        status = await apply_samples(store, key, batch.model_id, _compose(batch.updates), batch.now)
    except errors.OperatorError as exc:
        logger.warning(f"tuning profile {key.name}: {len(batch.updates)} sample(s) not recorded ({exc})")
        return
    if status is None:
        logger.info(f"tuning profile {key.name} is frozen: {len(batch.updates)} sample(s) not recorded")
        return
    logger.info(f"tuning profile {key.name} (+{len(batch.updates)}): {status['learned'].get('message', '')}")


async def record_observations(
    kube: object,
    keys: Keys,
    model_id: str,
    source: str,
    *,
    budget: MemoryBudget,
    observed_kv_tokens: int | None = None,
    oom: EngineSettings | None = None,
    healthy: EngineSettings | None = None,
    startup_seconds: float | None = None,
    now: str,
    logger: Any,
    window_s: float = BATCH_WINDOW_S,
) -> None:
    """What one closed-loop tick of ``source`` saw, to the profiles it teaches (:mod:`.profile_scope`):
    its namespace's always, the shared one when it may; its OOMs only when its utilisation was the
    planner's. A KV report above :func:`~kvpilot.tuner.plan.profiles.compute_kv_ceiling` of ``budget``
    (the budget of the settings it ran) is refused: logged, counted, never learned."""
    kv = None
    if observed_kv_tokens:
        ceiling = compute_kv_ceiling(budget)
        if observed_kv_tokens > ceiling:
            metrics.record_refused_sample(REFUSED_KV_ABOVE_DEVICE)
            logger.warning(
                f"tuning profile {keys.own.name}: refused {source}'s report of {observed_kv_tokens} KV "
                f"tokens: more than the {ceiling} that {budget.gpu_total_gib:.2f} GiB at the utilisation, "
                f"less {budget.weights_gib:.2f} GiB of weights, could hold"
            )
        else:
            kv = (budget.kv_cache_tokens, observed_kv_tokens)
    own = build_update(
        source,
        kv=kv,
        oom=oom if keys.teaches_ooms else None,
        healthy=healthy,
        startup_seconds=startup_seconds,
    )
    writes = [record_samples(kube, keys.own, model_id, own, now, logger, window_s)]
    if keys.shared is not None and keys.teaches_shared:
        writes.append(record_samples(kube, keys.shared, model_id, own, now, logger, window_s))
    await asyncio.gather(*writes)


REFUSED_KV_ABOVE_DEVICE = "KvAboveDevice"
"""``kvpilot_profile_samples_refused_total{reason}``: a KV report the GPU could not hold."""


__all__ = [
    "KIND",
    "PROFILE_PLURAL",
    "REFUSED_KV_ABOVE_DEVICE",
    "SCOPE_NAMESPACE",
    "SCOPE_SHARED",
    "ProfileStore",
    "apply_samples",
    "build_update",
    "fetch_learned",
    "fetch_plan_learned",
    "is_frozen",
    "record_observations",
    "record_samples",
    "store_for",
]
