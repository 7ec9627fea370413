"""The static planner: engine settings for a model on a GPU type, within the user's bounds.

* :mod:`.planner` -- :func:`compute_plan`, a chain of small steps over the memory model;
* :mod:`.profiles` -- fleet learning: the TuningProfile key, its samples and what a plan takes from them;
* :mod:`.topology` -- how a replica's GPUs split into tensor-parallel groups and pipeline stages
  (the planner, the rendered Deployment and the closed loop share it).

The top layer of the tuner beside :mod:`kvpilot.tuner.loop`; the two never import each other.
"""

from kvpilot.tuner.plan.planner import (
    CONTEXT_STEP,
    compute_plan,
    compute_safe_utilization,
)
from kvpilot.tuner.plan.profiles import Learned, ProfileKey, ProfileRecord, compute_learned
from kvpilot.tuner.plan.topology import (
    compute_pipeline_parallel,
    compute_tensor_parallel,
    compute_topology_budget,
    tensor_parallel_ok,
)

__all__ = [
    "CONTEXT_STEP",
    "Learned",
    "ProfileKey",
    "ProfileRecord",
    "compute_learned",
    "compute_pipeline_parallel",
    "compute_plan",
    "compute_safe_utilization",
    "compute_tensor_parallel",
    "compute_topology_budget",
    "tensor_parallel_ok",
]
