"""DeepSeek configs: V3 / R1 (MLA attention: one 576-element latent per token, FP8 block-quantized
weights, 256-expert MoE).
"""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of deepseek-ai/DeepSeek-R1 as published on the Hub (shared/data/vllm_memory_cases.json,
# case-074).
_DEEPSEEK_R1 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


# deepseek-ai/DeepSeek-V3 has R1's architecture: the same config.json but for transformers_version.
_DEEPSEEK_V3 = {**_DEEPSEEK_R1, "transformers_version": "4.33.1"}


ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        id="deepseek-ai/DeepSeek-V3",
        description="DeepSeek V3: 671B MoE, MLA (kv_lora_rank 512 + rope 64), FP8 weights",
        config=_DEEPSEEK_V3,
    ),
    ModelEntry(
        id="deepseek-ai/DeepSeek-R1",
        description="DeepSeek R1: V3 architecture, MLA, FP8 weights",
        config=_DEEPSEEK_R1,
    ),
)
