"""Table tests of the termination classifier against the exact texts vLLM and PyTorch print."""

from __future__ import annotations

import pytest

from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.restarts import classify_termination

V1_KV_033 = (
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (10.53 GiB). Based on the "
    "available memory, the "
    "estimated maximum model length is 86240. Try increasing `gpu_memory_utilization` (which "
    "also controls CPU "
    "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
V1_KV_010 = (
    "ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (2.50 GiB). Based on the "
    "available memory, the "
    "estimated maximum model length is 20480. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine."
)
V1_KV_085 = (  # 0.8.5 drops the estimate (string-concatenation bug)
    "To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache "
    "is needed, which "
    "is larger than the available KV cache memory (2.50 GiB).Try increasing `gpu_memory_utilization`"
)
V0_KV = (
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens "
    "that can be stored "
    "in KV cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine."
)
NO_BLOCKS_033 = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its "
    "name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
FREE_020 = (
    "ValueError: Free memory on device cuda:0 (30.12/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU memory used "
    "by other processes."
)
FREE_09 = (
    "ValueError: Free memory on device (30.12/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used "
    "by other processes."
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 140.75 MiB is free. Process 3270336 has 78.96 GiB memory in use. Of "
    "the allocated memory "
    "68.83 GiB is allocated by PyTorch, with 660.00 MiB allocated in private pools (e.g., CUDA Graphs), and "
    "331.08 MiB is reserved by PyTorch but unallocated."
)
OLD_TORCH_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
    "capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)"
)
ENGINE_DEAD = (
    "(EngineCore_DP0 pid=42) ERROR EngineCore encountered a fatal error.\n"
    + TORCH_OOM
    + "\n(APIServer pid=1) ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
)
START_FAIL_TAIL = (
    "(EngineCore_DP0 pid=77) " + V1_KV_033 + "\n(EngineCore_DP0 pid=77) EngineCore failed to start.\n"
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
    "{'EngineCore_DP0': 1}"
)


@pytest.mark.parametrize(
    ("message", "reason", "code", "kind"),
    [
        (V1_KV_033, "Error", 1, RestartKind.KV_CACHE_TOO_SMALL),
        (V1_KV_010, "Error", 1, RestartKind.KV_CACHE_TOO_SMALL),
        (V1_KV_085, "Error", 1, RestartKind.KV_CACHE_TOO_SMALL),
        (V0_KV, "Error", 1, RestartKind.KV_CACHE_TOO_SMALL),
        (START_FAIL_TAIL, "Error", 1, RestartKind.KV_CACHE_TOO_SMALL),
        (NO_BLOCKS_033, "Error", 1, RestartKind.NO_CACHE_BLOCKS),
        (
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
            "Error",
            1,
            RestartKind.NO_CACHE_BLOCKS,
        ),
        (FREE_020, "Error", 1, RestartKind.INSUFFICIENT_FREE_MEMORY),
        (FREE_09, "Error", 1, RestartKind.INSUFFICIENT_FREE_MEMORY),
        (TORCH_OOM, "Error", 1, RestartKind.CUDA_OOM),
        (OLD_TORCH_OOM, "Error", 1, RestartKind.CUDA_OOM),
        (ENGINE_DEAD, "Completed", 0, RestartKind.CUDA_OOM),
        ("RuntimeError: CUDA error: out of memory", "Error", 1, RestartKind.CUDA_OOM),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "Error",
            1,
            RestartKind.CUDA_OOM,
        ),
        (
            "NCCL error: unhandled cuda error, NCCL version 2.21.5\nCuda failure 'out of memory'",
            "Error",
            1,
            RestartKind.CUDA_OOM,
        ),
        ("", "OOMKilled", 137, RestartKind.HOST_OOM_KILLED),
        (None, "OOMKilled", 137, RestartKind.HOST_OOM_KILLED),
        (TORCH_OOM, "OOMKilled", 137, RestartKind.HOST_OOM_KILLED),  # the kubelet's reason wins
        ("", "Error", 137, RestartKind.OTHER),  # SIGKILL without OOMKilled: a probe kill, not memory
        (
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "Error",
            1,
            RestartKind.OTHER,
        ),
        ("OSError: We couldn't connect to 'https://huggingface.co'", "Error", 1, RestartKind.OTHER),
        (None, None, None, RestartKind.OTHER),
    ],
)
def test_kind(message: str | None, reason: str | None, code: int | None, kind: RestartKind) -> None:
    assert classify_termination(message, reason, code).kind == kind


