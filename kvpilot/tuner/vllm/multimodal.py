"""The multimodal encoder's profile run in vLLM 0.33: how many items of which size it encodes at start-up.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). Before the decoder's dummy forward,
``profile_run`` (``v1/worker/gpu/model_runner.py``; the V1 runner's ``gpu_model_runner.py`` does the
same) encodes ``MultiModalBudget.get_dummy_encoder_profile_inputs()``: ``max_items_per_batch`` dummy
items of the modality with the most tokens per item, in one batch, and keeps their outputs in the
encoder cache until the decoder's dummy run ends. Sources, in the pinned wheel:

* ``multimodal/encoder_budget.py::MultiModalBudget`` (``_get_max_items``, ``get_modality_with_max_tokens``)
  and ``v1/core/encoder_cache_manager.py::compute_mm_encoder_budget``: the encoder budget is
  ``max(max_num_batched_tokens, largest item)`` (``SchedulerConfig`` sets both the compute budget and
  the cache size to ``max_num_batched_tokens``);
* ``model_executor/models/qwen2_vl.py::Qwen2VLProcessingInfo`` (Qwen2-VL, Qwen2.5-VL): the image with
  the most features fills the image processor's ``max_pixels`` (``get_image_size_with_most_features``);
  the dummy video is that image repeated for as many frames as ``max_model_len`` holds, at most 14;
* ``model_executor/models/qwen3_vl.py::Qwen3VLProcessingInfo`` (Qwen3-VL, Qwen3.5, Qwen3.6): images as
  above; the dummy video is two frames filling the video processor's ``longest_edge``.

The processor limits are in a model's ``preprocessor_config.json`` (and ``video_preprocessor_config.json``),
not in ``config.json``. The defaults here are those of the installed transformers' processor classes
(transformers 5.20: ``Qwen2VLImageProcessor.size``, ``Qwen3VLVideoProcessor.size``), which is what vLLM
gets when a checkpoint ships no preprocessor config; published checkpoints usually raise them (a
preprocessor config's ``max_pixels`` is read by ``kvpilot plan --config FOLDER``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

QWEN2_VL_IMAGE_MAX_PIXELS = 28 * 28 * 1280
"""``Qwen2VLImageProcessor.size["longest_edge"]`` (transformers 5.20): the image processor of Qwen2-VL,
Qwen2.5-VL, Qwen3-VL and Qwen3.5 (``image_processing_auto.py`` maps all four to it)."""
QWEN2_VL_IMAGE_MIN_PIXELS = 56 * 56
"""``Qwen2VLImageProcessor.size["shortest_edge"]``."""
QWEN3_VL_VIDEO_MAX_PIXELS = 32 * 32 * 768
"""``Qwen3VLVideoProcessor.size["longest_edge"]`` (transformers 5.20): frames x height x width of a video."""
QWEN3_VL_VIDEO_TEMPORAL_PATCH = 2
"""``Qwen3VLVideoProcessor.temporal_patch_size``: vLLM divides the video's pixel budget by it per frame."""
QWEN2_VL_MAX_FRAMES_PER_VIDEO = 14
"""``qwen2_vl.py::_MAX_FRAMES_PER_VIDEO``: the dummy video's frame cap (Qwen2-VL, Qwen2.5-VL)."""
QWEN3_VL_DUMMY_VIDEO_FRAMES = 2
"""``Qwen3VLProcessingInfo.get_max_video_tokens``: the largest video item is two frames ("videos as special
images"), whatever ``max_model_len`` is."""
MAX_ASPECT_RATIO = 200
"""``Qwen2VLProcessingInfo.get_image_size_with_most_features``: grids longer than 200:1 are refused."""
DEFAULT_LIMIT_PER_PROMPT = 999
"""``MultiModalConfig.get_limit_per_prompt``: items per prompt where ``--limit-mm-per-prompt`` sets none."""

QWEN2_VL = "qwen2_vl"
"""Processing of ``Qwen2VLProcessingInfo`` (Qwen2-VL, Qwen2.5-VL)."""
QWEN3_VL = "qwen3_vl"
"""Processing of ``Qwen3VLProcessingInfo`` (Qwen3-VL, Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE)."""
PROCESSING_FAMILIES = {
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN2_VL,
    "qwen3_vl": QWEN3_VL,
    "qwen3_vl_moe": QWEN3_VL,
    "qwen3_5": QWEN3_VL,
    "qwen3_5_moe": QWEN3_VL,
}
"""Top-level ``model_type`` -> the processing-info class vLLM 0.33 registers for it."""


