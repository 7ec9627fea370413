"""The block size vLLM 0.33 picks per attention backend and GPU when ``--block-size`` is not given."""

from __future__ import annotations

import copy

from kvpilot.tuner import gpus, memory, vllm
from kvpilot.tuner.memory import kv_cache
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.types import EngineSettings

V033 = vllm.PINNED_VERSION
R1 = build_model_spec(models.lookup_model_config("deepseek-ai/DeepSeek-R1"))


def test_dense_mla_on_blackwell_takes_flashinfer_mlas_32_tokens() -> None:
    b200 = gpus.lookup_gpu("B200").compute_capability
    assert kv_cache.compute_kv_layout(R1, compute_capability=b200).block_size == 32
    assert kv_cache.compute_kv_layout(R1, compute_capability=(9, 0)).block_size == 16  # FlashAttention MLA
    assert kv_cache.compute_kv_layout(R1, compute_capability=(12, 0)).block_size == 16  # Triton MLA
    assert kv_cache.compute_kv_layout(R1, compute_capability=b200, block_size=64).block_size == 64  # pinned
    assert kv_cache.compute_kv_layout(R1, compute_capability=b200, vllm_version=(0, 19, 0)).block_size == 16


def test_flashinfer_mla_refuses_other_nope_dims_and_cutlass_takes_128() -> None:
    assert vllm.default_kv_block_size(V033, (10, 0), mla=True, qk_nope_head_dim=128) == 32
    assert vllm.default_kv_block_size(V033, (10, 0), mla=True, qk_nope_head_dim=96) == 128


def test_sparse_mla_takes_the_sparse_backends_blocks() -> None:
    assert vllm.default_kv_block_size(V033, (9, 0), mla=True, sparse=True) == 64
    assert vllm.default_kv_block_size(V033, (10, 0), mla=True, sparse=True, kv_cache_dtype="fp8") == 32
    assert vllm.default_kv_block_size(V033, (10, 0), mla=True, sparse=True, heads_per_gpu=16) == 32
    assert vllm.default_kv_block_size(V033, (10, 0), mla=True, sparse=True, heads_per_gpu=32) == 64
    assert vllm.default_kv_block_size(V033, (12, 0), mla=True, sparse=True) == 64


def test_attention_without_mla_keeps_16_everywhere() -> None:
    for capability in ((8, 0), (8, 9), (9, 0), (10, 0), (12, 0)):
        assert vllm.default_kv_block_size(V033, capability) == vllm.DEFAULT_BLOCK_SIZE == 16


def test_the_budget_counts_blackwell_mla_blocks_of_32_tokens() -> None:
    """A 32-token block holds twice a 16-token block's bytes: half the blocks."""
    b200 = gpus.lookup_gpu("B200")
    settings = EngineSettings(max_model_len=32768, tensor_parallel_size=8)
    budget = memory.compute_budget(copy.deepcopy(R1), b200, settings)
    pinned = memory.compute_budget(R1, b200, settings, block_size=16)
    assert budget.starts and pinned.starts
    assert budget.num_gpu_blocks == pinned.num_gpu_blocks // 2
