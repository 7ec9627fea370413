"""The vision encoder's profile-run term: vLLM 0.33's dummy items and the peak of their forward.

Qwen3-VL configs are the repository's copies of the published ones (``tests/data/hf_configs/INDEX.md``).
Qwen2.5-VL-7B-Instruct's is assembled here: its decoder is Qwen2.5-7B-Instruct's (the published config in
``tests/data/hf_configs``), its ``vision_config`` the published one (equal to transformers 5.20's
``Qwen2_5_VLVisionConfig`` defaults); ``PUBLISHED_MAX_PIXELS`` is its ``preprocessor_config.json``'s
``max_pixels``. The expected peaks are the docstring's derivation in :mod:`kvpilot.tuner.memory.encoder`,
written out by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory import budget, encoder
from kvpilot.tuner.model import PREPROCESSOR, apply_processor_files, build_model_spec, reads_processor_files
from kvpilot.tuner.model.vision import apply_processor_configs
from kvpilot.tuner.types import GIB
from kvpilot.tuner.vllm import multimodal

CONFIGS = Path(__file__).parent.parent / "data" / "hf_configs"
PUBLISHED_MAX_PIXELS = 12845056


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((CONFIGS / f"{name}.json").read_text()))


def _qwen2_5_vl_7b() -> dict[str, Any]:
    config = _config("Qwen__Qwen2.5-7B-Instruct")
    config.update(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        model_type="qwen2_5_vl",
        vision_config={
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
        },
    )
    return config


def test_qwen3_vl_items_at_transformers_default_limits() -> None:
    tower = build_model_spec(_config("Qwen__Qwen3-VL-32B-Instruct")).vision_tower
    assert tower is not None
    # 28 x 28 x 1280 pixels over 32 x 32-pixel merged tokens: 980 (28 x 35); a video is 2 frames of
    # 32 x 32 x 768 / 2 pixels: 384 (16 x 24), whatever max_model_len is.
    for length in (4096, 262144):
        assert tower.tokens_per_item(length) == {"image": 980, "video": 384}
    profile = tower.profile(max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=262144)
    assert profile == multimodal.EncoderProfile("image", 8, 980)  # 8192 // 980 images fit the budget


def test_qwen3_vl_32b_peak_at_default_limits() -> None:
    tower = build_model_spec(_config("Qwen__Qwen3-VL-32B-Instruct")).vision_tower
    assert tower is not None and (tower.hidden, tower.intermediate, tower.deepstack_layers) == (1152, 4304, 3)
    peak = encoder.compute_encoder_profile_peak(
        tower, tp=1, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=262144
    )
    assert peak is not None
    patches = 8 * 980 * 4
    held = 1152 + 1152 + 3 * 5120 // 4  # residual, position embeddings, three deepstack features
    attention = 9 * 1152  # qkv 3 + qk 2 + rotated qk 2 + output 1 + its contiguous copy 1
    per_patch = 2 * (held + attention) + 3 * 2 * 16 * 16 * 4  # bf16 activations + fp32 pixels
    assert peak.forward_bytes == patches * per_patch
    assert peak.cache_bytes == 8 * 980 * 5120 * 4 * 2  # merger + 3 deepstack slices per merged token
    assert 1.1 < peak.forward_bytes / GIB < 1.2


def test_qwen2_5_vl_video_profile_at_long_context_passes_10_gib() -> None:
    """The issue's figure: Qwen2.5-VL's published processor (16,384 tokens an image) profiles a 14-frame
    video at long context, 114,688 tokens in one item, and its forward peaks above 10 GiB."""
    spec = build_model_spec(_qwen2_5_vl_7b())
    tower = apply_processor_configs(
        spec.vision_tower, {"max_pixels": PUBLISHED_MAX_PIXELS, "min_pixels": 3136}
    )
    assert tower is not None and tower.mlp_gated
    assert tower.tokens_per_item(128000) == {"image": 16384, "video": 7 * 16384}
    assert tower.tokens_per_item(40000) == {"image": 16384, "video": 2 * 16384}  # frames fit max_model_len
    peak = encoder.compute_encoder_profile_peak(
        tower, tp=1, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=128000
    )
    assert peak is not None and peak.profile == multimodal.EncoderProfile("video", 1, 114688)
    mlp = 1280 + 1280 + 3 * 3420  # residual, norm, gate_up 2I + SiluAndMul I
    assert peak.forward_bytes == 114688 * 4 * (2 * mlp + 1176 * 4)
    assert peak.forward_bytes / GIB > 10
    # The same model at transformers' default processor (1,280 tokens an image, 8,960 a video): ~1 GiB.
    small = encoder.compute_encoder_profile_peak(
        spec.vision_tower,
        tp=1,
        dtype_bytes=2,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        max_model_len=128000,
    )
    assert small is not None and small.profile == multimodal.EncoderProfile("video", 1, 8960)
    assert small.forward_bytes / GIB < 1.5


def test_tensor_parallelism_shards_qkv_and_the_mlp_not_the_residual() -> None:
    tower = build_model_spec(_config("Qwen__Qwen3-VL-235B-A22B-Instruct")).vision_tower
    assert tower is not None
    kwargs: dict[str, Any] = {
        "dtype_bytes": 2,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 8,
        "max_model_len": 8192,
    }
    one, eight = (encoder.compute_encoder_profile_peak(tower, tp=tp, **kwargs) for tp in (1, 8))
    assert one is not None and eight is not None
    assert 0.3 * one.forward_bytes < eight.forward_bytes < 0.7 * one.forward_bytes
    assert one.cache_bytes == eight.cache_bytes  # the merged output is all-reduced: whole on every rank


def test_the_encoder_peak_sets_the_activation_when_it_is_the_larger() -> None:
    spec = build_model_spec(_qwen2_5_vl_7b())
    tower = apply_processor_configs(spec.vision_tower, {"max_pixels": PUBLISHED_MAX_PIXELS})
    spec = dataclasses.replace(spec, vision_tower=tower)
    kwargs: dict[str, Any] = {
        "tp": 1,
        "pp": 1,
        "pp_rank": 0,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
    }
    long = budget.compute_activation_bytes(
        spec, dtype="bfloat16", version=vllm.PINNED_VERSION, max_model_len=128000, **kwargs
    )
    peak = encoder.compute_encoder_profile_peak(
        tower, tp=1, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=128000
    )
    assert peak is not None and long == peak.forward_bytes
    short = budget.compute_activation_bytes(
        spec, dtype="bfloat16", version=vllm.PINNED_VERSION, max_model_len=4096, **kwargs
    )
    assert short < long / 4  # at 4,096 tokens the largest item is one frame: 16,384 tokens, not 114,688
    # A later pipeline stage runs no encoder.
    later = budget.compute_activation_bytes(
        spec,
        dtype="bfloat16",
        version=vllm.PINNED_VERSION,
        max_model_len=128000,
        **{**kwargs, "pp": 2, "pp_rank": 1},
    )
    assert later < peak.forward_bytes / 4


def test_text_only_and_unmodelled_towers_get_no_encoder_term() -> None:
    llama = build_model_spec(_config("meta-llama__Llama-3.1-8B-Instruct"))
    assert llama.vision_tower is None
    none = encoder.compute_encoder_profile_peak(
        llama.vision_tower,
        tp=1,
        dtype_bytes=2,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        max_model_len=8192,
    )
    assert none is None
    gemma = build_model_spec(_config("google__gemma-3-27b-it"))
    assert gemma.is_multimodal and gemma.vision_tower is None  # SigLIP: weights counted, forward not modelled
    kwargs: dict[str, Any] = {
        "tp": 1,
        "pp": 1,
        "pp_rank": 0,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
    }
    with_tower = budget.compute_activation_bytes(
        gemma, dtype="bfloat16", version=vllm.PINNED_VERSION, **kwargs
    )
    text_only = budget.compute_activation_bytes(
        dataclasses.replace(gemma, vision_params=0), dtype="bfloat16", version=vllm.PINNED_VERSION, **kwargs
    )
    assert with_tower - text_only == pytest.approx(
        budget.MM_ENCODER_COPIES * 8192 * gemma.hidden_size * 2, abs=1
    )


def test_processor_configs_override_the_class_defaults() -> None:
    tower = build_model_spec(_config("Qwen__Qwen3-VL-32B-Instruct")).vision_tower
    assert tower is not None
    assert tower.limits == multimodal.ProcessorLimits()
    published = apply_processor_configs(
        tower,
        {"size": {"longest_edge": 16777216, "shortest_edge": 65536}},
        {"size": {"longest_edge": 25165824}},
    )
    assert published is not None
    assert published.tokens_per_item(262144) == {"image": 16384, "video": 12288}
    assert apply_processor_configs(tower, None, None) == tower
    # max_pixels wins over size.longest_edge, as in the processor's __init__.
    both = apply_processor_configs(tower, {"max_pixels": 1024 * 100, "size": {"longest_edge": 16777216}})
    assert both is not None and both.tokens_per_item(4096)["image"] == 100


def test_a_config_reads_processor_files_exactly_when_its_tower_is_modelled() -> None:
    """The operator fetches the processor files only where :func:`reads_processor_files` says so: every
    published config whose tower kvpilot models, and no other (text models, SigLIP, MoonViT...)."""
    readers = []
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        try:
            spec = build_model_spec(config)
        except errors.TunerError:
            continue
        assert reads_processor_files(config) == (spec.vision_tower is not None), path.name
        if spec.vision_tower is not None:
            readers.append(path.stem)
        image = {PREPROCESSOR: {"size": {"longest_edge": 1 << 24}}}
        applied = apply_processor_files(spec, image)
        assert (applied == spec) == (spec.vision_tower is None), path.name
    assert "Qwen__Qwen3.5-9B" in readers and "Qwen__Qwen3-VL-32B-Instruct" in readers
    assert not reads_processor_files({"model_type": ["qwen3_5"], "vision_config": {}})  # unhashable: no
