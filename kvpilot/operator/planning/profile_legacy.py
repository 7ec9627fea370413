"""TuningProfiles an older kvpilot wrote, before profiles were scoped by namespace: ignored, and said so.

Before per-namespace profiles (issue 31) a profile's key had no namespace and no engine digest: every
service of a model, GPU, release, KV dtype and layout taught the same profile, whatever its namespace, its
extra args (``--hf-overrides``), its pinned settings or its bounds, and every such service was planned from
it. Such a profile cannot be migrated into per-namespace ones: its samples name their services'
namespaces, but not the engines, pins or bounds they ran with, so no sample can be told safe to keep. An
upgraded operator therefore never reads nor writes one (its name, a hash of the old key, is never looked
up, and :func:`kvpilot.operator.planning.profiles.build_learned` refuses a spec without the new key), and
says so where the owner of a service it would have steered looks: a Warning event on that service
(:func:`compute_legacy_matches`, :func:`build_legacy_message`), naming the profile and why. The
administrator may delete it; nothing of it is applied across namespaces, now or later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvpilot.tuner.plan.profiles import ProfileKey

LEGACY_REASON = "LegacyProfileIgnored"
_SCOPES = ("Namespace", "Shared")


def compute_legacy_reason(obj: Mapping[str, Any]) -> str | None:
    """Why a TuningProfile object predates per-namespace scoping, or ``None`` for a current one."""
    spec = obj.get("spec") or {}
    scope = spec.get("scope")
    if scope is None:
        return "it has no spec.scope (written before profiles were scoped by namespace)"
    if scope not in _SCOPES:
        return f"its spec.scope {scope!r} is none of {', '.join(_SCOPES)}"
    if scope == "Namespace" and not spec.get("namespace"):
        return "its scope is Namespace but it names no spec.namespace"
    if "engineDigest" not in spec:
        return "it has no spec.engineDigest (services run with memory-changing flags may have taught it)"
    return None


def _same_model_and_layout(spec: Mapping[str, Any], key: ProfileKey) -> bool:
    return (
        spec.get("modelDigest") == key.model_digest
        and spec.get("gpu") == key.gpu
        and spec.get("vllmVersion") == key.vllm_version
        and spec.get("kvCacheDtype") == key.kv_cache_dtype
        and spec.get("tensorParallelSize") == key.tensor_parallel_size
        and spec.get("pipelineParallelSize") == key.pipeline_parallel_size
    )


def compute_legacy_matches(objs: Iterable[Mapping[str, Any]], key: ProfileKey) -> list[tuple[str, str]]:
    """``(name, why)`` of each legacy profile that an older kvpilot would have planned ``key``'s service
    from (same model, GPU, release, KV dtype and layout), sorted by name."""
    out = []
    for obj in objs:
        why = compute_legacy_reason(obj)
        if why is not None and _same_model_and_layout(obj.get("spec") or {}, key):
            out.append((str((obj.get("metadata") or {}).get("name")), why))
    return sorted(out)


def build_legacy_message(name: str, why: str) -> str:
    """The Warning's text: which profile, why it is ignored, and what to do."""
    return (
        f"{LEGACY_REASON}: TuningProfile {name} was written by an older kvpilot and is ignored: {why}. Its "
        "samples may come from other namespaces' services, so this service is planned without them and "
        "its namespace learns a profile of its own; an administrator may delete it "
        f"(kubectl delete tuningprofile {name})."
    )


__all__ = [
    "LEGACY_REASON",
    "build_legacy_message",
    "compute_legacy_matches",
    "compute_legacy_reason",
]
