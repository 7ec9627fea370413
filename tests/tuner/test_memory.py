"""The start-up budget: calibration points, version behaviour, never-raising failures and their texts."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import budget as memory
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec

H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink", nvml_total_bytes=81_559 << 20)
"""79.19 GiB CUDA-visible (vllm_reference §8), NVML 81,559 MiB."""
A100_40 = GpuSpec("A100-40GB", int(39.5 * GIB), (8, 0), False, "nvlink", nvml_total_bytes=40_960 << 20)
L4 = GpuSpec("L4", int(21.96 * GIB), (8, 9), True, "pcie", nvml_total_bytes=23_034 << 20)

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
V019 = "0.19.0"
AT_095 = EngineSettings(gpu_memory_utilization=0.95, max_model_len=8192)


@pytest.mark.parametrize(
    ("config", "settings", "logged"),
    [
        (cfg.LLAMA_31_8B, AT_095.replace(kv_cache_dtype="fp8"), 58.11),  # case-020
        (cfg.GEMMA_2_9B, AT_095, 54.12),  # case-012
        (cfg.MIXTRAL_8X7B, AT_095.replace(tensor_parallel_size=2), 28.44),  # case-033
        (cfg.QWEN3_30B_A3B, AT_095, 15.41),  # case-044
        (cfg.LLAMA_4_SCOUT, AT_095.replace(tensor_parallel_size=4), 16.75),  # case-029
    ],
)
def test_calibration_points_of_vllm_019(config, settings: EngineSettings, logged: float) -> None:
    budget = memory.compute_budget(build_model_spec(config), H100, settings, vllm_version=V019)
    assert budget.starts
    assert budget.available_kv_cache_gib == pytest.approx(logged, rel=0.02)


def test_budget_adds_up() -> None:
    budget = memory.compute_budget(build_model_spec(cfg.LLAMA_31_8B), H100, EngineSettings())
    parts = budget.weights_gib + budget.activation_gib + budget.non_torch_gib + budget.cuda_graph_gib
    parts += budget.sampler_state_gib  # Model Runner V2 (0.33)
    assert budget.sampler_state_gib > 0
    assert budget.requested_gib == pytest.approx(H100.total_bytes * 0.92 / GIB, abs=1e-6)  # 0.33 default
    assert parts + budget.available_kv_cache_gib == pytest.approx(budget.requested_gib, abs=1e-6)
    assert budget.kv_bytes_per_token == 131072
    assert budget.num_gpu_blocks == int(budget.available_kv_cache_gib * GIB) // (2 << 20)


def test_cuda_graphs_are_subtracted_from_020_on() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    settings = AT_095
    new = memory.compute_budget(spec, H100, settings, vllm_version="0.20.0")
    old = memory.compute_budget(spec, H100, settings, vllm_version="0.19.1")
    eager = memory.compute_budget(spec, H100, settings, vllm_version="0.20.0", enforce_eager=True)
    assert new.cuda_graph_gib > 0 and eager.cuda_graph_gib == 0
    assert old.available_kv_cache_gib - new.available_kv_cache_gib == pytest.approx(
        new.cuda_graph_gib, abs=0.01
    )
    assert eager.available_kv_cache_gib == pytest.approx(old.available_kv_cache_gib, abs=0.01)


@pytest.mark.parametrize(
    ("version", "gpu", "tokens", "seqs", "util"),
    [
        ("0.33.0", H100, 8192, 1024, 0.92),
        ("0.19.0", H100, 8192, 1024, 0.90),
        ("0.33.0", A100_40, 2048, 256, 0.92),
        ("0.33.0", L4, 2048, 256, 0.92),
    ],
)
def test_version_and_gpu_defaults(version: str, gpu: GpuSpec, tokens: int, seqs: int, util: float) -> None:
    parsed = vllm.parse_version(version)
    limits = vllm.default_batch_limits(parsed, gpu)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (tokens, seqs)
    assert vllm.default_gpu_memory_utilization(parsed) == util


def test_b200_class_defaults_from_028() -> None:
    b200 = GpuSpec("B200", int(178.35 * GIB), (10, 0), True, "nvlink")
    assert vllm.default_batch_limits((0, 33), b200).max_num_batched_tokens == 16384
    assert vllm.default_batch_limits((0, 27), b200).max_num_batched_tokens == 8192


def test_short_context_caps_the_default_batch() -> None:
    limits = vllm.resolve_batch_limits((0, 33), H100, 4, None, 16)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (64, 16)


def test_a_multimodal_prefix_lm_raises_the_default_batch_to_one_item() -> None:
    from kvpilot.tuner import gpus
    from kvpilot.tuner.model import catalogue

    gemma = build_model_spec(catalogue.lookup_model_config("google/gemma-4-26B-A4B"))
    assert gemma.mm_prefix_item_tokens == 2496  # a 32-frame video: 32 x (70 + 8) tokens
    l4 = gpus.lookup_gpu("L4")
    settings = EngineSettings(max_model_len=32768)
    effective = vllm.compute_effective_settings(
        settings, l4, (0, 33), 32768, mm_prefix_item_tokens=gemma.mm_prefix_item_tokens
    )
    assert effective.max_num_batched_tokens == 2496  # 2048 by default on a 24 GB GPU
    text_only = dataclasses.replace(gemma, mm_prefix_item_tokens=0)
    raised, plain = (memory.compute_budget(m, l4, settings) for m in (gemma, text_only))
    assert raised.activation_gib > plain.activation_gib  # the profile run takes the larger batch
    before_033 = vllm.resolve_batch_limits((0, 19), l4, 32768, None, None, None, 2496)
    user_set = vllm.resolve_batch_limits((0, 33), l4, 32768, 1024, None, None, 2496)
    assert (before_033.max_num_batched_tokens, user_set.max_num_batched_tokens) == (2048, 1024)
    h100 = vllm.compute_effective_settings(settings, H100, (0, 33), 32768, mm_prefix_item_tokens=2496)
    assert h100.max_num_batched_tokens == 8192  # already above the floor


@pytest.mark.parametrize("text", ["0.19.0", "v0.19.1", "0.11.0 (stated ...)", "main @ 2025-01-30 (~v0.7.1)"])
def test_parse_version_of_free_text(text: str) -> None:
    assert vllm.parse_version(text)[:2] in {(0, 19), (0, 11), (0, 7)}


def test_no_memory_left_is_vllms_error_not_an_exception() -> None:
    budget = memory.compute_budget(build_model_spec(cfg.LLAMA_31_70B), H100, EngineSettings())
    assert not budget.starts and budget.available_kv_cache_gib < 0
    assert budget.error == (
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
        "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
        "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )


@pytest.mark.parametrize(("version", "word"), [("0.33.0", "model's"), ("0.19.0", "models's")])
def test_max_model_len_that_does_not_fit(version: str, word: str) -> None:
    spec = build_model_spec(cfg.LLAMA_31_70B)
    # 256 sequences: with 0.33's default 1,024 the graph estimate (102 graphs at TP 2) leaves no KV memory
    # at all, which is vLLM's other error
    settings = EngineSettings(tensor_parallel_size=2, max_num_seqs=256)
    budget = memory.compute_budget(spec, H100, settings, vllm_version=version)
    assert not budget.starts and budget.error is not None
    assert budget.error.startswith(f"To serve at least one request with the {word} max seq len (131072), (")
    assert "the estimated maximum model length is" in budget.error


def test_graphs_outside_the_budget_fail_gpt_oss_at_095_in_019() -> None:
    # case-036: gpt-oss-20b, H100, util 0.95, vLLM 0.19: OOM in the sampler warm-up after graph capture.
    spec = build_model_spec(cfg.GPT_OSS_20B)
    failing = memory.compute_budget(spec, H100, AT_095, vllm_version=V019)
    assert not failing.starts and failing.error
    assert failing.error.startswith(
        "CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
    )
    assert memory.compute_budget(
        spec, H100, AT_095.replace(gpu_memory_utilization=0.9), vllm_version=V019
    ).starts
    assert memory.compute_budget(spec, H100, AT_095, vllm_version=V019, enforce_eager=True).starts


def test_utilisation_above_free_memory_is_refused() -> None:
    budget = memory.compute_budget(
        build_model_spec(cfg.LLAMA_31_8B), H100, EngineSettings(gpu_memory_utilization=1.0)
    )
    assert not budget.starts and budget.error and budget.error.startswith("Free memory on device cuda:0 (")


def test_tensor_parallel_adds_all_reduce_memory_and_pipeline_takes_the_minimum() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    one = memory.compute_budget(spec, H100, AT_095, vllm_version=V019)
    two = memory.compute_budget(spec, H100, AT_095.replace(tensor_parallel_size=2), vllm_version=V019)
    assert two.non_torch_gib > one.non_torch_gib + 1
    pp = memory.compute_budget(spec, H100, AT_095, vllm_version=V019, pipeline_parallel_size=2)
    assert pp.available_kv_cache_gib == pytest.approx(66.54, abs=0.1)  # stage 0, as logged (case-025)
    assert pp.kv_cache_tokens == pytest.approx(1_075_312, rel=0.002)  # the last stage binds


def test_tensor_parallel_over_pcie_adds_what_pipeline_stages_add() -> None:
    """vLLM builds its communicators before the init snapshot; the fitted TP non-torch term is the
    NVLink-class paths', which PCIe-only ranks lack: they add what pipeline stages add. case-080
    (Qwen3-235B-A22B-FP8, 0.27.1, TP 4 over PCIe on RTX PRO 6000s) logs 27.85 GiB of KV cache."""
    spec = build_model_spec(json.loads((HF_CONFIGS / "Qwen__Qwen3-235B-A22B-FP8.json").read_text()))
    pro = GpuSpec("RTX-PRO-6000", int(95.01 * GIB), (12, 0), True, "pcie")
    settings = EngineSettings(
        gpu_memory_utilization=0.9, max_model_len=32768, max_num_seqs=32, tensor_parallel_size=4
    )
    pcie = memory.compute_budget(spec, pro, settings, vllm_version="0.27.1")
    nvlink = memory.compute_budget(
        spec, dataclasses.replace(pro, interconnect="nvlink"), settings, vllm_version="0.27.1"
    )
    stages = memory.compute_non_torch_bytes(1, 2, (0, 27), interconnect="pcie")
    assert pcie.non_torch_gib * GIB == pytest.approx(stages, abs=1)
    assert nvlink.non_torch_gib > pcie.non_torch_gib + 1.5
    # within 1.5 %: the graph estimate of 18 graphs at TP 4 (0.68 GiB) and the profile's peak are modelled
    # apart; the log gives only their sum (0.76 GiB)
    assert pcie.available_kv_cache_gib == pytest.approx(27.85, rel=0.015)


def test_activation_grows_with_batch_and_vocabulary() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    small = memory.compute_budget(spec, H100, EngineSettings(max_num_seqs=64, max_num_batched_tokens=2048))
    large = memory.compute_budget(spec, H100, EngineSettings(max_num_seqs=1024, max_num_batched_tokens=16384))
    assert large.activation_gib > small.activation_gib
    gemma = memory.compute_budget(build_model_spec(cfg.GEMMA_2_9B), H100, EngineSettings(max_num_seqs=1024))
    assert gemma.activation_gib > large.activation_gib  # 256k vocabulary of logits in the sampler warm-up


def test_max_model_len_above_the_config_is_vllms_error() -> None:
    spec = build_model_spec(cfg.GEMMA_2_9B)
    budget = memory.compute_budget(spec, H100, EngineSettings(max_model_len=16384))
    assert not budget.starts and budget.error is not None
    assert budget.error.startswith(
        "User-specified max_model_len (16384) is greater than the derived max_model_len "
        "(max_position_embeddings=8192.0 or model_max_length=None in model's config.json)."
    )


def test_tensor_parallel_must_divide_the_heads() -> None:
    budget = memory.compute_budget(
        build_model_spec(cfg.LLAMA_31_8B), H100, EngineSettings(tensor_parallel_size=3)
    )
    assert not budget.starts
    assert (
        budget.error == "Total number of attention heads (32) must be divisible by tensor parallel size (3)."
    )


def test_tensor_parallel_must_divide_the_padded_vocabulary() -> None:
    # Qwen3-14B: 40 heads allow TP 5, its 151,936-token vocabulary does not (vLLM asserts).
    qwen3_14b = {
        **cfg.QWEN3_30B_A3B,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "num_experts": None,
    }
    budget = memory.compute_budget(build_model_spec(qwen3_14b), H100, EngineSettings(tensor_parallel_size=5))
    assert not budget.starts and budget.error == "AssertionError: 151936 is not divisible by 5"


def test_a_hybrid_with_fewer_state_blocks_than_sequences_is_predicted_to_fail_graph_capture() -> None:
    """vLLM 0.33 (config/compilation.py): max_num_seqs above the hybrid's cache blocks stops CUDA-graph
    capture; the budget predicts it, eager mode does not capture and starts."""
    from kvpilot.tuner import gpus

    spec = build_model_spec(cfg.QWEN3_NEXT_80B)
    h200 = gpus.lookup_gpu("H200")
    tight = EngineSettings(
        max_model_len=4096, max_num_seqs=1024, gpu_memory_utilization=0.6, tensor_parallel_size=2
    )
    budget = memory.compute_budget(spec, h200, tight)
    assert budget.num_gpu_blocks < 1024, budget.num_gpu_blocks
    assert not budget.starts
    assert budget.error == vllm.mamba_cache_blocks_error(1024, budget.num_gpu_blocks)
    fewer = memory.compute_budget(spec, h200, tight.replace(max_num_seqs=budget.num_gpu_blocks))
    assert fewer.starts, fewer.error


def test_up_down_experts_write_two_intermediate_widths_not_three() -> None:
    """Nemotron-H's relu2 experts have no gate (vLLM's ``relu2_no_mul``: the activation keeps the up
    projection's width), so a token routed to an expert writes two expert widths, not a gated MLP's three."""
    data = json.loads((HF_CONFIGS / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json").read_text())
    spec = build_model_spec(data)
    assert not spec.mlp_gated and spec.moe is not None
    tokens, kwargs = 16384, {"tp": 1, "pp": 1, "pp_rank": 0, "max_num_seqs": 1, "dtype": "bfloat16"}
    up_down = memory.compute_activation_bytes(
        spec, max_num_batched_tokens=tokens, version=vllm.PINNED_VERSION, **kwargs
    )
    gated = memory.compute_activation_bytes(
        dataclasses.replace(spec, mlp_gated=True),
        max_num_batched_tokens=tokens,
        version=vllm.PINNED_VERSION,
        **kwargs,
    )
    moe = spec.moe
    one_width = moe.experts_per_token * moe.moe_intermediate_size + moe.shared_intermediate_size
    assert gated - up_down == pytest.approx(tokens * 2 * one_width, abs=2)
