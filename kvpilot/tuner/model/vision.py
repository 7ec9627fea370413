"""The vision tower's architecture, as far as the encoder's profile-run peak needs it.

Read from ``vision_config`` for the towers whose forward pass kvpilot models
(:mod:`kvpilot.tuner.memory.encoder`): Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5's
(``Qwen2VisionTransformer``, ``Qwen2_5_VisionTransformer``, ``Qwen3_VisionTransformer`` in vLLM 0.33).
Other towers (SigLIP, Llama 4, Kimi's MoonViT...) read as ``None``: their weights are counted
(``ModelSpec.vision_params``), their profile activation is not (docs/memory-model.md §3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner.model.fields import (
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_INTERMEDIATE_SIZE,
    MAX_LAYERS,
    MAX_SMALL,
    Fields,
    Limit,
)
from kvpilot.tuner.vllm import multimodal


@dataclass(frozen=True, slots=True)
class VisionTower:
    """One Qwen-style vision transformer: patches of ``temporal x patch x patch`` pixels, ``depth``
    pre-norm blocks at width ``hidden``, a 2x2 patch merger to ``out_hidden``."""

    processing: str
    """The processing-info family (:data:`kvpilot.tuner.vllm.multimodal.PROCESSING_FAMILIES`)."""
    depth: int
    hidden: int
    intermediate: int
    num_heads: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    in_channels: int
    out_hidden: int
    """The merger's output width: the language model's hidden size."""
    mlp_gated: bool
    """A gate/up MLP (Qwen2.5-VL's SiLU) rather than fc1/fc2 (Qwen2-VL, Qwen3-VL)."""
    deepstack_layers: int = 0
    """Qwen3-VL's deepstack mergers: each adds one ``out_hidden`` slice to every merged token."""
    learned_pos_embed: bool = False
    """Qwen3-VL adds interpolated position embeddings (one ``hidden`` row per patch, kept to the end)."""
    limits: multimodal.ProcessorLimits = multimodal.ProcessorLimits()

    @property
    def patch_pixels(self) -> int:
        """Input values of one patch: ``in_channels x temporal x patch x patch``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def output_width(self) -> int:
        """Width of one merged token the tower emits (the merger plus the deepstack slices)."""
        return self.out_hidden * (1 + self.deepstack_layers)

    def tokens_per_item(self, max_model_len: int) -> dict[str, int]:
        """vLLM's largest item per modality (:func:`.multimodal.compute_mm_max_tokens_per_item`)."""
        return multimodal.compute_mm_max_tokens_per_item(
            self.processing,
            patch_size=self.patch_size,
            spatial_merge_size=self.spatial_merge_size,
            temporal_patch_size=self.temporal_patch_size,
            max_model_len=max_model_len,
            limits=self.limits,
        )

    def profile(
        self, *, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
    ) -> multimodal.EncoderProfile | None:
        """The batch vLLM encodes in its profile run (:func:`.multimodal.compute_encoder_profile`)."""
        return multimodal.compute_encoder_profile(
            self.tokens_per_item(max_model_len),
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        )


def read_vision_tower(top: Fields, text_hidden: int) -> VisionTower | None:
    """The modelled tower of a config, or ``None`` (text-only, or a tower kvpilot does not model)."""
    processing = multimodal.PROCESSING_FAMILIES.get(top.string("model_type") or "")
    vc = top.child("vision_config")
    if processing is None or vc is None:
        return None
    hidden = vc.need_int("embed_dim", "hidden_size", limit=MAX_HIDDEN_SIZE)
    if vc.present("embed_dim"):  # Qwen2-VL: hidden_size is the merger's output, mlp_ratio x embed_dim the MLP
        ratio = vc.optional_float("mlp_ratio", maximum=64.0) or 4.0
        intermediate = int(hidden * ratio)
        out_hidden = vc.optional_int("hidden_size", limit=MAX_HIDDEN_SIZE) or text_hidden
    else:
        intermediate = vc.need_int("intermediate_size", limit=MAX_INTERMEDIATE_SIZE)
        out_hidden = vc.optional_int("out_hidden_size", limit=MAX_HIDDEN_SIZE) or text_hidden
    deepstack = vc.ints("deepstack_visual_indexes", limit=MAX_LAYERS) or []
    return VisionTower(
        processing=processing,
        depth=vc.need_int("depth", "num_hidden_layers", limit=MAX_LAYERS),
        hidden=hidden,
        intermediate=intermediate,
        num_heads=vc.need_int("num_heads", "num_attention_heads", limit=MAX_HEADS),
        patch_size=vc.optional_int("patch_size", limit=MAX_SMALL) or 14,
        spatial_merge_size=vc.optional_int("spatial_merge_size", limit=MAX_SMALL) or 2,
        temporal_patch_size=vc.optional_int("temporal_patch_size", limit=MAX_SMALL) or 2,
        in_channels=vc.optional_int("in_channels", "in_chans", limit=MAX_SMALL) or 3,
        out_hidden=out_hidden,
        mlp_gated=vc.string("hidden_act") in ("silu", "swiglu"),
        deepstack_layers=len(deepstack),
        learned_pos_embed=processing == multimodal.QWEN3_VL,
    )


MAX_PIXELS = Limit(1 << 34, "Qwen2.5-VL's published max_pixels is 12845056")


def _longest_edge(config: Mapping[str, Any] | None, where: str) -> int | None:
    """A processor config's pixel budget: ``max_pixels`` over ``size.longest_edge``, as the processor's
    ``__init__`` and vLLM's ``_get_vision_size`` resolve them."""
    if config is None:
        return None
    fields = Fields(config, where)
    size = fields.child("size")
    edge = size.optional_int("longest_edge", limit=MAX_PIXELS) if size is not None else None
    return fields.optional_int("max_pixels", limit=MAX_PIXELS) or edge


def apply_processor_configs(
    tower: VisionTower | None,
    preprocessor: Mapping[str, Any] | None,
    video_preprocessor: Mapping[str, Any] | None = None,
) -> VisionTower | None:
    """The tower with a checkpoint's ``preprocessor_config.json`` (and ``video_preprocessor_config.json``)
    pixel budgets in place of transformers' class defaults; an absent file or field keeps the default."""
    if tower is None:
        return None
    image = _longest_edge(preprocessor, "preprocessor_config")
    video = _longest_edge(video_preprocessor, "video_preprocessor_config")
    limits = multimodal.ProcessorLimits(
        image_max_pixels=image or tower.limits.image_max_pixels,
        video_max_pixels=video or tower.limits.video_max_pixels,
    )
    return dataclasses.replace(tower, limits=limits)
