"""Contract: every plan kvpilot makes for its catalogue renders arguments vLLM 0.33 accepts.

All catalogue models x all catalogue GPUs x 1/2/4/8 GPUs x a few bounds: the
rendered ``plan.args`` parse with vLLM's own parser to exactly the planned
settings, parse back with :func:`kvpilot.tuner.vllm.args.parse_vllm_args`, the
planned tensor-parallel size passes vLLM's ``verify_with_parallel_config``, and
the planned ``max_model_len`` never exceeds the length vLLM derives itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvpilot.tuner import build_model_spec, compute_plan, gpus, vllm
from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.types import EngineSettings, ServingBounds

pytestmark = pytest.mark.contract

MODEL_IDS = [model_id for model_id, _ in models.list_models()]
GPU_COUNTS = (1, 2, 4, 8)
BOUNDS = (
    ServingBounds(),
    ServingBounds(max_context=8192, concurrency=64, allow_fp8_kv=True),
)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_every_plan_renders_arguments_vllm_accepts(
    model_id: str,
    vllm_parser: Any,
    catalogue_model_config: Callable[[str], Any],
    parallel_config: Callable[[int], Any],
) -> None:
    spec = build_model_spec(models.lookup_model_config(model_id))
    vllm_config = catalogue_model_config(model_id)
    defaults = {name: vllm_parser.get_default(name) for name in vllm.FLAGS}
    checked_tp: set[int] = set()
    plans = 0
    for gpu in gpus.list_gpus():
        for count in GPU_COUNTS:
            for bounds in BOUNDS:
                plan = compute_plan(spec, gpu, count, bounds)
                where = f"{model_id} on {count} x {gpu.name}, {bounds}"
                assert plan.args, where
                assert plan.args == vllm.build_vllm_args(plan.settings), where
                namespace = vllm_parser.parse_args(list(plan.args))
                parsed = {name: getattr(namespace, name) for name in vllm.FLAGS}
                assert parsed == {**defaults, **plan.settings.as_dict()}, where
                assert vllm.parse_vllm_args(plan.args) == (plan.settings, ()), where
                settings: EngineSettings = plan.settings
                assert settings.max_model_len is not None
                assert 0 < settings.max_model_len <= vllm_config.max_model_len, where
                tp = settings.tensor_parallel_size or 1
                if tp not in checked_tp:
                    vllm_config.verify_with_parallel_config(parallel_config(tp))
                    checked_tp.add(tp)
                plans += 1
    assert plans == len(gpus.list_gpus()) * len(GPU_COUNTS) * len(BOUNDS)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_a_pinned_kv_pool_renders_kv_cache_memory_bytes_vllm_accepts(model_id: str, vllm_parser: Any) -> None:
    """``compute_plan(pin_kv_cache_memory=True)``: ``--kv-cache-memory-bytes`` instead of a utilisation."""
    spec = build_model_spec(models.lookup_model_config(model_id))
    default_util = vllm_parser.get_default("gpu_memory_utilization")
    pinned_plans = 0
    for gpu in (gpus.lookup_gpu("H100-SXM"), gpus.lookup_gpu("B200")):
        for count in (1, 8, 16):  # 16: GLM-5 in bf16 needs more than 8 B200s
            plan = compute_plan(spec, gpu, count, ServingBounds(max_context=32768), pin_kv_cache_memory=True)
            if not plan.feasible:
                assert plan.kv_cache_memory_bytes is None
                continue
            pinned_plans += 1
            where = f"{model_id} on {count} x {gpu.name}"
            assert plan.kv_cache_memory_bytes is not None and plan.kv_cache_memory_bytes > 0, where
            assert "--gpu-memory-utilization" not in plan.args, where
            namespace = vllm_parser.parse_args(list(plan.args))
            assert namespace.kv_cache_memory_bytes == plan.kv_cache_memory_bytes, where
            assert namespace.gpu_memory_utilization == default_util, where
            unpinned = compute_plan(spec, gpu, count, ServingBounds(max_context=32768))
            assert plan.budget.num_gpu_blocks == unpinned.budget.num_gpu_blocks, where
    assert pinned_plans > 0
