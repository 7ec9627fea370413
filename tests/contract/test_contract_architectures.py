"""Contract: the architectures kvpilot refuses as removed are the ones vLLM 0.33 removed."""

from __future__ import annotations

import types

import pytest

from kvpilot.tuner import vllm as kv_vllm

pytestmark = pytest.mark.contract


def test_removed_architectures_are_the_wheels(vllm: types.ModuleType) -> None:
    from vllm.model_executor.models import registry

    assert dict(kv_vllm.PREVIOUSLY_SUPPORTED_ARCHITECTURES) == dict(registry._PREVIOUSLY_SUPPORTED_MODELS)
    served = set(registry._VLLM_MODELS) if hasattr(registry, "_VLLM_MODELS") else set()
    assert served, "vLLM's registry of served architectures moved"
    assert not served & set(kv_vllm.PREVIOUSLY_SUPPORTED_ARCHITECTURES)


def test_the_2026_architectures_are_served(vllm: types.ModuleType) -> None:
    from vllm.model_executor.models import registry

    for architecture in (
        "Qwen3_5MoeForConditionalGeneration",
        "NemotronHForCausalLM",
        "Gemma4ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "DeciLMForCausalLM",
        "DeepseekV4ForCausalLM",
        "KimiK3ForConditionalGeneration",
    ):
        assert architecture in registry._VLLM_MODELS, architecture
        kv_vllm.check_architecture_served(architecture)  # not refused as removed
