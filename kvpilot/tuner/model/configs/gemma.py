"""Google Gemma configs: Gemma 2 (alternating sliding/full attention) and Gemma 3 (5 sliding : 1 full,
multimodal ``text_config``).
"""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of google/gemma-2-2b-it as published on the Hub (shared/data/vllm_memory_cases.json,
# case-011).
_GEMMA_2_2B_IT = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": [1, 107],
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.4",
    "use_cache": True,
    "vocab_size": 256000,
}


# config.json of google/gemma-2-9b-it as published on the Hub (shared/data/vllm_memory_cases.json,
# case-012).
_GEMMA_2_9B_IT = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}


# config.json of google/gemma-3-27b-it as published on the Hub (shared/data/vllm_memory_cases.json,
# case-014).
_GEMMA_3_27B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        id="google/gemma-2-2b-it",
        description="Gemma 2 2B IT: 26 layers alternating sliding (4096) / full",
        config=_GEMMA_2_2B_IT,
        checkpoint_bytes=5_228_683_776,
    ),
    ModelEntry(
        id="google/gemma-2-9b-it",
        description="Gemma 2 9B IT: 42 layers alternating sliding (4096) / full",
        config=_GEMMA_2_9B_IT,
    ),
    ModelEntry(
        id="google/gemma-3-27b-it",
        description="Gemma 3 27B IT: 62 layers, 5 sliding (1024) : 1 full, multimodal",
        config=_GEMMA_3_27B_IT,
    ),
)