@pytest.mark.parametrize(
    ("message", "length", "estimate", "needed", "available"),
    [
        (V1_KV_033, 131072, 86240, 16.0, 10.53),
        (V1_KV_010, 32768, 20480, 4.0, 2.5),
        (V1_KV_085, 32768, None, 4.0, 2.5),
        (V0_KV, 4096, 3664, None, None),
        (START_FAIL_TAIL, 131072, 86240, 16.0, 10.53),
    ],
)
def test_kv_figures(
    message: str, length: int, estimate: int | None, needed: float | None, available: float | None
) -> None:
    cause = classify_termination(message, "Error", 1)
    assert (cause.max_model_len, cause.estimated_max_model_len) == (length, estimate)
    assert (cause.needed_kv_gib, cause.available_kv_gib) == (needed, available)


@pytest.mark.parametrize("message", [FREE_020, FREE_09])
def test_free_memory_figures(message: str) -> None:
    cause = classify_termination(message, "Error", 1)
    assert (cause.free_gib, cause.total_gib) == (30.12, 79.19)


def test_cuda_oom_detail_names_the_allocation() -> None:
    assert "786.00 MiB" in classify_termination(TORCH_OOM, "Error", 1).detail


def test_other_keeps_the_last_line() -> None:
    cause = classify_termination("line one\nValueError: bad flag --foo\n", "Error", 2)
    assert cause.detail == "ValueError: bad flag --foo"
    assert "exit code 3" in classify_termination("", "Error", 3).detail


def test_matches_the_memory_models_own_error_texts() -> None:
    """The tuner's start-up simulator prints what vLLM prints; the classifier must read it back."""
    from kvpilot.tuner import vllm

    for version in ((0, 10), (0, 13), (0, 15), (0, 25), (0, 33)):
        text = vllm.max_len_error(version, 65536, 8.0, 5.25, 41984)
        cause = classify_termination(text, "Error", 1)
        assert (cause.kind, cause.max_model_len, cause.estimated_max_model_len) == (
            RestartKind.KV_CACHE_TOO_SMALL,
            65536,
            41984,
        )
        assert classify_termination(vllm.no_memory_error(version), "Error", 1).kind == (
            RestartKind.NO_CACHE_BLOCKS
        )


@pytest.mark.contract
def test_matches_the_pinned_vllm_source() -> None:
    """Raise the pinned vLLM's own start-up errors and classify them."""
    planning = pytest.importorskip("vllm.v1.core.kv_cache_planning")
    gib = 1 << 30
    with pytest.raises(ValueError) as too_small:
        planning._check_enough_kv_cache_memory(5 * gib, lambda: 8 * gib, 65536, lambda _: 40960)
    cause = classify_termination(str(too_small.value), "Error", 1)
    assert (cause.kind, cause.max_model_len, cause.estimated_max_model_len) == (
        RestartKind.KV_CACHE_TOO_SMALL,
        65536,
        40960,
    )
    assert (cause.needed_kv_gib, cause.available_kv_gib) == (8.0, 5.0)
    with pytest.raises(ValueError) as none_left:
        planning._check_enough_kv_cache_memory(0, lambda: gib, 4096, lambda _: 0)
    assert classify_termination(str(none_left.value), "Error", 1).kind == RestartKind.NO_CACHE_BLOCKS


