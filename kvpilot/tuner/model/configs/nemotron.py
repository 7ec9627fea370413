"""NVIDIA Nemotron-H / Nemotron 3 configs: Mamba2 state layers, attention, MLP and MoE blocks.

Copied verbatim from the published ``config.json`` (``tests/data/hf_configs/``; ``INDEX.md`` there
names each source repository and commit)."""

from __future__ import annotations

from kvpilot.tuner.model.configs._entry import ModelEntry

# config.json of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 as published (github:ai-dynamo/aiconfigurator).
_NVIDIA_NEMOTRON_3_NANO_30B_A3B_BF16 = {
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_nemotron_h.NemotronHConfig",
        "AutoModel": "modeling_nemotron_h.NemotronHForCausalLM",
        "AutoModelForCausalLM": "modeling_nemotron_h.NemotronHForCausalLM",
    },
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "eos_token_id": 2,
    "expand": 2,
    "head_dim": 128,
    "hidden_dropout": 0.0,
    "hidden_size": 2688,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "initializer_range": 0.02,
    "intermediate_size": 1856,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 64,
    "mamba_proj_bias": False,
    "mamba_ssm_cache_dtype": "float32",
    "max_position_embeddings": 262144,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h",
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1,
    "n_groups": 8,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_eps": 1e-05,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 52,
    "num_key_value_heads": 2,
    "num_logits_to_keep": 1,
    "pad_token_id": 0,
    "partial_rotary_factor": 1.0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "sliding_window": None,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.53.2",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 131072,
}


ENTRIES = (
    ModelEntry(
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "Nemotron 3 Nano 30B-A3B: 23 Mamba2 + 6 attention + 23 MoE blocks",
        _NVIDIA_NEMOTRON_3_NANO_30B_A3B_BF16,
    ),
)
