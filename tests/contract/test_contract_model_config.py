"""Contract: kvpilot's model arithmetic agrees with vLLM 0.33's own ``ModelConfig``.

For every catalogue model the same config.json goes to
:func:`kvpilot.tuner.model.spec.build_model_spec` and to vLLM's ``ModelConfig``
(a local folder, no tokenizer, no network); layers, KV heads per rank at TP
1/2/4/8, head size, hidden size, vocabulary, the derived ``max_model_len``, the
sliding window, MLA and the layer kinds must match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.model.spec import (
    CHUNKED,
    COMPRESSED,
    FULL,
    LINEAR,
    MLA,
    NO_KV,
    SLIDING,
    ModelSpec,
    build_model_spec,
)

pytestmark = pytest.mark.contract

MODEL_IDS = [model_id for model_id, _ in models.list_models()]
TP_SIZES = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def both(catalogue_model_config: Callable[[str], Any]) -> Callable[[str], tuple[ModelSpec, Any]]:
    """Our ModelSpec and vLLM's ModelConfig of one catalogue model, from the same config.json."""

    def get(model_id: str) -> tuple[ModelSpec, Any]:
        return build_model_spec(models.lookup_model_config(model_id)), catalogue_model_config(model_id)

    return get


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_geometry_matches_vllm(model_id: str, both: Any, parallel_config: Any) -> None:
    spec, vllm_config = both(model_id)
    assert spec.num_layers == vllm_config.get_total_num_hidden_layers()
    assert spec.head_dim == vllm_config.get_head_size()
    assert spec.hidden_size == vllm_config.get_hidden_size()
    assert spec.vocab_size == vllm_config.get_vocab_size()
    assert spec.max_model_len == vllm_config.max_model_len
    # DeepSeek-V4's compressed sparse attention is vLLM's sparse-MLA family too
    assert (spec.mla is not None or spec.compressed is not None) == bool(vllm_config.use_mla)
    for tp in TP_SIZES:
        pc = parallel_config(tp)
        assert spec.num_layers_per_rank(1) == vllm_config.get_num_layers(pc), tp
        assert spec.kv_heads_per_rank(tp) == vllm_config.get_num_kv_heads(pc), tp


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_sliding_window_matches_vllm(model_id: str, both: Any) -> None:
    spec, vllm_config = both(model_id)
    # DeepSeek-V4: every compressed-sparse layer keeps a sliding-window cache
    windows = {layer.window for layer in spec.layers if layer.kind in (SLIDING, COMPRESSED)}
    expected = vllm_config.get_sliding_window()
    assert windows == ({expected} if expected else set())


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_layer_kinds_match_vllm(model_id: str, both: Any, parallel_config: Any) -> None:
    spec, vllm_config = both(model_id)
    pc = parallel_config(1)
    kinds = [layer.kind for layer in spec.layers]
    assert len(kinds) == spec.num_layers
    if spec.model_type == "nemotron_h":
        # vLLM's get_num_layers_by_block_type does not count Nemotron-H's block names; its KV path reads
        # transformers' layers_block_type: "linear_attention" (Mamba2), "full_attention", "mlp" and "moe"
        blocks = list(vllm_config.hf_text_config.layers_block_type)
        assert kinds.count(LINEAR) == sum(block in ("mamba", "linear_attention") for block in blocks)
        assert kinds.count(FULL) == sum(block in ("attention", "full_attention") for block in blocks)
        assert kinds.count(NO_KV) == sum(block in ("mlp", "moe") for block in blocks)
        return
    text = vllm_config.hf_text_config
    if getattr(text, "linear_attn_config", None) is not None and hasattr(text, "is_kda_layer"):
        # Kimi-K3: vLLM builds a KDA layer where its KimiLinearConfig.is_kda_layer says so (its config has
        # no layer_types, so get_num_layers_by_block_type cannot count them), MLA elsewhere
        assert kinds == [LINEAR if text.is_kda_layer(i) else MLA for i in range(spec.num_layers)]
        return
    linear = vllm_config.get_num_layers_by_block_type(pc, "linear_attention")
    assert kinds.count(LINEAR) == linear
    if spec.mla is not None:
        assert set(kinds) <= {MLA, LINEAR}  # Kimi-K3: KDA layers beside MLA, counted just above
    elif spec.compressed is not None:
        assert set(kinds) == {COMPRESSED}
    elif linear:
        assert kinds.count(FULL) == vllm_config.get_num_layers_by_block_type(pc, "attention")


_HF_LAYER_TYPES = {
    SLIDING: "sliding_attention",
    FULL: "full_attention",
    LINEAR: "linear_attention",
    CHUNKED: "chunked_attention",
}


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_layer_pattern_matches_the_parsed_config(model_id: str, both: Any) -> None:
    """Where transformers spells out ``layer_types`` (Gemma 2/3, gpt-oss, Qwen3-Next), the order matches."""
    spec, vllm_config = both(model_id)
    layer_types = getattr(vllm_config.hf_text_config, "layer_types", None)
    kinds_known = all(layer.kind in _HF_LAYER_TYPES for layer in spec.layers)
    if not layer_types or spec.mla is not None or not kinds_known:
        return
    assert [_HF_LAYER_TYPES[layer.kind] for layer in spec.layers] == list(layer_types)[: spec.num_layers]


def test_every_catalogue_model_is_checked() -> None:
    assert len(MODEL_IDS) >= 20