def most_features_grid(max_pixels: int, unit: int) -> tuple[int, int]:
    """``get_image_size_with_most_features``: the (height, width) grid of merged tokens of the image that
    fills ``max_pixels``; ``unit`` is ``patch_size x spatial_merge_size``. The most tokens
    ``max_pixels // unit**2`` are factorised as squarely as possible; a count whose best pair is longer
    than 200:1 is lowered by one until one is not."""
    height, width = 1, max(max_pixels // (unit * unit), 1)
    for tokens in range(max_pixels // (unit * unit), 0, -1):
        height = next(d for d in range(math.isqrt(tokens), 0, -1) if tokens % d == 0)
        width = tokens // height
        if width / height <= MAX_ASPECT_RATIO:
            break
    return height, width


def vision_tokens(grid: tuple[int, int], num_frames: int, temporal_patch_size: int) -> int:
    """``_get_vision_info``: merged tokens of ``num_frames`` frames on ``grid`` (frames padded to a multiple
    of the temporal patch; each temporal patch is one grid of tokens)."""
    padded = num_frames + (-num_frames % temporal_patch_size)
    return max(padded // temporal_patch_size, 1) * grid[0] * grid[1]


@dataclass(frozen=True, slots=True)
class ProcessorLimits:
    """The image and video processors' pixel budgets (``preprocessor_config.json``)."""

    image_max_pixels: int = QWEN2_VL_IMAGE_MAX_PIXELS
    video_max_pixels: int = QWEN3_VL_VIDEO_MAX_PIXELS
    """Qwen3-VL's video processor only (Qwen2-VL's videos use the image processor's budget)."""


def compute_mm_max_tokens_per_item(
    family: str,
    *,
    patch_size: int,
    spatial_merge_size: int,
    temporal_patch_size: int,
    max_model_len: int,
    limits: ProcessorLimits = ProcessorLimits(),
) -> dict[str, int]:
    """``get_mm_max_tokens_per_item(seq_len=max_model_len, mm_counts={"image": 1, "video": 1})``."""
    unit = patch_size * spatial_merge_size
    grid = most_features_grid(limits.image_max_pixels, unit)
    image = vision_tokens(grid, 1, temporal_patch_size)
    if family == QWEN3_VL:
        video_grid = most_features_grid(limits.video_max_pixels // QWEN3_VL_VIDEO_TEMPORAL_PATCH, unit)
        return {
            "image": image,
            "video": vision_tokens(video_grid, QWEN3_VL_DUMMY_VIDEO_FRAMES, temporal_patch_size),
        }
    # Qwen2VLProcessingInfo._get_max_video_frames: add frames while the video still fits max_model_len.
    frames = 1
    while vision_tokens(grid, frames + 1, temporal_patch_size) <= max_model_len:
        frames += 1
    frames = max(min(frames, QWEN2_VL_MAX_FRAMES_PER_VIDEO), 1)
    return {"image": image, "video": vision_tokens(grid, frames, temporal_patch_size)}


@dataclass(frozen=True, slots=True)
class EncoderProfile:
    """What the encoder's profile pass encodes: ``items`` dummy items of ``modality``, in one batch."""

    modality: str
    items: int
    tokens_per_item: int

    @property
    def tokens(self) -> int:
        """Merged (decoder-side) tokens of the whole batch: the rows of the encoder cache it fills."""
        return self.items * self.tokens_per_item


def compute_encoder_profile(
    tokens_per_item: Mapping[str, int],
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    limit_per_prompt: int = DEFAULT_LIMIT_PER_PROMPT,
) -> EncoderProfile | None:
    """``MultiModalBudget``'s profile batch (chunked prefill on, as in 0.33's default); ``None`` when no
    modality has tokens."""
    if not tokens_per_item or max(tokens_per_item.values()) <= 0:
        return None
    modality, per_item = max(tokens_per_item.items(), key=lambda kv: (kv[1], kv[0]))
    budget = max(max_num_batched_tokens, per_item)  # compute_mm_encoder_budget: min(compute, cache)
    per_prompt = max(1, min(limit_per_prompt, max_model_len // per_item))
    items = max(1, min(budget // per_item, max_num_seqs * per_prompt))
    return EncoderProfile(modality, items, per_item)
