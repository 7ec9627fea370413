"""Contract: the multimodal encoder's profile batch is vLLM 0.33's own, run on CPU.

* tokens per item: vLLM's ``Qwen2VLProcessingInfo`` / ``Qwen2_5_VLProcessingInfo`` /
  ``Qwen3VLProcessingInfo.get_mm_max_tokens_per_item``, called on the real ``hf_config`` (transformers'
  config classes, from the repository's copies of the published configs) and on transformers' own
  processor classes at their defaults, and at a published ``max_pixels``. The processing-info object is
  made without its ``InputProcessingContext`` (which would load the processor from the Hub): the four
  accessors the methods call return those objects, and no per-request processor kwargs are merged;
* items per batch: ``MultiModalBudget._get_max_items`` with ``compute_mm_encoder_budget``'s budget, on
  a ``SchedulerConfig``-shaped namespace (chunked prefill on, vLLM's default).
"""

from __future__ import annotations

import importlib
import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.vllm import multimodal

pytestmark = pytest.mark.contract

CONFIGS = Path(__file__).parent.parent / "data" / "hf_configs"
QWEN3_VL = [
    "Qwen__Qwen3-VL-2B-Instruct",
    "Qwen__Qwen3-VL-32B-Instruct",
    "Qwen__Qwen3-VL-30B-A3B-Instruct",
    "Qwen__Qwen3-VL-235B-A22B-Instruct",
]
LENGTHS = (2048, 4096, 32768, 131072, 262144)
PUBLISHED_QWEN2_VL_MAX_PIXELS = 12845056
"""Qwen2-VL's and Qwen2.5-VL's published ``preprocessor_config.json`` (``max_pixels``; 16,384 tokens)."""


def _info(cls: type, hf_config: Any, image_processor: Any, video_processor: Any = None) -> Any:
    info = cls.__new__(cls)
    info.get_hf_config = lambda: hf_config
    info.get_image_processor = lambda **_: image_processor
    info.get_video_processor = lambda **_: video_processor
    info._merge_and_resolve_mm_processor_kwargs = lambda _: {}
    return info


@pytest.fixture(scope="module")
def image_processor_cls(vllm: Any) -> Any:
    module = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    return module.Qwen2VLImageProcessorPil


@pytest.mark.parametrize("name", QWEN3_VL)
def test_qwen3_vl_tokens_per_item_are_vllms(name: str, image_processor_cls: Any) -> None:
    qwen3_vl = importlib.import_module("vllm.model_executor.models.qwen3_vl")
    transformers = importlib.import_module("transformers")
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    config_cls = (
        transformers.Qwen3VLMoeConfig if "moe" in config["model_type"] else transformers.Qwen3VLConfig
    )
    video_processor = qwen3_vl.Qwen3VLVideoProcessor()
    tower = build_model_spec(config).vision_tower
    assert tower is not None
    for max_pixels in (None, 16777216):
        image_processor = (
            image_processor_cls() if max_pixels is None else image_processor_cls(max_pixels=max_pixels)
        )
        info = _info(qwen3_vl.Qwen3VLProcessingInfo, config_cls(**config), image_processor, video_processor)
        limits = multimodal.ProcessorLimits(image_max_pixels=image_processor.size["longest_edge"])
        ours = multimodal.compute_mm_max_tokens_per_item(
            tower.processing,
            patch_size=tower.patch_size,
            spatial_merge_size=tower.spatial_merge_size,
            temporal_patch_size=tower.temporal_patch_size,
            max_model_len=32768,
            limits=limits,
        )
        for length in LENGTHS:
            assert info.get_mm_max_tokens_per_item(length, {"image": 1, "video": 1}) == ours, (
                length,
                max_pixels,
            )
    assert video_processor.size["longest_edge"] == multimodal.QWEN3_VL_VIDEO_MAX_PIXELS
    assert video_processor.temporal_patch_size == multimodal.QWEN3_VL_VIDEO_TEMPORAL_PATCH


@pytest.mark.parametrize("max_pixels", [None, PUBLISHED_QWEN2_VL_MAX_PIXELS, 640 * 28 * 28])
def test_qwen2_5_vl_tokens_per_item_are_vllms(max_pixels: int | None, image_processor_cls: Any) -> None:
    """Qwen2.5-VL's video grows with ``max_model_len`` up to 14 frames (transformers' ``Qwen2_5_VLConfig``
    defaults are Qwen2.5-VL-7B's vision tower)."""
    qwen2_5_vl = importlib.import_module("vllm.model_executor.models.qwen2_5_vl")
    transformers = importlib.import_module("transformers")
    hf_config = transformers.Qwen2_5_VLConfig()
    image_processor = (
        image_processor_cls() if max_pixels is None else image_processor_cls(max_pixels=max_pixels)
    )
    assert (max_pixels or multimodal.QWEN2_VL_IMAGE_MAX_PIXELS) == image_processor.size["longest_edge"]
    info = _info(qwen2_5_vl.Qwen2_5_VLProcessingInfo, hf_config, image_processor)
    vc = hf_config.vision_config
    limits = multimodal.ProcessorLimits(image_max_pixels=image_processor.size["longest_edge"])
    for length in LENGTHS + (9000, 114688, 114687):
        ours = multimodal.compute_mm_max_tokens_per_item(
            multimodal.QWEN2_VL,
            patch_size=vc.patch_size,
            spatial_merge_size=vc.spatial_merge_size,
            temporal_patch_size=vc.temporal_patch_size,
            max_model_len=length,
            limits=limits,
        )
        assert info.get_mm_max_tokens_per_item(length, {"image": 1, "video": 1}) == ours, length


def test_the_profile_batch_is_vllms(vllm: Any) -> None:
    budget_mod = importlib.import_module("vllm.multimodal.encoder_budget")
    cache_mod = importlib.import_module("vllm.v1.core.encoder_cache_manager")
    per_items = (
        {"image": 980, "video": 384},
        {"image": 16384, "video": 114688},
        {"image": 1280, "video": 8960},
    )
    for per_item, tokens, seqs, length in itertools.product(
        per_items, (512, 2048, 8192, 16384, 65536), (1, 4, 256, 1024), (1024, 8192, 32768, 262144)
    ):
        scheduler = SimpleNamespace(
            max_num_batched_tokens=tokens,
            max_num_encoder_input_tokens=tokens,
            encoder_cache_size=tokens,
            disable_chunked_mm_input=False,
            enable_chunked_prefill=True,
        )
        compute, cache = cache_mod.compute_mm_encoder_budget(scheduler, per_item)
        budget = budget_mod.MultiModalBudget.__new__(budget_mod.MultiModalBudget)
        budget.encoder_compute_budget, budget.encoder_cache_size = compute, cache
        budget.scheduler_config, budget.max_num_reqs, budget.max_model_len = scheduler, seqs, length
        budget.mm_limits = dict.fromkeys(per_item, multimodal.DEFAULT_LIMIT_PER_PROMPT)
        budget.mm_max_toks_per_item = per_item
        modality = budget.get_modality_with_max_tokens()
        _, items = budget._get_max_items(modality, per_item[modality])
        ours = multimodal.compute_encoder_profile(
            per_item, max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=length
        )
        assert ours is not None
        assert (ours.modality, ours.items) == (modality, items), (per_item, tokens, seqs, length)
