"""Contract: ``--kv-cache-dtype auto`` on a checkpoint that declares its KV cache is vLLM 0.33's own.

The published NVFP4 checkpoints in tests/data/hf_configs/ whose ModelOpt ``quantization_config``
declares an fp8 KV cache (``kv_cache_scheme`` / ``kv_cache_quant_algo``) run an fp8 cache under
``auto``: vLLM's ``resolve_kv_cache_dtype_string`` says so (``EngineArgs.create_engine_config``). Each
is resolved by both sides, then sized by both (``kv_points``: vLLM's specs and ``get_kv_cache_configs``
with the dtype vLLM resolved, kvpilot's layout with the dtype kvpilot resolved): blocks, tokens and
concurrency must be equal. A mutation (the declaration removed from kvpilot's reading) must break it.
"""

from __future__ import annotations

import copy
import json
import pathlib
import types
from typing import Any

import kv_points as kp
import pytest
from test_contract_kv_cache import cuda_like_config, wheel  # noqa: F401  (fixtures)

from kvpilot.tuner import errors
from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
DECLARING = (
    "nvidia__GLM-5.1-NVFP4",
    "nvidia__Gemma-4-26B-A4B-NVFP4",
    "nvidia__Gemma-4-31B-IT-NVFP4",
    "nvidia__Kimi-K2.5-NVFP4",
    "nvidia__MiniMax-M2.5-NVFP4",
    "nvidia__Qwen3.5-122B-A10B-NVFP4",
    "nvidia__Qwen3.5-397B-A17B-NVFP4",
    "nvidia__Qwen3.6-27B-NVFP4",
)
POINTS = (
    kp.Point(8, 1, 16, "auto", 131_072, 40 * GIB + 98_765, (9, 0)),
    kp.Point(4, 1, 16, "auto", 32_768, 20 * GIB + 3, (9, 0)),
)


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((HF_CONFIGS / f"{name}.json").read_text()))


def _vllms_resolution(config: dict[str, Any]) -> str:
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    hf = types.SimpleNamespace(quantization_config=config.get("quantization_config"))
    return str(resolve_kv_cache_dtype_string("auto", types.SimpleNamespace(hf_config=hf)))


def _declares(name: str) -> bool:
    try:
        quant = build_model_spec(_config(name)).quantization
    except errors.InvalidModelConfig:
        return False  # refused with a reason: tests/test_published_configs.py holds those
    return quant is not None and quant.kv_cache is not None


def test_every_declaring_config_is_found() -> None:
    assert sorted(p.stem for p in HF_CONFIGS.glob("*.json") if _declares(p.stem)) == sorted(DECLARING)


@pytest.mark.parametrize("name", DECLARING)
def test_auto_resolves_as_vllm_resolves(vllm: types.ModuleType, name: str) -> None:
    config = _config(name)
    spec = build_model_spec(copy.deepcopy(config))
    assert spec.quantization is not None
    ours = kv_vllm.resolve_kv_cache_dtype("auto", spec.quantization.kv_cache)
    theirs = _vllms_resolution(config)
    assert theirs != "auto" and kv_vllm.is_fp8(theirs)
    assert ours == theirs


def _compare(wheel_: dict[str, Any], vc: Any, name: str, kv_declared: bool) -> list[str]:
    config = _config(name)
    spec = build_model_spec(copy.deepcopy(config))
    assert spec.quantization is not None
    declared = spec.quantization.kv_cache if kv_declared else None
    return kp.collect_misses(
        wheel_,
        vc,
        spec,
        POINTS,
        lambda point: kp.build_vllm_specs(wheel_, vc, config, spec, point)[0],
        ours_point=lambda point: kp.replace(
            point, dtype=kv_vllm.resolve_kv_cache_dtype(point.dtype, declared)
        ),
        theirs_point=lambda point: kp.replace(point, dtype=_vllms_resolution(config)),
    )


@pytest.mark.parametrize("name", DECLARING)
def test_declared_fp8_kv_is_sized_as_vllm_sizes_it(
    wheel: dict[str, Any],  # noqa: F811
    cuda_like_config: Any,  # noqa: F811
    monkeypatch: Any,
    name: str,
) -> None:
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    assert not _compare(wheel, cuda_like_config, name, kv_declared=True)
    # the mutation: ignoring the declaration (kvpilot's old reading) sizes bf16 and must differ
    assert _compare(wheel, cuda_like_config, name, kv_declared=False)
