"""``kvpilot estimate``'s core: one row per case, errors per case, and the calibration set's accuracy."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import model_configs_for_tests as cfg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.tuner import errors
from kvpilot.tuner.memory import estimate
from kvpilot.tuner.types import GIB, GpuSpec

CASES = Path(__file__).resolve().parents[1] / "data" / "vllm_memory_cases.json"
H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink", nvml_total_bytes=81_559 << 20)


def lookup(name: str) -> GpuSpec:
    if name.lower().startswith(("h100", "nvidia h100")):
        return H100
    raise errors.UnknownGpu(f"GPU {name!r} is not in kvpilot's catalogue.")


def case(**changes):
    base = {
        "id": "llama",
        "hf_config": cfg.LLAMA_31_8B,
        "gpu": "H100",
        "gpu_total_gib": 79.19,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.95,
        "max_model_len": 8192,
        "vllm_version": "0.19.0",
        "kv_cache_dtype": "fp8",
    }
    base.update(changes)
    return base


def test_rows_have_the_documented_keys_and_values() -> None:
    [row] = estimate.compute_estimates([case()], lookup)
    assert tuple(row) == estimate.OUTPUT_KEYS
    assert row["id"] == "llama" and row["starts"] is True and row["error"] is None
    assert row["available_kv_cache_gib"] == pytest.approx(58.11, rel=0.01)  # case-020 of the calibration set
    assert row["kv_cache_tokens"] == pytest.approx(952_032, rel=0.01)
    json.dumps(row)  # plain JSON types only


def test_a_bad_case_gets_an_error_and_the_batch_goes_on() -> None:
    cases = [
        case(id="no-config", hf_config=None),
        case(id="mamba", hf_config={"model_type": "bamba", "architectures": ["BambaForCausalLM"]}),
        case(id="unknown-gpu", gpu="Voodoo-5", gpu_total_gib=None),
        case(id="bad-util", gpu_memory_utilization=1.5),
        "not a case",
        case(id="fine"),
    ]
    rows = estimate.compute_estimates(cases, lookup)
    assert [r["id"] for r in rows] == ["no-config", "mamba", "unknown-gpu", "bad-util", None, "fine"]
    assert all(r["error"] and r["starts"] is False for r in rows[:5])
    assert "does not support BambaForCausalLM" in rows[1]["error"] and "Voodoo-5" in rows[2]["error"]
    assert rows[5]["error"] is None


def test_gpu_by_name_only_and_by_memory_only() -> None:
    by_name = estimate.compute_estimates([case(gpu_total_gib=None)], lookup)[0]
    by_memory = estimate.compute_estimates([case(gpu=None)], None)[0]
    assert by_name["error"] is None and by_memory["error"] is None
    assert by_name["available_kv_cache_gib"] == pytest.approx(by_memory["available_kv_cache_gib"], abs=0.02)


def test_quantization_fields_apply_to_an_unquantized_config() -> None:
    plain = estimate.compute_estimates([case()], lookup)[0]
    w8 = estimate.compute_estimates([case(quantization="compressed-tensors", weight_bits=8)], lookup)[0]
    assert w8["weights_gib"] < plain["weights_gib"] * 0.6


def test_a_failing_start_is_reported_not_raised() -> None:
    [row] = estimate.compute_estimates([case(max_model_len=131072, gpu_memory_utilization=0.3)], lookup)
    assert row["starts"] is False and row["error"].startswith("To serve at least one request")
    assert row["available_kv_cache_gib"] is not None
    # the length vLLM's error names, and the blocks it allocated
    assert 0 < row["estimated_max_model_len"] < 131072
    assert f"estimated maximum model length is {row['estimated_max_model_len']}." in row["error"]
    assert row["num_gpu_blocks"] > 0


def test_a_start_names_no_estimated_length() -> None:
    [row] = estimate.compute_estimates([case()], lookup)
    assert row["starts"] is True and row["estimated_max_model_len"] is None
    assert row["num_gpu_blocks"] * 16 >= row["kv_cache_tokens"]  # one group of every layer, block 16


def test_kv_cache_memory_bytes_fixes_the_pool_whatever_the_utilisation() -> None:
    """vLLM's --kv-cache-memory-bytes: the KV pool per GPU is exactly that many bytes."""
    pool = 10 * GIB
    rows = estimate.compute_estimates(
        [case(kv_cache_memory_bytes=pool), case(kv_cache_memory_bytes=pool, gpu_memory_utilization=0.6)],
        lookup,
    )
    assert rows[0]["available_kv_cache_gib"] == rows[1]["available_kv_cache_gib"] == 10.0
    per_block = 16 * 32 * 8 * 128 * 2  # Llama-3.1-8B, fp8: 32 layers x 8 KV heads x (K + V) 128 B per token
    assert rows[0]["num_gpu_blocks"] == rows[1]["num_gpu_blocks"] == pool // per_block
    tiny = estimate.compute_estimates([case(kv_cache_memory_bytes=64 << 20, vllm_version="0.33.0")], lookup)[
        0
    ]
    # 0.33 checks against the pool less its null block: 63 blocks of 16 tokens
    assert tiny["starts"] is False and tiny["estimated_max_model_len"] == ((64 << 20) // per_block - 1) * 16


def test_checkpoint_size_is_used() -> None:
    [row] = estimate.compute_estimates([case(weights_total_bytes=20 * GIB)], lookup)
    assert row["weights_gib"] == pytest.approx(20.03, abs=0.02)


def test_calibration_set_accuracy_guard() -> None:
    cases = json.loads(CASES.read_text())
    rows = estimate.compute_estimates(cases, None)
    errs = []
    for c, row in zip(cases, rows, strict=True):
        logged = (c.get("observed") or {}).get("available_kv_cache_gib")
        if (
            not str(c.get("engine", "")).startswith("V1")
            or row["error"] is not None
            and row["starts"] is None
        ):
            continue
        if c["outcome_class"] == "started" and logged and row["error"] is None:
            errs.append((row["available_kv_cache_gib"] - logged) / logged)
        if c["outcome_class"] == "failed" and row["available_kv_cache_gib"] is not None:
            assert row["starts"] is False, c["id"]
    assert len(errs) >= 15
    assert statistics.median(abs(e) for e in errs) < 0.02
    assert max(errs) < 0.03


def test_a_missing_config_can_come_from_a_catalogue() -> None:
    def configs(model_id: str):
        if model_id == "meta-llama/Llama-3.1-8B-Instruct":
            return cfg.LLAMA_31_8B
        raise errors.UnknownModel(model_id)

    cases = [
        case(hf_config=None, model="meta-llama/Llama-3.1-8B-Instruct"),
        case(hf_config=None, model="x/y"),
    ]
    rows = estimate.compute_estimates(cases, lookup, configs)
    assert rows[0]["error"] is None and rows[1]["error"] is not None


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-4, 300000),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(0, 4), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
_keys = st.sampled_from(
    [
        "hf_config",
        "gpu",
        "gpu_total_gib",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "dtype",
        "quantization",
        "weight_bits",
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "enforce_eager",
        "vllm_version",
        "weights_total_bytes",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=6), st.booleans())
