"""The fleet's start-up with and without a warm compile cache (``e2e/fleet/caches.py``, ``StartupModel``).

A restart whose compile hash (the settings :data:`kvpilot.tuner.vllm.COMPILE_HASH_SETTINGS` names, and the
model) matches a start that finished on the same ``VLLM_CACHE_ROOT`` volume loads its graphs; the terms come
from real GPU logs (``tests/data/vllm_logs/gpu_compile_lines.json``), read with kvpilot's own patterns.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from e2e.fleet.caches import StartCaches, StartSources, compute_compile_key
from e2e.fleet.pod import read_compile_cache, read_weight_cache
from e2e.fleet.truth import EngineArgs, GroundTruth, StartupModel
from kvpilot.tuner.loop import trade
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import log_lines

LINES = Path(__file__).resolve().parents[1] / "data" / "vllm_logs" / "gpu_compile_lines.json"
VOLUME = "pvc:team/weights"
BASE = EngineArgs.parse(["--model", "m", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.9"])


def compile_seconds(cache: str) -> list[float]:
    """Each start's "torch.compile takes|took S s in total" whose cache state its own lines say."""
    out = []
    for start in json.loads(LINES.read_text())["starts"]:
        text = "\n".join(start["lines"])
        warm, cold = log_lines.COMPILE_CACHE_HIT.search(text), log_lines.COMPILE_CACHE_MISS.search(text)
        assert bool(warm) != bool(cold), start["source"]  # each start says which it was, once
        assert start["cache"] == ("warm" if warm else "cold"), start["source"]
        total = log_lines.TORCH_COMPILE.search(text)
        assert total is not None, start["source"]
        if start["cache"] == cache:
            out.append(float(total.group(1)))
    return out


def test_the_compile_terms_are_the_real_logs_medians() -> None:
    cold, warm = compile_seconds("cold"), compile_seconds("warm")
    assert (len(cold), len(warm)) == (8, 7)
    assert min(cold) > max(warm)  # 13.29 s against 9.37 s: a warm start never compiled as long
    model = StartupModel()
    assert statistics.median(cold) == pytest.approx(model.compile_s, abs=2.5)  # 23.5 s
    assert statistics.median(warm) == pytest.approx(model.warm_compile_s, abs=0.5)  # 5.0 s
    assert model.compile_s < model.engine_s


def test_a_warm_compile_cache_spares_the_compile_and_nothing_else() -> None:
    model = StartupModel(checkpoint_gib=15.0)
    cold, warm = (
        model.simulated_seconds(cached=True),
        model.simulated_seconds(cached=True, compile_cached=True),
    )
    assert (cold, warm) == (48.75, 28.75)  # 15/4 s of load, 45 s of engine; less 25 - 5 s of compile
    downloaded = model.simulated_seconds(cached=False, compile_cached=True)
    assert downloaded - warm == 30.0  # the weights' download is the weight cache's business
    truth = GroundTruth(startup=model)
    assert truth.startup_wall_s(cached=True, compile_cached=True) == pytest.approx(warm * 0.02)
    assert GroundTruth().startup_wall_s(cached=True, compile_cached=True) == 1.0  # no checkpoint: constant


def test_start_up_terms_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="out of order"):
        StartupModel(compile_s=60.0, engine_s=45.0)
    with pytest.raises(ValueError, match="out of order"):
        StartupModel(warm_compile_s=30.0)


def test_a_restart_with_the_same_hash_on_the_same_volume_is_warm() -> None:
    caches = StartCaches()
    first = caches.compute_sources(BASE, VOLUME, VOLUME)
    assert first == StartSources(weights_cached=False, compile_cached=False)
    caches.record_start(BASE, VOLUME, VOLUME)
    assert caches.compute_sources(BASE, VOLUME, VOLUME) == StartSources(True, True)
    memory_only = dataclasses.replace(BASE, gpu_memory_utilization=0.95)  # outside vLLM's compile hash
    assert caches.compute_sources(memory_only, VOLUME, VOLUME).compile_cached


