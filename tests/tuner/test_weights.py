"""Weight bytes per rank: parameter counts, sharding, quantization formats, checkpoint sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner.memory import weights
from kvpilot.tuner.model import FULL
from kvpilot.tuner.model.spec import QuantSpec, build_model_spec
from kvpilot.tuner.types import GIB

LLAMA_8B_CHECKPOINT = 16_060_522_496
"""Llama-3.1-8B's safetensors, all shards (the calibration set's ``weights_total_bytes``)."""


def gib(model, **kw) -> float:
    return weights.compute_weight_bytes(model, **kw) / GIB


def test_llama_8b_matches_the_logged_load() -> None:
    # vLLM logs "Model loading took 14.99 GiB": the 14.96 GiB checkpoint plus the rotary cache.
    spec = build_model_spec(cfg.LLAMA_31_8B)
    assert gib(spec) == pytest.approx(14.99, abs=0.01)
    assert gib(spec, weights_total_bytes=LLAMA_8B_CHECKPOINT) == pytest.approx(14.99, abs=0.01)
    assert gib(spec, dtype="float32") == pytest.approx(29.98, abs=0.01)


@pytest.mark.parametrize(("pp", "rank", "logged"), [(2, 0, 7.51), (4, 0, 4.26)])
def test_pipeline_stages(pp: int, rank: int, logged: float) -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    assert gib(spec, pipeline_parallel_size=pp, pp_rank=rank) == pytest.approx(logged, abs=0.02)


def test_tensor_parallel_shards_and_replicates() -> None:
    spec = build_model_spec(cfg.LLAMA_31_70B)
    one, two, eight = (gib(spec, tensor_parallel_size=tp) for tp in (1, 2, 8))
    assert two == pytest.approx(one / 2, rel=0.01)
    assert eight == pytest.approx(one / 8, rel=0.03)


@pytest.mark.parametrize(
    ("quant", "ratio"),
    [
        (QuantSpec("fp8", 8), 0.5),
        (QuantSpec("compressed-tensors", 8), 0.5),
        (QuantSpec("awq", 4, 128), 0.26),
        (QuantSpec("gptq", 4, 128), 0.26),
        (QuantSpec("compressed-tensors", 4, 128), 0.26),
        (QuantSpec("bitsandbytes", 4, 64), 0.26),
    ],
)
def test_quantized_linears_shrink_but_embeddings_do_not(quant: QuantSpec, ratio: float) -> None:
    dense = build_model_spec(cfg.LLAMA_31_70B)
    quantized = dataclasses.replace(dense, quantization=quant)
    embed_and_head = 2 * 128256 * 8192 * 2 / GIB
    body = gib(dense) - embed_and_head
    assert gib(quantized) - embed_and_head == pytest.approx(body * ratio, rel=0.04)


def test_mxfp4_quantizes_only_the_experts_and_pads_them() -> None:
    spec = build_model_spec(cfg.GPT_OSS_20B)
    assert gib(spec) == pytest.approx(13.64, abs=0.1)  # logged on an H100 (vLLM 0.19)
    assert gib(spec, tensor_parallel_size=2) == pytest.approx(7.01, abs=0.15)
    unquantized = dataclasses.replace(spec, quantization=None)
    assert gib(unquantized) > 2.5 * gib(spec)


def test_fp8_deepseek_v3_is_about_its_checkpoint() -> None:
    spec = build_model_spec(cfg.DEEPSEEK_V3)
    assert 600 < gib(spec) < 660  # 671B parameters at one byte, embeddings in bf16


def test_checkpoint_size_is_split_like_the_parameters() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    whole = weights.compute_weight_bytes(spec, weights_total_bytes=LLAMA_8B_CHECKPOINT)
    halves = [
        weights.compute_weight_bytes(
            spec, pipeline_parallel_size=2, pp_rank=r, weights_total_bytes=LLAMA_8B_CHECKPOINT
        )
        for r in (0, 1)
    ]
    assert sum(halves) == pytest.approx(whole, rel=0.01)


@pytest.mark.parametrize(("vocab", "padded"), [(128_256, 128_256), (151_646, 151_680), (1, 64)])
def test_vocabulary_is_padded_to_a_multiple_of_64(vocab: int, padded: int) -> None:
    spec = dataclasses.replace(build_model_spec(cfg.LLAMA_31_8B), vocab_size=vocab)
    assert weights.padded_vocab_size(spec) == padded


def _nemotron_h(pattern: str, **extra: object) -> dict[str, object]:
    """A small Nemotron-H config (the published Nano's field names) with ``pattern``'s blocks."""
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "torch_dtype": "bfloat16",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,
        "ssm_state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "expand": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "mlp_hidden_act": "relu2",
        **extra,
    }


def test_a_nemotron_h_block_holds_one_component() -> None:
    """Each Nemotron-H block is a Mamba2 mixer, attention, a relu2 MLP (up, down) or a MoE, with one norm;
    adding a block adds only its own component."""
    h, inter = 256, 512
    base = weights.compute_weight_breakdown(build_model_spec(_nemotron_h("M*"))).params
    mlp = weights.compute_weight_breakdown(build_model_spec(_nemotron_h("M*-"))).params - base
    assert mlp == 2 * (2 * h * inter + h)  # bf16: up, down and the block's norm
    attention = weights.compute_weight_breakdown(build_model_spec(_nemotron_h("M**"))).params - base
    assert attention == 2 * (h * (4 * 64 + 2 * 2 * 64) + 4 * 64 * h + h)  # q, k, v, o and the norm
    moe = {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "moe_shared_expert_intermediate_size": 256,
        "n_shared_experts": 1,
    }
    with_moe = build_model_spec(_nemotron_h("M*E", **moe))
    expert_block = weights.compute_weight_breakdown(with_moe).params - base
    assert expert_block == 2 * (8 * 2 * h * 128 + 2 * h * 256 + 8 * h + h)  # experts, shared, router, norm
    # the MoE block is where the pattern puts it, also under pipeline parallelism
    first = weights.compute_weight_breakdown(
        build_model_spec(_nemotron_h("EM*M", **moe)), pipeline_parallel_size=2, pp_rank=0
    ).params
    last = weights.compute_weight_breakdown(
        build_model_spec(_nemotron_h("EM*M", **moe)), pipeline_parallel_size=2, pp_rank=1
    ).params
    assert first > last + 2 * 8 * 2 * h * 128 // 2


def _decilm_parameters(config: dict[str, Any]) -> int:
    """Llama-3.3-Nemotron-Super-49B's parameters counted from its block_configs as vLLM's nemotron_nas.py
    builds the layers: attention only where not a no-op (GQA from n_heads_in_group), an MLP of
    ``_ffn_mult_to_intermediate_size(ffn_mult)`` only where not a no-op, a norm before each present part."""
    h, vocab, heads = config["hidden_size"], config["vocab_size"], config["num_attention_heads"]
    head_dim = h // heads
    total = 2 * vocab * h + h  # untied embedding and lm_head, the final norm
    for block in config["block_configs"]:
        attention, ffn = block["attention"], block["ffn"]
        if not attention["no_op"]:
            kv = heads // attention["n_heads_in_group"]
            total += 2 * h * h + 2 * h * kv * head_dim + h
        if not ffn["no_op"]:
            width = int(2 * ffn["ffn_mult"] * h / 3)
            width += -width % 256
            total += 3 * h * width + h
    return total


def test_decilm_layers_carry_their_own_attention_and_mlp_width() -> None:
    """Nemotron-Super-49B's 80 layers: 49 with attention, MLPs from 0.5x to 5.25x; 49,867,145,216 parameters
    (the Hub's "49.9B"), where one MLP width and attention in every layer counted about 70 B."""
    data = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
    path = data / "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json"
    config = json.loads(path.read_text())
    spec = build_model_spec(config)
    assert sum(layer.kind == FULL for layer in spec.layers) == 49
    expected = _decilm_parameters(config)
    assert expected == 49_867_145_216
    assert weights.compute_weight_breakdown(spec).params == 2 * expected  # bf16


def test_the_qwen3_vision_tower_keeps_its_norms_embeddings_and_row_biases_whole_at_tp() -> None:
    """vLLM's ``Qwen3_VisionTransformer`` splits its linears by TP but every rank holds the patch embedding,
    the position table, the LayerNorms and the row-parallel biases whole: Qwen3.5-9B's 4,617,856 parameters
    (the model-class contract holds TP 2 to vLLM's ranks, byte for byte)."""
    path = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "Qwen__Qwen3.5-9B.json"
    spec = build_model_spec(json.loads(path.read_text()))
    assert spec.towers_whole_params == 4_617_856
    text_only = dataclasses.replace(spec, vision_params=0, towers_whole_params=0)
    for tp in (2, 4):
        tower = (
            weights.compute_weight_breakdown(spec, tensor_parallel_size=tp).params
            - weights.compute_weight_breakdown(text_only, tensor_parallel_size=tp).params
        )
        split = spec.vision_params - spec.towers_whole_params
        assert tower == 2 * (split // tp + spec.towers_whole_params)  # bf16
