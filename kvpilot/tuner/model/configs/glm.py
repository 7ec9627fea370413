"""Z.ai GLM-5 configs: MLA with a sparse-attention indexer, MoE.

Copied verbatim from the published ``config.json`` (``tests/data/hf_configs/``; ``INDEX.md`` there
names each source repository and commit)."""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of zai-org/GLM-5 as published (github:ai-dynamo/aiconfigurator).
_GLM_5 = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "dtype": "bfloat16",
    "eos_token_id": [154820, 154827, 154829],
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "head_dim": 64,
    "hidden_size": 6144,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "indexer_rope_interleave": True,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "kv_lora_rank": 512,
    "max_position_embeddings": 202752,
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "model_type": "glm_moe_dsa",
    "n_group": 1,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
    "num_key_value_heads": 64,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 154820,
    "pretraining_tp": 1,
    "q_lora_rank": 2048,
    "qk_head_dim": 256,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_interleave": True,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "transformers_version": "5.0.2.dev0",
    "use_cache": True,
    "v_head_dim": 256,
    "vocab_size": 154880,
}


ENTRIES = (
    ModelEntry(
        "zai-org/GLM-5", "GLM-5: 78 MLA layers with a sparse-attention indexer, 256-expert MoE", _GLM_5
    ),
)
