"""Which untuned flags and environment may change vLLM's memory (kvpilot.tuner.vllm.sizing)."""

from __future__ import annotations

from kvpilot.tuner import vllm


def test_neutral_and_tuned_flags_drop_out_and_the_rest_keep_their_values_in_canonical_spelling() -> None:
    args = [
        "--served-model-name",
        "chat",
        "--hf_overrides",
        '{"num_hidden_layers": 1}',
        "--max-model-len",
        "4096",
        "--enforce-eager",
        "--quantization=fp8",
        "--tool-call-parser",
        "hermes",
        "-tp",
        "2",
    ]
    assert vllm.compute_sizing_args(args) == (
        "--hf-overrides",
        '{"num_hidden_layers": 1}',
        "--enforce-eager",
        "--quantization=fp8",
    )
    assert vllm.compute_sizing_args(["--served-model-name", "a", "--disable-log-requests"]) == ()
    later = ["--a-flag-from-a-later-release", "1"]
    assert vllm.compute_sizing_args(later) == tuple(later)


def test_sizing_environment_is_vllms_torchs_cudas_and_nccls() -> None:
    env = [
        ("HF_HOME", "/cache"),
        ("VLLM_ATTENTION_BACKEND", "FLASHINFER"),
        ("PYTORCH_CUDA_ALLOC_CONF", None),
        ("LOG_LEVEL", "debug"),
    ]
    assert vllm.compute_sizing_env(env) == ("PYTORCH_CUDA_ALLOC_CONF", "VLLM_ATTENTION_BACKEND=FLASHINFER")
