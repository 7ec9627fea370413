"""The pod's memory limit against LMCache's pinned CPU backend (``--kv-transfer-config`` with
``LMCacheConnectorV1``: ``max_local_cpu_size`` GiB per GPU worker), beside vLLM's offloading tier."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpilot.operator import api, errors
from kvpilot.operator.planning import host_memory, release
from kvpilot.tuner import vllm

LMCACHE = ["--kv-transfer-config", json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})]


def _spec(
    extra: list[str], memory: str | None, count: int = 1, env: list[dict[str, Any]] | None = None
) -> Any:
    engine: dict[str, Any] = {"extraArgs": extra, "env": env or []}
    if memory is not None:
        engine["resources"] = {"limits": {"memory": memory}}
    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": count}, "engine": engine}
    return api.InferenceServiceSpec.model_validate(body)


def test_a_limit_below_lmcaches_pinned_cpu_backend_is_refused_by_name() -> None:
    with pytest.raises(errors.InvalidSpec) as refused:
        host_memory.check_host_memory(_spec(LMCACHE, "16Gi", count=4))  # 4 workers x 5 GiB
    message = str(refused.value)
    assert "--kv-transfer-config" in message and "20.0 GiB" in message and "limits.memory (16Gi)" in message
    assert "LMCACHE_MAX_LOCAL_CPU_SIZE" in message


def test_the_pods_environment_and_the_extra_config_size_it() -> None:
    host_memory.check_host_memory(_spec(LMCACHE, "24Gi", count=4))
    small = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "2"}]
    host_memory.check_host_memory(_spec(LMCACHE, "16Gi", count=4, env=small))
    bigger = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "8"}]
    with pytest.raises(errors.InvalidSpec, match="32.0 GiB"):
        host_memory.check_host_memory(_spec(LMCACHE, "24Gi", count=4, env=bigger))
    extra = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    extra["kv_connector_extra_config"] = {"lmcache.max_local_cpu_size": 1}  # type: ignore[assignment]
    host_memory.check_host_memory(_spec(["--kv-transfer-config", json.dumps(extra)], "8Gi", count=4))


def test_the_offloading_tier_and_lmcaches_backend_add_up() -> None:
    both = [*LMCACHE, "--kv-offloading-size", "10"]
    host_memory.check_host_memory(_spec(both, "16Gi"))  # 10 + 5
    with pytest.raises(errors.InvalidSpec, match="beside the 10.0 GiB KV offloading tier"):
        host_memory.check_host_memory(_spec(both, "14Gi"))


def test_what_cannot_be_read_is_not_held_against_the_limit() -> None:
    from_file = [{"name": "LMCACHE_CONFIG_FILE", "value": "/etc/lmcache.yaml"}]
    host_memory.check_host_memory(_spec(LMCACHE, "1Gi", count=4, env=from_file))
    secret = {"secretKeyRef": {"name": "s", "key": "k"}}
    from_secret = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "valueFrom": secret}]
    host_memory.check_host_memory(_spec(LMCACHE, "1Gi", count=4, env=from_secret))
    host_memory.check_host_memory(_spec(LMCACHE, None, count=4))


def test_the_release_reads_lmcaches_settings_from_the_pods_literal_environment() -> None:
    env = [{"name": "LMCACHE_CHUNK_SIZE", "value": "512"}]
    flags = release.resolve_release(_spec(LMCACHE, None, env=env)).flags
    assert flags.kv_connector is not None and flags.kv_connector.lmcache is not None
    assert flags.kv_connector.lmcache.chunk_size == 512
    assert vllm.KV_TRANSFER_CONFIG_FLAG not in flags.unmodelled
