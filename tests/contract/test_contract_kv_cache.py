"""Contract: kvpilot's KV-cache arithmetic is vLLM 0.33's own, integer for integer.

For every catalogue model and every config in tests/data/hf_configs/ that kvpilot sizes, a deterministic
sample of points over TP 1/2/4/8, PP 1/2/4, block 16/64, KV dtype ``auto``/``fp8``/per-token-head, four
available sizes, three lengths and two GPUs (H100: FlashInfer GDN; A100: Triton GDN) is run through both
sides (``kv_points``): ``num_gpu_blocks``, logged KV tokens, max concurrency, the start verdict and the
estimated maximum length of vLLM's error must be equal. A point vLLM itself cannot build (a TP that does
not divide a state's heads) is counted as such, never skipped silently; so is a point whose only
difference is the number of batches in flight at PP > 1 (``vllm.in_flight_batches``: Model Runner V2's
``PP + 1``, owned by the budget's half of issue 11), which the test recomputes with vLLM's in-flight to
prove the KV arithmetic itself exact there.
"""

from __future__ import annotations

import copy
import itertools
import json
import pathlib
import random
import types
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kv_points as kp
import pytest

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.model import MLA, build_model_spec
from kvpilot.tuner.model import catalogue as models
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
POINTS_PER_ENTRY = 40
TPS, PPS, BLOCKS = (1, 2, 4, 8), (1, 2, 4), (16, 64)
AVAILABLE = (1 * GIB + 12_345, 4 * GIB + 777, 20 * GIB + 3, 40 * GIB + 98_765)
CAPABILITIES = ((9, 0), (8, 0))
DTYPES = ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
EMPTY_STAGE = (
    "a PP stage with no KV layer at all (Gemma 4 E2B/E4B: its last layers share earlier layers' KV): "
    "vLLM's validate_kv_cache_layout raises on the empty stage's groups, so there is no count to compare"
)
MLA_DTYPES = ("auto", "fp8")
"""vLLM's MLA backends take no per-token-head dtype (Triton-only), so MLA models are not tried with one."""


def _entries() -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    sources = [(entry_id, models.lookup_model_config(entry_id)) for entry_id, _ in models.list_models()]
    sources += [(path.stem, json.loads(path.read_text())) for path in sorted(HF_CONFIGS.glob("*.json"))]
    for name, config in sources:
        key = json.dumps(config, sort_keys=True)
        if key in seen:
            continue
        try:
            build_model_spec(copy.deepcopy(config))
        except errors.InvalidModelConfig:
            continue  # refused with a reason: tests/test_published_configs.py holds those
        seen.add(key)
        found.append((name, config))
    return found


def _points(name: str, mla: bool, default_len: int) -> list[kp.Point]:
    rng = random.Random(name)
    lengths = sorted({4096, 32768, default_len})
    dtypes = MLA_DTYPES if mla else DTYPES
    grid = [
        kp.Point(tp, pp, block, dtype, length, available, capability)
        for tp in TPS
        for pp in PPS
        for block in BLOCKS
        for dtype in dtypes
        for length in lengths
        for available in AVAILABLE
        for capability in CAPABILITIES
    ]
    return rng.sample(grid, POINTS_PER_ENTRY)


