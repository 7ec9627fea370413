"""A checkpoint's processor files beside config.json, as vLLM reads them for a multimodal model.

vLLM sizes the dummy image and video of its encoder profile run from ``preprocessor_config.json`` and
``video_preprocessor_config.json`` (their pixel budgets: :mod:`kvpilot.tuner.vllm.multimodal`), not from
config.json. The callers read the files (``kvpilot plan --config FOLDER``, the operator's ConfigMap and
Hub sources) and pass them here parsed, by file name; only a config whose vision tower kvpilot models
(:func:`reads_processor_files`) has a plan they change, so only its files are worth fetching.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kvpilot.tuner.model.spec import ModelSpec
from kvpilot.tuner.model.vision import apply_processor_configs
from kvpilot.tuner.vllm import multimodal

PREPROCESSOR = "preprocessor_config.json"
VIDEO_PREPROCESSOR = "video_preprocessor_config.json"
PROCESSOR_FILES = (PREPROCESSOR, VIDEO_PREPROCESSOR)
"""The processor files a plan reads, in the order the image's and the video's budgets are applied."""


def reads_processor_files(config: Mapping[str, Any]) -> bool:
    """Whether ``config``'s plan depends on its processor files: a ``vision_config`` of a family whose tower
    kvpilot models (:data:`.multimodal.PROCESSING_FAMILIES`, as :func:`.vision.read_vision_tower` reads
    it). Text-only models and towers kvpilot does not model (SigLIP, MoonViT...) never read them."""
    model_type = config.get("model_type")
    return (
        isinstance(model_type, str)
        and model_type in multimodal.PROCESSING_FAMILIES
        and isinstance(config.get("vision_config"), Mapping)
    )


def apply_processor_files(spec: ModelSpec, files: Mapping[str, Mapping[str, Any]]) -> ModelSpec:
    """``spec`` with the pixel budgets of a checkpoint's processor ``files`` (file name -> parsed content);
    an absent file or field keeps transformers' default, as vLLM does. Raises
    :class:`~kvpilot.tuner.errors.InvalidModelConfig` naming a field it refuses."""
    if spec.vision_tower is None or not files:
        return spec
    tower = apply_processor_configs(spec.vision_tower, files.get(PREPROCESSOR), files.get(VIDEO_PREPROCESSOR))
    return dataclasses.replace(spec, vision_tower=tower)
