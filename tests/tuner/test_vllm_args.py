"""Rendering, parsing and vetting vLLM engine flags (the vLLM side is in tests/contract/)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.types import EngineSettings


def test_renders_every_set_field_in_order() -> None:
    settings = EngineSettings(8192, 64, 0.9, "fp8", 4, 8192)
    assert vllm.build_vllm_args(settings) == (
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "64",
        "--gpu-memory-utilization",
        "0.9",
        "--kv-cache-dtype",
        "fp8",
        "--tensor-parallel-size",
        "4",
        "--max-num-batched-tokens",
        "8192",
    )


def test_renders_only_set_fields_then_extra() -> None:
    args = vllm.build_vllm_args(EngineSettings(max_num_seqs=16), ("--enable-prefix-caching",))
    assert args == ("--max-num-seqs", "16", "--enable-prefix-caching")
    assert vllm.build_vllm_args(EngineSettings()) == ()


def test_float_keeps_its_exact_value() -> None:
    args = vllm.build_vllm_args(EngineSettings(gpu_memory_utilization=0.9123456789))
    assert float(args[1]) == 0.9123456789


@pytest.mark.parametrize("extra", [("--max-model-len", "4096"), ("--max_num_seqs=4",), ("-tp", "2")])
def test_tuned_flag_in_extra_is_refused(extra: tuple[str, ...]) -> None:
    with pytest.raises(errors.InvalidEngineArgs, match="pinned"):
        vllm.build_vllm_args(EngineSettings(), extra)


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        (EngineSettings(max_model_len=0), "--max-model-len"),
        (EngineSettings(max_num_seqs=0), "--max-num-seqs"),
        (EngineSettings(gpu_memory_utilization=1.2), "--gpu-memory-utilization"),
        (EngineSettings(gpu_memory_utilization=0.0), "--gpu-memory-utilization"),
        (EngineSettings(kv_cache_dtype="int8"), "--kv-cache-dtype"),
        (EngineSettings(tensor_parallel_size=0), "--tensor-parallel-size"),
        (EngineSettings(max_num_seqs=512, max_num_batched_tokens=256), "--max-num-batched-tokens"),
    ],
)
def test_invalid_settings_are_refused(settings: EngineSettings, flag: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs) as info:
        vllm.build_vllm_args(settings)
    assert info.value.flag == flag
    assert flag in info.value.message


def test_parse_extracts_every_spelling_and_keeps_the_rest() -> None:
    args = [
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max_model_len=32K",
        "-tp",
        "2",
        "--enable-prefix-caching",
        "--device-memory-utilization",
        "0.85",
        "--kv-cache-dtype=fp8",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "2k",
        "--served-model-name",
        "llama",
    ]
    settings, rest = vllm.parse_vllm_args(args)
    assert settings == EngineSettings(32768, 8, 0.85, "fp8", 2, 2000)
    assert rest == (
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--enable-prefix-caching",
        "--served-model-name",
        "llama",
    )


def test_parse_later_occurrence_wins_and_auto_is_minus_one() -> None:
    settings, _ = vllm.parse_vllm_args(["--max-model-len", "4096", "--max-model-len", "auto"])
    assert settings.max_model_len == vllm.AUTO_MAX_MODEL_LEN
    settings, _ = vllm.parse_vllm_args(["--max-model-len", "-1"])
    assert settings.max_model_len == -1


@pytest.mark.parametrize(
    "args",
    [
        ["--max-model-len"],
        ["--max-model-len", "--enforce-eager"],
        ["--max-model-len", "lots"],
        ["--max-model-len", "1.5K"],
        ["--gpu-memory-utilization", "1.5"],
        ["--kv-cache-dtype", "int8"],
        ["--max-num-seqs=none"],
    ],
)
def test_parse_refuses_bad_values(args: list[str]) -> None:
    with pytest.raises(errors.InvalidEngineArgs):
        vllm.parse_vllm_args(args)


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("32K", 32768), ("2M", 2 << 20)],
)
def test_human_readable_ints(text: str, value: int) -> None:
    assert vllm.parse_human_int(text) == value


@pytest.mark.parametrize("flag", sorted(vllm.UNSUPPORTED_FLAGS))
def test_unsupported_flags_are_refused_with_a_reason(flag: str) -> None:
    for args in ([flag, "8"], [f"{flag}=8"], [flag.replace("-", "_").replace("__", "--", 1), "8"]):
        with pytest.raises(errors.InvalidEngineArgs) as info:
            vllm.validate_extra_args(args)
        assert info.value.flag == flag
        assert vllm.UNSUPPORTED_FLAGS[flag] in info.value.message


@pytest.mark.parametrize(
    "args",
    [
        ["--max-model", "4096"],
        ["--max-num", "8"],
        ["--gpu-mem=0.8"],
        ["--kv-cache-memory=8G"],
        ["--num-gpu-blocks", "100"],
        ["--num_gpu_blocks_over=100"],
    ],
)
def test_abbreviations_that_would_fight_the_plan_are_refused(args: list[str]) -> None:
    with pytest.raises(errors.InvalidEngineArgs):
        vllm.validate_extra_args(args)


def test_repeated_serve_and_bad_kv_dtype_are_refused() -> None:
    with pytest.raises(errors.InvalidEngineArgs, match="serve"):
        vllm.validate_extra_args(["serve", "--model", "x"])
    with pytest.raises(errors.InvalidEngineArgs, match="int8"):
        vllm.validate_extra_args(["--kv-cache-dtype", "int8"])


def test_ordinary_extra_args_pass() -> None:
    vllm.validate_extra_args(
        ["--enable-prefix-caching", "--served-model-name", "llama", "--block-size", "32", "--enforce-eager"]
    )
    vllm.validate_extra_args(["--kv-cache-dtype", "fp8_e5m2", "--max-model-len", "4096"])


settings_strategy = st.builds(
    EngineSettings,
    max_model_len=st.none() | st.just(-1) | st.integers(1, 10_000_000),
    max_num_seqs=st.none() | st.integers(1, 4096),
    gpu_memory_utilization=st.none() | st.floats(0.01, 1.0),
    kv_cache_dtype=st.none() | st.sampled_from(vllm.KV_CACHE_DTYPES),
    tensor_parallel_size=st.none() | st.integers(1, 64),
    max_num_batched_tokens=st.none() | st.integers(4096, 1_000_000),
)


@given(settings_strategy)
def test_parse_inverts_build(settings: EngineSettings) -> None:
    assert vllm.parse_vllm_args(vllm.build_vllm_args(settings)) == (settings, ())


# --- flags that contradict the pod or the plan -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "9000"], "--port"),
        (["--port=9000"], "--port"),
        (["--host", "127.0.0.1"], "--host"),
        (["--model", "other/model"], "--model"),
        (["--config", "/tmp/x.yaml"], "--config"),
        (["--revision=main"], "--revision"),
        (["--data_parallel_size", "2"], "--data-parallel-size"),
        (["-dp", "2"], "--data-parallel-size"),
        (["--uds", "/tmp/s"], "--uds"),
        (["--por", "1"], "--por"),
    ],
)
def test_pod_flags_are_found_in_every_spelling(args: list[str], flag: str) -> None:
    ((found, why),) = vllm.find_pod_flags(args)
    assert found == flag and why


def test_ordinary_flags_are_not_pod_flags() -> None:
    assert vllm.find_pod_flags(["--enforce-eager", "--served-model-name", "x", "--model-impl", "vllm"]) == []


@pytest.mark.parametrize(
    ("args", "values"),
    [
        (["--pipeline-parallel-size", "2"], ["2"]),
        (["--pipeline_parallel_size=4"], ["4"]),
        (["-pp", "8", "--enforce-eager"], ["8"]),
        (["-pp=2", "-pp", "3"], ["2", "3"]),
        (["--enforce-eager"], []),
    ],
)
def test_find_flag_values_reads_every_spelling(args: list[str], values: list[str]) -> None:
    assert vllm.find_flag_values(args, vllm.PIPELINE_PARALLEL_FLAG) == values


@pytest.mark.parametrize(
    ("args", "model_dtype", "ok"),
    [
        (["--dtype", "auto"], "bfloat16", True),
        (["--dtype=bfloat16"], "bfloat16", True),
        (["--dtype", "float16"], "bfloat16", True),  # the same 2 bytes a weight: planned the same
        (["--dtype", "half"], "bfloat16", True),
        (["--dtype", "float32"], "bfloat16", False),
        (["--dtype=float"], "float16", False),
        (["--dtype", "int3"], "bfloat16", False),
    ],
)
def test_dtype_must_size_the_weights_as_planned(args: list[str], model_dtype: str, ok: bool) -> None:
    if ok:
        vllm.check_dtype(args, model_dtype)
    else:
        with pytest.raises(errors.InvalidEngineArgs, match="--dtype") as info:
            vllm.check_dtype(args, model_dtype)
        assert info.value.flag == "--dtype"


def test_a_pinned_kv_pool_renders_in_place_of_the_utilisation() -> None:
    settings = EngineSettings(max_model_len=8192, gpu_memory_utilization=0.9, max_num_seqs=8)
    args = vllm.build_vllm_args(settings, kv_cache_memory_bytes=12_345_678_901)
    assert args == (
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "8",
        "--kv-cache-memory-bytes",
        "12345678901",
    )
    with pytest.raises(errors.InvalidEngineArgs):
        vllm.build_vllm_args(settings, kv_cache_memory_bytes=0)
    with pytest.raises(errors.InvalidEngineArgs):  # users still may not pass it
        vllm.validate_extra_args(["--kv-cache-memory-bytes", "1000"])


@pytest.mark.parametrize(
    ("extra", "flag", "bound"),
    [
        (["--max-model-len", "9" * 400], "--max-model-len", 1 << 24),
        (["--max-model-len=16777217"], "--max-model-len", 1 << 24),
        (["--max-num-batched-tokens", "9" * 400 + "k"], "--max-num-batched-tokens", 1 << 24),
        (["--max_num_seqs", "65537"], "--max-num-seqs", 1 << 16),
        (["--tensor-parallel-size", "-" + "9" * 50], "--tensor-parallel-size", 64),
    ],
)
def test_an_out_of_range_integer_is_invalid_engine_args_naming_flag_and_bound(
    extra: list[str], flag: str, bound: int
) -> None:
    """400 nines used to pass the parser and overflow later as an InternalError; the message never echoes
    the whole figure."""
    with pytest.raises(errors.InvalidEngineArgs) as err:
        vllm.parse_vllm_args(extra)
    assert err.value.flag == flag
    assert f"at most {bound}" in err.value.message and "out of range" in err.value.message
    assert "9" * 40 not in err.value.message


def test_the_bounds_themselves_are_accepted() -> None:
    settings, _ = vllm.parse_vllm_args(["--max-model-len", "16M", "--max-num-seqs", "65536"])
    assert (settings.max_model_len, settings.max_num_seqs) == (1 << 24, 1 << 16)
