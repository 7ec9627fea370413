"""NVIDIA ModelOpt checkpoints against vLLM's own ModelOpt configs (``quantization/modelopt.py``).

For every published ModelOpt ``quantization_config`` in tests/data/hf_configs/: the method vLLM's
override chain picks (``ModelConfig._verify_quantization`` asks each ModelOpt config's
``override_quantization_method``) is the one kvpilot sizes the weights by, its algorithms are vLLM's
``LINEAR_ALGOS``, and every module name kvpilot tries a component on is excluded exactly when vLLM's
``is_layer_excluded`` excludes it.
"""

from __future__ import annotations

import json
import pathlib
import re
from types import ModuleType
from typing import Any

import pytest

from kvpilot.tuner.model import build_quant_spec
from kvpilot.tuner.model import modelopt as ours

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
VLLM_METHODS = ("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed")
"""vLLM's ModelOpt methods, in its override order (``vllm/config/model.py``)."""


def _modelopt_configs() -> list[tuple[str, dict[str, Any], int]]:
    found = []
    for path in sorted(HF_CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        text = config.get("text_config") or {}
        qc = config.get("quantization_config") or text.get("quantization_config")
        if qc and str(qc.get("quant_method", "")).lower().startswith("modelopt"):
            layers = text.get("num_hidden_layers") or config.get("num_hidden_layers")
            found.append((path.stem, qc, int(layers)))
    return found


CONFIGS = _modelopt_configs()


@pytest.fixture(scope="module")
def quantization(vllm: ModuleType) -> ModuleType:
    import vllm.model_executor.layers.quantization as me_quant

    return me_quant


def test_the_published_modelopt_configs_are_here() -> None:
    assert len(CONFIGS) >= 9, [name for name, _, _ in CONFIGS]


def test_the_algorithms_are_vllms(quantization: ModuleType) -> None:
    import vllm.model_executor.layers.quantization.modelopt as vllm_modelopt

    assert {k: owner for k, (owner, _) in ours.LINEAR_ALGOS.items()} == {
        k: owner for k, (owner, _) in vllm_modelopt.LINEAR_ALGOS.items()
    }
    assert ours.MIXED_PRECISION in vllm_modelopt.QUANT_ALGOS
    assert set(ours.BLOCK_FP8_ALIASES) | {"FP8_PB_WO"} == set(vllm_modelopt._BLOCK_FP8_MOE_ALGOS)


@pytest.mark.parametrize(("name", "qc", "layers"), CONFIGS, ids=[n for n, _, _ in CONFIGS])
def test_the_method_is_the_one_vllm_overrides_to(
    quantization: ModuleType, name: str, qc: dict[str, Any], layers: int
) -> None:
    picked = next(
        m
        for m in VLLM_METHODS
        if quantization.get_quantization_config(m).override_quantization_method(qc, None) is not None
    )
    spec = build_quant_spec(qc)
    assert spec.modelopt is not None and spec.modelopt.method == picked, (spec, picked)
    assert spec.weight_bits == (4 if picked == "modelopt_fp4" else 8)


@pytest.mark.parametrize(("name", "qc", "layers"), CONFIGS, ids=[n for n, _, _ in CONFIGS])
def test_a_component_is_excluded_as_vllm_excludes_its_modules(
    quantization: ModuleType, name: str, qc: dict[str, Any], layers: int
) -> None:
    spec = build_quant_spec(qc).modelopt
    assert spec is not None
    config = quantization.get_quantization_config(spec.method).from_config(qc)
    excluded_somewhere = 0
    for layer in range(layers):
        for component in (ours.MIXER, ours.DENSE, ours.SHARED):
            vllm_excludes = any(config.is_layer_excluded(n) for n in ours.component_names(layer, component))
            kept = ours.compute_component_bytes(spec, layer, component, 2.0) == 2.0
            if spec.algo != ours.MIXED_PRECISION:
                assert kept == vllm_excludes, (name, layer, component)
            else:  # excluded, or not listed: unquantized either way
                assert kept or not vllm_excludes, (name, layer, component)
            excluded_somewhere += vllm_excludes
    if spec.algo != ours.MIXED_PRECISION:
        assert excluded_somewhere, f"{name}: no component excluded (the published checkpoints exclude some)"


@pytest.mark.parametrize(
    ("name", "qc", "layers"),
    [c for c in CONFIGS if c[1].get("quant_algo") == "MIXED_PRECISION"],
    ids=[n for n, qc, _ in CONFIGS if qc.get("quant_algo") == "MIXED_PRECISION"],
)
def test_mixed_precision_takes_each_modules_algorithm_from_vllm(
    quantization: ModuleType, name: str, qc: dict[str, Any], layers: int
) -> None:
    spec = build_quant_spec(qc).modelopt
    assert spec is not None
    config = quantization.get_quantization_config("modelopt_mixed").from_config(qc)
    for module, algo in qc["quantized_layers"].items():
        assert config._resolve_quant_algo(module) == algo["quant_algo"].upper(), module
    checked = 0
    for module in qc["quantized_layers"]:
        found = re.search(r"(?:^|\.)layers\.(\d+)\.(.+)$", module)
        component = ours._component_of(found.group(2)) if found and not module.startswith("mtp") else None
        if found is None or component is None:
            continue  # the LM head, the vision tower, MTP layers: not decoder layers
        layer = int(found.group(1))
        vllm_bytes = ours.LINEAR_ALGOS[config._resolve_quant_algo(module)][1]
        assert ours.compute_component_bytes(spec, layer, component, 2.0) >= vllm_bytes, module
        checked += 1
    assert checked >= layers, checked


@pytest.mark.parametrize("algo", ["FP8", "fp8_pb_wo", "NVFP4", "MIXED_PRECISION", "W4A16_NVFP4", "MXFP8"])
def test_a_sidecar_gets_the_method_vllm_gives_it(quantization: ModuleType, algo: str) -> None:
    """hf_quant_config.json names no quant_method: vLLM's ``_normalize_quantization_config`` sets it from the
    algorithm (and refuses the algorithms it does not list there); kvpilot does the same."""
    from types import SimpleNamespace

    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    from kvpilot.tuner import errors

    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"}} if algo == "MIXED_PRECISION" else None
    inner: dict[str, Any] = {"quant_algo": algo, "exclude_modules": ["lm_head"]}
    if layers:
        inner["quantized_layers"] = layers
    sidecar = {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": inner}
    try:
        normalized = ModelArchConfigConvertorBase._normalize_quantization_config(
            None, SimpleNamespace(quantization_config=json.loads(json.dumps(sidecar)))
        )
    except ValueError:
        with pytest.raises(errors.InvalidModelConfig):
            build_quant_spec(sidecar)
        return
    spec = build_quant_spec(sidecar).modelopt
    assert spec is not None and spec.method == normalized["quant_method"], (spec, normalized)


@pytest.mark.parametrize(("name", "qc", "layers"), CONFIGS, ids=[n for n, _, _ in CONFIGS])
def test_the_output_head_is_quantized_as_vllm_quantizes_it(
    quantization: ModuleType, name: str, qc: dict[str, Any], layers: int
) -> None:
    """vLLM's ``get_quant_method`` on the head's prefix (``language_model.lm_head`` for a multimodal
    model, ``lm_head`` else): excluded, or (``MIXED_PRECISION``) no algorithm resolved, keeps the model
    dtype."""
    spec = build_quant_spec(qc).modelopt
    assert spec is not None
    config_json = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    multimodal = any("ConditionalGeneration" in a for a in config_json.get("architectures") or [])
    prefix = "language_model.lm_head" if multimodal else "lm_head"
    config = quantization.get_quantization_config(spec.method).from_config(qc)
    if config.is_layer_excluded(prefix):
        algo = None
    elif spec.algo == ours.MIXED_PRECISION:
        algo = config._resolve_quant_algo(prefix)
    else:
        algo = spec.algo
    expected = 2.0 if algo is None else ours.LINEAR_ALGOS[algo][1]
    assert ours.compute_lm_head_bytes(spec, 2.0) == expected, (name, prefix, algo)
