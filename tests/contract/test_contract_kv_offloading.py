"""Contract: the host memory kvpilot holds against the pod's limit is what vLLM 0.33 gives its KV offloading
tier: the flags as vLLM's own parser reads them, then ``VllmConfig._post_init_kv_transfer_config`` (the
step that turns ``--kv-offloading-size`` into the connector's ``cpu_bytes_to_use``) run on them."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.vllm import kv_offloading

pytestmark = pytest.mark.contract

CASES = [
    [],
    ["--kv-offloading-size", "100"],
    ["--kv-offloading-size=12.5"],
    ["--kv_offloading_size", "64"],
    ["--kv-offloading-size", "8", "--kv-offloading-size", "16"],
    ["--kv-offloading-size", "100", "--kv-offloading-backend", "native"],
    ["--kv-offloading-size", "100", "--kv-offloading-backend", "lmcache"],
    ["--kv-offloading-backend", "native"],
]


def _vllm_tier_bytes(args: list[str], parser: Any) -> int | None:
    from vllm.config import CacheConfig, VllmConfig

    parsed = parser.parse_args(args)
    cache = CacheConfig(
        kv_offloading_size=parsed.kv_offloading_size, kv_offloading_backend=parsed.kv_offloading_backend
    )
    config = types.SimpleNamespace(cache_config=cache, kv_transfer_config=None)
    VllmConfig._post_init_kv_transfer_config(config)  # type: ignore[arg-type]
    transfer = config.kv_transfer_config
    if transfer is None:
        return None
    extra = transfer.kv_connector_extra_config.get("cpu_bytes_to_use")
    return None if extra is None else int(extra)


@pytest.mark.parametrize("args", CASES)
def test_the_tier_is_the_bytes_vllm_gives_its_connector(args: list[str], vllm_parser: Any) -> None:
    assert kv_offloading.compute_offloading_host_bytes(args) == _vllm_tier_bytes(args, vllm_parser)


def test_a_size_vllm_refuses_is_refused() -> None:
    for bad in ("lots", "-1", "nan"):
        with pytest.raises(errors.InvalidEngineArgs, match="--kv-offloading-size"):
            kv_offloading.compute_offloading_host_bytes(["--kv-offloading-size", bad])
