"""Where vLLM keeps its compile and kernel caches, and which tuned settings make a start miss them.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). Established from vLLM 0.33's code
(``tests/contract/test_contract_compile_cache.py`` checks it against vLLM's own ``compute_hash``):

* **Where.** Every cache lives under ``VLLM_CACHE_ROOT`` (``vllm/envs.py``; default ``~/.cache/vllm``, or
  ``$XDG_CACHE_HOME/vllm``): the torch.compile artifacts in ``torch_compile_cache/<hash>/``
  (``compilation/backends.py``), Inductor's cache beside them in ``<hash>/inductor_cache`` and Triton's in
  ``<hash>/triton_cache`` unless ``TRITON_CACHE_DIR`` is set (``compilation/compiler_interface.py::
  initialize_inductor_cache``: a caller's ``TRITON_CACHE_DIR`` wins), and FlashInfer's autotune results in
  ``flashinfer_autotune_cache/`` (``model_executor/warmup/flashinfer_autotune_cache.py``). The root's own
  path does not enter the key (``envs.compile_factors`` ignores ``VLLM_CACHE_ROOT``), so a volume mounted
  elsewhere on the next pod still hits.
* **Keyed by.** ``<hash>`` is the first 10 hex digits of SHA-256 over four factors: vLLM's environment
  (``envs.compile_factors``), ``VllmConfig.compute_hash()`` (vLLM's version and the model, cache,
  parallel, scheduler, compilation ... configs' own ``compute_hash``), the traced source files and the
  compiler's (torch's) own hash. With AOT compilation (``VLLM_USE_AOT_COMPILE``, on by default from torch
  2.10) the folder is ``torch_compile_cache/torch_aot_compile/<hash>/``, from the same environment and
  config hashes plus the model's forward code (``compilation/decorators.py``, ``caching.py::
  aot_compile_hash_factors``). A start whose factors all match loads the compiled graphs instead of
  compiling ("torch.compile takes S s in total" drops to the load).
* **Which tuned settings enter it.** ``SchedulerConfig.compute_hash`` hashes ``max_num_batched_tokens``
  (LoRA's static buffers, Inductor's 32/64-bit indexing) and ``max_num_seqs`` (per-request static buffers
  captured in graphs); ``ModelConfig`` hashes ``max_model_len``; ``CacheConfig`` hashes ``cache_dtype``
  (``kv_cache_dtype``) and ``block_size``; ``ParallelConfig`` the tensor-parallel size;
  ``CompilationConfig`` the CUDA-graph capture sizes (derived from ``max_num_seqs`` unless given). Not
  hashed: ``gpu_memory_utilization`` and ``kv_cache_memory_bytes`` (``CacheConfig``'s ignored factors:
  they size the KV cache, not the graph), prefix caching.

So of the settings kvpilot tunes, only a change of ``gpu_memory_utilization`` alone restarts onto a warm
compile cache; any other change compiles again (its Triton kernels may still hit a shared
``TRITON_CACHE_DIR``: Triton keys each kernel by its own source and options). Only 0.33 is read here;
for other releases kvpilot claims the same set: where a release hashes fewer fields, the claim only
forgoes a discount, never promises one.
"""

from __future__ import annotations

from kvpilot.tuner.types import EngineSettings

CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
"""The variable naming the root of every vLLM cache (``vllm/envs.py``)."""
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
"""Triton's kernel cache; vLLM keeps a caller's value (``initialize_inductor_cache``), else one per hash."""
COMPILE_CACHE_DIR = "torch_compile_cache"
"""The folder under :data:`CACHE_ROOT_ENV` holding one ``<hash>`` folder per compiled configuration."""

COMPILE_HASH_SETTINGS: frozenset[str] = frozenset(
    {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "tensor_parallel_size"}
)
"""The :class:`~kvpilot.tuner.types.EngineSettings` fields that enter ``VllmConfig.compute_hash`` (module
docstring); every other field (``gpu_memory_utilization``) leaves the compile cache warm."""


def build_cache_env(root: str) -> dict[str, str]:
    """The environment that keeps vLLM's caches under ``root`` (a persistent volume's folder): vLLM's own
    root, and one Triton cache shared by every compiled configuration (kernels are keyed by content)."""
    return {CACHE_ROOT_ENV: root, TRITON_CACHE_ENV: f"{root}/triton_cache"}


def compute_compile_key(settings: EngineSettings) -> tuple[tuple[str, object], ...]:
    """What of *effective* ``settings`` enters vLLM's compile hash: two settings of one service (one model,
    release and environment) with the same key share the compiled graphs in ``<hash>/``."""
    values = settings.as_dict()
    return tuple(sorted((name, values.get(name)) for name in COMPILE_HASH_SETTINGS))


def compute_compile_invalidating(current: EngineSettings, proposed: EngineSettings) -> frozenset[str]:
    """The fields whose change between two *effective* settings (every field set) makes vLLM compile
    again; empty when the restart loads the compiled graphs from a warm cache."""
    before, after = current.as_dict(), proposed.as_dict()
    return frozenset(name for name in COMPILE_HASH_SETTINGS if before.get(name) != after.get(name))
