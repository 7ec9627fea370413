"""How a replica over several nodes splits: TP x PP, or DP x EP for a MoE model, as the node planner chose.

A replica of ``gpu.nodesPerReplica`` nodes of ``gpu.count`` GPUs runs the layout
:func:`kvpilot.tuner.plan.compute_node_plan` chooses for it: tensor parallelism within a node and pipeline
stages across nodes (the default rendering: :func:`kvpilot.operator.pods.workloads.build_engine_args`
derives the stages from the GPUs), or, for a MoE model where that serves a longer context or more
sequences, ``data_parallel_size`` engines of ``tp`` GPUs with the routed experts split over the group
(``--data-parallel-size``, ``--data-parallel-size-local``, ``--enable-expert-parallel``).

The layout is structure, not tuning: it follows from the spec, the model, the GPU and the release alone,
so the reconciler's render and every closed-loop render of other settings agree
(:func:`compute_data_parallel`, cached by its inputs; for a service,
:func:`kvpilot.operator.planning.modes.compute_group_layout`). A fleet-learned TuningProfile does not move
it, and the plan of a DP x EP group's engines is the node planner's own (the same call's ``plan``),
without the learned profile (one learned lesson per single engine today).

Pure apart from the cache; no I/O.
"""

from __future__ import annotations

import functools

from kvpilot.operator import api
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import memory, vllm
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.plan import Layout, NodePlan, compute_node_plan
from kvpilot.tuner.types import EngineSettings, GpuSpec, ServingBounds


@functools.lru_cache(maxsize=512)
def _cached_node_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    gpus_per_node: int,
    nodes: int,
    bounds: ServingBounds,
    pinned: EngineSettings,
    vllm_version: str,
    engine: vllm.EngineFlags,
    weights_total_bytes: int | None,
) -> NodePlan | tuner_errors.TunerError:
    """One node-planner call, its verdict cached by every input."""
    try:
        return compute_node_plan(
            model,
            gpu,
            gpus_per_node,
            bounds,
            nodes=nodes,
            pinned=pinned,
            vllm_version=vllm_version,
            engine=engine,
            weights_total_bytes=weights_total_bytes,
        )
    except tuner_errors.TunerError as exc:
        return exc


def compute_data_parallel(
    spec: api.InferenceServiceSpec,
    model: ModelSpec,
    gpu: GpuSpec,
    pinned: EngineSettings,
    *,
    vllm_version: str = vllm.PINNED_VLLM_VERSION,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    weights_total_bytes: int | None = None,
) -> NodePlan | None:
    """The node plan of ``spec``'s replica when the node planner splits it DP x EP: its ``layout`` is what
    the workload renders, its ``plan`` each data-parallel engine's (its settings carry the engine's
    tensor-parallel size). ``None`` for one node, a dense model, TP x PP or a planner error (the TP x PP
    path reports it)."""
    if spec.gpu.nodes_per_replica < 2 or model.moe is None:
        return None
    found = _cached_node_plan(
        model,
        gpu,
        spec.gpu.count,
        spec.gpu.nodes_per_replica,
        spec.to_bounds(),
        pinned,
        vllm_version,
        engine,
        weights_total_bytes,
    )
    if isinstance(found, tuner_errors.TunerError) or found.layout.data_parallel_size < 2:
        return None
    return found


def compute_engine_topology(
    spec: api.InferenceServiceSpec, layout: Layout | None
) -> tuple[int, memory.ExpertShards]:
    """What one engine's budget is computed over (:func:`kvpilot.tuner.plan.compute_topology_budget`): a
    DP x EP engine's own GPUs and the group's expert shards; else every GPU of the replica, whose GPUs the
    tensor-parallel group leaves over are the pipeline stages across nodes."""
    if layout is not None and layout.data_parallel_size > 1:
        ranks = layout.data_parallel_size * layout.tensor_parallel_size
        return layout.tensor_parallel_size, memory.ExpertShards(ranks, expert_parallel=layout.expert_parallel)
    return spec.gpu.count * spec.gpu.nodes_per_replica, memory.ONE_ENGINE
