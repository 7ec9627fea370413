"""The one check of a pod's memory limit against what the engine pins in host memory: vLLM's KV offloading
tier and LMCache's CPU backend (``--kv-transfer-config`` with ``LMCacheConnectorV1``: ``max_local_cpu_size``
GiB per GPU worker) (:func:`kvpilot.operator.planning.host_memory.find_host_memory_shortfall`), which the
InferenceService's spec and the EngineTuner's target both go through."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpilot.operator import api, errors
from kvpilot.operator.planning import host_memory, release
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm

GIB = 1 << 30
TIER_100 = ["--kv-offloading-size", "100"]


def test_a_limit_below_the_tier_is_a_shortfall_of_the_whole_tier() -> None:
    short = host_memory.find_host_memory_shortfall(TIER_100, "64Gi")
    assert short == host_memory.HostMemoryShortfall(share_bytes=100 * GIB, limit="64Gi", pods=1)


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (TIER_100, "100Gi"),  # exactly the tier: holds it
        (TIER_100, "128Gi"),
        (TIER_100, None),  # no limit: nothing to hold it against
        (TIER_100, "lots"),  # not a quantity: not this check's to refuse
        ([*TIER_100, "--kv-offloading-backend", "lmcache"], "1Gi"),  # LMCache's server holds the tier
        (["--max-num-seqs", "8"], "1Gi"),  # no tier
    ],
    ids=["exact", "above", "no-limit", "not-a-quantity", "lmcache", "no-tier"],
)
def test_no_shortfall(args: list[str], limit: str | None) -> None:
    assert host_memory.find_host_memory_shortfall(args, limit) is None


def test_one_byte_short_is_short_and_the_last_size_wins() -> None:
    assert host_memory.find_host_memory_shortfall(TIER_100, str(100 * GIB - 1)) is not None
    assert host_memory.find_host_memory_shortfall(["--kv-offloading-size=200", *TIER_100], "100Gi") is None
    assert host_memory.find_host_memory_shortfall([*TIER_100, "--kv-offloading-size=200"], "100Gi")


def test_a_limit_that_is_a_number_is_read_as_bytes() -> None:
    # a manifest may give the limit as a bare integer (JSON number), not a string
    assert host_memory.find_host_memory_shortfall(TIER_100, 64 * GIB) is not None
    assert host_memory.find_host_memory_shortfall(TIER_100, 128 * GIB) is None


def test_the_tier_is_split_over_the_engines_pods() -> None:
    assert host_memory.find_host_memory_shortfall(TIER_100, "64Gi", pods=2) is None  # 50 GiB each
    short = host_memory.find_host_memory_shortfall(TIER_100, "32Gi", pods=2)
    assert short is not None and short.share_bytes == 50 * GIB and short.pods == 2
    assert "its share on each of the replica's pods" in short.describe("here", "there")


def test_a_size_that_is_not_gib_is_invalid_engine_args() -> None:
    with pytest.raises(tuner_errors.InvalidEngineArgs, match="--kv-offloading-size"):
        host_memory.find_host_memory_shortfall(["--kv-offloading-size", "-1"], "64Gi")


def test_describe_names_both_places_and_what_to_do() -> None:
    short = host_memory.find_host_memory_shortfall(TIER_100, "64Gi")
    assert short is not None
    text = short.describe("the args", "the limit")
    assert text.startswith("--kv-offloading-size in the args pins 100.0 GiB of host memory")
    assert "more than the limit (64Gi) holds" in text
    assert "raise the limit above 100Gi" in text and "or lower --kv-offloading-size" in text
    assert "share" not in text  # one pod: the whole tier


def _spec(engine: dict[str, Any], nodes: int = 1) -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "gpu": {"count": 1, "product": "L4", "nodesPerReplica": nodes},
            "engine": engine,
        }
    )


def test_an_inference_service_is_checked_with_its_extra_args_and_limit() -> None:
    engine = {"extraArgs": TIER_100, "resources": {"limits": {"memory": "64Gi"}}}
    with pytest.raises(errors.InvalidSpec) as raised:
        host_memory.check_host_memory(_spec(engine))
    assert raised.value.message.startswith("--kv-offloading-size in spec.engine.extraArgs pins 100.0 GiB")
    assert "spec.engine.resources.limits.memory (64Gi)" in raised.value.message
    host_memory.check_host_memory(_spec(engine, nodes=2))  # 50 GiB on each of the two pods: holds
    host_memory.check_host_memory(_spec({"extraArgs": TIER_100}))  # no limit


LMCACHE = ["--kv-transfer-config", json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})]


def _lmcache_spec(
    extra: list[str], memory: str | None, count: int = 1, env: list[dict[str, Any]] | None = None
) -> Any:
    engine: dict[str, Any] = {"extraArgs": extra, "env": env or []}
    if memory is not None:
        engine["resources"] = {"limits": {"memory": memory}}
    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": count}, "engine": engine}
    return api.InferenceServiceSpec.model_validate(body)


def test_a_limit_below_lmcaches_pinned_cpu_backend_is_refused_by_name() -> None:
    with pytest.raises(errors.InvalidSpec) as refused:
        host_memory.check_host_memory(_lmcache_spec(LMCACHE, "16Gi", count=4))  # 4 workers x 5 GiB
    message = str(refused.value)
    assert "--kv-transfer-config" in message and "20.0 GiB" in message and "limits.memory (16Gi)" in message
    assert "LMCACHE_MAX_LOCAL_CPU_SIZE" in message


def test_the_pods_environment_and_the_extra_config_size_it() -> None:
    host_memory.check_host_memory(_lmcache_spec(LMCACHE, "24Gi", count=4))
    small = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "2"}]
    host_memory.check_host_memory(_lmcache_spec(LMCACHE, "16Gi", count=4, env=small))
    bigger = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "8"}]
    with pytest.raises(errors.InvalidSpec, match="32.0 GiB"):
        host_memory.check_host_memory(_lmcache_spec(LMCACHE, "24Gi", count=4, env=bigger))
    extra = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    extra["kv_connector_extra_config"] = {"lmcache.max_local_cpu_size": 1}  # type: ignore[assignment]
    host_memory.check_host_memory(_lmcache_spec(["--kv-transfer-config", json.dumps(extra)], "8Gi", count=4))


def test_the_offloading_tier_and_lmcaches_backend_add_up() -> None:
    both = [*LMCACHE, "--kv-offloading-size", "10"]
    host_memory.check_host_memory(_lmcache_spec(both, "16Gi"))  # 10 + 5
    with pytest.raises(errors.InvalidSpec, match="beside the 10.0 GiB KV offloading tier"):
        host_memory.check_host_memory(_lmcache_spec(both, "14Gi"))


def test_what_cannot_be_read_is_not_held_against_the_limit() -> None:
    from_file = [{"name": "LMCACHE_CONFIG_FILE", "value": "/etc/lmcache.yaml"}]
    host_memory.check_host_memory(_lmcache_spec(LMCACHE, "1Gi", count=4, env=from_file))
    secret = {"secretKeyRef": {"name": "s", "key": "k"}}
    from_secret = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "valueFrom": secret}]
    host_memory.check_host_memory(_lmcache_spec(LMCACHE, "1Gi", count=4, env=from_secret))
    host_memory.check_host_memory(_lmcache_spec(LMCACHE, None, count=4))


def test_the_release_reads_lmcaches_settings_from_the_pods_literal_environment() -> None:
    env = [{"name": "LMCACHE_CHUNK_SIZE", "value": "512"}]
    flags = release.resolve_release(_lmcache_spec(LMCACHE, None, env=env)).flags
    assert flags.kv_connector is not None and flags.kv_connector.lmcache is not None
    assert flags.kv_connector.lmcache.chunk_size == 512
    assert vllm.KV_TRANSFER_CONFIG_FLAG not in flags.unmodelled
