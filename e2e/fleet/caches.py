"""What a simulated pod's start finds on its volumes: the weights, and vLLM's compiled graphs.

Two caches decide how long a start takes (:class:`e2e.fleet.truth.StartupModel`):

* **weights**: the Hugging Face cache under the container's ``HF_HOME``. A volume that a start finished
  downloading ``model`` onto holds it for every later start that mounts it (:func:`e2e.fleet.pod.
  read_weight_cache`: a claim for every pod, a ``hostPath`` for the pods of its node).
* **compiled graphs**: vLLM's compile cache under ``VLLM_CACHE_ROOT`` (:func:`e2e.fleet.pod.
  read_compile_cache`), one folder per compile hash. A start whose hash matches a start that finished
  on the same volume loads the graphs ("torch.compile takes" the warm figure); any other start compiles.
  Which settings enter the hash is the fleet's own truth, :data:`HASHED_SETTINGS` (the fleet never asks
  the code it judges: ``e2e/test_fleet.py``); ``tests/contract/test_contract_compile_cache.py`` holds it,
  and kvpilot's claim, to vLLM's own ``VllmConfig.compute_hash``. The model's name stands for the model's
  config and code, which enter the hash too.

A start records its caches when it ends, whether the engine then serves or fails its KV check: vLLM
writes the compiled graphs during the profile run, before the KV cache is sized.
"""

from __future__ import annotations

import dataclasses

from e2e.fleet.truth import EngineArgs

CompileKey = tuple[str, tuple[tuple[str, object], ...]]

HASHED_SETTINGS: frozenset[str] = frozenset(
    {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "tensor_parallel_size"}
)
"""The engine arguments that change vLLM 0.33's ``VllmConfig.compute_hash()`` (the compile cache's folder
name; ``vllm/compilation/backends.py``), as vLLM's own hash shows them (the contract test above);
``gpu_memory_utilization`` is not among them."""


def compute_compile_key(args: EngineArgs) -> CompileKey:
    """What of ``args`` enters vLLM's compile hash: the model and each setting kvpilot knows to be hashed
    (as the pod gives it: ``None`` for a flag left to vLLM's default)."""
    missing = sorted(name for name in HASHED_SETTINGS if not hasattr(args, name))
    if missing:
        raise ValueError(f"the fleet's EngineArgs lack settings vLLM's compile hash covers: {missing}")
    return args.model, tuple((name, getattr(args, name)) for name in sorted(HASHED_SETTINGS))


@dataclasses.dataclass(frozen=True)
class StartSources:
    """Where one start finds its weights and its compiled graphs."""

    weights_cached: bool
    compile_cached: bool

    def describe(self, weights_volume: str | None) -> str:
        """The ``Started``/``Restarted`` event's words, e.g. ``weights=cache-hit compile=warm``."""
        weights = (
            "cache-hit" if self.weights_cached else ("download" if weights_volume else "download-no-cache")
        )
        return f"weights={weights} compile={'warm' if self.compile_cached else 'cold'}"


class StartCaches:
    """The fleet's volumes: which (volume, model) pairs hold weights and which hold compiled graphs."""

    def __init__(self) -> None:
        self._weights: set[tuple[str, str]] = set()
        self._compiled: set[tuple[str, CompileKey]] = set()

    def compute_sources(
        self, args: EngineArgs, weights_volume: str | None, compile_volume: str | None
    ) -> StartSources:
        """What a start with ``args`` finds on the volumes its pod mounts (``None``: no volume)."""
        return StartSources(
            weights_volume is not None and (weights_volume, args.model) in self._weights,
            compile_volume is not None and (compile_volume, compute_compile_key(args)) in self._compiled,
        )

    def record_start(self, args: EngineArgs, weights_volume: str | None, compile_volume: str | None) -> None:
        """A start with ``args`` ended: its weights and its compiled graphs are on its volumes now."""
        if weights_volume is not None:
            self._weights.add((weights_volume, args.model))
        if compile_volume is not None:
            self._compiled.add((compile_volume, compute_compile_key(args)))

    def holds_weights(self, weights_volume: str, model: str) -> bool:
        return (weights_volume, model) in self._weights
