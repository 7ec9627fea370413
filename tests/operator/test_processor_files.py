"""A multimodal model's processor files from a ConfigMap: the operator plans what ``kvpilot plan --config
FOLDER`` plans for the same files (:mod:`kvpilot.operator.planning.model_files`).

The model is case-104 of ``tests/data/vllm_memory_cases_public_2x.json``: Qwen/Qwen3.5-0.8B's published
config.json and its family's published processor files (image ``size.longest_edge`` 16,777,216, video
25,165,824), with which vLLM's dummy encoder batch is one image of 16,384 tokens, not eight of 980.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from operator_fakes import FakeKube, Harness, isvc

from kvpilot import cli
from kvpilot.operator import api, errors
from kvpilot.operator.planning import model_files, resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import model as models

CASES = Path(__file__).resolve().parents[1] / "data" / "vllm_memory_cases_public_2x.json"
(QWEN35,) = (case for case in json.loads(CASES.read_text()) if case["id"] == "case-104")
CONFIG: dict[str, Any] = QWEN35["hf_config"]
PROCESSORS = {
    "preprocessor_config.json": QWEN35["preprocessor_config"],
    "video_preprocessor_config.json": QWEN35["video_preprocessor_config"],
}
GPU, CONTEXT = "A100-80GB", 32768
REF = api.ConfigMapRef(name="cfg")


def _config_map(**extra: str) -> dict[str, str]:
    return {"config.json": json.dumps(CONFIG), **extra}


def _with_processors() -> dict[str, str]:
    return _config_map(**{name: json.dumps(content) for name, content in PROCESSORS.items()})


def _cli_budget(folder: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan", "--config", str(folder), "--gpu", GPU, "--max-context", str(CONTEXT), "--json"]
    assert cli.main(argv, out=out, err=err) == 0, err.getvalue()
    return dict(json.loads(out.getvalue())["budget"])


async def _operator_budget(planner: Harness, data: dict[str, str]) -> dict[str, Any]:
    resolve.clear_caches()
    planner.kube.config_maps[("ns1", "cfg")] = data
    body = isvc(
        model={"id": "Qwen/Qwen3.5-0.8B", "source": "ConfigMap", "configMapRef": {"name": "cfg"}},
        gpu={"count": 1, "product": GPU},
        serving={"maxContextLength": CONTEXT},
    )
    await planner.run(body)
    return dict(body["status"]["budget"])


async def test_a_configmaps_processor_files_plan_as_the_cli_plans_their_folder(
    planner: Harness, tmp_path: Path
) -> None:
    """The same files, the same budget: the operator's status and ``kvpilot plan --config FOLDER``'s JSON;
    without them both plan transformers' default pixels, a smaller encoder batch and a larger KV cache."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    default_cli, default_operator = _cli_budget(tmp_path), await _operator_budget(planner, _config_map())
    for name, content in PROCESSORS.items():
        (tmp_path / name).write_text(json.dumps(content))
    published_cli, published_operator = (
        _cli_budget(tmp_path),
        await _operator_budget(planner, _with_processors()),
    )

    assert published_operator["kvCacheTokens"] == published_cli["kv_cache_tokens"]
    assert published_operator["activationGiB"] == pytest.approx(published_cli["activation_gib"], abs=1e-3)
    assert default_operator["kvCacheTokens"] == default_cli["kv_cache_tokens"]
    assert published_operator["activationGiB"] > default_operator["activationGiB"] + 0.3
    assert published_operator["kvCacheTokens"] < default_operator["kvCacheTokens"]


def test_the_model_key_is_config_json_s_until_processor_files_come_and_each_replans() -> None:
    """A text model (or a multimodal one without processor files) keeps the key it always had, so its
    TuningProfiles still match; a changed processor file is another key, another ModelSpec, a new plan."""
    resolve.clear_caches()
    kube = FakeKube()
    ref = api.ModelRef(id="Qwen/Qwen3.5-0.8B", source="ConfigMap", configMapRef=REF)
    kube.config_maps[("ns1", "cfg")] = _config_map()
    plain = resolve.read_model(ref, "ns1", kube)
    assert plain.config_key == model_files.compute_config_key(CONFIG)
    kube.config_maps[("ns1", "cfg")] = _with_processors()
    published = resolve.read_model(ref, "ns1", kube)
    smaller = {"size": {"longest_edge": 1 << 20, "shortest_edge": 65536}}
    kube.config_maps[("ns1", "cfg")]["preprocessor_config.json"] = json.dumps(smaller)
    edited = resolve.read_model(ref, "ns1", kube)
    assert len({plain.config_key, published.config_key, edited.config_key}) == 3
    limits = [
        m.spec.vision_tower.limits.image_max_pixels for m in (plain, published, edited) if m.spec.vision_tower
    ]
    assert limits == [models.build_model_spec(CONFIG).vision_tower.limits.image_max_pixels, 1 << 24, 1 << 20]


def test_a_processor_key_that_is_not_json_is_refused_by_name() -> None:
    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {**_with_processors(), "video_preprocessor_config.json": "{broken"}
    with pytest.raises(tuner_errors.InvalidModelConfig, match="key 'video_preprocessor_config.json'") as info:
        model_files.read_config_map_files(REF, "ns1", kube)
    assert "ConfigMap ns1/cfg" in info.value.message
    failure = errors.classify(info.value)
    assert (failure.reason, failure.retry) == ("InvalidModelConfig", False)
    kube.config_maps[("ns1", "cfg")]["video_preprocessor_config.json"] = json.dumps({"max_pixels": "many"})
    with pytest.raises(tuner_errors.InvalidModelConfig, match="max_pixels"):  # JSON, but not a budget
        resolve.read_model(api.ModelRef(id="q", source="ConfigMap", configMapRef=REF), "ns1", kube)


def test_a_text_models_configmap_never_reads_processor_keys() -> None:
    """Only a tower kvpilot models reads them: a Llama ConfigMap made from a whole checkpoint folder plans
    from config.json alone, whatever else it holds."""
    llama = models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct")
    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {
        "config.json": json.dumps(llama),
        "preprocessor_config.json": "{broken",
    }
    assert model_files.read_config_map_files(REF, "ns1", kube) == model_files.ModelFiles(llama)


def test_a_missing_configmap_says_how_to_add_the_processor_files() -> None:
    with pytest.raises(errors.ConfigNotFound) as info:
        model_files.read_config_map_files(REF, "ns1", FakeKube())
    message = str(info.value)
    assert "kubectl create configmap cfg --from-file=config.json=config.json" in message
    assert "--from-file=preprocessor_config.json" in message
    assert "--from-file=video_preprocessor_config.json" in message
