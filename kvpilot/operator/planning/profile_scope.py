"""Whose TuningProfiles a service reads and teaches: tenants who do not trust each other.

A profile's scope is one namespace by default: the services of a namespace teach that namespace's profile
and are planned from it, and nothing one namespace's services report reaches another's plans. Namespaces an
administrator lists (``learning.sharedNamespaces`` in the chart, ``$KVPILOT_SHARED_PROFILE_NAMESPACES``,
read and checked at start-up by :func:`sharing_from_env`) also teach and read one shared profile per key,
whose figures bind only when services of several of those namespaces agree
(:mod:`kvpilot.tuner.plan.profiles`).

What a service teaches (:func:`compute_keys`):

* its engine -- the image, and the flags and environment that may change vLLM's memory
  (:func:`kvpilot.tuner.vllm.compute_sizing_args`: ``--hf-overrides``, ``--quantization``, any unknown flag)
  -- is part of the key (:attr:`~kvpilot.tuner.plan.profiles.ProfileKey.engine_digest`), so a service with
  ``--hf-overrides '{"num_hidden_layers": 1}'`` teaches only the profile of services run the same way;
* a service with sizing flags or environment, pinned memory settings (``spec.engine.pinned`` or a tuned
  flag in ``extraArgs``) or ``spec.tuning.bounds`` never teaches a shared profile: its settings are its
  owner's choice, not the planner's;
* such a pinned or bounded service teaches its namespace's profile what it measured (KV capacity against
  the prediction for the same settings, healthy runs, start-up times) but not its CUDA OOMs: a crash at her
  own pinned or bounded 0.30 says nothing about the utilisation the planner would choose for anyone else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvpilot.operator import api
from kvpilot.tuner import vllm
from kvpilot.tuner.plan import compute_pipeline_parallel
from kvpilot.tuner.plan.profiles import SHARED, Learned, ProfileKey
from kvpilot.tuner.types import EngineSettings, ServingBounds

SHARED_NAMESPACES_ENV = "KVPILOT_SHARED_PROFILE_NAMESPACES"
"""Comma-separated namespaces whose services share TuningProfiles (empty: every namespace learns alone)."""
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PINNED_MEMORY_FIELDS = ("max_model_len", "max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens")
"""Pinned settings that make a service's samples its owner's choice (the KV dtype and tensor-parallel size
are part of the key instead)."""


class SharingConfigError(ValueError):
    """``$KVPILOT_SHARED_PROFILE_NAMESPACES`` is malformed: the operator refuses to start."""


def sharing_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The namespaces that share profiles, from :data:`SHARED_NAMESPACES_ENV`: namespace names, comma
    separated; none, or at least two (a shared figure needs two namespaces to agree)."""
    raw = (os.environ if environ is None else environ).get(SHARED_NAMESPACES_ENV, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if not _NAMESPACE.match(n)]
    if bad:
        raise SharingConfigError(f"{SHARED_NAMESPACES_ENV}={raw!r}: {bad[0]!r} is not a namespace name")
    if len(set(names)) == 1:
        raise SharingConfigError(
            f"{SHARED_NAMESPACES_ENV}={raw!r}: list at least two namespaces (a shared figure needs "
            "services of two namespaces to agree), or none"
        )
    return frozenset(names)


_shared: frozenset[str] = frozenset()


def configure_sharing(namespaces: frozenset[str]) -> None:
    """Set the namespaces that share profiles (the operator's start-up; tests)."""
    global _shared
    _shared = frozenset(namespaces)


def shared_namespaces() -> frozenset[str]:
    return _shared


@dataclass(frozen=True, slots=True)
class Keys:
    """The profiles one service reads and teaches."""

    own: ProfileKey
    """Its namespace's profile for its engine: read first, taught always."""
    shared: ProfileKey | None
    """The shared profile it reads (its namespace is listed and its engine is the plain one); ``None``."""
    teaches_shared: bool
    """Whether its samples also go to :attr:`shared`."""
    teaches_ooms: bool
    """Whether its CUDA OOMs are learned at all (its utilisation was the planner's to choose)."""
    why_not_shared: tuple[str, ...] = ()
    """Why it teaches no shared profile (for logs)."""


