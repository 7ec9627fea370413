"""Gemma 4's ``use_double_wide_mlp`` (E2B): the KV-sharing layers' MLP is twice as wide, as vLLM 0.33's
``Gemma4DecoderLayer`` builds it (``tests/contract/test_contract_model_classes.py`` holds the bytes to vLLM's
own class on the meta device; these hold what the flag moves)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import budget
from kvpilot.tuner.memory.weights import compute_weight_breakdown
from kvpilot.tuner.model import build_model_spec

E2B = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "google__gemma-4-E2B-it.json"


def _with(wide: bool | None) -> dict[str, Any]:
    config = copy.deepcopy(json.loads(E2B.read_text()))
    if wide is None:
        config["text_config"].pop("use_double_wide_mlp", None)
    else:
        config["text_config"]["use_double_wide_mlp"] = wide
    return config


def test_the_kv_sharing_layers_of_a_double_wide_config_have_twice_the_mlp() -> None:
    wide, narrow = build_model_spec(_with(True)), build_model_spec(_with(False))
    shared = 20  # the E2B config's num_kv_shared_layers
    assert [la.mlp_intermediate for la in wide.layers[-shared:]] == [2 * 6144] * shared
    assert all(la.mlp_intermediate is None for la in wide.layers[:-shared])
    assert all(la.mlp_intermediate is None for la in narrow.layers)
    assert build_model_spec(_with(None)) == narrow  # absent is transformers' default, False
    gap = compute_weight_breakdown(wide).params - compute_weight_breakdown(narrow).params
    assert gap == shared * 3 * 1536 * 6144 * 2  # gate, up and down, 6,144 more wide, bf16


def test_the_profile_runs_the_widest_mlp() -> None:
    def activation(spec: Any) -> float:
        return budget.compute_activation_bytes(
            spec,
            tp=1,
            pp=1,
            pp_rank=0,
            max_num_batched_tokens=8192,
            max_num_seqs=1,  # the forward, not the sampler, sets the peak
            dtype="bfloat16",
            version=vllm.parse_version(vllm.PINNED_VLLM_VERSION),
        )

    more = activation(build_model_spec(_with(True))) - activation(build_model_spec(_with(False)))
    assert more == 8192 * 2 * 3 * 6144  # tokens x bf16 x (gate, up, product) x the added width
