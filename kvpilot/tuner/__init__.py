"""kvpilot's tuner: pure, sans-I/O planning and retuning of vLLM engine arguments.

Sub-packages in layers (``.importlinter`` enforces them; each owns its ``__all__``):

* :mod:`.plan` and :mod:`.loop` on top -- the static planner, and the closed loop's policy
  (they never import each other);
* :mod:`.engines` -- the engine seam (what the planner and the loop ask any engine) and SGLang's budget;
* :mod:`.memory` -- vLLM's start-up memory accounting: weights, activations, graphs, KV cache;
* :mod:`.model` -- ``config.json`` -> :class:`ModelSpec`, and the built-in catalogue;
* :mod:`.vllm`, :mod:`.sglang` and :mod:`.tgi` at the bottom -- what each release of each engine does:
  the only home of that engine's facts.

Beside the layers, every layer may use the value objects (:mod:`.types`), the error tree
(:mod:`.errors`) and the GPU catalogue (:mod:`.gpus`). This module re-exports the entry points
the operator, the CLI and anyone embedding the tuner need.

Nothing in this package does I/O, reads the clock or the environment; time and observations are
arguments.
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
from kvpilot.tuner.loop import (
    Decision,
    Evidence,
    LoopState,
    PolicyConfig,
    TuningBounds,
    TuningContext,
    compute_decision,
)
from kvpilot.tuner.memory import compute_budget
from kvpilot.tuner.model import ModelSpec, build_model_spec, list_models, lookup_model_config
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget, Plan, ServingBounds
from kvpilot.tuner.vllm import PINNED_VLLM_VERSION, build_vllm_args, parse_vllm_args, validate_extra_args

__all__ = [
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
]