def compute_pinned(spec: api.InferenceServiceSpec) -> tuple[str, ...]:
    """The memory settings ``spec`` pins (``spec.engine.pinned``, or a tuned flag in ``extraArgs``)."""
    from_args, _ = vllm.parse_vllm_args(spec.engine.extra_args)
    pinned = spec.engine.pinned.to_engine()
    return tuple(f for f in PINNED_MEMORY_FIELDS if getattr(pinned, f) is not None or getattr(from_args, f))


def compute_bounded(spec: api.InferenceServiceSpec) -> tuple[str, ...]:
    """The ``spec.tuning.bounds`` that constrain the utilisation or the sequences the planner would choose
    (narrower than :class:`~kvpilot.tuner.types.ServingBounds`' defaults); context bounds are plan inputs
    like ``spec.serving``'s and constrain nothing here."""
    b, d = spec.to_bounds(), ServingBounds()
    out = []
    if (b.min_gpu_memory_utilization, b.max_gpu_memory_utilization) != (
        d.min_gpu_memory_utilization,
        d.max_gpu_memory_utilization,
    ):
        out.append("gpuMemoryUtilization")
    if b.min_max_num_seqs != d.min_max_num_seqs or b.max_max_num_seqs is not None:
        out.append("maxNumSeqs")
    return tuple(out)


def compute_engine_digest(spec: api.InferenceServiceSpec) -> tuple[str, bool]:
    """(a digest of the image and of the flags and environment that may change vLLM's memory, whether
    there are any such flags or variables)."""
    args = vllm.compute_sizing_args(spec.engine.extra_args)
    env = vllm.compute_sizing_env((e.name, e.value) for e in spec.engine.env)
    text = json.dumps([spec.engine.image, list(args), list(env)])
    return hashlib.sha256(text.encode()).hexdigest()[:16], bool(args or env)


def compute_keys(
    model_digest: str,
    gpu: str,
    spec: api.InferenceServiceSpec,
    settings: EngineSettings,
    namespace: str,
    shared_with: frozenset[str] | None = None,
) -> Keys:
    """The profiles of a service of ``namespace`` running ``settings`` (the KV dtype and layout the
    Deployment renders); ``shared_with``: the namespaces that share (default: the operator's setting)."""
    sharing = shared_namespaces() if shared_with is None else shared_with
    tp = settings.tensor_parallel_size or 1
    release = vllm.resolve_image_version(spec.engine.image, spec.engine.vllm_version)
    digest, sizing = compute_engine_digest(spec)
    own = ProfileKey(
        model_digest=model_digest,
        gpu=gpu,
        vllm_version=release.version,
        kv_cache_dtype=settings.kv_cache_dtype or "auto",
        tensor_parallel_size=tp,
        pipeline_parallel_size=compute_pipeline_parallel(spec.gpu.count, tp),
        namespace=namespace,
        engine_digest=digest,
    )
    pinned = compute_pinned(spec)
    bounds = compute_bounded(spec)
    why = [
        *([f"its namespace {namespace!r} is not listed to share"] if namespace not in sharing else []),
        *(["flags or environment that may change vLLM's memory"] if sizing else []),
        *([f"pinned {', '.join(pinned)}"] if pinned else []),
        *([f"spec.tuning.bounds on {', '.join(bounds)}"] if bounds else []),
    ]
    shared = None
    if namespace in sharing and not sizing:
        shared = dataclasses.replace(own, namespace=SHARED)
    return Keys(
        own=own,
        shared=shared,
        teaches_shared=shared is not None and not why,
        teaches_ooms=not pinned and not bounds,
        why_not_shared=tuple(why),
    )


def choose_learned(own: Learned | None, shared: Learned | None) -> Learned | None:
    """What a plan starts from: the namespace's own profile when it teaches something, else the shared one
    when it does; else whichever exists (named in the plan's note, changing nothing)."""
    for learned in (own, shared):
        if learned is not None and learned.used:
            return learned
    return own if own is not None else shared


__all__ = [
    "SHARED_NAMESPACES_ENV",
    "Keys",
    "SharingConfigError",
    "choose_learned",
    "compute_bounded",
    "compute_engine_digest",
    "compute_keys",
    "compute_pinned",
    "configure_sharing",
    "shared_namespaces",
    "sharing_from_env",
]