def test_reads_the_e2e_fleet_simulators_texts() -> None:
    """The e2e fleet prints what vLLM 0.33 prints; the closed loop must classify it the same way."""
    truth_mod = pytest.importorskip("e2e.fleet.truth")
    truth = truth_mod.GroundTruth(non_kv_gib=60.0)
    args = truth_mod.EngineArgs(max_model_len=131072)
    error = truth.startup_error(args)
    assert error is not None
    cause = classify_termination(truth.startup_failure_log(args, error), "Error", 1)
    assert (cause.kind, cause.max_model_len) == (RestartKind.KV_CACHE_TOO_SMALL, 131072)
    message = classify_termination(truth.startup_failure_message(args, error), "Error", 1)
    assert message.kind == RestartKind.OTHER and "further up the log" in message.detail
    assert cause.estimated_max_model_len is not None and 0 < cause.estimated_max_model_len < 131072
    for startup in (False, True):
        assert classify_termination(truth.cuda_oom_message(args, startup=startup), "Error", 1).kind == (
            RestartKind.CUDA_OOM
        )
    none_left = truth_mod.GroundTruth(non_kv_gib=79.0).startup_error(args)
    assert classify_termination(none_left, "Error", 1).kind == RestartKind.NO_CACHE_BLOCKS


def test_mamba_cache_blocks_text_of_vllm_033_is_classified_with_its_figure() -> None:
    from kvpilot.tuner import vllm

    text = "INFO ...\n" + vllm.mamba_cache_blocks_error(1024, 612) + "\nEngine core initialization failed"
    cause = classify_termination(text, "Error", 1)
    assert (cause.kind, cause.cache_blocks) == (RestartKind.MAMBA_CACHE_BLOCKS, 612)
    assert cause.detail.startswith("max_num_seqs (1024) exceeds available Mamba cache blocks (612)")


# A group over several nodes: the texts a rank prints when a peer stops answering. vLLM 0.33's own
# (``v1/executor/multiproc_executor.py``, ``distributed/utils.py``) and torch 2.13's NCCL watchdog.
NCCL_WATCHDOG = (
    "[rank1]:[E1205 20:11:02.123456 ProcessGroupNCCL.cpp:685] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for "
    "600012 milliseconds before timing out."
)
RPC_TIMEOUT_033 = "TimeoutError: RPC call to execute_model timed out."
BARRIER_033 = "RuntimeError: Barrier timed out after 300.00 seconds"
WORKER_DIED_033 = (
    "(EngineCore pid=77) ERROR 12-05 20:11:02 [multiproc_executor.py:381] Worker proc VllmWorker-3 died "
    "unexpectedly (exit code: -9), shutting down executor."
)


@pytest.mark.parametrize("message", [NCCL_WATCHDOG, RPC_TIMEOUT_033, BARRIER_033, WORKER_DIED_033])
def test_a_peers_timeout_is_not_a_kv_failure(message: str) -> None:
    cause = classify_termination(f"INFO loading\n{message}\nshutting down", "Error", 1)
    assert cause.kind == RestartKind.DISTRIBUTED_TIMEOUT
    assert message.split(":")[-1].strip()[:20] in cause.detail


def test_a_ranks_own_oom_outranks_the_timeout_it_caused() -> None:
    text = f"{NCCL_WATCHDOG}\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert classify_termination(text, "Error", 1).kind == RestartKind.CUDA_OOM


def test_a_missing_streamer_package_names_the_package_not_the_memory() -> None:
    """vLLM's failure when ``--load-format runai_streamer`` meets an image without runai-model-streamer
    (``kvpilot.tuner.vllm.loaders``): the command is wrong for the image, no memory rule cures it."""
    log = (
        "(EngineCore_DP0 pid=81) ERROR 12-05 10:00:00 [core.py:946] EngineCore failed to start.\n"
        "ModuleNotFoundError: No module named 'runai_model_streamer'\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    cause = classify_termination(log, "Error", 1)
    assert cause.kind == RestartKind.INVALID_ENGINE_ARGS
    assert cause.detail is not None and "runai-model-streamer" in cause.detail
    assert classify_termination("ModuleNotFoundError: No module named 'runai'", "Error", 1).kind == (
        RestartKind.OTHER
    )
