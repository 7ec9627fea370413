"""kvpilot's claim of which tuned settings invalidate vLLM's compile cache, against vLLM's own hash.

vLLM names its torch.compile cache folder after ``VllmConfig.compute_hash()`` (with its environment,
the traced code and the compiler's hash, which a retune does not change:
``vllm/compilation/backends.py``). Each test builds vLLM's own ``VllmConfig`` with ``EngineArgs.
create_engine_config`` on the CPU platform, twice, differing only in one setting kvpilot tunes, and checks
that the hash changes exactly when :data:`kvpilot.tuner.vllm.COMPILE_HASH_SETTINGS` says it does.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from e2e.fleet.caches import HASHED_SETTINGS
from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.types import EngineSettings

BASE = EngineSettings(
    max_model_len=8192,
    max_num_seqs=128,
    gpu_memory_utilization=0.9,
    kv_cache_dtype="auto",
    tensor_parallel_size=1,
    max_num_batched_tokens=8192,
)
CHANGED: dict[str, typing.Any] = {
    "max_model_len": 4096,
    "max_num_seqs": 64,
    "gpu_memory_utilization": 0.8,
    "kv_cache_dtype": "fp8",
    "max_num_batched_tokens": 4096,
}
"""One other value per tuned field (``tensor_parallel_size`` below: a CPU start checks it against ranks)."""


def _vllm_hash(engine_args_cls: typing.Any, model: Path, settings: EngineSettings) -> str:
    args = engine_args_cls(model=str(model), skip_tokenizer_init=True, **settings.as_dict())
    return str(args.create_engine_config().compute_hash())


def test_every_tuned_field_is_classified() -> None:
    """A field added to EngineSettings must be placed on one side of the claim, by a test here."""
    fields = {f.name for f in dataclasses.fields(EngineSettings)}
    assert fields == set(CHANGED) | {"tensor_parallel_size"}
    assert fields >= kv_vllm.COMPILE_HASH_SETTINGS
    assert fields >= HASHED_SETTINGS


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_compile_hash_changes_exactly_for_claimed_fields(
    engine_args_cls: typing.Any, local_model_dir: Path, field: str
) -> None:
    changed = dataclasses.replace(BASE, **{field: CHANGED[field]})
    theirs = _vllm_hash(engine_args_cls, local_model_dir, BASE) != _vllm_hash(
        engine_args_cls, local_model_dir, changed
    )
    ours = kv_vllm.compute_compile_invalidating(BASE, changed)
    assert theirs == bool(ours), f"{field}: vLLM's hash changes={theirs}, kvpilot claims {sorted(ours)}"
    fleet = field in HASHED_SETTINGS  # the fleet simulator's own truth, held to vLLM's hash too
    assert theirs == fleet, f"{field}: vLLM's hash changes={theirs}, the fleet's truth says {fleet}"
    assert ours <= {field}


def test_tensor_parallel_size_enters_the_hash(vllm: typing.Any) -> None:
    """``ParallelConfig.compute_hash`` (a part of ``VllmConfig.compute_hash``) for TP 1 against TP 2."""
    parallel: typing.Any = vllm.config.ParallelConfig
    one, two = (parallel(tensor_parallel_size=n).compute_hash() for n in (1, 2))
    theirs = one != two
    ours = kv_vllm.compute_compile_invalidating(BASE, dataclasses.replace(BASE, tensor_parallel_size=2))
    assert theirs and ours == {"tensor_parallel_size"}


def test_cudagraph_capture_sizes_enter_the_hash(vllm: typing.Any) -> None:
    """The capture sizes (derived from ``max_num_seqs`` on CUDA) are part of ``CompilationConfig``'s hash:
    a second reason a ``max_num_seqs`` change misses the cache on a GPU."""
    compilation: typing.Any = vllm.config.CompilationConfig
    small = compilation(cudagraph_capture_sizes=[1, 2, 4]).compute_hash()
    large = compilation(cudagraph_capture_sizes=[1, 2, 4, 8]).compute_hash()
    assert small != large
    assert "max_num_seqs" in kv_vllm.COMPILE_HASH_SETTINGS


def test_cache_root_is_the_variable_vllm_reads(vllm: typing.Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_cache_env``'s root is where vLLM puts its caches, and the root's path is not in the key."""
    from vllm import envs

    env = kv_vllm.build_cache_env("/models/vllm")
    monkeypatch.setenv(kv_vllm.compile_cache.CACHE_ROOT_ENV, env[kv_vllm.compile_cache.CACHE_ROOT_ENV])
    assert envs.VLLM_CACHE_ROOT == "/models/vllm"
    assert kv_vllm.compile_cache.CACHE_ROOT_ENV not in envs.compile_factors()