@pytest.fixture(scope="module")
def wheel(vllm: types.ModuleType) -> dict[str, Any]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.layers.mamba import mamba_utils
    from vllm.model_executor.layers.mamba.kda_checkpoint import kda_prefill_checkpoint_alignment
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
    from vllm.models.deepseek_v4.attention import (
        DeepseekV4Attention,
        DeepseekV4IndexerCache,
        _resolve_dsv4_kv_cache_dtype,
    )
    from vllm.models.deepseek_v4.compressor import CompressorStateCache
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backends import gdn_attn
    from vllm.v1.attention.backends.mla.indexer import DeepseekV4IndexerBackend
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core import kv_cache_utils as utils
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_quant_mode,
    )

    return {
        "torch": torch,
        "get_pp_indices": get_pp_indices,
        "mamba_utils": mamba_utils,
        "MambaMixer2": MambaMixer2,
        "DeepseekV32IndexerCache": DeepseekV32IndexerCache,
        "set_current_vllm_config": set_current_vllm_config,
        "kda_prefill_checkpoint_alignment": kda_prefill_checkpoint_alignment,
        "DeepseekV4Attention": DeepseekV4Attention,
        "DeepseekV4IndexerCache": DeepseekV4IndexerCache,
        "DeepseekV4IndexerBackend": DeepseekV4IndexerBackend,
        "DeepseekV4SWACache": DeepseekV4SWACache,
        "CompressorStateCache": CompressorStateCache,
        "resolve_dsv4_kv_cache_dtype": _resolve_dsv4_kv_cache_dtype,
        "STR_DTYPE_TO_TORCH_DTYPE": STR_DTYPE_TO_TORCH_DTYPE,
        "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT": gdn_attn.FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
        "MambaAttentionBackendEnum": MambaAttentionBackendEnum,
        "TritonAttentionBackend": TritonAttentionBackend,
        "get_global_kv_cache_groups": planning.get_global_kv_cache_groups,
        "get_kv_cache_configs": planning.get_kv_cache_configs,
        "get_kv_cache_configs_unchecked": kp.unchecked(planning),
        "generate_scheduler_kv_cache_config": utils.generate_scheduler_kv_cache_config,
        "get_kv_cache_capacity": utils.get_kv_cache_capacity,
        "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec,
        "FullAttentionSpec": FullAttentionSpec,
        "MambaSpec": MambaSpec,
        "MLAAttentionSpec": MLAAttentionSpec,
        "SlidingWindowSpec": SlidingWindowSpec,
        "get_kv_quant_mode": get_kv_quant_mode,
    }


