"""``--kv-cache-dtype auto`` on a checkpoint that declares its KV cache: sized as the dtype vLLM runs.

vLLM 0.33 resolves ``auto`` from the checkpoint's ``quantization_config`` (ModelOpt's
``kv_cache_scheme`` / ``kv_cache_quant_algo``; compressed-tensors' ``kv_cache_scheme``): the published
NVFP4 checkpoints run an fp8 cache, and the plan says so. The contract against the wheel is
tests/contract/test_contract_kv_dtype_auto.py.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from kvpilot.tuner import memory, vllm
from kvpilot.tuner.model.quantization import build_quant_spec
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import planner
from kvpilot.tuner.types import EngineSettings, GpuSpec, ServingBounds

H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink", nvml_total_bytes=81_559 << 20)
CONFIG = json.loads(
    (
        pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "nvidia__Qwen3.6-27B-NVFP4.json"
    ).read_text()
)
MODEL = build_model_spec(copy.deepcopy(CONFIG))
SETTINGS = EngineSettings(
    max_model_len=32768, tensor_parallel_size=1, gpu_memory_utilization=0.9, max_num_seqs=64
)


def _declared(qc: dict[str, object]) -> str | None:
    return vllm.declared_kv_cache_dtype(build_quant_spec(qc).kv_cache)


def test_auto_is_sized_as_the_declared_fp8_cache() -> None:
    auto = memory.compute_budget(MODEL, H100, SETTINGS.replace(kv_cache_dtype="auto"))
    fp8 = memory.compute_budget(MODEL, H100, SETTINGS.replace(kv_cache_dtype="fp8_e4m3"))
    bf16 = memory.compute_budget(MODEL, H100, SETTINGS.replace(kv_cache_dtype="bfloat16"))
    assert auto.kv_cache_tokens == fp8.kv_cache_tokens
    assert (
        auto.kv_cache_tokens > 1.6 * bf16.kv_cache_tokens
    )  # an explicit bf16 still wins (GDN state stays bf16)


def test_the_plan_says_what_auto_means() -> None:
    plan = planner.compute_plan(MODEL, H100, 1, ServingBounds(max_context=32768))
    assert plan.settings.kv_cache_dtype == "auto"
    assert any("--kv-cache-dtype auto means fp8_e4m3" in w for w in plan.warnings), plan.warnings


@pytest.mark.parametrize(
    ("qc", "expected"),
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, "fp8_e4m3"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}, "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}, "auto"),
        (
            {
                "quant_method": "modelopt",
                "quant_algo": "FP8",
                "kv_cache_scheme": {"num_bits": 8, "type": "float"},
            },
            "auto",  # not declared static: vLLM falls back to auto
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_scheme": None}, None),
        ({"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "fp8"),
        ({"quant_method": "fp8"}, None),
        (
            {
                "producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
            },
            None,
        ),
    ],
)
def test_declarations_resolve_as_vllm_resolves_them(qc: dict[str, object], expected: str | None) -> None:
    assert _declared(qc) == expected
