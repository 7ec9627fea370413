"""NVIDIA ModelOpt checkpoints: the algorithm, the modules left in bf16, per-layer mixed precision.

Before this, every ``quant_method: modelopt`` was sized as FP8: the published NVFP4 builds (GLM-5.1,
Kimi-K2.5, Qwen3.5, MiniMax-M2.5, Gemma 4) were counted at nearly twice their weight, and their plans
gave the KV cache tens of GiB less than vLLM would. The bytes per format and the exclusion rule are
checked against vLLM's own ModelOpt configs in tests/contract/test_contract_modelopt.py.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.memory import weights
from kvpilot.tuner.model import QuantSpec, build_model_spec, build_quant_spec
from kvpilot.tuner.model import modelopt as mo
from kvpilot.tuner.types import GIB

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
NVFP4 = 0.5 + 1 / 16


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((HF_CONFIGS / f"{name}.json").read_text()))


def _gib(config: dict[str, Any], quant: QuantSpec | None = None) -> float:
    spec = build_model_spec(config)
    if quant is not None:
        spec = dataclasses.replace(spec, quantization=quant)
    return weights.compute_weight_breakdown(spec).total / GIB


@pytest.mark.parametrize(
    ("qc", "method", "bits"),
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", 4),
        ({"quant_method": "modelopt", "quant_algo": "w4a16_nvfp4"}, "nvfp4", 4),  # ModelOpt may lower-case
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", 8),
        ({"quant_method": "modelopt", "quant_algo": "FP8_BLOCK_SCALES"}, "fp8", 8),
        ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "mxfp8", 8),
        # hf_quant_config.json's layout: the algorithm under "quantization"
        (
            {
                "quant_method": "modelopt",
                "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]},
            },
            "nvfp4",
            4,
        ),
        ({"quant_method": "modelopt"}, "fp8", 8),  # `--quantization modelopt`: vLLM's FP8 config
    ],
)
def test_the_algorithm_decides_the_format(qc: dict[str, Any], method: str, bits: int) -> None:
    spec = build_quant_spec(qc)
    assert (spec.method, spec.weight_bits) == (method, bits)


def test_an_unknown_algorithm_names_the_field_and_the_known_ones() -> None:
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_quant_spec({"quant_method": "modelopt", "quant_algo": "INT3_MAGIC"})
    assert caught.value.field == "quantization_config.quant_algo"
    assert "'INT3_MAGIC'" in str(caught.value) and "NVFP4" in str(caught.value)


def test_mixed_precision_needs_its_layer_table() -> None:
    with pytest.raises(errors.InvalidModelConfig, match="quantized_layers"):
        build_quant_spec({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"})
    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "FP2"}}
    qc = {"quant_method": "modelopt", "quant_algo": "mixed_precision", "quantized_layers": layers}
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_quant_spec(qc)
    assert caught.value.field.endswith("quantized_layers.model.layers.0.mlp.down_proj.quant_algo")


def test_excluded_modules_stay_in_the_model_dtype() -> None:
    """GLM-5.1-NVFP4 keeps its three dense layers whole, and every layer's attention and shared experts."""
    spec = build_quant_spec(_config("nvidia__GLM-5.1-NVFP4")["quantization_config"]).modelopt
    assert spec is not None
    assert [mo.compute_component_bytes(spec, 0, c, 2.0) for c in mo.COMPONENTS] == [2.0, 2.0, 2.0, 2.0]
    assert [mo.compute_component_bytes(spec, 10, c, 2.0) for c in mo.COMPONENTS] == [2.0, NVFP4, 2.0, NVFP4]


def test_a_wildcard_over_the_dense_mlp_leaves_gemma4s_experts_quantized() -> None:
    """Gemma 4's MoE layer holds a dense ``mlp`` beside its ``experts``: ``layers.0.mlp*`` is the MLP."""
    spec = build_quant_spec(_config("nvidia__Gemma-4-26B-A4B-NVFP4")["quantization_config"]).modelopt
    assert spec is not None
    assert mo.compute_component_bytes(spec, 0, mo.DENSE, 2.0) == 2.0
    assert mo.compute_component_bytes(spec, 0, mo.EXPERTS, 2.0) == NVFP4


def test_mixed_precision_reads_each_layers_algorithm() -> None:
    """Qwen3.6-35B-A3B: FP8 linear attention, W4A16 NVFP4 experts; what the table does not list is bf16."""
    spec = build_quant_spec(_config("nvidia__Qwen3.6-35B-A3B-NVFP4")["quantization_config"]).modelopt
    assert spec is not None
    assert mo.compute_component_bytes(spec, 0, mo.MIXER, 2.0) == 1.0
    assert mo.compute_component_bytes(spec, 0, mo.EXPERTS, 2.0) == NVFP4
    assert mo.compute_component_bytes(spec, 0, mo.DENSE, 2.0) == 2.0  # an MoE model: no dense MLP listed


