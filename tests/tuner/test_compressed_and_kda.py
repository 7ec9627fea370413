"""DeepSeek-V4's compressed sparse attention and Kimi-K3's KDA layers: read, paged and weighed.

The figures are vLLM 0.33's own (tests/contract/test_contract_kv_cache.py checks every point against the
wheel); these tests pin the layout the contract found, and the refusals, without importing vLLM.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory import kv_cache, weights
from kvpilot.tuner.model import COMPRESSED, LINEAR, MLA, SLIDING, build_model_spec

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def _config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    return config


def test_deepseek_v4_flash_caches_pack_into_vllms_five_groups() -> None:
    spec = build_model_spec(_config("deepseek-ai__DeepSeek-V4-Flash"))
    assert {layer.kind for layer in spec.layers} == {COMPRESSED}
    assert [layer.compress_ratio for layer in spec.layers[:4]] == [1, 1, 4, 128]
    layout = kv_cache.compute_kv_layout(spec, tensor_parallel_size=8)
    groups = [(g.kind, g.block_size, g.window, g.layers, g.group_bytes) for g in layout.groups]
    assert groups == [
        (SLIDING, 64, 128, 22, 22 * 37_440),  # every layer's SWA cache, split in two (repeats of 22)
        (SLIDING, 64, 128, 21, 21 * 37_440),
        ("full", 256, None, 62, 21 * 37_440 + 21 * 8_640 + 20 * 1_728),  # C4 + indexer + C128 latents
        (SLIDING, 4, 8, 42, 21 * 32_832 + 21 * 8_640),  # C4 compressor states, main and indexer
        (SLIDING, 8, 128, 20, 20 * 32_832),  # C128 compressor states
    ]
    assert layout.block_size == vllm.COMPRESSED_ATTENTION_BLOCK_SIZE == 256
    assert layout.bytes_per_block == 1_002_240  # vLLM's _pool_bytes_per_block on the same specs
    capacity = kv_cache.compute_capacity(layout, 40 * 2**30, 32_768, 2 * 8192)
    assert (capacity.num_blocks, capacity.tokens) == (42_853, 206_197)  # vLLM's get_kv_cache_capacity


def test_deepseek_v4_cache_is_the_same_in_every_fp8_spelling_and_replicated_over_tp() -> None:
    spec = build_model_spec(_config("deepseek-ai__DeepSeek-V4-Pro"))
    layouts = {
        kv_cache.compute_kv_layout(spec, tensor_parallel_size=tp, kv_cache_dtype=dtype)
        for tp in (1, 8)
        for dtype in ("auto", "fp8", "fp8_ds_mla")
    }
    assert len(layouts) == 1
    with pytest.raises(ValueError, match="DeepSeek-V4 cache"):
        kv_cache.compute_kv_layout(spec, kv_cache_dtype="int8_per_token_head")


def test_a_pipeline_stage_keeps_every_group_but_only_its_own_pages() -> None:
    spec = build_model_spec(_config("deepseek-ai__DeepSeek-V4-Flash"))
    whole = kv_cache.compute_kv_layout(spec)
    first, last = (kv_cache.compute_kv_layout(spec, pipeline_parallel_size=4, pp_rank=r) for r in (0, 3))
    assert len(first.groups) == len(last.groups) == len(whole.groups)
    assert sum(g.layers for g in first.groups) + sum(g.layers for g in last.groups) < sum(
        g.layers for g in whole.groups
    )
    assert first.bytes_per_block < whole.bytes_per_block


@pytest.mark.parametrize(
    ("ratios", "message"),
    [(lambda r: r[:10], "one entry per decoder layer"), (lambda r: [8] * len(r), "ratios 0, 1, 4 and 128")],
)
def test_compress_ratios_vllm_does_not_build_are_refused(ratios: Any, message: str) -> None:
    config = copy.deepcopy(_config("deepseek-ai__DeepSeek-V4-Flash"))
    config["compress_ratios"] = ratios(config["compress_ratios"])
    with pytest.raises(errors.InvalidModelConfig, match=message):
        build_model_spec(config)


def test_deepseek_v4_experts_are_weighed_at_mxfp4_unless_the_config_says_fp8() -> None:
    config = _config("deepseek-ai__DeepSeek-V4-Flash")
    fp4 = weights.compute_weight_bytes(build_model_spec(config))
    fp8 = weights.compute_weight_bytes(build_model_spec({**config, "expert_dtype": "fp8"}))
    assert 140 * 2**30 < fp4 < 150 * 2**30  # the published checkpoint: about 160 GB
    assert fp8 > 1.7 * fp4
    with pytest.raises(errors.InvalidModelConfig, match="expert_dtype"):
        build_model_spec({**config, "expert_dtype": "int2"})


def test_kimi_k3_pages_kda_state_beside_mla_with_flashkda_checkpoints_where_it_runs() -> None:
    spec = build_model_spec(_config("moonshotai__Kimi-K3"))
    kinds = spec.layer_kinds
    assert (kinds.count(LINEAR), kinds.count(MLA)) == (69, 24)
    assert kinds[3] == MLA and kinds[0] == kinds[1] == LINEAR  # kda_layers count from 1
    hopper = kv_cache.compute_kv_layout(spec, tensor_parallel_size=8, compute_capability=(9, 0))
    ampere = kv_cache.compute_kv_layout(spec, tensor_parallel_size=8, compute_capability=(8, 0))
    assert hopper.state_blocks_per_request() == 3 * 3  # FlashKDA: a checkpoint page per state group
    assert ampere.state_blocks_per_request() == 3 * 2  # Triton KDA: none
    assert hopper.block_size % vllm.MLA_HYBRID_BLOCK_ALIGNMENT == 0
    state = spec.linear_state
    assert state is not None and state.state_bytes(8, 2) <= hopper.groups[0].page_bytes
    unbounded = copy.deepcopy(_config("moonshotai__Kimi-K3"))
    del unbounded["text_config"]["linear_attn_config"]["gate_lower_bound"]
    plain = kv_cache.compute_kv_layout(build_model_spec(unbounded), compute_capability=(9, 0))
    assert plain.state_blocks_per_request() == 3 * 2  # FlashKDA needs a bounded gate


def test_kimi_k3_kda_layers_must_leave_an_mla_layer() -> None:
    config = copy.deepcopy(_config("moonshotai__Kimi-K3"))
    config["text_config"]["linear_attn_config"]["kda_layers"] = list(range(1, 94))
    with pytest.raises(errors.InvalidModelConfig, match="at least one MLA layer"):
        build_model_spec(config)
