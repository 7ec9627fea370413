"""The TuningProfile edge (kvpilot.operator.planning.profiles): conflict-safe writes, the cached read, the
reconcile
starting from a profile and returning to the memory model's plan once it is gone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import FakeStore, Harness, ProfileKube, isvc

from kvpilot.operator import api
from kvpilot.operator.clients.kube import Conflict
from kvpilot.operator.planning import profile_scope, profiles, resolve
from kvpilot.tuner import memory
from kvpilot.tuner.plan import profiles as learning
from kvpilot.tuner.types import EngineSettings

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "tuningprofiles.kvpilot.io.yaml"
LOG = logging.getLogger("test")
KEY = learning.ProfileKey("0123456789abcdef", "L4", "0.33.0", "auto", 1, 1, "ns")


def oom(source: str, util: float) -> profiles.Update:
    update = profiles.build_update(source, oom=EngineSettings(gpu_memory_utilization=util, max_num_seqs=64))
    assert update is not None
    return update


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    profiles.clear_cache()


async def test_the_first_write_creates_the_profile_with_its_key_in_spec_and_labels() -> None:
    store = FakeStore()
    status = await profiles.apply_samples(
        store, KEY, "meta-llama/Llama-3.1-8B-Instruct", oom("ns/a", 0.91), "t"
    )
    obj = store.objects[KEY.name]
    assert obj["spec"]["gpu"] == "L4" and obj["spec"]["memoryModelVersion"] == memory.MEMORY_MODEL_VERSION
    assert obj["metadata"]["labels"]["profiles.kvpilot.io/model-digest"] == KEY.model_digest
    assert status["learned"]["utilizationCeiling"] == pytest.approx(0.89)
    assert status["oomSamples"] == [{"source": "ns/a", "gpuMemoryUtilization": 0.91, "maxNumSeqs": 64}]
    assert status["contributors"] == ["ns/a"]


async def test_a_writer_in_between_is_a_conflict_and_both_samples_land() -> None:
    store = FakeStore()
    await profiles.apply_samples(store, KEY, "m", oom("ns/a", 0.95), "t1")

    def other_writer() -> None:  # service B writes between A's read and A's patch
        asyncio.run(profiles.apply_samples(store, KEY, "m", oom("ns/b", 0.93), "t2"))

    store.before_patch = other_writer
    await profiles.apply_samples(store, KEY, "m", oom("ns/c", 0.91), "t3")
    status = store.objects[KEY.name]["status"]
    assert store.conflicts == 1
    assert {o["source"] for o in status["oomSamples"]} == {"ns/a", "ns/b", "ns/c"}
    assert status["learned"]["lowestOomUtilization"] == 0.91


async def test_samples_of_many_services_for_one_profile_are_written_together() -> None:
    """A hundred services' ticks bring a sample each within the batch window: one create and one patch, not
    a read, a patch and conflicts per service; every sample lands. A sample after the write starts a new
    batch."""
    store = FakeStore()
    fn = [profiles.build_update(f"ns/s{i:03d}", startup_seconds=30.0 + i) for i in range(100)]
    await asyncio.gather(*(profiles.record_samples(store, KEY, "m", u, "t", LOG, window_s=0.05) for u in fn))
    status = store.objects[KEY.name]["status"]
    assert (store.patches, store.conflicts) == (1, 0)
    sources = [s["source"] for s in status["startupSamples"]]
    assert sources == [f"ns/s{i:03d}" for i in range(100 - learning.MAX_SAMPLES, 100)]  # the newest kept
    assert len(status["contributors"]) >= learning.MAX_SAMPLES
    await profiles.record_samples(store, KEY, "m", oom("ns/late", 0.91), "t2", LOG, window_s=0.0)
    assert store.patches == 2
    assert store.objects[KEY.name]["status"]["oomSamples"][0]["source"] == "ns/late"


async def test_a_racing_creator_is_read_instead_of_overwritten() -> None:
    store = FakeStore()
    real_read = store.read_profile
    reads = 0

    def read(name: str) -> dict[str, Any] | None:
        nonlocal reads
        reads += 1
        if reads == 1:  # absent when read, created by another service before our create
            asyncio.run(profiles.apply_samples(FakeStoreView(store), KEY, "m", oom("ns/b", 0.93), "t"))
            return None
        return real_read(name)

    store.read_profile = read  # type: ignore[method-assign]
    await profiles.apply_samples(store, KEY, "m", oom("ns/a", 0.95), "t")
    assert {o["source"] for o in store.objects[KEY.name]["status"]["oomSamples"]} == {"ns/a", "ns/b"}


class FakeStoreView(FakeStore):
    """The same objects through an unpatched read (the other writer's own client)."""

    def __init__(self, store: FakeStore) -> None:
        self.__dict__ = store.__dict__


async def test_endless_conflicts_give_up_with_an_operator_error() -> None:
    store = FakeStore()
    await profiles.apply_samples(store, KEY, "m", oom("ns/a", 0.95), "t")

    def always_stale(name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        raise Conflict("stale")

    store.patch_profile_status = always_stale  # type: ignore[method-assign]
    with pytest.raises(Exception, match="write conflicts in a row"):
        await profiles.apply_samples(store, KEY, "m", oom("ns/b", 0.9), "t")


async def test_reads_share_one_cached_list_and_a_write_refreshes_it() -> None:
    store = FakeStore()
    now = [0.0]
    assert await profiles.fetch_learned(store, KEY, LOG, clock=lambda: now[0]) is None
    for _ in range(5):
        await profiles.fetch_learned(store, KEY, LOG, clock=lambda: now[0])
    assert store.lists == 1
    await profiles.apply_samples(store, KEY, "m", oom("ns/a", 0.95), "t")
    learned = await profiles.fetch_learned(store, KEY, LOG, clock=lambda: now[0])
    assert learned is not None and learned.utilization_ceiling == pytest.approx(0.93) and store.lists == 2
    del store.objects[KEY.name]  # deleted by a person: unused once the cached list expires
    assert await profiles.fetch_learned(store, KEY, LOG, clock=lambda: now[0]) is not None
    now[0] += profiles.LIST_TTL_S + 1
    assert await profiles.fetch_learned(store, KEY, LOG, clock=lambda: now[0]) is None


async def test_a_profile_of_another_memory_model_or_spec_is_not_used() -> None:
    store = FakeStore()
    await profiles.apply_samples(store, KEY, "m", oom("ns/a", 0.95), "t")
    store.objects[KEY.name]["spec"]["memoryModelVersion"] = "0.0.1"  # hand-edited: not this key's lesson
    assert await profiles.fetch_learned(store, KEY, LOG) is None


def test_nothing_new_is_no_write() -> None:
    assert profiles.build_update("ns/a") is None
    assert profiles.build_update("ns/a", oom=EngineSettings(max_num_seqs=4)) is None  # no utilisation known


def test_the_status_written_is_what_the_crd_schema_declares() -> None:
    record = learning.ProfileRecord()
    for update in (
        profiles.build_update("ns/a", kv=(1000, 900), startup_seconds=61.23),
        profiles.build_update("ns/a", healthy=EngineSettings(gpu_memory_utilization=0.9, max_num_seqs=8)),
        oom("ns/b", 0.95),
    ):
        assert update is not None
        record = update(record)
    status = profiles.build_status(record, KEY.name, "2026-12-02T00:00:00Z")
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    declared = schema["status"]["properties"]
    assert set(status) <= set(declared)
    assert set(status["learned"]) <= set(declared["learned"]["properties"])
    for name in ("kvSamples", "oomSamples", "healthySamples", "startupSamples"):
        assert status[name], name
        assert set(status[name][0]) <= set(declared[name]["items"]["properties"]), name
    assert set(profiles.build_profile(KEY, "m")["spec"]) <= set(schema["spec"]["properties"])
    assert profiles.read_record(status) == record  # the wire format round-trips
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["plural"] == profiles.PROFILE_PLURAL
    columns = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Model", "GPU", "Samples", "KV Ratio", "OOM Ceiling"} <= columns


# --- the reconcile --------------------------------------------------------------------------------------


def _util(body: dict[str, Any]) -> float:
    return float(body["status"]["applied"]["gpuMemoryUtilization"])


async def test_a_new_service_starts_from_the_profile_and_the_event_names_it(planner: Harness) -> None:
    spec = {"serving": {"maxContextLength": 4096, "concurrency": 4}}
    a = isvc("a", **spec)
    await planner.run(a)
    u = _util(a)
    assert "profile" not in a["status"]
    kube = planner.kube
    assert isinstance(kube, ProfileKube)
    parsed = api.InferenceServiceSpec.model_validate(a["spec"])
    inputs = await resolve.fetch_inputs(parsed, "ns1", kube, planner.deps.hub)
    applied = EngineSettings(kv_cache_dtype="auto", tensor_parallel_size=1)
    key = profile_scope.compute_keys(inputs.model.config_key, inputs.gpu.gpu.name, parsed, applied, "ns1").own
    await profiles.apply_samples(kube, key, "m", oom("ns1/a", u), "t")

    b = isvc("b", **spec)
    await planner.run(b)
    assert _util(b) == pytest.approx(u - learning.UTILIZATION_MARGIN)
    assert b["status"]["profile"]["name"] == key.name
    planned = [m for _, r, m in planner.emitter.events if r == "Planned"]
    assert f"from TuningProfile {key.name}" in planned[-1]

    del kube.objects[key.name]
    profiles.clear_cache()  # the cached list expired
    c = isvc("c", **spec)
    await planner.run(c)
    assert _util(c) == u and "profile" not in c["status"]
