"""vLLM 0.33's own MTP drafter, built on the meta device from a target's config.json, rank by rank.

For ``test_contract_speculative.py``. The drafter is what vLLM builds for ``--speculative-config``:
``SpeculativeConfig`` (``config/speculative.py``) is given the target's ``ModelConfig`` and the user's
method and count, and rewrites the target's ``hf_config`` into the drafter's
(``hf_config_override``); the class is the registry's for that config (``get_model_architecture``),
constructed under a ``VllmConfig`` carrying the speculative config inside ``torch.device("meta")``, as
``load_eagle_model`` (``v1/worker/gpu/spec_decode/eagle/utils.py``) has ``get_model`` build it; a separate
draft model (``draft_model``) under its own model and parallel configs, prefix ``draft_model``, as
``StandaloneARSpeculator.load_draft_model`` builds it. Each
rank runs in a spawned process of a real gloo group (TP 1 and TP 2), like
:func:`.model_classes.build_ranks_on_meta`.

Reported per rank: the drafter's parameter bytes, those of the parameters the proposer swaps for the
target's after load (``embed_tokens``, each ``shared_head.head`` and an MTP drafter's top-level ``lm_head``:
``maybe_share_target_embed`` and ``load_eagle_model``), those of DeepSeek's ``e_score_correction_bias``
(fp32, one per routed expert), the KV specs the drafter's attention layers declare, and, at TP 1, the KV
blocks vLLM's own planner (``get_global_kv_cache_groups`` / ``get_kv_cache_configs``) gives the target's
layers and the drafter's together for a pool of ``available`` bytes, the target's layer specs also taken
from its own class built on the meta device (a hybrid's state layers included, its block aligned by
:func:`_align_hybrid`), with the concurrency ``get_kv_cache_capacity`` reports, the cache config the specs
were read under and each state layer's ``MambaSpec`` (shapes, page, ``num_speculative_blocks``, pages per
request).
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from pathlib import Path
from typing import Any


def _attention_specs(model: Any, vc: Any) -> dict[str, Any]:
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    return {  # by the layer's name in vLLM's forward context (an EAGLE3 layer's index follows the target's)
        getattr(module, "layer_name", name): module.get_kv_cache_spec(vc)
        for name, module in model.named_modules()
        if isinstance(module, AttentionLayerBase)
    }


def _align_hybrid(
    vc: Any,
    config: dict[str, Any],
    target_cls: Any,
    draft_specs: dict[str, Any],
    alignment: int | None = None,
) -> None:
    """``Platform._align_hybrid_block_size`` as a CUDA start runs it (vLLM's CPU platform does not): the
    attention block raised until one page holds a state, the state page padded to it, from the state
    shapes the target's class declares under this ``VllmConfig`` (its speculative tokens included) and
    the drafter's one-token attention page (Triton GDN: no prefill checkpoints, as on a GPU kvpilot is
    given no compute capability for; ``alignment``: FlashInfer GDN's prefill-checkpoint grid, which the
    block is also a multiple of). The copy of the formula is :func:`kv_points.align_hybrid_block_size`.

    The SSM state's dtype is first put back to what a CUDA start keeps (the model's config hooks,
    :func:`kv_points._ssm_dtype`): vLLM's CPU platform resets it to float32 for its accelerated GDN
    kernel (``platforms/cpu.py:319``-``:338``), a CPU-only rule."""
    import kv_points
    from vllm.v1.kv_cache_interface import MambaSpec

    cache = vc.cache_config
    text = kv_points._text(config)
    cache.mamba_ssm_cache_dtype = kv_points._ssm_dtype(text, str(text.get("model_type")))
    page = MambaSpec(
        shapes=target_cls.get_mamba_state_shape_from_config(vc),
        dtypes=target_cls.get_mamba_state_dtype_from_config(vc),
        block_size=-1,
    ).page_size_bytes
    attention = next(iter(draft_specs.values()))
    one = type(attention)(
        block_size=1,
        num_kv_heads=attention.num_kv_heads,
        head_size=attention.head_size,
        dtype=attention.dtype,
    )
    block, padded = kv_points.align_hybrid_block_size(cache.block_size, False, alignment, page, one)
    cache.block_size = block
    cache.mamba_block_size = block  # align mode (prefix caching on): the state block is the attention's
    cache.mamba_page_size_padded = None if padded == page else padded


def _plan_with_checkpoints(
    vc: Any, config: dict[str, Any], target_cls: Any, target: Any, draft: Any, available: int
) -> dict[str, Any]:  # pragma: no cover - runs in a spawned process
    """The same plan on a GPU whose GDN prefill is FlashInfer's (Hopper): the block also a multiple of
    its 64-token checkpoint grid and each state layer's spec given one prefill-checkpoint page, as
    ``QwenGatedDeltaNetAttention.get_kv_cache_spec`` (``qwen_gdn_linear_attn.py:739``-``:750``) gives it
    there (vLLM's CPU platform picks no FlashInfer kernel); ``num_speculative_blocks`` stays vLLM's own."""
    import dataclasses

    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core import kv_cache_utils as kv_utils
    from vllm.v1.kv_cache_interface import MambaSpec

    cache = vc.cache_config
    cache.block_size = 16
    draft_specs = _attention_specs(draft, vc)
    _align_hybrid(vc, config, target_cls, draft_specs, FLASHINFER_GDN_CHECKPOINT_ALIGNMENT)
    specs = {**_attention_specs(target, vc), **_attention_specs(draft, vc)}
    workers = [
        {
            name: dataclasses.replace(
                s, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=cache.mamba_block_size
            )
            if isinstance(s, MambaSpec)
            else s
            for name, s in specs.items()
        }
    ]
    groups = planning.get_global_kv_cache_groups(vc, workers)
    configs = planning.get_kv_cache_configs(vc, workers, [available], groups)
    _, concurrency = kv_utils.get_kv_cache_capacity(vc, kv_utils.generate_scheduler_kv_cache_config(configs))
    pages = {
        int(s.max_memory_usage_bytes(vc) // s.page_size_bytes)
        for s in workers[0].values()
        if isinstance(s, MambaSpec)
    }
    return {
        "block_size": int(cache.block_size),
        "num_blocks": int(configs[0].num_blocks),
        "concurrency": float(concurrency),
        "state_pages": sorted(pages),
    }


def _build_rank(
    rank: int,
    tp: int,
    config: dict[str, Any],
    spec: dict[str, Any],
    available: int,
    init: str,
    results: Any,
    draft: dict[str, Any] | None = None,
) -> None:  # pragma: no cover - runs in a spawned process
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
    from vllm.config.speculative import SpeculativeConfig
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core import kv_cache_utils as kv_utils

    try:
        folder = Path(tempfile.mkdtemp())
        (folder / "config.json").write_text(json.dumps(config))
        mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096, enforce_eager=True)
        if draft is not None:  # a draft checkpoint (EAGLE3): its config.json in a folder of its own
            draft_folder = Path(tempfile.mkdtemp())
            (draft_folder / "config.json").write_text(json.dumps(draft))
            spec = {**spec, "model": str(draft_folder)}
        pc = ParallelConfig(tensor_parallel_size=tp)
        sc = SpeculativeConfig(**spec, target_model_config=mc, target_parallel_config=pc)
        vc = VllmConfig(
            model_config=mc,
            speculative_config=sc,
            cache_config=CacheConfig(block_size=16),
            device_config=DeviceConfig("cpu"),
            load_config=LoadConfig(load_format="dummy"),
            parallel_config=pc,
        )
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=tp, rank=rank, distributed_init_method=init, local_rank=rank, backend="gloo"
            )
            initialize_model_parallel(tp, 1)
        # vLLM keeps a drafter's top-level lm_head when the drafter's checkpoint holds one and it differs
        # from the target's (``_should_share``, v1/worker/gpu/spec_decode/eagle/utils.py:18). A draft
        # checkpoint of its own holds one over its draft vocabulary (llama_eagle3.py:329); an MTP drafter's
        # weights sit in the target's checkpoint, whose lm_head is the target's, so it is shared
        own_checkpoint = draft is not None
        draft_config = sc.draft_model_config
        cls, architecture = get_model_architecture(draft_config)
        draft_vc, prefix = vc, ""
        if sc.method == "draft_model":  # a whole model of its own: load_draft_model builds it under the
            # draft's model and parallel configs, prefix draft_model (standalone_ar/speculator.py:112-130)
            from vllm.config import replace

            draft_vc = replace(
                vc,
                model_config=draft_config,
                quant_config=None,
                parallel_config=replace(sc.draft_parallel_config, rank=rank),
            )
            prefix = "draft_model"
        with set_current_vllm_config(draft_vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
            draft = cls(vllm_config=draft_vc, prefix=prefix)
        params = dict(draft.named_parameters())

        def size(names: list[str]) -> int:
            return sum(params[n].numel() * params[n].element_size() for n in names)

        shared = [
            n
            for n in params
            if n.endswith("embed_tokens.weight")
            or ".shared_head.head." in n
            or (n.startswith("lm_head.") and not own_checkpoint)
        ]
        bias = [n for n in params if n.endswith("e_score_correction_bias")]
        draft_specs = _attention_specs(draft, vc)
        cache = vc.cache_config
        found: dict[str, Any] = {
            "architecture": architecture,
            "method": sc.method,
            "num_speculative_tokens": sc.num_speculative_tokens,
            "n_predict": getattr(draft_config.hf_config, "n_predict", None),
            "param_bytes": size(list(params)),
            "shared_bytes": size(shared),
            "bias_bytes": size(bias),
            "kv": [
                (type(s).__name__, int(s.num_kv_heads), int(s.head_size), int(getattr(s, "head_size_v", 0)))
                for s in draft_specs.values()
            ],
        }
        if tp == 1:
            target_cls, _ = get_model_architecture(mc)
            with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
                target = target_cls(vllm_config=vc, prefix="")
            vc.cache_config.kv_cache_layout = "LBNHC"  # what the engine core resolves (kv_points does too)
            if hasattr(target_cls, "get_mamba_state_shape_from_config"):
                _align_hybrid(vc, config, target_cls, draft_specs)
                draft_specs = _attention_specs(draft, vc)  # read again: the block the alignment chose
            workers = [{**_attention_specs(target, vc), **draft_specs}]
            groups = planning.get_global_kv_cache_groups(vc, workers)
            configs = planning.get_kv_cache_configs(vc, workers, [available], groups)
            found["num_blocks"] = int(configs[0].num_blocks)
            found["kv_layers"] = len(workers[0])
            scheduler = kv_utils.generate_scheduler_kv_cache_config(configs)
            tokens, concurrency = kv_utils.get_kv_cache_capacity(vc, scheduler)
            found["capacity"] = (int(tokens), float(concurrency))
            found["cache"] = {
                "block_size": cache.block_size,
                "mamba_block_size": cache.mamba_block_size,
                "mamba_cache_mode": cache.mamba_cache_mode,
                "mamba_page_size_padded": cache.mamba_page_size_padded,
                "enable_prefix_caching": bool(cache.enable_prefix_caching),
                "max_model_len": mc.max_model_len,
            }
            found["states"] = [  # the target's state layers (MambaSpec), as vLLM declares them
                (
                    [list(shape) for shape in s.shapes],
                    int(s.real_page_size_bytes),
                    int(s.page_size_bytes),
                    int(s.num_speculative_blocks),
                    int(s.num_prefill_checkpoint_blocks),
                    int(s.max_memory_usage_bytes(vc) // s.page_size_bytes),
                )
                for s in workers[0].values()
                if type(s).__name__ == "MambaSpec"
            ]
            if hasattr(target_cls, "get_mamba_state_shape_from_config"):
                found["flashinfer"] = _plan_with_checkpoints(vc, config, target_cls, target, draft, available)
        try:  # the same method without a count (the draft's folder kept: a draft model needs it)
            kept = {"model": spec["model"]} if spec["method"] == "draft_model" else {}
            SpeculativeConfig(
                method=spec["method"], **kept, target_model_config=mc, target_parallel_config=pc
            )
            found["refused_without_count"] = ""
        except ValueError as exc:
            found["refused_without_count"] = str(exc)
        results.put((rank, found))
    except Exception as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def build_drafter_ranks(
    config: dict[str, Any], spec: dict[str, Any], tp: int, available: int, draft: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """What :func:`_build_rank` reports for every TP rank of the drafter of ``config`` under ``spec`` (the
    ``--speculative-config`` object); ``draft``: a draft checkpoint's config.json (EAGLE3, a draft model),
    given to vLLM as the ``model`` of ``spec``."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init = f"file://{tempfile.mktemp()}"
    workers = [
        ctx.Process(target=_build_rank, args=(rank, tp, config, spec, available, init, results, draft))
        for rank in range(tp)
    ]
    for worker in workers:
        worker.start()
    found = dict(results.get(timeout=900) for _ in workers)
    for worker in workers:
        worker.join()
    failed = {rank: v for rank, v in found.items() if isinstance(v, str)}
    assert not failed, f"vLLM could not build the drafter: {failed}"
    return [found[rank] for rank in range(tp)]
