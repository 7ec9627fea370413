"""Mistral configs: Mistral 7B v0.1 (sliding window on every layer), v0.3 (full attention), Mixtral
8x7B (MoE).
"""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of mistralai/Mistral-7B-Instruct-v0.1 as published on the Hub.
_MISTRAL_7B_INSTRUCT_V0_1 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


# config.json of mistralai/Mistral-7B-Instruct-v0.3 as published on the Hub.
_MISTRAL_7B_INSTRUCT_V0_3 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 32768,
}


# config.json of mistralai/Mixtral-8x7B-Instruct-v0.1 as published on the Hub
# (shared/data/vllm_memory_cases.json, case-033).
_MIXTRAL_8X7B_INSTRUCT_V0_1 = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        id="mistralai/Mistral-7B-Instruct-v0.1",
        description="Mistral 7B Instruct v0.1: sliding window 4096 on all 32 layers",
        config=_MISTRAL_7B_INSTRUCT_V0_1,
    ),
    ModelEntry(
        id="mistralai/Mistral-7B-Instruct-v0.3",
        description="Mistral 7B Instruct v0.3: full attention, 32K context",
        config=_MISTRAL_7B_INSTRUCT_V0_3,
    ),
    ModelEntry(
        id="mistralai/Mixtral-8x7B-Instruct-v0.1",
        description="Mixtral 8x7B Instruct: 8-expert MoE, 32 layers, 8 KV heads",
        config=_MIXTRAL_8X7B_INSTRUCT_V0_1,
    ),
)
