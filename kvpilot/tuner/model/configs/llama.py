"""Meta Llama configs: Llama 3 / 3.1 / 3.3 dense (GQA, llama3 RoPE scaling), an FP8 checkpoint, Llama 4
Scout (MoE, multimodal).
"""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of meta-llama/Llama-3.1-8B-Instruct as published on the Hub
# (shared/data/vllm_memory_cases.json, case-001).
_LLAMA_3_1_8B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 128256,
}


# config.json of meta-llama/Meta-Llama-3-8B-Instruct as published on the Hub
# (shared/data/vllm_memory_cases.json, case-086).
_META_LLAMA_3_8B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128009,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


# config.json of meta-llama/Llama-3.1-70B-Instruct as published on the Hub.
_LLAMA_3_1_70B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "intermediate_size": 28672,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 128256,
}


# config.json of meta-llama/Llama-3.3-70B-Instruct as published on the Hub.
_LLAMA_3_3_70B_INSTRUCT = {**_LLAMA_3_1_70B_INSTRUCT, "transformers_version": "4.47.0.dev0"}


# config.json of RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8 as published on the Hub.
_META_LLAMA_3_1_70B_INSTRUCT_FP8 = {
    **_LLAMA_3_1_70B_INSTRUCT,
    "transformers_version": "4.44.0",
    "quantization_config": {
        "config_groups": {
            "group_0": {
                "input_activations": {
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "tensor",
                    "symmetric": True,
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "tensor",
                    "symmetric": True,
                    "type": "float",
                },
            },
        },
        "format": "float-quantized",
        "global_compression_ratio": 1.463543865167781,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "frozen",
    },
}


# config.json of meta-llama/Llama-4-Scout-17B-16E-Instruct as published on the Hub
# (shared/data/vllm_memory_cases.json, case-029).
_LLAMA_4_SCOUT_17B_16E_INSTRUCT = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "boi_token_index": 200080,
    "eoi_token_index": 200081,
    "image_token_index": 200092,
    "model_type": "llama4",
    "text_config": {
        "_attn_implementation_autoset": True,
        "attention_bias": False,
        "attention_chunk_size": 8192,
        "attention_dropout": 0.0,
        "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008],
        "for_llm_compressor": False,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "interleave_moe_layer_step": 1,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "max_position_embeddings": 10485760,
        "model_type": "llama4_text",
        "no_rope_layers": [],
        "num_attention_heads": 40,
        "num_experts_per_tok": 1,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "num_local_experts": 16,
        "output_router_logits": False,
        "pad_token_id": 200018,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 16.0,
            "high_freq_factor": 1.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_qk_norm": True,
        "vocab_size": 202048,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
    "vision_config": {
        "_attn_implementation_autoset": True,
        "attention_dropout": 0.0,
        "hidden_act": "gelu",
        "hidden_size": 1408,
        "image_size": 336,
        "initializer_range": 0.02,
        "intermediate_size": 5632,
        "model_type": "llama4_vision_model",
        "multi_modal_projector_bias": False,
        "norm_eps": 1e-05,
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 34,
        "patch_size": 14,
        "pixel_shuffle_ratio": 0.5,
        "projector_dropout": 0.0,
        "projector_input_dim": 4096,
        "projector_output_dim": 4096,
        "rope_theta": 10000,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "vision_output_dim": 4096,
    },
}


ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        id="meta-llama/Llama-3.1-8B-Instruct",
        description="Llama 3.1 8B Instruct: 32 layers, 8 KV heads, 128K context",
        config=_LLAMA_3_1_8B_INSTRUCT,
        checkpoint_bytes=16_060_522_496,
    ),
    ModelEntry(
        id="meta-llama/Meta-Llama-3-8B-Instruct",
        description="Llama 3 8B Instruct: 32 layers, 8 KV heads, 8K context",
        config=_META_LLAMA_3_8B_INSTRUCT,
        checkpoint_bytes=16_060_522_496,
    ),
    ModelEntry(
        id="meta-llama/Llama-3.1-70B-Instruct",
        description="Llama 3.1 70B Instruct: 80 layers, 8 KV heads, 128K context",
        config=_LLAMA_3_1_70B_INSTRUCT,
    ),
    ModelEntry(
        id="meta-llama/Llama-3.3-70B-Instruct",
        description="Llama 3.3 70B Instruct: 80 layers, 8 KV heads, 128K context",
        config=_LLAMA_3_3_70B_INSTRUCT,
    ),
    ModelEntry(
        id="RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8",
        description="Llama 3.1 70B Instruct, FP8 weights (compressed-tensors W8A8)",
        config=_META_LLAMA_3_1_70B_INSTRUCT_FP8,
    ),
    ModelEntry(
        id="meta-llama/Llama-4-Scout-17B-16E-Instruct",
        description="Llama 4 Scout: 16-expert MoE, chunked attention, multimodal",
        config=_LLAMA_4_SCOUT_17B_16E_INSTRUCT,
    ),
)
