"""vLLM 0.33's flags for an engine spread over several GPUs and nodes (``engine/arg_utils.py``).

One engine is ``tensor_parallel_size x pipeline_parallel_size`` GPUs; ``--data-parallel-size`` runs that many
engines as one group (MoE models: their routed experts split over the whole group with
``--enable-expert-parallel``, ``model_executor/layers/fused_moe/config.py::FusedMoEParallelConfig.make``).
Across nodes vLLM needs no Ray since 0.18: the multiprocessing executor takes ``--nnodes``,
``--node-rank`` and ``--master-addr`` (``EngineArgs.create_engine_config``: ``--nnodes`` must divide
the world size ``data_parallel_size x pipeline_parallel_size x tensor_parallel_size``).
"""

from __future__ import annotations

from kvpilot.tuner.vllm.args import PIPELINE_PARALLEL_FLAG

DATA_PARALLEL_SIZE_FLAG = "--data-parallel-size"
"""Engines (data-parallel ranks) in the group; each holds its own KV cache and serves its own requests."""
DATA_PARALLEL_SIZE_LOCAL_FLAG = "--data-parallel-size-local"
"""Data-parallel ranks on this node."""
EXPERT_PARALLEL_FLAG = "--enable-expert-parallel"
"""Whole routed experts per GPU over the group's DP x TP ranks, instead of each expert split by TP."""
NNODES_FLAG = "--nnodes"
"""Nodes of the group (``ParallelConfig.nnodes``, short ``-n``)."""
NODE_RANK_FLAG = "--node-rank"
"""This node's zero-based index in the group (``ParallelConfig.node_rank``, short ``-r``)."""
MASTER_ADDR_FLAG = "--master-addr"
"""The address of node 0, where the group's processes meet (``ParallelConfig.master_addr``)."""
HEADLESS_FLAG = "--headless"
"""A node that runs engine ranks but no API server (``entrypoints/cli/serve.py::run_headless``)."""


def build_parallel_args(
    *,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    data_parallel_size_local: int | None = None,
    expert_parallel: bool = False,
) -> tuple[str, ...]:
    """The group-wide parallelism flags beside ``--tensor-parallel-size`` (none for one engine, one stage)."""
    args: list[str] = []
    if pipeline_parallel_size > 1:
        args += [PIPELINE_PARALLEL_FLAG, str(pipeline_parallel_size)]
    if data_parallel_size > 1:
        args += [DATA_PARALLEL_SIZE_FLAG, str(data_parallel_size)]
        if data_parallel_size_local is not None:
            args += [DATA_PARALLEL_SIZE_LOCAL_FLAG, str(data_parallel_size_local)]
    if expert_parallel:
        args.append(EXPERT_PARALLEL_FLAG)
    return tuple(args)


def build_node_role_args(nnodes: int, node_rank: str, master_addr: str, *, headless: bool) -> tuple[str, ...]:
    """The flags of one node of a group of ``nnodes`` (none for one node): its rank and node 0's address
    (strings: a pod renders them as ``$(VAR)`` references). Node 0 serves the API; the others run
    ``--headless`` (pipeline stages: ``MultiprocExecutor`` workers; data-parallel engines: inferred from
    ``--node-rank``, ``EngineArgs.create_engine_config``)."""
    if nnodes <= 1:
        return ()
    args = (NNODES_FLAG, str(nnodes), NODE_RANK_FLAG, node_rank, MASTER_ADDR_FLAG, master_addr)
    return (*args, HEADLESS_FLAG) if headless else args
