"""The built-in model catalogue: its ids, lookups, and configs equal to the published ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.model.spec import MLA, SLIDING, build_model_spec

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "vllm_memory_cases.json"

REQUIRED = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8",
    "meta-llama/Llama-3.3-70B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-30B-A3B",
    "mistralai/Mistral-7B-Instruct-v0.1",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "google/gemma-2-9b-it",
    "google/gemma-3-27b-it",
    "deepseek-ai/DeepSeek-V3",
    "openai/gpt-oss-20b",
    "openai/gpt-oss-120b",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
]
IDS = [model_id for model_id, _ in models.list_models()]


def test_catalogue_has_the_required_models() -> None:
    assert set(REQUIRED) <= set(IDS)
    assert len(IDS) == len(set(IDS))


def test_every_entry_has_a_description() -> None:
    assert all(description.strip() for _, description in models.list_models())


@pytest.mark.parametrize("model_id", IDS)
def test_configs_are_plain_json_data(model_id: str) -> None:
    config = models.lookup_model_config(model_id)
    assert json.loads(json.dumps(config)) == config
    assert config.get("architectures")


@pytest.mark.parametrize("model_id", IDS)
def test_every_config_builds_a_model_spec(model_id: str) -> None:
    spec = build_model_spec(models.lookup_model_config(model_id))
    assert spec.num_layers > 0


def _published_configs() -> dict[str, dict[str, object]]:
    published: dict[str, dict[str, object]] = {}
    for case in json.loads(CASES_FILE.read_text()):
        if case.get("config_exact") and case.get("hf_config"):
            published.setdefault(case["model"].split(" ")[0], case["hf_config"])
    return published


def test_configs_equal_the_published_ones_where_the_data_has_them() -> None:
    published = _published_configs()
    checked = [model_id for model_id in IDS if model_id in published]
    assert len(checked) >= 15
    for model_id in checked:
        assert models.lookup_model_config(model_id) == published[model_id], model_id


def test_lookup_returns_a_deep_copy() -> None:
    config = models.lookup_model_config("google/gemma-3-27b-it")
    config["text_config"]["num_hidden_layers"] = 1  # type: ignore[index]
    assert models.lookup_model_config("google/gemma-3-27b-it")["text_config"]["num_hidden_layers"] == 62  # type: ignore[index]


@pytest.mark.parametrize(
    "query",
    [
        "meta-llama/Llama-3.1-8B-Instruct",
        "META-LLAMA/llama-3.1-8b-instruct",
        "Llama-3.1-8B-Instruct",
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct",
        " meta-llama/Llama-3.1-8B-Instruct/ ",
    ],
)
def test_lookup_is_forgiving_about_spelling(query: str) -> None:
    assert models.lookup_model(query).id == "meta-llama/Llama-3.1-8B-Instruct"


def test_unknown_model_names_close_matches_and_the_ways_out() -> None:
    with pytest.raises(errors.UnknownModel) as info:
        models.lookup_model_config("meta-llama/Llama-3.1-8B")
    message = info.value.message
    assert "meta-llama/Llama-3.1-8B-Instruct" in message
    assert "--config" in message
    assert "ConfigMap" in message
    assert "Hub" in message
    assert info.value.reason == "UnknownModel"


def test_known_checkpoint_sizes() -> None:
    assert models.lookup_checkpoint_bytes("meta-llama/Llama-3.1-8B-Instruct") == 16_060_522_496
    assert models.lookup_checkpoint_bytes("meta-llama/Llama-3.1-70B-Instruct") is None


def test_architecture_features_the_memory_model_relies_on() -> None:
    fp8 = models.lookup_model_config("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8")
    assert fp8["quantization_config"]["quant_method"] == "compressed-tensors"  # type: ignore[index]
    mistral = build_model_spec(models.lookup_model_config("mistralai/Mistral-7B-Instruct-v0.1"))
    assert {layer.kind for layer in mistral.layers} == {SLIDING}
    assert "text_config" in models.lookup_model_config("google/gemma-3-27b-it")
    deepseek = build_model_spec(models.lookup_model_config("deepseek-ai/DeepSeek-V3"))
    assert {layer.kind for layer in deepseek.layers} == {MLA}
