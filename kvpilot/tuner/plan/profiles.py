"""Fleet learning: what every service of one (scope, model, GPU, vLLM, engine, KV dtype, layout) observed,
and what a new one starts from. The math behind the ``TuningProfile`` kind; pure (the operator reads and
writes the objects).

A profile is keyed by :class:`ProfileKey` and holds bounded lists of samples (:class:`ProfileRecord`). Its
*scope* is one namespace (the services of one tenant teach that tenant's plans) or :data:`SHARED` (the
services of the namespaces an administrator lists teach each other's); its *engine digest* separates engines
whose memory differs beyond the key's fields (the image, flags and environment of
:mod:`kvpilot.tuner.vllm.sizing`).

* **KV samples**: the KV tokens vLLM reported at start-up against the memory model's prediction for the same
  settings (one per service and prediction: a service re-reporting the same settings replaces its sample);
* **OOM samples**: the ``gpu_memory_utilization`` / ``max_num_seqs`` / ``max_num_batched_tokens`` at which a
  CUDA OOM struck (the closed loop's ``CudaOOM`` remedy);
* **healthy samples**: settings that passed the closed loop's probation (``status.lastGoodSettings``);
* **start-up samples**: seconds from container start to Ready.

:func:`compute_learned` turns a record into what the planner uses (:class:`Learned`), under three guards:

* *One sample is not a profile.* The KV ratio is used from :data:`MIN_KV_SAMPLES` samples of at least
  :data:`MIN_KV_SERVICES` services: one service could be one odd node (ECC-retired pages, a MIG slice, another
  process on the GPU). A CUDA OOM is a hard fact, not a statistic: one sets the utilisation ceiling, since
  repeating it costs a crash loop and avoiding it costs a few hundredths of the GPU.
* *An outlier does not move it.* The ratio is the median (of three or more: one wild report cannot move it
  past its neighbours). An OOM is set aside when a healthy run at the same or a higher utilisation with at
  least as many sequences refutes it (that crash was not the utilisation's).
* *A new memory model does not reuse old profiles.* :data:`kvpilot.tuner.memory.MEMORY_MODEL_VERSION` is
  part of the key (and so of the name): a new model's predictions start a new profile.

A shared profile binds only on agreement (:data:`MIN_SHARED_SERVICES` services from
:data:`MIN_SHARED_NAMESPACES` namespaces, for the KV ratio and for an OOM ceiling alike), counts each service
once (the median of its own samples, its lowest OOM) and keeps at most :data:`MAX_SAMPLES_PER_NAMESPACE` of
each list from one namespace, so one tenant can neither steer nor flush it.

No observation is learned beyond what the GPU could hold (:func:`compute_kv_ceiling`): vLLM reporting more KV
tokens than the device's memory at the utilisation, less the weights, can hold is a report of another engine
(or a forged one) and is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kvpilot.tuner import memory
from kvpilot.tuner.types import GIB, MemoryBudget

MIN_KV_SAMPLES = 3
"""KV samples before the learned ratio is used: the median of three resists one outlier."""
MIN_KV_SERVICES = 2
"""Distinct services among those samples: one service's pods may share one odd node."""
MAX_SAMPLES = 16
"""Each sample list keeps the newest this many (a profile object stays small)."""
UTILIZATION_MARGIN = 0.02
"""A new service plans this much below the lowest utilisation that OOMed (the closed loop's own first step
down is of the same order; the fleet's OOMs are "strictly above" a threshold)."""
MIN_SHARED_SERVICES = 3
"""Services that must agree before a shared profile's figure binds."""
MIN_SHARED_NAMESPACES = 2
"""Namespaces those services must come from: one tenant alone never sets a shared figure."""
MAX_SAMPLES_PER_NAMESPACE = 4
"""Each list of a shared profile keeps at most this many samples of one namespace (the newest)."""
SHARED = ""
"""The scope of a profile shared by the namespaces an administrator lists (else the scope is a namespace)."""
NAME_PREFIX = "tp-"


@dataclass(frozen=True, slots=True)
class ProfileKey:
    """What makes two services' memory behave alike."""

    model_digest: str
    """Digest of the model's config.json (``resolve.ResolvedModel.config_key``)."""
    gpu: str
    """The GPU's catalogue name (``GpuSpec.name``)."""
    vllm_version: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    namespace: str
    """The namespace whose services teach it and whose plans it steers; :data:`SHARED` for a shared one."""
    engine_digest: str = ""
    """A digest of the image and of the flags and environment that may change the engine's memory
    (:mod:`kvpilot.tuner.vllm.sizing`)."""
    memory_model_version: str = memory.MEMORY_MODEL_VERSION

    @property
    def shared(self) -> bool:
        return self.namespace == SHARED

    @property
    def name(self) -> str:
        """The object's name: a hash of the whole key (deterministic; labels carry the readable key)."""
        text = json.dumps(dataclasses.astuple(self))
        return NAME_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class KvSample:
    source: str
    """``namespace/name`` of the service."""
    predicted_tokens: int
    observed_tokens: int

    @property
    def ratio(self) -> float:
        return self.observed_tokens / self.predicted_tokens


