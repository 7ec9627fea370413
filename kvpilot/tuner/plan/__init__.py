"""The static planner: engine settings for a model on a GPU type, within the user's bounds.

* :mod:`.planner` -- :func:`compute_plan`, a chain of small steps over the memory model;
* :mod:`.profiles` -- fleet learning: the TuningProfile key, its samples and what a plan takes from them;
* :mod:`.nodes` -- :func:`compute_node_plan`: a replica over several nodes, TP x PP or DP x EP, the fewest
  nodes that fit, and why;
* :mod:`.topology` -- how a replica's GPUs split into tensor-parallel groups and pipeline stages
  (the planner, the rendered Deployment and the closed loop share it).

The top layer of the tuner beside :mod:`kvpilot.tuner.loop`; the two never import each other.
"""

from kvpilot.tuner.plan.nodes import Candidate, Layout, NodePlan, RankBudget, compute_node_plan
from kvpilot.tuner.plan.planner import (
    CONTEXT_STEP,
    compute_plan,
    compute_safe_utilization,
)
from kvpilot.tuner.plan.profiles import Learned, ProfileKey, ProfileRecord, compute_learned
from kvpilot.tuner.plan.topology import (
    compute_expert_shards,
    compute_pipeline_parallel,
    compute_rank_gpus,
    compute_tensor_parallel,
    compute_topology_budget,
    tensor_parallel_ok,
)

__all__ = [
    "CONTEXT_STEP",
    "Candidate",
    "Layout",
    "Learned",
    "NodePlan",
    "ProfileKey",
    "ProfileRecord",
    "RankBudget",
    "compute_expert_shards",
    "compute_learned",
    "compute_node_plan",
    "compute_pipeline_parallel",
    "compute_plan",
    "compute_rank_gpus",
    "compute_safe_utilization",
    "compute_tensor_parallel",
    "compute_topology_budget",
    "tensor_parallel_ok",
]
