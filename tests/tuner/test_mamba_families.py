"""The Mamba / Mamba2 / short-conv families: layers, state pages, refusals and plans.

Configs: ``tests/data/mamba_family_configs.json`` (transformers config classes' defaults, as its ``source``
fields say). vLLM's own arithmetic on them: ``tests/contract/test_contract_mamba_families.py``.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import errors, gpus, memory, vllm
from kvpilot.tuner.memory import kv_cache
from kvpilot.tuner.model import FULL, LINEAR, MAMBA1, MAMBA2, SHORT_CONV, build_model_spec
from kvpilot.tuner.plan import planner
from kvpilot.tuner.types import EngineSettings, ServingBounds

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "mamba_family_configs.json"
CONFIGS: dict[str, dict[str, Any]] = {e["name"]: e["config"] for e in json.loads(DATA.read_text())["configs"]}


def config(name: str, **changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(CONFIGS[name]), **changes}


@pytest.mark.parametrize(
    ("name", "family", "attention", "state"),
    [
        ("MambaForCausalLM", MAMBA1, 0, 32),
        ("FalconMambaForCausalLM", MAMBA1, 0, 32),
        ("Mamba2ForCausalLM", MAMBA2, 0, 64),
        ("JambaForCausalLM", MAMBA1, 4, 28),  # attention where i % 8 == 4
        ("FalconH1ForCausalLM", MAMBA2, 32, 32),  # both in every layer
        ("GraniteMoeHybridForCausalLM", MAMBA2, 4, 28),
        ("Lfm2ForCausalLM", SHORT_CONV, 8, 24),  # full_attn_idxs
        ("Lfm2MoeForCausalLM", SHORT_CONV, 8, 24),
    ],
)
def test_each_family_reads_its_layers_and_state(name: str, family: str, attention: int, state: int) -> None:
    spec = build_model_spec(CONFIGS[name])
    assert spec.linear_state is not None and spec.linear_state.family == family
    assert sum(layer.kind == FULL for layer in spec.layers) == attention
    assert sum(layer.kind == LINEAR or layer.with_state for layer in spec.layers) == state


def test_jamba_layers_follow_attn_and_expert_periods() -> None:
    spec = build_model_spec(config("JambaForCausalLM", attn_layer_period=4, attn_layer_offset=1))
    assert [i for i, layer in enumerate(spec.layers) if layer.kind == FULL] == list(range(1, 32, 4))
    assert spec.moe is not None and spec.moe.num_moe_layers == 16  # i % 2 == 1
    dense = build_model_spec(config("JambaForCausalLM", num_experts=1))
    assert dense.moe is None


def test_state_page_bytes_are_conv_plus_ssm_in_the_model_dtype() -> None:
    mamba = build_model_spec(CONFIGS["MambaForCausalLM"])
    layout = kv_cache.compute_kv_layout(mamba)
    # (conv: 1536 x 3 + ssm: 1536 x 16) x 2 B, 32 layers in one group, unpadded: no attention page
    assert layout.groups[0].page_bytes == (1536 * 3 + 1536 * 16) * 2
    assert layout.bytes_per_block == 32 * layout.groups[0].page_bytes
    lfm2 = build_model_spec(CONFIGS["Lfm2ForCausalLM"])
    assert lfm2.linear_state is not None
    assert lfm2.linear_state.state_bytes(2, 2) == 2560 // 2 * 2 * 2  # conv only, L_cache - 1 = 2 steps


def test_attention_free_models_run_without_prefix_caching_by_default() -> None:
    """vLLM 0.33 enables prefix caching for hybrids only: an attention-free model keeps one state page per
    request; with ``--enable-prefix-caching`` (align mode) MambaMixer2 holds three (two, plus the prefill
    checkpoint its ``get_kv_cache_spec`` declares), Jamba's Mamba1 two."""
    spec = build_model_spec(CONFIGS["Mamba2ForCausalLM"])
    assert kv_cache.compute_kv_layout(spec).state_blocks_per_request() == 1
    assert kv_cache.compute_kv_layout(spec, enable_prefix_caching=True).state_blocks_per_request() == 3
    jamba = build_model_spec(CONFIGS["JambaForCausalLM"])
    assert kv_cache.compute_kv_layout(jamba).groups[0].state_pages == 2  # a hybrid: align mode


def test_falcon_h1_pads_its_state_to_the_attention_page() -> None:
    """Every Falcon-H1 layer keeps an attention page and a Mamba2 state page; vLLM raises the attention
    block until its page holds the state (Platform._align_hybrid_block_size)."""
    spec = build_model_spec(CONFIGS["FalconH1ForCausalLM"])
    layout = kv_cache.compute_kv_layout(spec)
    assert [(g.kind, g.layers) for g in layout.groups] == [(FULL, 32), (LINEAR, 32)]
    state = spec.linear_state
    assert state is not None
    page = layout.groups[0].page_bytes
    assert page == layout.block_size * 8 * 128 * 2 * 2 >= state.state_bytes(1, 2)
    assert layout.block_size % 16 == 0 and (layout.block_size - 16) * 8 * 128 * 4 < state.state_bytes(1, 2)


