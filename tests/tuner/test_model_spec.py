"""Model specs from published configs: geometry, layer kinds, MoE, MLA, max_model_len, errors."""

from __future__ import annotations

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.model.spec import CHUNKED, FULL, LINEAR, MLA, SLIDING, build_model_spec


def kinds(spec):
    return list(spec.layer_kinds)


def test_llama3_gqa_versus_the_naive_formula() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)
    assert (spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (4096, 14336, 128256)
    assert spec.dtype == "bfloat16" and not spec.tie_word_embeddings
    assert spec.max_model_len == 131072  # llama3 rope scaling is not applied again
    assert set(kinds(spec)) == {FULL}
    gqa = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    naive = 2 * spec.num_layers * spec.num_attention_heads * spec.head_dim * 2
    assert gqa == 128 * 1024
    assert naive / gqa == 4  # the guides' MHA formula overstates Llama 3's KV four-fold


@pytest.mark.parametrize(("tp", "per_rank"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)])
def test_kv_heads_per_rank(tp: int, per_rank: int) -> None:
    assert build_model_spec(cfg.LLAMA_31_8B).kv_heads_per_rank(tp) == per_rank


def test_mistral_v01_is_all_sliding_window_and_v03_is_full() -> None:
    v01 = build_model_spec(cfg.MISTRAL_7B_V01)
    assert set(kinds(v01)) == {SLIDING}
    assert {layer.window for layer in v01.layers} == {4096}
    assert set(kinds(build_model_spec(cfg.MISTRAL_7B_V03))) == {FULL}


def test_gemma2_alternates_sliding_and_full() -> None:
    spec = build_model_spec(cfg.GEMMA_2_9B)
    assert kinds(spec)[:4] == [SLIDING, FULL, SLIDING, FULL]
    assert kinds(spec).count(SLIDING) == kinds(spec).count(FULL) == 21
    assert spec.tie_word_embeddings  # Gemma's config class default
    assert spec.max_model_len == 8192


def test_gemma3_text_config_defaults_and_five_to_one_pattern() -> None:
    spec = build_model_spec(cfg.GEMMA_3_27B)
    assert spec.model_type == "gemma3_text"
    assert spec.vocab_size == 262208  # from Gemma3TextConfig's defaults: the config omits it
    assert kinds(spec).count(SLIDING) == 52 and kinds(spec).count(FULL) == 10
    assert kinds(spec)[5] == FULL and kinds(spec)[:5] == [SLIDING] * 5
    assert spec.max_model_len == 131072  # vLLM skips the linear factor for Gemma 3
    assert spec.is_multimodal and spec.vision_params > 400_000_000


def test_gpt_oss_alternation_moe_and_mxfp4() -> None:
    spec = build_model_spec(cfg.GPT_OSS_20B)
    assert kinds(spec)[:2] == [SLIDING, FULL] and {layer.window for layer in spec.layers if layer.window} == {
        128
    }
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.num_moe_layers) == (32, 4, 24)
    assert spec.quantization is not None and spec.quantization.method == "mxfp4"
    assert spec.quantization.experts_only
    assert spec.max_model_len == 131072
    assert spec.default_max_model_len((0, 29)) == 4096 * 32  # YaRN multiplied the original length up to 0.29


def test_deepseek_v3_mla_latent_is_one_replicated_head() -> None:
    spec = build_model_spec(cfg.DEEPSEEK_V3)
    assert set(kinds(spec)) == {MLA}
    assert spec.num_kv_heads == 1 and spec.head_dim == 576
    assert spec.kv_heads_per_rank(8) == 1
    assert (
        spec.moe is not None and spec.moe.num_moe_layers == 58 and spec.moe.shared_intermediate_size == 2048
    )
    assert spec.quantization is not None and spec.quantization.method == "fp8"
    assert spec.max_model_len == 163840


def test_qwen3_next_hybrid_linear_attention() -> None:
    spec = build_model_spec(cfg.QWEN3_NEXT_80B)
    assert kinds(spec).count(LINEAR) == 36 and kinds(spec).count(FULL) == 12
    assert kinds(spec)[3] == FULL
    assert spec.linear_state is not None and spec.linear_state.conv_dim == 2 * 16 * 128 + 32 * 128
    assert spec.moe is not None and spec.moe.num_experts == 512


@pytest.mark.parametrize(
    ("config", "experts", "top_k", "inter", "moe_layers"),
    [
        (cfg.MIXTRAL_8X7B, 8, 2, 14336, 32),
        (cfg.QWEN3_30B_A3B, 128, 8, 768, 48),
        (cfg.LLAMA_4_SCOUT, 16, 1, 8192, 48),
    ],
)
def test_moe_layouts(config, experts: int, top_k: int, inter: int, moe_layers: int) -> None:
    moe = build_model_spec(config).moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.moe_intermediate_size, moe.num_moe_layers) == (
        experts,
        top_k,
        inter,
        moe_layers,
    )


def test_llama4_chunked_local_with_every_fourth_layer_global() -> None:
    spec = build_model_spec(cfg.LLAMA_4_SCOUT)
    assert kinds(spec)[:4] == [CHUNKED, CHUNKED, CHUNKED, FULL]
    assert kinds(spec).count(FULL) == 12
    assert (
        spec.intermediate_size == 16384 and spec.moe is not None and spec.moe.shared_intermediate_size == 8192
    )
    assert spec.is_multimodal and spec.max_model_len == 10485760


def test_multimodal_reads_the_nested_text_config() -> None:
    spec = build_model_spec(cfg.GEMMA_3_27B)
    assert spec.hidden_size == 5376 and spec.num_layers == 62 and spec.num_kv_heads == 16


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}, "max_position_embeddings": 4096}, 16384),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 4096}, 8192),
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
                "max_position_embeddings": 131072,
            },
            131072,
        ),
        ({"rope_scaling": None, "max_position_embeddings": 8192, "model_max_length": 4096}, 4096),
        ({"rope_scaling": None, "max_position_embeddings": 8192, "seq_length": 4096}, 4096),
    ],
)
def test_max_model_len_rules(changes, expected: int) -> None:
    assert build_model_spec({**cfg.LLAMA_31_8B, **changes}).max_model_len == expected


def test_pipeline_split_follows_get_pp_indices() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    assert [spec.num_layers_per_rank(3, r) for r in range(3)] == [11, 11, 10]
    assert [spec.num_layers_per_rank(4, r) for r in range(4)] == [8, 8, 8, 8]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({k: v for k, v in cfg.LLAMA_31_8B.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        ({k: v for k, v in cfg.LLAMA_31_8B.items() if k != "vocab_size"}, "vocab_size"),
        (
            {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "num_hidden_layers": 32},
            "hidden_size",
        ),
        (
            {**cfg.LLAMA_31_8B, "quantization_config": {"quant_method": "hqq"}},
            "quantization_config.quant_method",
        ),
        ({**cfg.GPT_OSS_20B, "sliding_window": None}, "sliding_window"),
    ],
)
def test_unaccountable_configs_name_the_field(config, field: str) -> None:
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_model_spec(config)
    assert caught.value.field == field
    assert field.split(".")[-1] in caught.value.message or field == "model_type"