@dataclass(frozen=True, slots=True)
class OomSample:
    source: str
    gpu_memory_utilization: float
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class HealthySample:
    source: str
    gpu_memory_utilization: float
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class StartupSample:
    source: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    kv: tuple[KvSample, ...] = ()
    ooms: tuple[OomSample, ...] = ()
    healthy: tuple[HealthySample, ...] = ()
    startups: tuple[StartupSample, ...] = ()
    shared: bool = False
    """A shared profile's record: its lists cap each namespace, its figures need agreement."""

    @property
    def sources(self) -> tuple[str, ...]:
        """Every service that contributed, sorted."""
        every = {s.source for s in self.kv} | {s.source for s in self.ooms}
        every |= {s.source for s in self.healthy} | {s.source for s in self.startups}
        return tuple(sorted(every))


class _Sourced(Protocol):
    @property
    def source(self) -> str: ...


_S = TypeVar("_S", bound=_Sourced)


def namespace_of(source: str) -> str:
    """The namespace of a ``namespace/name`` source."""
    return source.partition("/")[0]


def _bounded(items: tuple[_S, ...], shared: bool) -> tuple[_S, ...]:
    """The newest :data:`MAX_SAMPLES`; in a shared record, at most :data:`MAX_SAMPLES_PER_NAMESPACE` of each
    namespace first."""
    if shared:
        seen: dict[str, int] = {}
        kept = []
        for item in reversed(items):
            ns = namespace_of(item.source)
            seen[ns] = seen.get(ns, 0) + 1
            if seen[ns] <= MAX_SAMPLES_PER_NAMESPACE:
                kept.append(item)
        items = tuple(reversed(kept))
    return items[-MAX_SAMPLES:]


def add_kv_sample(record: ProfileRecord, sample: KvSample) -> ProfileRecord:
    """``record`` with ``sample``; the same service's sample for the same prediction is replaced."""
    if sample.predicted_tokens <= 0 or sample.observed_tokens <= 0:
        return record
    kept = tuple(
        s for s in record.kv if (s.source, s.predicted_tokens) != (sample.source, sample.predicted_tokens)
    )
    return dataclasses.replace(record, kv=_bounded((*kept, sample), record.shared))


def add_oom(record: ProfileRecord, sample: OomSample) -> ProfileRecord:
    """``record`` with ``sample`` (the same service's OOM at the same settings counts once)."""
    kept = tuple(s for s in record.ooms if s != sample)
    return dataclasses.replace(record, ooms=_bounded((*kept, sample), record.shared))


def add_healthy(record: ProfileRecord, sample: HealthySample) -> ProfileRecord:
    kept = tuple(s for s in record.healthy if s != sample)
    return dataclasses.replace(record, healthy=_bounded((*kept, sample), record.shared))


def add_startup(record: ProfileRecord, sample: StartupSample) -> ProfileRecord:
    """``record`` with ``sample``; a service keeps its newest start-up time only."""
    kept = tuple(s for s in record.startups if s.source != sample.source)
    return dataclasses.replace(record, startups=_bounded((*kept, sample), record.shared))


@dataclass(frozen=True, slots=True)
class Learned:
    """What the planner takes from a profile (hashable: it is part of the plan cache's key)."""

    name: str
    kv_ratio: float | None = None
    """Median observed / predicted KV tokens; ``None`` below the sample guard."""
    utilization_ceiling: float | None = None
    """The highest ``gpu_memory_utilization`` to plan: the lowest unrefuted OOM's, less the margin."""
    lowest_oom_utilization: float | None = None
    kv_samples: int = 0
    kv_services: int = 0
    oom_samples: int = 0
    startup_seconds: float | None = None
    """Median start-up time (informational)."""
    shared: bool = False
    namespaces: int = 0
    """Distinct namespaces among the contributors."""

    @property
    def used(self) -> bool:
        """Whether the profile changes a plan at all."""
        return self.kv_ratio is not None or self.utilization_ceiling is not None

    def describe(self) -> str:
        """One line for the Planned event and ``status.profile.message``."""
        parts = []
        if self.utilization_ceiling is not None:
            parts.append(
                f"gpu_memory_utilization at most {self.utilization_ceiling:.2f} (CUDA OOM at "
                f"{self.lowest_oom_utilization:.2f})"
            )
        if self.kv_ratio is not None:
            parts.append(
                f"KV capacity x{self.kv_ratio:.3f} of the memory model's ({self.kv_samples} samples from "
                f"{self.kv_services} services)"
            )
        elif self.kv_samples and self.shared:
            parts.append(
                f"KV ratio not used yet ({self.kv_services} services; {MIN_SHARED_SERVICES} services from "
                f"{MIN_SHARED_NAMESPACES} namespaces needed)"
            )
        elif self.kv_samples:
            parts.append(
                f"KV ratio not used yet ({self.kv_samples} samples from {self.kv_services} services; "
                f"{MIN_KV_SAMPLES} from {MIN_KV_SERVICES} needed)"
            )
        if self.shared and self.oom_samples and self.utilization_ceiling is None:
            parts.append(
                f"{self.oom_samples} CUDA OOM(s) not used yet ({MIN_SHARED_SERVICES} services from "
                f"{MIN_SHARED_NAMESPACES} namespaces needed)"
            )
        scope = f"shared TuningProfile {self.name}" if self.shared else f"TuningProfile {self.name}"
        return f"{scope}: " + ("; ".join(parts) or "nothing learned yet")


