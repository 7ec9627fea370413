"""The tuner's public surface: a sorted ``__all__`` that names exactly what it exports."""

from __future__ import annotations

import types

import kvpilot.tuner as tuner

EXPECTED = {
    "EngineSettings",
    "GpuSpec",
    "InfeasiblePlan",
    "InvalidEngineArgs",
    "InvalidModelConfig",
    "MemoryBudget",
    "ModelSpec",
    "Plan",
    "ServingBounds",
    "TunerError",
    "UnknownGpu",
    "UnknownModel",
    "build_gpu_from_labels",
    "build_model_spec",
    "build_vllm_args",
    "compute_budget",
    "compute_plan",
    "list_gpus",
    "list_models",
    "lookup_gpu",
    "lookup_model_config",
    "parse_vllm_args",
    "validate_extra_args",
}


def test_all_is_sorted() -> None:
    assert tuner.__all__ == sorted(tuner.__all__)


def test_all_is_the_expected_surface() -> None:
    assert set(tuner.__all__) == EXPECTED
    assert len(tuner.__all__) == len(EXPECTED)


def test_every_public_name_is_exported() -> None:
    public = {
        name
        for name, value in vars(tuner).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(tuner.__all__)


def test_exports_come_from_the_tuner() -> None:
    for name in tuner.__all__:
        assert getattr(tuner, name).__module__.startswith("kvpilot.tuner."), name
