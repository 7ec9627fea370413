"""The sparse-attention indexer cache (DeepSeek-V3.2 / GLM-5): which layers keep one, and what it costs.

Integer agreement with vLLM 0.33 itself is tests/contract/test_contract_kv_cache.py; these check the rule
and the wiring on their own, without the wheel."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory import kv_cache
from kvpilot.tuner.model import MLA, build_model_spec

HF_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
V32 = json.loads((HF_CONFIGS / "deepseek-ai__DeepSeek-V3.2.json").read_text())


def test_every_layer_keeps_one_by_default() -> None:
    assert vllm.indexer_layers(5) == (True,) * 5


def test_the_index_cache_frequency_skips_layers() -> None:
    # layer i is skipped when max(i - offset + 1, 0) % freq != 0 (offset 2)
    assert vllm.indexer_layers(6, index_topk_freq=2) == (True, True, False, True, False, True)
    assert vllm.indexer_layers(4, index_topk_freq=2, index_skip_topk_offset=0) == (False, True, False, True)


def test_a_pattern_names_the_skipped_layers() -> None:
    assert vllm.indexer_layers(4, index_topk_pattern="FSFS") == (True, False, True, False)
    assert vllm.indexer_layers(3, index_topk_pattern=["S"]) == (False, True, True)


def test_the_indexer_page_is_beside_the_mla_page() -> None:
    spec = build_model_spec(copy.deepcopy(V32))
    without = build_model_spec({k: v for k, v in copy.deepcopy(V32).items() if not k.startswith("index")})
    assert all(layer.kind == MLA and layer.indexer_head_dim == V32["index_head_dim"] for layer in spec.layers)
    assert all(layer.indexer_head_dim == 0 for layer in without.layers)
    ours = kv_cache.compute_kv_layout(spec, block_size=16)  # the default differs: sparse backends take 64
    plain = kv_cache.compute_kv_layout(without, block_size=16)
    per_layer = vllm.indexer_bytes_per_token(V32["index_head_dim"])
    assert per_layer > V32["index_head_dim"]  # fp8 keys plus fp32 scales
    assert ours.bytes_per_token == plain.bytes_per_token + spec.num_layers * per_layer
    assert ours.bytes_per_block == plain.bytes_per_block + spec.num_layers * per_layer * ours.block_size
    assert ours.num_groups == 1  # one group: the indexer spec is full attention too


def test_the_pipeline_stage_counts_only_its_own_indexers() -> None:
    spec = build_model_spec(copy.deepcopy(V32))
    whole = kv_cache.compute_kv_layout(spec)
    first = kv_cache.compute_kv_layout(spec, pipeline_parallel_size=2, pp_rank=0)
    second = kv_cache.compute_kv_layout(spec, pipeline_parallel_size=2, pp_rank=1)
    assert first.bytes_per_token + second.bytes_per_token == whole.bytes_per_token


def test_a_bad_index_head_dim_is_refused_naming_it() -> None:
    config = copy.deepcopy(V32)
    config["index_head_dim"] = "128"
    with pytest.raises(errors.InvalidModelConfig) as info:
        build_model_spec(config)
    assert "index_head_dim" in str(info.value)
