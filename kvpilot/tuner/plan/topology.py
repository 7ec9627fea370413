"""How a replica's GPUs are split: tensor parallelism within a group, pipeline stages across groups.

kvpilot's rule, used by the planner, the Deployment the operator renders and the closed loop's
budget alike (one home: a copy of it drifted once, and the planner budgeted a pipeline-parallel
layout as if one tensor-parallel group held the whole model):

* the tensor-parallel size is the GPU count, or the largest size below it that vLLM accepts for
  the model (:func:`compute_tensor_parallel`), unless the user fixes it;
* the GPUs left over form pipeline stages: ``pipeline_parallel_size = gpu_count // tp``
  (:func:`compute_pipeline_parallel`).
"""

from __future__ import annotations

from kvpilot.tuner import memory, vllm
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.types import EngineSettings, GpuSpec, MemoryBudget


def tensor_parallel_ok(model: ModelSpec, tp: int) -> bool:
    """vLLM's rules: TP divides the attention heads and the padded vocabulary; the KV heads divide TP
    or TP divides them (not asked of MLA, whose one latent is replicated); a state layer's conv channels
    and heads split evenly (``divide`` in ``MambaStateShapeCalculator``)."""
    kv = model.num_kv_heads
    padded_vocab = memory.padded_vocab_size(model)
    heads_ok = model.num_attention_heads % tp == 0 and (model.mla is not None or kv % tp == 0 or tp % kv == 0)
    state_ok = model.linear_state is None or model.linear_state.shards_over(tp)
    return heads_ok and state_ok and padded_vocab % tp == 0


def compute_tensor_parallel(model: ModelSpec, gpu_count: int) -> int:
    """The largest TP size <= ``gpu_count`` that vLLM accepts for this model."""
    for tp in range(max(1, gpu_count), 0, -1):
        if tensor_parallel_ok(model, tp):
            return tp
    return 1


def compute_pipeline_parallel(gpu_count: int, tensor_parallel_size: int) -> int:
    """Pipeline stages of a replica of ``gpu_count`` GPUs in groups of ``tensor_parallel_size``
    (1 when the group is as large as the replica, or larger: a suggestion of more GPUs)."""
    tp = max(1, tensor_parallel_size)
    return max(1, gpu_count // tp) if tp <= gpu_count else 1


def compute_topology_budget(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    settings: EngineSettings,
    vllm_version: str,
    weights_total_bytes: int | None = None,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> MemoryBudget:
    """The budget of ``settings`` on a replica of ``gpu_count`` GPUs in the topology kvpilot deploys:
    an unset tensor-parallel size is vLLM's 1, the GPUs the tensor-parallel group leaves over are
    pipeline stages (:func:`compute_pipeline_parallel`). The one home of "the budget in the deployed
    topology": the planner, the InferenceService's closed loop and the EngineTuner's loop all call it.
    ``expert_shards``: the replica is one data-parallel rank of a group (:mod:`.nodes`)."""
    tp = settings.tensor_parallel_size or 1
    return memory.compute_budget(
        model,
        gpu,
        settings.replace(tensor_parallel_size=tp),
        pipeline_parallel_size=compute_pipeline_parallel(gpu_count, tp),
        vllm_version=vllm_version,
        weights_total_bytes=weights_total_bytes,
        expert_shards=expert_shards,
        **engine.budget_kwargs(),
    )
