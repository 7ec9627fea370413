"""vLLM 0.33's flags for an engine spread over several GPUs and nodes (``engine/arg_utils.py``).

One engine is ``tensor_parallel_size x pipeline_parallel_size`` GPUs; ``--data-parallel-size`` runs that many
engines as one group (MoE models: their routed experts split over the whole group with
``--enable-expert-parallel``, ``model_executor/layers/fused_moe/config.py::FusedMoEParallelConfig.make``).
Across nodes vLLM needs no Ray since 0.18: the multiprocessing executor takes ``--nnodes``,
``--node-rank`` and ``--master-addr`` (``EngineArgs.create_engine_config``: ``--nnodes`` must divide
the world size ``data_parallel_size x pipeline_parallel_size x tensor_parallel_size``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import PIPELINE_PARALLEL_FLAG, find_flag_values, find_last_int, iter_flags

DATA_PARALLEL_SIZE_FLAG = "--data-parallel-size"
"""Engines (data-parallel ranks) in the group; each holds its own KV cache and serves its own requests."""
DATA_PARALLEL_SIZE_LOCAL_FLAG = "--data-parallel-size-local"
"""Data-parallel ranks on this node."""
DATA_PARALLEL_RANK_FLAG = "--data-parallel-rank"
"""This process's one data-parallel rank (external load balancing: one rank per pod, ``-dpn``)."""
EXPERT_PARALLEL_FLAG = "--enable-expert-parallel"
"""Whole routed experts per GPU over the group's DP x TP ranks, instead of each expert split by TP."""
_EXPERT_PARALLEL = {EXPERT_PARALLEL_FLAG: True, "-ep": True, "--disable-expert-parallel": False}
"""vLLM 0.33's spellings of the boolean (``EnableDisableAction``, ``engine/arg_utils.py:1305``); the last
wins."""
DATA_PARALLEL_FLAGS = (
    DATA_PARALLEL_SIZE_FLAG,
    "-dp",
    DATA_PARALLEL_SIZE_LOCAL_FLAG,
    "-dpl",
    DATA_PARALLEL_RANK_FLAG,
    "-dpn",
    *_EXPERT_PARALLEL,
)
"""Every spelling :func:`read_data_parallel` reads (vLLM 0.33's option strings of the four)."""
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


@dataclass(frozen=True, slots=True)
class DataParallel:
    """The data-parallel engines a pod's arguments start (``ParallelConfig``, ``config/parallel.py:147-190``).

    Each rank is a whole engine of ``tensor_parallel_size x pipeline_parallel_size`` GPUs with its own KV
    cache, ``--max-num-seqs`` and CUDA graphs; what the ranks share is the routed experts of a MoE model,
    split over all ``size x tensor_parallel_size`` ranks of the group (whole experts with
    ``--enable-expert-parallel``, else each expert's intermediate size:
    ``FusedMoEParallelConfig.make``, ``model_executor/layers/fused_moe/config.py:1117``)."""

    size: int
    """``--data-parallel-size``: ranks in the group."""
    local: int
    """Ranks this pod runs: ``--data-parallel-size-local``; 1 for an externally balanced rank
    (``--data-parallel-rank``); else the whole group (``EngineArgs.create_engine_config``,
    ``engine/arg_utils.py:2483-2535``)."""
    expert_parallel: bool


def read_data_parallel(args: Sequence[str]) -> DataParallel | None:
    """The data parallelism of ``args`` (``-dp``, ``-dpl``, ``-dpn``, ``-ep`` and their long spellings, the
    last occurrence winning as with argparse); ``None`` for one engine without expert parallelism. A value
    vLLM refuses is :func:`check_data_parallel`'s to report."""
    expert_parallel = False
    for _, flag, inline in iter_flags(args):
        if flag in _EXPERT_PARALLEL and inline is None:
            expert_parallel = _EXPERT_PARALLEL[flag]
    size = find_last_int(args, DATA_PARALLEL_SIZE_FLAG) or 1
    if size <= 1 and not expert_parallel:
        return None
    if find_last_int(args, DATA_PARALLEL_RANK_FLAG) is not None:
        local = 1
    else:
        local = min(size, find_last_int(args, DATA_PARALLEL_SIZE_LOCAL_FLAG) or size)
    return DataParallel(size, max(1, local), expert_parallel)


def check_data_parallel(args: Sequence[str]) -> None:
    """Refuse what vLLM 0.33 refuses of these flags: a size below 1 (``ge=1``), a local size above the size
    (``ParallelConfig.__post_init__``, ``config/parallel.py:545``), a value that is not an integer, a value
    given to the boolean."""
    for flag in (DATA_PARALLEL_SIZE_FLAG, DATA_PARALLEL_SIZE_LOCAL_FLAG, DATA_PARALLEL_RANK_FLAG):
        for value in find_flag_values(args, flag):
            least = 1 if flag == DATA_PARALLEL_SIZE_FLAG else 0
            if not value.strip().isdigit() or int(value) < least:
                raise errors.InvalidEngineArgs(
                    f"{flag} {value[:32]!r} must be an integer >= {least} (vLLM 0.33 refuses it)", flag=flag
                )
    for _, flag, inline in iter_flags(args):
        if flag in _EXPERT_PARALLEL and inline is not None:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag} takes no value (vLLM refuses {flag}={inline})", flag=flag
            )
    size = find_last_int(args, DATA_PARALLEL_SIZE_FLAG) or 1
    local = find_last_int(args, DATA_PARALLEL_SIZE_LOCAL_FLAG)
    if local is not None and local > size:
        raise errors.InvalidEngineArgs(
            f"{DATA_PARALLEL_SIZE_LOCAL_FLAG} {local} must be <= {DATA_PARALLEL_SIZE_FLAG} {size} (vLLM 0.33 "
            "refuses it)",
            flag=DATA_PARALLEL_SIZE_LOCAL_FLAG,
        )


def describe_data_parallel(dp: DataParallel, tensor_parallel_size: int, experts: int | None) -> str:
    """The plan's line on the ranks: what each holds and what they share (``experts``: the routed experts
    of the model, ``None`` for a dense one)."""
    ranks = dp.size * tensor_parallel_size
    if dp.size > 1:
        head = (
            f"{DATA_PARALLEL_SIZE_FLAG} {dp.size}: the settings and the budget are one engine's (a "
            f"data-parallel rank of tensor-parallel size {tensor_parallel_size}); this pod runs "
            f"{dp.local} of them, each with its own KV cache and --max-num-seqs"
        )
    else:
        head = f"{EXPERT_PARALLEL_FLAG} on one engine of tensor-parallel size {tensor_parallel_size}"
    if experts is None:
        return head + ("; the model has no routed experts to split." if dp.expert_parallel else ".")
    if dp.expert_parallel:
        busiest = -(-experts // ranks)
        whole = f"; the routed experts split whole over {ranks} GPUs ({busiest} of {experts} on the busiest)."
        return head + whole
    return head + f"; each routed expert's intermediate size splits over {ranks} GPUs."
