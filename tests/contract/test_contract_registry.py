"""The generated registry (``kvpilot/tuner/vllm/registry_data.py``) against the pinned vLLM's own
``ModelRegistry``: the architectures kvpilot accepts for the pinned release are exactly the ones
vLLM serves."""

from __future__ import annotations

from types import ModuleType

from kvpilot.tuner import vllm as kv


def test_pinned_registry_equals_vllms_own(vllm: ModuleType) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    theirs = set(ModelRegistry.get_supported_archs())
    ours = set(kv.served_architectures(kv.PINNED_VERSION))
    assert ours == theirs, (sorted(ours - theirs)[:10], sorted(theirs - ours)[:10])
