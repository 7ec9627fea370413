"""Contract: the 0.33 budget's terms agree with vLLM 0.33's own code, run on CPU.

Each term of :mod:`kvpilot.tuner.vllm.runner` and :mod:`kvpilot.tuner.vllm.versions` that the
budget uses is computed here by the pinned wheel's own classes and functions, with only the
platform queries replaced (the CPU platform has no device memory, name or UVA):

* Model Runner V2's persistent sampler state: ``PenaltiesState`` and ``StructuredOutputsWorker``
  built on CPU, their tensors' bytes summed;
* the batch defaults: ``EngineArgs.get_batch_defaults`` and
  ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` with a GPU's memory, name and
  compute capability (H100, A100, B200, GB10; ``--performance-mode``);
* the CUDA-graph capture sizes: ``VllmConfig._set_cudagraph_sizes``;
* the in-flight batches of a sliding-window reservation: ``VllmConfig.max_concurrent_batches``.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvpilot.tuner import gpus
from kvpilot.tuner import vllm as kv
from kvpilot.tuner.types import GIB, GpuSpec

pytestmark = pytest.mark.contract

GB10 = GpuSpec(name="GB10", total_bytes=int(119.7 * GIB), compute_capability=(12, 1), fp8_kv=True)
GPUS = [gpus.lookup_gpu(name) for name in ("H100-SXM", "A100-80GB", "B200", "L4")] + [GB10]


class _HostOnly:
    """Stands in for ``UvaBackedTensor`` (pinned host memory, no GPU bytes): CPU has no UVA."""

    def __init__(self, size: int, dtype: Any = None) -> None:
        self.np = np.zeros(size)

    def copy_to_uva(self) -> None:
        return None


def _tensor_bytes(obj: object, torch: Any) -> int:
    return sum(v.nbytes for v in vars(obj).values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize(
    ("seqs", "vocab"), [(1, 32000), (7, 1000), (256, 128256), (1024, 262144), (56, 151936)]
)
def test_sampler_state_is_v2s_own_buffers(seqs: int, vocab: int, vllm: Any, monkeypatch: Any) -> None:
    torch = importlib.import_module("torch")
    penalties = importlib.import_module("vllm.v1.worker.gpu.sample.penalties")
    structured = importlib.import_module("vllm.v1.worker.gpu.structured_outputs")
    monkeypatch.setattr(penalties, "UvaBackedTensor", _HostOnly)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: None)
    cpu = torch.device("cpu")
    state = penalties.PenaltiesState(None, SimpleNamespace(device=cpu, max_num_reqs=seqs, vocab_size=vocab))
    worker = structured.StructuredOutputsWorker(seqs, vocab, cpu, 1)
    expected = _tensor_bytes(state, torch) + _tensor_bytes(worker, torch)
    assert kv.compute_sampler_state_bytes(seqs, vocab) == expected


def _patch_platform(monkeypatch: Any, gpu: GpuSpec) -> None:
    platform = importlib.import_module("vllm.platforms").current_platform
    memory = gpu.nvml_total_bytes or gpu.total_bytes
    monkeypatch.setattr(platform, "get_device_total_memory", lambda *a, **k: memory)
    monkeypatch.setattr(platform, "get_device_name", lambda *a, **k: f"NVIDIA {gpu.name}")
    monkeypatch.setattr(
        platform, "is_device_capability", lambda cap, *a, **k: tuple(cap) == gpu.compute_capability
    )
    monkeypatch.setattr(
        platform, "is_device_capability_family", lambda cap, *a, **k: cap == gpu.compute_capability[0] * 10
    )
    monkeypatch.setattr(platform, "is_cpu", lambda *a, **k: False)
    monkeypatch.setattr(platform, "is_tpu", lambda *a, **k: False)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_batch_tiers_are_get_batch_defaults(gpu: GpuSpec, engine_args_cls: Any, monkeypatch: Any) -> None:
    usage = importlib.import_module("vllm.usage.usage_lib").UsageContext
    _patch_platform(monkeypatch, gpu)
    tokens, seqs = engine_args_cls.get_batch_defaults(1)
    ours = kv.default_batch_limits(kv.PINNED_VERSION, gpu)
    assert (ours.max_num_batched_tokens, ours.max_num_seqs) == (
        tokens[usage.OPENAI_API_SERVER],
        seqs[usage.OPENAI_API_SERVER],
    )


@pytest.mark.parametrize(
    ("gpu", "mode", "length", "tokens", "seqs"),
    list(itertools.product(GPUS, ("balanced", "throughput"), (4, 512, 32768), (None, 4096), (None, 64))),
    ids=str,
)
def test_resolved_batch_limits_are_vllms(
    gpu: GpuSpec,
    mode: str,
    length: int,
    tokens: int | None,
    seqs: int | None,
    engine_args_cls: Any,
    monkeypatch: Any,
) -> None:
    usage = importlib.import_module("vllm.usage.usage_lib").UsageContext
    _patch_platform(monkeypatch, gpu)
    args = SimpleNamespace(
        pipeline_parallel_size=1,
        tensor_parallel_size=1,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        performance_mode=mode,
        enable_chunked_prefill=True,
        get_batch_defaults=engine_args_cls.get_batch_defaults,
    )
    model_config = SimpleNamespace(max_model_len=length, is_multimodal_model=False, is_mm_prefix_lm=False)
    parallel = SimpleNamespace(use_batched_dp_moe=False)
    engine_args_cls._set_default_max_num_seqs_and_batched_tokens_args(
        args, usage.OPENAI_API_SERVER, model_config, parallel
    )
    ours = kv.resolve_batch_limits(kv.PINNED_VERSION, gpu, length, tokens, seqs, mode)
    assert (ours.max_num_batched_tokens, ours.max_num_seqs) == (
        args.max_num_batched_tokens,
        args.max_num_seqs,
    )


SEQS = (1, 3, 8, 56, 100, 255, 256, 300, 512, 1024)
TOKENS = (2, 64, 100, 2048, 8192)


@pytest.mark.parametrize("mode", ("balanced", "interactivity"))
@pytest.mark.parametrize("gpu", [gpus.lookup_gpu("H100-SXM"), gpus.lookup_gpu("B200")], ids=lambda g: g.name)
def test_capture_sizes_are_set_cudagraph_sizes(gpu: GpuSpec, mode: str, vllm: Any, monkeypatch: Any) -> None:
    config = importlib.import_module("vllm.config")
    compilation = importlib.import_module("vllm.config.compilation")
    _patch_platform(monkeypatch, gpu)
    for seqs, tokens in itertools.product(SEQS, TOKENS):
        if tokens < seqs:
            continue  # vLLM refuses max_num_batched_tokens < max_num_seqs
        fake = SimpleNamespace(
            model_config=SimpleNamespace(enforce_eager=False),
            compilation_config=SimpleNamespace(
                cudagraph_mode=compilation.CUDAGraphMode.FULL_AND_PIECEWISE,
                max_cudagraph_capture_size=None,
                cudagraph_capture_sizes=None,
                post_init_cudagraph_sizes=lambda: None,
            ),
            uniform_decode_query_len=1,
            scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
            performance_mode=mode,
            speculative_config=None,
        )
        config.VllmConfig._set_cudagraph_sizes(fake)
        theirs = tuple(fake.compilation_config.cudagraph_capture_sizes)
        ours = kv.cuda_graph_capture_sizes(kv.PINNED_VERSION, gpu, seqs, tokens, mode)
        assert ours == theirs, (seqs, tokens)


@pytest.mark.parametrize(
    ("pp", "v2", "async_"), list(itertools.product((1, 2, 4), (True, False), (True, False)))
)
def test_in_flight_batches_are_max_concurrent_batches(pp: int, v2: bool, async_: bool, vllm: Any) -> None:
    config = importlib.import_module("vllm.config")
    fake = SimpleNamespace(
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        scheduler_config=SimpleNamespace(async_scheduling=async_),
        use_v2_model_runner=v2,
    )
    theirs = config.VllmConfig.max_concurrent_batches.fget(fake)
    if async_:  # kvpilot models the default, async scheduling on (0.30+)
        assert kv.in_flight_batches(kv.PINNED_VERSION, pp, v2) == theirs
    else:
        assert theirs == pp


def test_v2_is_the_pinned_default(vllm: Any, monkeypatch: Any) -> None:
    """``VllmConfig.use_v2_model_runner`` with the env unset and no V2-unsupported feature."""
    config = importlib.import_module("vllm.config")
    envs = importlib.import_module("vllm.envs")
    vllm_config_module = importlib.import_module("vllm.config.vllm")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    fake = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=None),
        watermark_config=None,
        _get_v2_model_runner_unsupported_features=lambda: [],
    )
    assert envs.VLLM_USE_V2_MODEL_RUNNER is None
    assert config.VllmConfig.use_v2_model_runner.fget(fake) is True
    assert kv.uses_model_runner_v2(kv.PINNED_VERSION) is True
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert config.VllmConfig.use_v2_model_runner.fget(fake) is False
    assert kv.uses_model_runner_v2(kv.PINNED_VERSION, override=False) is False


def test_grid_covers_the_tiers() -> None:
    tiers = {dataclasses.astuple(kv.default_batch_limits(kv.PINNED_VERSION, g)) for g in GPUS}
    assert len(tiers) == 3  # 16384/1024, 8192/1024, 2048/256


MM_PREFIX_MODELS = ("google/gemma-4-26B-A4B",)


@pytest.mark.parametrize("model_id", MM_PREFIX_MODELS)
@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_the_multimodal_prefix_lm_batch_floor_is_vllms(
    model_id: str, gpu: GpuSpec, engine_args_cls: Any, catalogue_model_config: Any, monkeypatch: Any
) -> None:
    """Gemma 4 with bidirectional vision attention: vLLM's own ``ModelConfig`` says it is a multimodal prefix
    LM, ``Gemma4ProcessingInfo.get_mm_max_tokens_per_item`` (run on the real hf_config, without its
    processor: no per-request kwargs, no audio tower) gives the item kvpilot reads, and
    ``_set_default_max_num_seqs_and_batched_tokens_args`` raises the default batch to it, as kvpilot does."""
    from kvpilot.tuner.model import build_model_spec
    from kvpilot.tuner.model import catalogue as models

    gemma4 = importlib.import_module("vllm.model_executor.models.gemma4_mm")
    usage = importlib.import_module("vllm.usage.usage_lib").UsageContext
    vllm_model = catalogue_model_config(model_id)
    assert vllm_model.is_multimodal_model and vllm_model.is_mm_prefix_lm
    info = SimpleNamespace(
        get_hf_config=lambda: vllm_model.hf_config,
        has_audio=lambda: vllm_model.hf_config.audio_config is not None,
        ctx=SimpleNamespace(
            get_merged_mm_kwargs=lambda _: {},
            model_config=SimpleNamespace(get_multimodal_config=lambda: SimpleNamespace(limit_per_prompt={})),
        ),
    )
    per_item = gemma4.Gemma4ProcessingInfo.get_mm_max_tokens_per_item(info, 32768, {"image": 1, "video": 1})
    spec = build_model_spec(models.lookup_model_config(model_id))
    assert spec.mm_prefix_item_tokens == max(per_item.values())
    modality = max(per_item, key=per_item.__getitem__)
    _patch_platform(monkeypatch, gpu)
    for length, tokens in itertools.product((4, 512, 32768), (None, 1024)):
        args = SimpleNamespace(
            pipeline_parallel_size=1,
            tensor_parallel_size=1,
            max_num_batched_tokens=tokens,
            max_num_seqs=None,
            performance_mode="balanced",
            enable_chunked_prefill=True,
            get_batch_defaults=engine_args_cls.get_batch_defaults,
            _get_min_mm_batched_tokens=lambda _: (per_item[modality], modality),
        )
        model_config = SimpleNamespace(
            max_model_len=length, is_multimodal_model=True, is_mm_prefix_lm=True, model=model_id
        )
        parallel = SimpleNamespace(use_batched_dp_moe=False)
        engine_args_cls._set_default_max_num_seqs_and_batched_tokens_args(
            args, usage.OPENAI_API_SERVER, model_config, parallel
        )
        ours = kv.resolve_batch_limits(
            kv.PINNED_VERSION, gpu, length, tokens, None, "balanced", spec.mm_prefix_item_tokens
        )
        assert (ours.max_num_batched_tokens, ours.max_num_seqs) == (
            args.max_num_batched_tokens,
            args.max_num_seqs,
        ), (length, tokens)
