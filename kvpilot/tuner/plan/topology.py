"""How a replica's GPUs are split: tensor parallelism within a group, pipeline stages across groups.

kvpilot's rule, used by the planner, the Deployment the operator renders and the closed loop's
budget alike (one home: a copy of it drifted once, and the planner budgeted a pipeline-parallel
layout as if one tensor-parallel group held the whole model):

* the tensor-parallel size is the GPU count, or the largest size below it that vLLM accepts for
  the model (:func:`compute_tensor_parallel`), unless the user fixes it;
* the GPUs left over form pipeline stages: ``pipeline_parallel_size = gpu_count // tp``
  (:func:`compute_pipeline_parallel`);
* a pod whose arguments start data-parallel engines (``--data-parallel-size``, read by
  :func:`kvpilot.tuner.vllm.read_data_parallel`) splits its GPUs between its ranks first
  (:func:`compute_rank_gpus`), and a MoE model's routed experts split over the whole group's
  ``data-parallel x tensor-parallel`` GPUs (:func:`compute_expert_shards`).
"""

from __future__ import annotations

from kvpilot.tuner import errors, memory, vllm
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


def compute_rank_gpus(gpu_count: int, engine: vllm.EngineFlags) -> int:
    """The GPUs of one engine of a pod of ``gpu_count`` GPUs: all of them, or a data-parallel rank's share
    (:func:`check_rank_gpus` refuses a count the pod's ranks do not split evenly)."""
    dp = engine.data_parallel
    return gpu_count if dp is None else max(1, gpu_count // dp.local)


def check_rank_gpus(gpu_count: int, engine: vllm.EngineFlags, tensor_parallel_size: int | None) -> None:
    """Refuse a pod whose data-parallel ranks do not take its GPUs evenly (vLLM would leave GPUs idle or not
    start: each rank takes ``tensor x pipeline`` GPUs of its own)."""
    dp = engine.data_parallel
    if dp is None:
        return
    tp = tensor_parallel_size
    if gpu_count % dp.local or (tp is not None and (gpu_count // dp.local) % tp):
        tp_text = f" x {vllm.FLAGS['tensor_parallel_size']} {tp}" if tp is not None else ""
        raise errors.InvalidEngineArgs(
            f"{dp.local} data-parallel ranks ({vllm.DATA_PARALLEL_SIZE_FLAG} {dp.size}, "
            f"{dp.local} on this pod){tp_text} do not split the pod's {gpu_count} GPUs evenly: give "
            f"{vllm.DATA_PARALLEL_SIZE_LOCAL_FLAG} (or {vllm.DATA_PARALLEL_SIZE_FLAG}) times the "
            "tensor-parallel size equal to the pod's GPUs",
            flag=vllm.DATA_PARALLEL_SIZE_FLAG,
        )


def compute_expert_shards(
    engine: vllm.EngineFlags,
    tensor_parallel_size: int,
    expert_shards: memory.ExpertShards = memory.ONE_ENGINE,
) -> memory.ExpertShards:
    """How the routed experts split for an engine run with ``engine``'s flags: the group's (a node plan's
    ``expert_shards``) when given, else over the ``--data-parallel-size x tensor-parallel`` GPUs the flags
    start, else by tensor parallelism alone."""
    dp = engine.data_parallel
    if expert_shards != memory.ONE_ENGINE or dp is None:
        return expert_shards
    return memory.ExpertShards(dp.size * max(1, tensor_parallel_size), expert_parallel=dp.expert_parallel)


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
    ``expert_shards``: the replica is one data-parallel rank of a group (:mod:`.nodes`); ``gpu_count`` is
    then that engine's. A pod's own data-parallel ranks (``engine.data_parallel``) are not: the budget is
    one rank's, of :func:`compute_rank_gpus` of ``gpu_count``, with the group's expert shards."""
    tp = settings.tensor_parallel_size or 1
    if expert_shards == memory.ONE_ENGINE:
        gpu_count = compute_rank_gpus(gpu_count, engine)
    expert_shards = compute_expert_shards(engine, tp, expert_shards)
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
