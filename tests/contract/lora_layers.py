"""vLLM 0.33's own LoRA buffers, allocated on the meta device for a model built from a config.json.

The model is vLLM's class built as :mod:`.model_classes` builds it (``torch.device("meta")``, the CPU
platform, a gloo group); then vLLM's ``LoRAModelManager`` wraps it exactly as ``load_lora_model`` does at
start-up (``lora/model_manager.py:476``, ``_create_lora_modules``), each wrapper's ``create_lora_weights``
placing its stacked A/B buffers on the device of the layer it wraps: the meta device, so nothing is
allocated. The bytes are ``numel x element_size`` of every tensor the wrappers hold (views, such as the
MoE wrapper's per-expert lists, once through their base).

Two parts cannot be built on the CPU platform and are taken from vLLM's own shape code instead:

* ``FusedMoEWithLoRA.__init__`` refuses the CPU MoE kernel ("Old-style modular kernel not supported",
  ``lora/layers/fused_moe.py:76``): the experts are skipped while the manager wraps the rest, and their
  buffers come from calling ``FusedMoEWithLoRA._create_lora_a_weights`` / ``_create_lora_b_weights`` on an
  object holding the experts' geometry;
* the CPU platform's Punica wrapper has no ``LoRAKernelMeta``: the GPU wrapper's two are
  ``LoRAKernelMeta.make`` called on the meta device (``punica_gpu.py:57``).
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _tensor_bytes(values: Any, seen: set[int]) -> int:
    """Bytes of the tensors among ``values`` (tuples and lists looked into), bases only, each once."""
    import torch

    total = 0
    for value in values:
        items = value if isinstance(value, (tuple, list)) else (value,)
        for t in items:
            if isinstance(t, torch.Tensor) and t._base is None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _experts_bytes(model: Any, lora_config: Any, tp: int) -> int:
    """The routed experts' LoRA buffers, by ``FusedMoEWithLoRA``'s own shape code on the meta device."""
    import torch
    from vllm.lora.layers import FusedMoEWithLoRA
    from vllm.model_executor.layers.fused_moe import MoERunner

    total, seen, kept = 0, set[int](), []  # kept alive: ``seen`` holds ids
    for module in model.modules():
        if not isinstance(module, MoERunner):
            continue
        config = module.moe_config
        stub = SimpleNamespace(
            hidden_size=config.hidden_dim,
            local_num_experts=config.num_local_experts,
            intermediate_size_per_partition=config.intermediate_size_per_partition,
            _w13_slices=2 if config.is_act_and_mul else 1,
            _w13_a_num_experts=config.num_local_experts,
            _w2_b_num_experts=config.num_local_experts,
            fully_sharded=lora_config.fully_sharded_loras,
            tp_size=tp,
            device=torch.device("meta"),
        )
        FusedMoEWithLoRA._create_lora_a_weights(stub, lora_config.max_loras, lora_config)
        FusedMoEWithLoRA._create_lora_b_weights(stub, lora_config.max_loras, lora_config)
        adapter_enabled = torch.zeros(lora_config.max_loras + 1, dtype=torch.int, device="meta")
        total += _tensor_bytes([*vars(stub).values(), adapter_enabled], seen)
        kept.append((stub, adapter_enabled))
    return total


def _punica_bytes(manager: Any, max_loras: int, max_num_batched_tokens: int) -> int:
    """The language model's Punica wrapper as the GPU builds it: the base buffers, two kernel metas."""
    import torch
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    wrapper = next(iter(manager.punica_wrapper_mapping.values()))
    meta = LoRAKernelMeta.make(max_loras, max_num_batched_tokens, device=torch.device("meta"))
    device_meta = [t for t in vars(meta).values() if isinstance(t, torch.Tensor) and t.device.type == "meta"]
    return _tensor_bytes(vars(wrapper).values(), set()) + 2 * _tensor_bytes(device_meta, set())


def lora_bytes(
    config: dict[str, Any], lora: dict[str, Any], tp: int, max_num_seqs: int, max_num_batched_tokens: int
) -> dict[str, int]:
    """vLLM's LoRA buffers on this rank for ``config`` under ``lora`` (``LoRAConfig`` fields): the
    wrapped modules, the routed experts and the Punica wrapper, in bytes. Needs the process group set up."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers import FusedMoEWithLoRA
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(config))
    mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096, enforce_eager=True)
    lora_config = LoRAConfig(**lora)
    lora_config.verify_with_model_config(mc)
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=16),
        device_config=DeviceConfig("cpu"),
        load_config=LoadConfig(load_format="dummy"),
        parallel_config=ParallelConfig(tensor_parallel_size=tp),
        lora_config=lora_config,
    )
    cls, _ = get_model_architecture(mc)
    original = FusedMoEWithLoRA.can_replace_layer
    FusedMoEWithLoRA.can_replace_layer = classmethod(lambda *_a, **_k: False)  # type: ignore[assignment]
    try:
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
            model = cls(vllm_config=vc, prefix="")
            manager = LoRAModelManager(
                model,
                max_num_seqs,
                max_num_batched_tokens,
                config["vocab_size"],
                lora_config,
                torch.device("meta"),
                vc,
            )
    finally:
        FusedMoEWithLoRA.can_replace_layer = original  # type: ignore[method-assign]
    seen: set[int] = set()
    modules = {name: _tensor_bytes(vars(m).values(), seen) for name, m in manager.modules.items()}
    return {
        "modules": sum(modules.values()),
        "vocab": sum(b for name, b in modules.items() if "embed_tokens" in name or "lm_head" in name),
        "experts": _experts_bytes(model, lora_config, tp),
        "punica": _punica_bytes(manager, lora_config.max_loras, max_num_batched_tokens),
    }


def _rank(rank: int, tp: int, init: str, jobs: list[Any], results: Any) -> None:  # pragma: no cover
    """One rank of a TP group (a spawned process): each job's :func:`lora_bytes`."""
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    try:
        vc = VllmConfig(
            device_config=DeviceConfig("cpu"), parallel_config=ParallelConfig(tensor_parallel_size=tp)
        )
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=tp, rank=rank, distributed_init_method=init, local_rank=rank, backend="gloo"
            )
            initialize_model_parallel(tp, 1)
        results.put((rank, [lora_bytes(*job, tp, 256, 8192) for job in jobs]))
    except Exception as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def lora_bytes_at_tp(jobs: list[tuple[dict[str, Any], dict[str, Any]]], tp: int) -> list[dict[str, int]]:
    """Rank 0's :func:`lora_bytes` of each ``(config, lora)`` job at ``tp`` (256 sequences, 8192 tokens),
    every rank a spawned process of a real gloo group."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init = f"file://{tempfile.mktemp()}"
    workers = [ctx.Process(target=_rank, args=(rank, tp, init, jobs, results)) for rank in range(tp)]
    for worker in workers:
        worker.start()
    found = dict(results.get(timeout=900) for _ in workers)
    for worker in workers:
        worker.join()
    failed = {rank: v for rank, v in found.items() if isinstance(v, str)}
    assert not failed, f"vLLM could not build the LoRA layers: {failed}"
    return list(found[0])
