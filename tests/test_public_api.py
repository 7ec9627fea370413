"""The tuner's public surfaces: each package names exactly what it exports, in a sorted ``__all__``.

The root package re-exports the entry points; each sub-package (``vllm``, ``model``, ``memory``,
``plan``, ``loop``) owns its own ``__all__``, which the operator, the CLI and the other layers use
(httpx's ``tests/test_exported_members.py`` is the model).
"""

from __future__ import annotations

import importlib
import types

import pytest

import kvpilot.tuner as tuner

EXPECTED = {
    "Decision",
    "EngineSettings",
    "Evidence",
    "GpuSpec",
    "InfeasiblePlan",
    "InvalidEngineArgs",
    "InvalidModelConfig",
    "LoopState",
    "MemoryBudget",
    "ModelSpec",
    "PINNED_VLLM_VERSION",
    "Plan",
    "PolicyConfig",
    "ServingBounds",
    "TunerError",
    "TuningBounds",
    "TuningContext",
    "UnknownGpu",
    "UnknownModel",
    "build_gpu_from_labels",
    "build_model_spec",
    "build_vllm_args",
    "compute_budget",
    "compute_decision",
    "compute_plan",
    "list_gpus",
    "list_models",
    "lookup_gpu",
    "lookup_model_config",
    "parse_vllm_args",
    "validate_extra_args",
}

PACKAGES = (
    "kvpilot.tuner",
    "kvpilot.tuner.vllm",
    "kvpilot.tuner.model",
    "kvpilot.tuner.memory",
    "kvpilot.tuner.plan",
    "kvpilot.tuner.loop",
)


def test_root_all_is_the_expected_surface() -> None:
    assert set(tuner.__all__) == EXPECTED
    assert len(tuner.__all__) == len(EXPECTED)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_unique(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__all__ == sorted(set(package.__all__))


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_is_exported(name: str) -> None:
    package = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(package.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_exports_come_from_inside_the_package(name: str) -> None:
    package = importlib.import_module(name)
    for attr in package.__all__:
        value = getattr(package, attr)
        origin = getattr(value, "__module__", None)
        if origin is None or isinstance(value, types.GenericAlias):  # constants and type aliases
            continue
        assert origin.startswith("kvpilot.tuner"), (name, attr, origin)
        if name != "kvpilot.tuner":
            assert origin.startswith(name), (name, attr, origin)