def test_no_input_raises(changes, keep_config) -> None:
    bad = case(**changes)
    if keep_config and "hf_config" in changes:
        bad["hf_config"] = {
            **cfg.LLAMA_31_8B,
            **{k: v for k, v in changes.items() if k in ("max_model_len",)},
        }
    [row] = estimate.compute_estimates([bad], lookup)
    assert set(row) == set(estimate.OUTPUT_KEYS)
    json.dumps(row, allow_nan=True)


def test_kv_cache_memory_bytes_in_a_case_is_the_pool() -> None:
    pool = 30 * GIB + 7
    [pinned, plain] = estimate.compute_estimates(
        [case(id="pinned", kv_cache_memory_bytes=pool), case(id="plain")], lookup
    )
    assert pinned["available_kv_cache_gib"] == round(pool / GIB, 4)
    assert pinned["kv_cache_tokens"] < plain["kv_cache_tokens"]  # 30 GiB < the 58 GiB the utilisation leaves
    [bad] = estimate.compute_estimates([case(kv_cache_memory_bytes=-1)], lookup)
    assert bad["error"] is not None and "kv_cache_memory_bytes" in bad["error"]


def test_a_case_carries_the_checkpoints_processor_configs() -> None:
    """vLLM sizes its dummy encoder batch from the checkpoint's ``preprocessor_config.json``: Qwen3.5's
    4096^2-pixel budget is one 16,384-token image (65,536 patches), not transformers' default eight of 980."""
    qwen = json.loads(
        (Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "Qwen__Qwen3.5-9B.json").read_text()
    )
    base = case(
        id="qwen",
        hf_config=qwen,
        max_model_len=32768,
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        vllm_version="0.28.0",
    )
    image = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}}
    video = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}}
    default, published = estimate.compute_estimates(
        [base, {**base, "preprocessor_config": image, "video_preprocessor_config": video}], lookup
    )
    assert published["activation_gib"] > default["activation_gib"] + 0.3
    assert published["available_kv_cache_gib"] < default["available_kv_cache_gib"] - 0.3
    model = estimate.build_case_model({**base, "preprocessor_config": image})
    assert model.vision_tower is not None and model.vision_tower.limits.image_max_pixels == 16777216
    (bad,) = estimate.compute_estimates([{**base, "preprocessor_config": "16777216"}], lookup)
    assert bad["available_kv_cache_gib"] is None and "preprocessor_config must be a mapping" in bad["error"]