@pytest.fixture(scope="module")
def cuda_like_config(
    vllm: types.ModuleType, model_dir_factory: Callable[[Mapping[str, object]], Path]
) -> Any:
    """One ``VllmConfig`` set the way a CUDA start sets it (hybrid manager, async scheduling, V2 runner)."""
    from vllm.config import ModelConfig

    folder = model_dir_factory(models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    return kp.build_cuda_like_config(ModelConfig(model=str(folder), skip_tokenizer_init=True))


def test_kv_arithmetic_is_vllms_own(wheel: dict[str, Any], cuda_like_config: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    vc = cuda_like_config
    checked, exact = 0, 0
    exceptions: Counter[str] = Counter()
    misses: list[str] = []
    entries = _entries()
    for name, config in entries:
        spec = build_model_spec(copy.deepcopy(config))
        mla = any(layer.kind == MLA for layer in spec.layers) or spec.compressed is not None
        for point in _points(name, mla, spec.max_model_len):
            checked += 1
            try:
                workers, _ = kp.build_vllm_specs(wheel, vc, config, spec, point)
            except AssertionError:
                exceptions["vLLM cannot shard this model at this TP (divide() asserts)"] += 1
                continue
            if not all(workers):
                exceptions[EMPTY_STAGE] += 1
                continue
            ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point)
            if ours == theirs:
                exact += 1
                continue
            same_flight = kp.kvpilot_outcome(spec, point, vc.max_concurrent_batches)
            if same_flight == theirs:
                exceptions[
                    "in flight at PP > 1: PP + 1 batches (vllm.in_flight_batches, the budget half)"
                ] += 1
                continue
            misses.append(f"{name} {point}: kvpilot {ours} vLLM {theirs}")
    summary = f"{checked} points over {len(entries)} models: {exact} exact, exceptions {dict(exceptions)}"
    print(summary)
    assert len(entries) >= 90  # distinct configs: 94 published ones sized, the catalogue, duplicates once
    assert not misses, f"{summary}; {len(misses)} differ:\n" + "\n".join(misses[:30])
    assert exact + sum(exceptions.values()) == checked


INDEXER_LENGTHS = (4096, 32768, 163_840)
INDEXER_AVAILABLE = (4 * GIB + 777, 40 * GIB + 98_765)


def test_sparse_attention_indexer_cache_is_vllms_own(
    wheel: dict[str, Any], cuda_like_config: Any, monkeypatch: Any
) -> None:
    """DeepSeek-V3.2 / GLM-5: every layer's ``DeepseekV32IndexerCache`` (the wheel's own spec) sits in
    the MLA group; kvpilot's bytes per block and every outcome equal vLLM's over the full grid
    (TP x PP x block x dtype x length x memory), not a sample."""
    from vllm.v1.kv_cache_interface import SparseCacheRole

    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    vc = cuda_like_config
    entries = [
        (n, c)
        for n, c in _entries()
        if "index_topk" in kp._text(c) and "compress_ratios" not in kp._text(c)  # V4: its own test below
    ]
    names = {n for n, _ in entries}
    assert {"deepseek-ai__DeepSeek-V3.2", "zai-org/GLM-5"} <= names, names  # the catalogue GLM-5 = its copy
    checked, exact, misses = 0, 0, []
    for name, config in entries:
        spec = build_model_spec(copy.deepcopy(config))
        assert all(layer.indexer_head_dim for layer in spec.layers), name  # default IndexCache rule
        for tp in TPS:
            for pp in PPS:
                for block in BLOCKS:
                    for dtype in MLA_DTYPES:
                        for length in INDEXER_LENGTHS:
                            for available in INDEXER_AVAILABLE:
                                point = kp.Point(tp, pp, block, dtype, length, available, (9, 0))
                                checked += 1
                                workers, _ = kp.build_vllm_specs(wheel, vc, config, spec, point)
                                roles = Counter(s.cache_role for w in workers for s in w.values())
                                assert roles[SparseCacheRole.INDEXER] == spec.num_layers, roles
                                ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point)
                                if ours == theirs:
                                    exact += 1
                                else:
                                    misses.append(f"{name} {point}: kvpilot {ours} vLLM {theirs}")
    print(f"indexer models: {len(entries)} configs, {checked} points, {exact} exact")
    assert not misses, f"{len(misses)} of {checked} differ:\n" + "\n".join(misses[:20])
    assert checked == exact == len(entries) * len(TPS) * len(PPS) * len(BLOCKS) * 2 * 3 * 2


COMPRESSED_LENGTHS = (4096, 32768, 1_048_576)


