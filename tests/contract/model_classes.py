"""vLLM 0.33's own model classes, built on the meta device from a published config.json.

The contract of ``test_contract_model_classes.py`` compares kvpilot's reading of a config
(:func:`kvpilot.tuner.model.build_model_spec`, :func:`kvpilot.tuner.memory.weights.compute_weight_breakdown`)
with what vLLM itself builds from it, not with a structure derived from kvpilot's reading: the
architecture's class from vLLM's registry (``get_model_architecture``), constructed under the
config's ``VllmConfig`` inside ``torch.device("meta")`` (no weights, no memory), on the CPU platform,
in a single-rank process group (TP 1, PP 1). Each layer's KV spec is the one the layer itself
declares (``AttentionLayerBase.get_kv_cache_spec``: attention, MLA, Mamba and linear-attention
layers), each parameter's bytes are ``numel x element_size`` of the built parameters (tied ones
once).

The per-rank weights at TP 2 or PP 2 (:func:`build_ranks_on_meta`) come from two spawned processes
joined by a real two-rank gloo group: each parallel layer shards itself as vLLM's
``ColumnParallelLinear``, ``RowParallelLinear``, ``QKVParallelLinear``, ``VocabParallelEmbedding`` and
``FusedMoE`` do, and ``make_layers`` splits the pipeline as vLLM does.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot.tuner.model import CHUNKED, FULL, LINEAR, MLA, SLIDING

_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")
SPEC_KIND = {
    "FullAttentionSpec": FULL,
    "SlidingWindowSpec": SLIDING,
    "MLAAttentionSpec": MLA,
    "MambaSpec": LINEAR,
    "ChunkedLocalAttentionSpec": CHUNKED,
}
"""vLLM's KV spec class -> kvpilot's layer kind."""


@dataclass(frozen=True)
class LayerKv:
    """One layer's KV spec in kvpilot's terms (kind, KV heads, K and V head sizes, window)."""

    kind: str
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    window: int | None


@dataclass(frozen=True)
class Built:
    architecture: str
    param_bytes: int
    layers: dict[int, list[LayerKv]]
    """Decoder layer index -> the KV specs its modules declare (in module order)."""


def init_single_rank(vllm_config_cls: Any, device_config_cls: Any) -> None:
    """A one-process gloo group with TP 1 / PP 1 / EP (a config without a model creates every group)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(vllm_config_cls(device_config=device_config_cls("cpu"))):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"file://{tempfile.mktemp()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)


def _layer_kv(spec: Any) -> LayerKv:
    kind = SPEC_KIND[type(spec).__name__]
    if kind == LINEAR:
        return LayerKv(LINEAR, 0, 0, 0, None)
    window = (
        getattr(spec, "attention_chunk_size", None)
        if kind == CHUNKED
        else getattr(spec, "sliding_window", None)
    )
    v = 0 if kind == MLA else int(spec.head_size_v)
    return LayerKv(kind, int(spec.num_kv_heads), int(spec.head_size), v, window)


def build_on_meta(config: dict[str, Any]) -> Built:
    """vLLM's model class for ``config``, built on the meta device: its parameter bytes and KV specs."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(config))
    mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096, enforce_eager=True)
    # EngineArgs.create_engine_config (engine/arg_utils.py): a model-level sliding window only when every
    # layer slides (no layer_types, or all "sliding_attention"); it reaches each Attention through
    # cache_config.sliding_window.
    layer_types = getattr(mc.hf_text_config, "layer_types", None)
    all_sliding = layer_types is None or all(t == "sliding_attention" for t in layer_types)
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(
            block_size=16, sliding_window=mc.get_sliding_window() if all_sliding else None
        ),
        device_config=DeviceConfig("cpu"),
        load_config=LoadConfig(load_format="dummy"),
    )
    cls, architecture = get_model_architecture(mc)
    with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
        model = cls(vllm_config=vc, prefix="")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    layers: dict[int, list[LayerKv]] = {}
    for name, module in model.named_modules():
        if isinstance(module, AttentionLayerBase) and not getattr(
            module, "kv_sharing_target_layer_name", None
        ):
            # (a layer that reads an earlier layer's cache holds no pages of its own: no KV here)
            found = _LAYER_INDEX.search(name)
            assert found is not None, f"{architecture}: KV layer {name} outside a decoder layer"
            layers.setdefault(int(found.group(1)), []).append(_layer_kv(module.get_kv_cache_spec(vc)))
    return Built(architecture, int(params), layers)


def _rank_param_bytes(
    rank: int, tp: int, pp: int, config: dict[str, Any], init: str, results: Any
) -> None:  # pragma: no cover - runs in a spawned process
    """One rank of a TP x PP group: build ``config``'s class on the meta device and report its bytes."""
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
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    try:
        folder = Path(tempfile.mkdtemp())
        (folder / "config.json").write_text(json.dumps(config))
        mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096, enforce_eager=True)
        vc = VllmConfig(
            model_config=mc,
            cache_config=CacheConfig(block_size=16),
            device_config=DeviceConfig("cpu"),
            load_config=LoadConfig(load_format="dummy"),
            parallel_config=ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp),
        )
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=tp * pp, rank=rank, distributed_init_method=init, local_rank=rank, backend="gloo"
            )
            initialize_model_parallel(tp, pp)
        cls, _ = get_model_architecture(mc)
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
            model = cls(vllm_config=vc, prefix="")
        results.put((rank, sum(p.numel() * p.element_size() for p in model.parameters())))
    except Exception as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def build_ranks_on_meta(config: dict[str, Any], tp: int, pp: int) -> list[int]:
    """Parameter bytes of every rank (rank = pp_rank x tp + tp_rank) of vLLM's class for ``config`` at
    ``tp`` x ``pp``, each rank built in its own spawned process of a real gloo group."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init = f"file://{tempfile.mktemp()}"
    workers = [
        ctx.Process(target=_rank_param_bytes, args=(rank, tp, pp, config, init, results))
        for rank in range(tp * pp)
    ]
    for worker in workers:
        worker.start()
    found = dict(results.get(timeout=900) for _ in workers)
    for worker in workers:
        worker.join()
    failed = {rank: v for rank, v in found.items() if isinstance(v, str)}
    assert not failed, f"vLLM could not build the ranks: {failed}"
    return [int(found[rank]) for rank in range(tp * pp)]
