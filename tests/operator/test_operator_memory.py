"""Operator memory bounded whatever configs tenants name (kvpilot.operator.planning.resolve,
kvpilot.tuner.model.fields): a hostile config.json is refused before it is parsed, and the Hub cache keeps
what the memory model needs, never the documents."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest
from operator_fakes import FakeKube

from kvpilot.operator import api
from kvpilot.operator.planning import resolve
from kvpilot.operator.planning.model_files import ModelFiles
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.model import MAX_JSON_VALUES
from kvpilot.tuner.model.fields import count_json_values, parse_config_json

HOSTILE = ("[" + ",".join(["{}"] * 300_000) + "]").encode()[: (1 << 20) - 1]  # just under 1 MiB
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}


def test_the_count_is_an_upper_bound_that_ignores_punctuation_in_strings() -> None:
    text = json.dumps({"a": [1, 2, {"b": "x, y, [z], {w}"}], "c": None}).encode()
    assert count_json_values(text) >= 7  # the object, a, its list, 1, 2, the inner object, its string...
    long_string = json.dumps({"template": "," * (MAX_JSON_VALUES * 2)}).encode()
    assert count_json_values(long_string) <= 3  # commas inside a string are no values
    parse_config_json(long_string, "config.json")  # so a long string is no reason to refuse


def test_a_config_of_many_values_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(tuner_errors.InvalidModelConfig, match=r"JSON values; a config.json may hold at most"):
        parse_config_json(HOSTILE, "config.json of evil/model")


def test_every_published_config_is_far_below_the_value_bound() -> None:
    configs = sorted((Path(__file__).resolve().parents[1] / "data" / "hf_configs").glob("*.json"))
    assert configs, "the published configs are in tests/data"
    worst = max(count_json_values(p.read_bytes()) for p in configs)
    assert worst < MAX_JSON_VALUES / 5, worst


def test_200_hostile_hub_configs_leave_the_operator_small() -> None:
    """200 InferenceServices naming 200 hostile Hub repositories, and 200 naming real-looking ones: what
    stays in the operator's memory is bounded by the caches' entries of a few KB each."""
    resolve.clear_caches()

    def hub(model_id: str, revision: str | None, token: str | None) -> ModelFiles:
        if model_id.startswith("evil/"):
            return ModelFiles(parse_config_json(HOSTILE, f"config.json of {model_id}"))
        wider = {**LLAMA, "hidden_size": 4096 + 128 * int(model_id[5:])}
        return ModelFiles(parse_config_json(json.dumps(wider), model_id))

    gc.collect()
    tracemalloc.start()
    try:
        for i in range(200):
            with pytest.raises(tuner_errors.InvalidModelConfig):
                resolve.read_model(api.ModelRef(id=f"evil/m{i}", source="Hub"), "ns", FakeKube(), hub)
            resolve.read_model(api.ModelRef(id=f"good/{i}", source="Hub"), "ns", FakeKube(), hub)
        gc.collect()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        resolve.clear_caches()
    print(f"200 hostile + 200 real Hub configs: peak {peak / 2**20:.1f} MiB, retained {retained / 2**20:.2f}")
    assert peak < 64 << 20  # the chart's limit is 512Mi
    assert retained < 16 << 20