@pytest.mark.parametrize(
    "change",
    [
        {"max_num_seqs": 32},
        {"max_num_batched_tokens": 4096},
        {"max_model_len": 8192},
        {"kv_cache_dtype": "fp8"},
        {"tensor_parallel_size": 2},
        {"model": "other"},
    ],
)
def test_a_change_of_a_hashed_setting_compiles_again(change: dict[str, Any]) -> None:
    caches = StartCaches()
    caches.record_start(BASE, VOLUME, VOLUME)
    changed = dataclasses.replace(BASE, **change)
    assert not caches.compute_sources(changed, VOLUME, VOLUME).compile_cached
    assert compute_compile_key(changed) != compute_compile_key(BASE)


def test_without_a_compile_volume_or_on_another_one_every_start_is_cold() -> None:
    caches = StartCaches()
    caches.record_start(BASE, VOLUME, None)  # VLLM_CACHE_ROOT in the container's own filesystem
    assert caches.compute_sources(BASE, VOLUME, None) == StartSources(True, False)
    caches.record_start(BASE, VOLUME, VOLUME)
    assert not caches.compute_sources(BASE, VOLUME, "pvc:team/other").compile_cached
    assert StartSources(True, True).describe(VOLUME) == "weights=cache-hit compile=warm"
    assert StartSources(False, False).describe(None) == "weights=download-no-cache compile=cold"


def pod(env: dict[str, str], volume: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team"},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "volumeMounts": [{"name": "cache", "mountPath": "/models"}],
                }
            ],
            "volumes": [{"name": "cache", **volume}],
        },
    }


def test_the_compile_volume_is_the_one_under_vllm_cache_root() -> None:
    claim = {"persistentVolumeClaim": {"claimName": "weights"}}
    both = pod({"HF_HOME": "/models/hf", "VLLM_CACHE_ROOT": "/models/vllm"}, claim)
    assert (read_weight_cache(both), read_compile_cache(both)) == (VOLUME, VOLUME)
    weights_only = pod({"HF_HOME": "/models/hf"}, claim)  # a read-only volume: kvpilot sets no cache root
    assert (read_weight_cache(weights_only), read_compile_cache(weights_only)) == (VOLUME, None)
    host = pod({"VLLM_CACHE_ROOT": "/models/vllm"}, {"hostPath": {"path": "/data"}})
    assert read_compile_cache(host) == "host:n1:/data"
    assert read_compile_cache(pod({"VLLM_CACHE_ROOT": "/models/vllm"}, {"emptyDir": {}})) is None


def test_the_policy_prices_what_the_fleet_spares() -> None:
    """The closed loop's trade takes off a warm restart what the fleet's start-up model spares on one: a
    retune that keeps the compile hash (``gpu_memory_utilization`` alone) is priced 20 s under one that
    changes it (``max_num_seqs``), as the fleet's two starts differ."""
    startup = StartupModel(checkpoint_gib=15.0)
    cold = startup.simulated_seconds(cached=True)
    spared = cold - startup.simulated_seconds(cached=True, compile_cached=True)
    current = EngineSettings(max_num_seqs=256, gpu_memory_utilization=0.9, max_model_len=8192)
    policy = PolicyConfig()

    def priced(proposed: EngineSettings) -> float:
        warm = trade.compute_warm_compile_seconds(
            current, proposed, persistent=True, compile_seconds=policy.compile_seconds, restart_seconds=cold
        )
        return cold - warm

    assert priced(current.replace(gpu_memory_utilization=0.95)) == pytest.approx(cold - spared)
    assert priced(current.replace(max_num_seqs=128)) == cold


def test_the_streaming_loader_reads_a_slow_volume_at_its_own_rate() -> None:
    """``--load-format runai_streamer`` (what ``spec.model.loader: RunaiStreamer`` renders) loads at 5 GiB/s;
    on a network volume read at 0.22 GiB/s (case-068's gpt-oss-20b) that takes minutes off a 61 GiB load."""
    args = EngineArgs.parse(["--model", "m", "--load-format", "runai_streamer"])
    assert args.load_format == "runai_streamer" and EngineArgs.parse(["--model", "m"]).load_format == "auto"
    network = StartupModel(checkpoint_gib=61.0, disk_gib_per_s=0.22)
    default, streamed = (network.simulated_seconds(cached=True, streamer=s) for s in (False, True))
    assert (round(default, 1), round(streamed, 1)) == (322.3, 57.2)
    local = StartupModel(checkpoint_gib=61.0)
    assert local.simulated_seconds(cached=True) - local.simulated_seconds(cached=True, streamer=True) == (
        pytest.approx(61.0 / 4.0 - 61.0 / 5.0)
    )