def test_the_output_head_is_loaded_as_vllm_quantizes_it() -> None:
    """vLLM quantizes ``ParallelLMHead`` like any linear unless excluded; a MIXED_PRECISION table gives it its
    algorithm by the name ``lm_head`` even for a multimodal model, whose head vLLM names
    ``language_model.lm_head`` (``_quantized_layer_prefix_candidates``, 0.22+). The Qwen3.6 NVFP4 builds list
    it as W4A16 NVFP4: nvidia/Qwen3.6-27B-NVFP4 loads 19.78 GiB on vLLM 0.23 (a bf16 head: 21.30 GiB)."""
    config = _config("nvidia__Qwen3.6-27B-NVFP4")
    spec = build_quant_spec(config["quantization_config"]).modelopt
    assert spec is not None
    assert mo.compute_lm_head_bytes(spec, 2.0) == NVFP4
    assert 19.5 < _gib(config) < 19.78
    unlisted = dataclasses.replace(spec, layer_algos=tuple(e for e in spec.layer_algos if e[0] != "lm_head"))
    assert mo.compute_lm_head_bytes(unlisted, 2.0) == 2.0
    assert _gib(config) + 1.6 < _gib(
        config, dataclasses.replace(build_model_spec(config).quantization, modelopt=unlisted)
    )
    # one algorithm for the whole checkpoint: the head too, unless a pattern names it
    nvfp4 = mo.ModelOptSpec("NVFP4")
    assert mo.compute_lm_head_bytes(nvfp4, 2.0) == NVFP4
    assert mo.compute_lm_head_bytes(dataclasses.replace(nvfp4, excluded=("lm_head",)), 2.0) == 2.0
    assert (
        mo.compute_lm_head_bytes(dataclasses.replace(nvfp4, excluded=("language_model.lm_head",)), 2.0) == 2.0
    )


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("nvidia__GLM-5.1-NVFP4", 0.55, 0.65),
        ("nvidia__Kimi-K2.5-NVFP4", 0.55, 0.62),
        ("nvidia__Qwen3.5-397B-A17B-NVFP4", 0.55, 0.65),
        ("nvidia__MiniMax-M2.5-NVFP4", 0.55, 0.65),
        ("nvidia__Gemma-4-26B-A4B-NVFP4", 0.6, 0.75),
    ],
)
def test_nvfp4_builds_weigh_a_little_over_half_their_fp8_count(name: str, low: float, high: float) -> None:
    """Experts at 4.5 bits instead of 8; attention, shared experts, embeddings and the head stay bf16."""
    config = _config(name)
    as_fp8 = _gib(config, QuantSpec("fp8", 8))
    assert low * as_fp8 < _gib(config) < high * as_fp8


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["x*"] * 9000},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["*" * 600]},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": "lm_head"},
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", 7]},
    ],
    ids=["too-many-patterns", "a-huge-pattern", "not-a-list", "not-a-string"],
)
def test_a_hostile_exclusion_list_is_refused_by_name(qc: dict[str, Any]) -> None:
    with pytest.raises(errors.InvalidModelConfig) as caught:
        build_quant_spec(qc)
    where = ("quantization_config.ignore", "quantization_config.exclude_modules")
    assert caught.value.field.startswith(where), caught.value.field


SIDECAR = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": None,
        "exclude_modules": ["lm_head", "backbone.layers.*.mixer.in_proj*"],
    },
}
"""ModelOpt 0.29's hf_quant_config.json layout (the format vLLM's ``_normalize_quantization_config`` reads;
Nemotron 3 Nano's own sidecar is not in tests/data)."""


def test_the_sidecar_quantizes_a_config_without_its_own() -> None:
    """Nemotron 3 Nano NVFP4 keeps its quantization in hf_quant_config.json: without it, sized as bf16."""
    config = _config("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    merged = dict(mo.build_config_with_quant_sidecar(config, SIDECAR))
    spec = build_quant_spec(merged["quantization_config"])
    assert spec.method == "nvfp4" and spec.modelopt is not None
    assert spec.modelopt.excluded == ("lm_head", "backbone.layers.*.mixer.in_proj*")
    assert _gib(merged) < 0.45 * _gib(config)  # experts at 4.5 bits, the Mamba mixers' in_proj kept bf16
    own = {**config, "quantization_config": {"quant_method": "fp8"}}
    assert mo.build_config_with_quant_sidecar(own, SIDECAR) is own  # config.json's own wins, as in vLLM


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "MXFP8", "INT4_AWQ"])
def test_a_sidecar_algorithm_vllm_refuses_is_refused(algo: str) -> None:
    sidecar = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo}}
    with pytest.raises(errors.InvalidModelConfig, match="hf_quant_config.json") as caught:
        build_quant_spec(sidecar)
    assert caught.value.field == "quantization_config.quantization.quant_algo"