def _refuted(oom: OomSample, healthy: tuple[HealthySample, ...]) -> bool:
    """A healthy run at this utilisation or higher with at least as many sequences: not the utilisation's."""
    for h in healthy:
        seqs_ok = oom.max_num_seqs is None or (
            h.max_num_seqs is not None and h.max_num_seqs >= oom.max_num_seqs
        )
        if h.gpu_memory_utilization >= oom.gpu_memory_utilization and seqs_ok:
            return True
    return False


def _agreed(by_service: dict[str, float]) -> bool:
    """Whether these services are enough to bind a shared figure."""
    namespaces = {namespace_of(source) for source in by_service}
    return len(by_service) >= MIN_SHARED_SERVICES and len(namespaces) >= MIN_SHARED_NAMESPACES


def _shared_ratio(kv: tuple[KvSample, ...]) -> float | None:
    """The median over services of each service's median ratio, once enough services agree."""
    ratios: dict[str, list[float]] = {}
    for s in kv:
        ratios.setdefault(s.source, []).append(s.ratio)
    by_service = {source: statistics.median(r) for source, r in ratios.items()}
    return statistics.median(by_service.values()) if _agreed(by_service) else None


def _shared_lowest_oom(standing: list[OomSample]) -> float | None:
    """The lowest utilisation that enough services agree is too high: each service counts its lowest OOM,
    and an OOM at ``u`` agrees that every utilisation from ``u`` up is unsafe. One service's OOM far below
    the others' (her own bounds, a forged report) moves nothing."""
    lowest: dict[str, float] = {}
    for o in standing:
        lowest[o.source] = min(lowest.get(o.source, 1.0), o.gpu_memory_utilization)
    agreeing: dict[str, float] = {}
    for source, util in sorted(lowest.items(), key=lambda item: item[1]):
        agreeing[source] = util
        if _agreed(agreeing):
            return util
    return None


def compute_learned(record: ProfileRecord, name: str) -> Learned:
    """What ``record`` teaches, under the guards of the module docstring (a shared record's figures also
    need :data:`MIN_SHARED_SERVICES` services from :data:`MIN_SHARED_NAMESPACES` namespaces)."""
    services = len({s.source for s in record.kv})
    ratio = None
    standing = [o for o in record.ooms if not _refuted(o, record.healthy)]
    if record.shared:
        shared_ratio = _shared_ratio(record.kv)
        ratio = round(shared_ratio, 4) if shared_ratio is not None else None
        lowest = _shared_lowest_oom(standing)
    else:
        if len(record.kv) >= MIN_KV_SAMPLES and services >= MIN_KV_SERVICES:
            ratio = round(statistics.median(s.ratio for s in record.kv), 4)
        lowest = min(o.gpu_memory_utilization for o in standing) if standing else None
    ceiling = round(lowest - UTILIZATION_MARGIN, 2) if lowest is not None else None
    startup = statistics.median(s.seconds for s in record.startups) if record.startups else None
    return Learned(
        name=name,
        kv_ratio=ratio,
        utilization_ceiling=ceiling,
        lowest_oom_utilization=lowest,
        kv_samples=len(record.kv),
        kv_services=services,
        oom_samples=len(record.ooms),
        startup_seconds=startup,
        shared=record.shared,
        namespaces=len({namespace_of(source) for source in record.sources}),
    )


def compute_kv_ceiling(budget: MemoryBudget) -> int:
    """The most KV tokens one GPU of ``budget`` could hold: the device's memory at the budget's utilisation
    less the weights, all of it KV cache, at the memory model's tokens per byte. An observation above it is
    not of this engine (another model config behind the same digest, ``--hf-overrides``, a forged report)."""
    room = max(budget.requested_gib - budget.weights_gib, 0.0)
    if budget.available_kv_cache_gib > 0 and budget.kv_cache_tokens > 0:
        per_gib = budget.kv_cache_tokens / budget.available_kv_cache_gib
    elif budget.kv_bytes_per_token > 0:
        per_gib = GIB / budget.kv_bytes_per_token
    else:
        return 0
    return math.floor(room * per_gib)