def test_compressed_sparse_attention_is_vllms_own(
    wheel: dict[str, Any], cuda_like_config: Any, monkeypatch: Any
) -> None:
    """DeepSeek-V4 (Flash, Pro, Flash-NVFP4): every layer's SWA, compressed latent, compressor-state and
    indexer caches from the wheel's own classes, packed by vLLM's block-outermost grouping; kvpilot's
    blocks, tokens, concurrency, start verdict and estimated length equal vLLM's over the full grid."""
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    vc = cuda_like_config
    entries = [(n, c) for n, c in _entries() if "compress_ratios" in kp._text(c)]
    names = {n.replace("/", "__") for n, _ in entries}  # a catalogue id, or the file it was copied from
    assert {"deepseek-ai__DeepSeek-V4-Flash", "deepseek-ai__DeepSeek-V4-Pro"} <= names, names
    assert len(entries) == 3, names  # and nvidia's NVFP4 Flash
    checked, exact, misses = 0, 0, []
    for name, config in entries:
        spec = build_model_spec(copy.deepcopy(config))
        for tp in TPS:
            for pp in PPS:
                for dtype in MLA_DTYPES:
                    for length in COMPRESSED_LENGTHS:
                        for available in AVAILABLE:
                            point = kp.Point(tp, pp, 256, dtype, length, available, (9, 0))
                            checked += 1
                            workers, block = kp.build_vllm_specs(wheel, vc, config, spec, point)
                            assert block == vllm.COMPRESSED_ATTENTION_BLOCK_SIZE
                            ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point)
                            if ours == theirs:
                                exact += 1
                            else:
                                misses.append(f"{name} {point}: kvpilot {ours} vLLM {theirs}")
    published = checked
    # Layer patterns no published config has, for the grouping's other branches: SWA only (one bucket), no
    # C4 layer (no repeat pattern: the state buckets split to the widest block), C4 only, a short model.
    flash = next(c for n, c in entries if n.endswith("DeepSeek-V4-Flash"))
    variants = {
        "all 0": [0] * 44,
        "all 128": [128] * 44,
        "all 4": [4] * 44,
        "0, 4, 128 x 3": [0, 4, 128, 4, 128, 4, 128, 0],
    }
    for label, ratios in variants.items():
        config = {**flash, "compress_ratios": ratios, "num_hidden_layers": len(ratios) - 1}
        spec = build_model_spec(copy.deepcopy(config))
        for pp, length, available in itertools.product((1, 2), (4096, 1_048_576), AVAILABLE[:2]):
            point = kp.Point(1, pp, 256, "auto", length, available, (9, 0))
            checked += 1
            workers, _ = kp.build_vllm_specs(wheel, vc, config, spec, point)
            ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point)
            if ours == theirs:
                exact += 1
            else:
                misses.append(f"{label} {point}: kvpilot {ours} vLLM {theirs}")
    vc.cache_config.kv_cache_layout = "LBNHC"
    found = f"{len(entries)} configs + {len(variants)} variants, {checked} points, {exact} exact"
    print(f"compressed-attention models: {found}")
    assert not misses, f"{len(misses)} of {checked} differ:\n" + "\n".join(misses[:20])
    assert published == len(entries) * len(TPS) * len(PPS) * 2 * 3 * len(AVAILABLE)
    assert checked == exact == published + len(variants) * 8


KDA_CAPABILITIES = ((9, 0), (8, 0), (10, 0))


def test_kimi_delta_attention_state_is_vllms_own(
    wheel: dict[str, Any], cuda_like_config: Any, monkeypatch: Any
) -> None:
    """Kimi-K3: its MLA layers beside KDA state pages (``kda_state_shape`` / ``kda_state_dtype``, FlashKDA's
    16-token checkpoints on Hopper and Blackwell, Triton's none on Ampere) equal vLLM's over the full grid."""
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    vc = cuda_like_config
    entries = [(n, c) for n, c in _entries() if "linear_attn_config" in kp._text(c)]
    assert {n.replace("/", "__") for n, _ in entries} >= {"moonshotai__Kimi-K3"}, entries
    checked, exact, misses = 0, 0, []
    for name, config in entries:
        spec = build_model_spec(copy.deepcopy(config))
        grid = itertools.product(
            TPS, PPS, BLOCKS, MLA_DTYPES, INDEXER_LENGTHS, INDEXER_AVAILABLE, KDA_CAPABILITIES
        )
        for tp, pp, block, dtype, length, available, capability in grid:
            point = kp.Point(tp, pp, block, dtype, length, available, capability)
            checked += 1
            workers, _ = kp.build_vllm_specs(wheel, vc, config, spec, point)
            ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point)
            if ours == theirs:
                exact += 1
            else:
                misses.append(f"{name} {point}: kvpilot {ours} vLLM {theirs}")
    print(f"KDA models: {len(entries)} configs, {checked} points, {exact} exact")
    assert not misses, f"{len(misses)} of {checked} differ:\n" + "\n".join(misses[:20])
    assert checked == exact == len(entries) * len(TPS) * len(PPS) * len(BLOCKS) * 2 * 3 * 2 * 3
