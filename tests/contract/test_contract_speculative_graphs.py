"""Contract: the CUDA graphs vLLM 0.33 builds with speculative decoding, from its own classes on CPU.

For a decode query length of ``1 + k`` the pinned wheel's own code gives the graphs one rank captures;
:func:`kvpilot.tuner.vllm.cuda_graph_counts` and :func:`kvpilot.tuner.memory.drafter_graph_count` must
give the same counts:

* the sizes: ``VllmConfig._set_cudagraph_sizes`` on a stand-in config (the platform's SM family patched);
* the V1 runner: a real ``CompilationConfig``'s ``adjust_cudagraph_sizes_for_spec_decode``, then a
  ``CudagraphDispatcher``'s ``initialize_cudagraph_keys(FULL_AND_PIECEWISE, 1 + k)`` (its PIECEWISE and FULL
  keys are what ``profile_cudagraph_memory`` captures);
* Model Runner V2: ``CudaGraphManager._init_candidates`` (``v1/worker/gpu/cudagraph_utils.py``) for the
  target (``FULL_AND_PIECEWISE`` at ``1 + k``) and, as an EAGLE / MTP speculator builds them
  (``target_dependent_ar/speculator.py::init_cudagraph_manager``), its prefill manager (the same) and its
  decode manager (``FULL_DECODE_ONLY`` at query length 1, for ``k > 1``).
"""

from __future__ import annotations

import importlib
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from kvpilot.tuner import gpus, memory
from kvpilot.tuner import vllm as kv
from kvpilot.tuner.types import GpuSpec

pytestmark = pytest.mark.contract

SEQS = (3, 100, 256, 1024)
TOKENS = (300, 2048, 8192)
K = (1, 3, 4)


def _sizes(gpu: GpuSpec, seqs: int, tokens: int, k: int, monkeypatch: Any) -> tuple[list[int], int]:
    config = importlib.import_module("vllm.config")
    compilation = importlib.import_module("vllm.config.compilation")
    platform = importlib.import_module("vllm.platforms").current_platform
    monkeypatch.setattr(
        platform, "is_device_capability_family", lambda cap, *a, **kw: cap == gpu.compute_capability[0] * 10
    )
    fake = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False),
        compilation_config=SimpleNamespace(
            cudagraph_mode=compilation.CUDAGraphMode.FULL_AND_PIECEWISE,
            max_cudagraph_capture_size=None,
            cudagraph_capture_sizes=None,
            post_init_cudagraph_sizes=lambda: None,
        ),
        uniform_decode_query_len=1 + k,
        num_speculative_tokens=k,
        scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
        performance_mode=None,
        speculative_config=SimpleNamespace(
            num_speculative_tokens=k, uses_dynamic_speculative_decoding=lambda: False
        ),
    )
    config.VllmConfig._set_cudagraph_sizes(fake)
    return list(
        fake.compilation_config.cudagraph_capture_sizes
    ), fake.compilation_config.max_cudagraph_capture_size


def _v1_keys(sizes: list[int], largest: int, seqs: int, k: int) -> tuple[int, int]:
    compilation = importlib.import_module("vllm.config.compilation")
    dispatcher_module = importlib.import_module("vllm.v1.cudagraph_dispatcher")
    mode = compilation.CUDAGraphMode
    real = compilation.CompilationConfig(
        cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=largest
    )
    real.adjust_cudagraph_sizes_for_spec_decode(1 + k)
    dispatcher = object.__new__(dispatcher_module.CudagraphDispatcher)
    dispatcher.vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=seqs),
        lora_config=None,
        compilation_config=real,
        parallel_config=SimpleNamespace(data_parallel_size=1),
    )
    dispatcher.compilation_config = real
    dispatcher.uniform_decode_query_len = 1 + k
    dispatcher.cudagraph_keys = {mode.PIECEWISE: set(), mode.FULL: set()}
    dispatcher.keys_initialized = False
    dispatcher.specialize_lora_count = False
    dispatcher.cudagraph_mode = mode.NONE
    dispatcher.initialize_cudagraph_keys(mode.FULL_AND_PIECEWISE, 1 + k)
    keys = dispatcher.cudagraph_keys
    return len(keys[mode.PIECEWISE]), len(keys[mode.FULL])


def _v2_descs(
    sizes: list[int], largest: int, seqs: int, k: int, cg_mode: Any, query_len: int
) -> dict[str, int]:
    compilation = importlib.import_module("vllm.config.compilation")
    manager_module = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
    manager = object.__new__(manager_module.CudaGraphManager)
    manager.vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=k, uses_dynamic_speculative_decoding=lambda: False
        ),
        num_speculative_tokens=k,
        cache_config=SimpleNamespace(use_kda_recoverssm=False),
    )
    manager.compilation_config = compilation.CompilationConfig(
        cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=largest
    )
    manager.max_num_reqs = seqs
    manager.cudagraph_mode = cg_mode
    manager.decode_query_len = query_len
    manager.varlen_decode = False
    manager.ubatch_runner = None
    manager.lora_capture_cases = [0]
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    return {m.name: len(descs) for m, descs in manager._capture_descs.items()}


@pytest.mark.parametrize("gpu", [gpus.lookup_gpu("H100-SXM"), gpus.lookup_gpu("B200")], ids=lambda g: g.name)
def test_the_graphs_are_vllms_own(gpu: GpuSpec, vllm: Any, monkeypatch: Any) -> None:
    mode = importlib.import_module("vllm.config.compilation").CUDAGraphMode
    for seqs, tokens, k in itertools.product(SEQS, TOKENS, K):
        if tokens < seqs:
            continue  # vLLM refuses max_num_batched_tokens < max_num_seqs
        sizes, largest = _sizes(gpu, seqs, tokens, k, monkeypatch)
        assert list(kv.cuda_graph_capture_sizes(kv.PINNED_VERSION, gpu, seqs, tokens, None, k)) == sizes
        where = (seqs, tokens, k)
        v1 = kv.cuda_graph_counts(kv.PINNED_VERSION, gpu, seqs, tokens, None, k, model_runner_v2=False)
        assert v1 == _v1_keys(sizes, largest, seqs, k), where
        target = _v2_descs(sizes, largest, seqs, k, mode.FULL_AND_PIECEWISE, 1 + k)
        v2 = kv.cuda_graph_counts(kv.PINNED_VERSION, gpu, seqs, tokens, None, k, model_runner_v2=True)
        assert v2 == (target.get("PIECEWISE", 0), target.get("FULL", 0)), where
        # the speculator's managers: prefill as the target's, decode FULL at query length 1 for k > 1
        decode = _v2_descs(sizes, largest, seqs, k, mode.FULL_DECODE_ONLY, 1) if k > 1 else {}
        theirs = sum(target.values()) + sum(decode.values())
        ours = memory.drafter_graph_count(
            kv.PINNED_VERSION, gpu, seqs, tokens, num_speculative_tokens=k, model_runner_v2=True
        )
        assert ours == theirs, where
        # the V1 runner: the drafter in each PIECEWISE graph
        assert (
            memory.drafter_graph_count(kv.PINNED_VERSION, gpu, seqs, tokens, num_speculative_tokens=k)
            == v1[0]
        )
