"""kvpilot's tuner: pure, sans-I/O planning of vLLM engine arguments.

The public surface, for the operator, the CLI and anyone embedding the planner:

* value objects -- :class:`EngineSettings`, :class:`GpuSpec`, :class:`ServingBounds`,
  :class:`MemoryBudget`, :class:`Plan`, :class:`ModelSpec`;
* errors -- :class:`TunerError` and its subclasses (see :mod:`kvpilot.tuner.errors`);
* entry points -- :func:`build_model_spec` (config.json -> ModelSpec),
  :func:`lookup_model_config` / :func:`list_models` (built-in configs),
  :func:`lookup_gpu` / :func:`build_gpu_from_labels` / :func:`list_gpus` (GPU catalogue),
  :func:`compute_budget` (vLLM's start-up memory accounting), :func:`compute_plan`
  (the static planner), :func:`build_vllm_args` / :func:`parse_vllm_args` /
  :func:`validate_extra_args` (engine flags).

Nothing in this package does I/O, reads the clock or the environment;
``.importlinter`` enforces it.
"""

from kvpilot.tuner.errors import (
    InfeasiblePlan,
    InvalidEngineArgs,
    InvalidModelConfig,
    TunerError,
    UnknownGpu,
    UnknownModel,
)
from kvpilot.tuner.gpus import build_gpu_from_labels, list_gpus, lookup_gpu
from kvpilot.tuner.memory.budget import compute_budget
from kvpilot.tuner.model.catalogue import list_models, lookup_model_config
from kvpilot.tuner.model.spec import ModelSpec, build_model_spec
from kvpilot.tuner.plan.planner import compute_plan
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget, Plan, ServingBounds
from kvpilot.tuner.vllm.args import build_vllm_args, parse_vllm_args, validate_extra_args

__all__ = [
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
]