def test_bamba_is_refused_as_not_served() -> None:
    bamba = {"architectures": ["BambaForCausalLM"], "model_type": "bamba", "num_hidden_layers": 32}
    with pytest.raises(errors.InvalidModelConfig, match="vLLM 0.33 does not support BambaForCausalLM"):
        build_model_spec(bamba)


@pytest.mark.parametrize(
    ("name", "drop", "field"),
    [
        ("Lfm2ForCausalLM", "conv_dim", "conv_dim"),  # vLLM's lfm2.py reads config.conv_dim
        ("GraniteMoeHybridForCausalLM", "layer_types", "layer_types"),
        ("FalconH1ForCausalLM", "mamba_n_heads", "mamba_n_heads"),
        ("MambaForCausalLM", "state_size", "state_size"),
    ],
)
def test_a_missing_state_field_is_named(name: str, drop: str, field: str) -> None:
    broken = {k: v for k, v in CONFIGS[name].items() if k != drop}
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_model_spec(broken)
    assert caught.value.field == field


def test_an_attention_offset_past_its_period_is_refused() -> None:
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_model_spec(config("JambaForCausalLM", attn_layer_period=4, attn_layer_offset=4))
    assert caught.value.field == "attn_layer_offset"


@pytest.mark.parametrize("gpu_name", ["H100-SXM", "L4"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_plans_start_and_never_ask_more_sequences_than_state_blocks(name: str, gpu_name: str) -> None:
    gpu = gpus.lookup_gpu(gpu_name)
    spec = build_model_spec(CONFIGS[name])
    plan = planner.compute_plan(spec, gpu, 8, ServingBounds(max_context=32768))
    assert plan.feasible, plan.reasons
    assert plan.budget.starts and plan.budget.error is None
    assert plan.settings.max_num_seqs is not None and plan.settings.max_num_seqs <= plan.budget.num_gpu_blocks


def test_more_sequences_than_state_blocks_is_vllms_start_up_error() -> None:
    spec = build_model_spec(CONFIGS["FalconH1ForCausalLM"])
    gpu = gpus.lookup_gpu("L4")
    budget = memory.compute_budget(spec, gpu, EngineSettings(max_model_len=4096, max_num_seqs=1024))
    assert budget.num_gpu_blocks < 1024
    assert budget.error == vllm.mamba_cache_blocks_error(1024, budget.num_gpu_blocks)


def test_zamba2_is_refused_as_not_modelled() -> None:
    zamba = {"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "num_hidden_layers": 54}
    with pytest.raises(errors.InvalidModelConfig, match="Zamba2's shared attention blocks") as caught:
        build_model_spec(zamba)
    assert caught.value.field == "model_type"


def test_estimate_takes_prefix_caching_from_the_case() -> None:
    """``enable_prefix_caching`` in an estimate case: off halves a hybrid's state pages per request."""
    from kvpilot.tuner.memory import estimate

    base = {"hf_config": CONFIGS["JambaForCausalLM"], "gpu": "H100-SXM", "tensor_parallel_size": 8}
    base |= {"max_model_len": 4096, "max_num_seqs": 256}
    cases = [{**base, "id": "on", "enable_prefix_caching": True}, {**base, "id": "default"}]
    cases.append({**base, "id": "off", "enable_prefix_caching": False})
    on, default, off = estimate.compute_estimates(cases, gpus.lookup_gpu)
    assert on["num_gpu_blocks"] == off["num_gpu_blocks"] == default["num_gpu_blocks"]
    assert on["max_concurrency"] == default["max_concurrency"] < off["max_concurrency"]


def test_tensor_parallelism_must_split_the_state_evenly() -> None:
    """vLLM's ``divide`` asserts on a mixer's heads and conv channels: the planner's TP stays below a size
    that does not split them, and the budget refuses it with vLLM's assertion text."""
    from kvpilot.tuner.plan import topology

    odd = build_model_spec(
        config("FalconH1ForCausalLM", mamba_d_ssm=1536, mamba_n_heads=12, mamba_d_head=128)
    )
    assert odd.linear_state is not None and odd.num_attention_heads % 8 == 0
    assert topology.compute_tensor_parallel(odd, 8) == 4
    budget = memory.compute_budget(odd, gpus.lookup_gpu("H100-SXM"), EngineSettings(tensor_parallel_size=8))
    assert not budget.starts and budget.error == "AssertionError: 12 is not divisible by 8"
    even = build_model_spec(CONFIGS["FalconH1ForCausalLM"])
    assert topology.compute_tensor_parallel(even, 8) == 8
