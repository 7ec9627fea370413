"""TuningProfiles an older kvpilot wrote before per-namespace scoping (planning.profile_legacy): never
read into any namespace's plan, and a warning (kopf posts it as the service's Warning event) names
each one a service would have been planned from."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from operator_fakes import FakeStore

from kvpilot.operator import api
from kvpilot.operator.planning import profile_legacy, profile_scope, profiles
from kvpilot.tuner import gpus
from kvpilot.tuner.model import catalogue
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

LOG = logging.getLogger("test.legacy")
DIGEST, GPU = "0123456789abcdef", "L4"
APPLIED = EngineSettings(kv_cache_dtype="auto", tensor_parallel_size=1)
LLAMA = build_model_spec(catalogue.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
BUDGET = compute_plan(LLAMA, gpus.lookup_gpu("L4"), 1, ServingBounds(max_context=4096)).budget


def keys(ns: str, **fields: Any) -> profile_scope.Keys:
    spec = api.InferenceServiceSpec.model_validate(
        {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": 1, "product": "L4"}, **fields}
    )
    return profile_scope.compute_keys(DIGEST, GPU, spec, APPLIED, ns, shared_with=frozenset())


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    profiles.clear_cache()
    yield
    profiles.clear_cache()


async def _teach_oom(store: FakeStore, k: profile_scope.Keys, source: str) -> dict[str, Any]:
    """A profile that teaches a CUDA OOM at 0.30 (what one tenant's bounded service once taught all)."""
    await profiles.record_observations(
        store,
        k,
        "m",
        source,
        budget=BUDGET,
        oom=EngineSettings(gpu_memory_utilization=0.3, max_num_seqs=8),
        now="t",
        logger=LOG,
        window_s=0.0,
    )
    return store.objects[k.own.name]


def _as_legacy(obj: dict[str, Any], name: str, drop: tuple[str, ...]) -> dict[str, Any]:
    """``obj`` as an older kvpilot wrote it: the key without ``drop`` (its name a hash of the old key)."""
    legacy = {**obj, "metadata": {**obj["metadata"], "name": name}, "spec": dict(obj["spec"])}
    for field in drop:
        legacy["spec"].pop(field, None)
    return legacy


OLD_KEY = ("scope", "namespace", "engineDigest")


async def test_the_profile_would_steer_the_plan_as_written_now() -> None:
    """The control: the same samples in a current profile of team-b's own are read (so the next test's
    refusal is the legacy rule, not an empty profile)."""
    store = FakeStore()
    await _teach_oom(store, keys("team-b"), "team-b/x")
    learned = await profiles.fetch_plan_learned(store, keys("team-b"), LOG)
    assert learned is not None and learned.used and learned.utilization_ceiling is not None


@pytest.mark.parametrize("same_name", [False, True], ids=["old-name", "current-name"])
async def test_a_legacy_profile_reaches_no_plan_and_a_warning_names_it(
    caplog: pytest.LogCaptureFixture, same_name: bool
) -> None:
    """An unscoped profile taught by team-a's service: team-b's (and team-a's) plans start from nothing,
    even when the old object sits under the name the new key hashes to."""
    store = FakeStore()
    current = await _teach_oom(store, keys("team-a"), "team-a/x")
    del store.objects[current["metadata"]["name"]]
    name = keys("team-b").own.name if same_name else "kvtp-0ld0ld0ld0ld0ld0ld0"
    store.objects[name] = _as_legacy(current, name, OLD_KEY)
    for ns in ("team-b", "team-a"):
        profiles.clear_cache()
        with caplog.at_level(logging.WARNING, logger=LOG.name):
            caplog.clear()
            assert await profiles.fetch_plan_learned(store, keys(ns), LOG) is None
        (warning,) = [r.getMessage() for r in caplog.records]
        assert warning.startswith(f"{profile_legacy.LEGACY_REASON}: TuningProfile {name} ")
        assert "no spec.scope" in warning and f"kubectl delete tuningprofile {name}" in warning


@pytest.mark.parametrize(
    ("drop", "why"),
    [
        (("scope", "namespace", "engineDigest"), "no spec.scope"),
        (("namespace",), "names no spec.namespace"),
        (("engineDigest",), "no spec.engineDigest"),
    ],
)
async def test_each_older_key_shape_is_named(drop: tuple[str, ...], why: str) -> None:
    store = FakeStore()
    current = await _teach_oom(store, keys("team-a"), "team-a/x")
    legacy = _as_legacy(current, "old", drop)
    reason = profile_legacy.compute_legacy_reason(legacy)
    assert reason is not None and why in reason
    assert profile_legacy.compute_legacy_reason(current) is None
    assert profile_legacy.compute_legacy_matches([legacy, current], keys("team-b").own) == [("old", reason)]


async def test_only_profiles_of_the_same_model_and_layout_are_named(caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStore()
    current = await _teach_oom(store, keys("team-a"), "team-a/x")
    other_gpu = _as_legacy(current, "old-a100", OLD_KEY)
    other_gpu["spec"]["gpu"] = "A100-80GB"
    store.objects = {"old-a100": other_gpu, current["metadata"]["name"]: current}
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        await profiles.fetch_plan_learned(store, keys("team-b"), LOG)
    assert not [r for r in caplog.records if profile_legacy.LEGACY_REASON in r.getMessage()]
