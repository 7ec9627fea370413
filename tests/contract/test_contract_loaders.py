"""Contract: the streaming loader's flag, package and failure text are vLLM 0.33's own.

kvpilot renders ``--load-format runai_streamer`` for ``spec.model.loader: RunaiStreamer``
(:mod:`kvpilot.tuner.vllm.loaders`); vLLM's parser must read it as that loader, vLLM's metadata must name the
package kvpilot tells users to install, and the error vLLM itself raises when the package is missing (its
lazily imported placeholder, used as the loader uses it) must be classified with that reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from types import ModuleType
from typing import Any

import pytest

from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.restarts import classify_termination
from kvpilot.tuner.vllm import loaders

pytestmark = pytest.mark.contract


def test_vllm_parses_the_rendered_flag_as_the_streamer(vllm_parser: Any) -> None:
    parsed = vllm_parser.parse_args(list(kv_vllm.build_loader_args(True)))
    assert parsed.load_format == loaders.STREAMER_LOAD_FORMAT
    assert vllm_parser.parse_args(list(kv_vllm.build_loader_args(False))).load_format == "auto"


def test_the_streamer_is_one_of_vllms_loaders(vllm: ModuleType) -> None:
    model_loader = importlib.import_module("vllm.model_executor.model_loader")
    assert loaders.STREAMER_LOAD_FORMAT in model_loader._LOAD_FORMAT_TO_MODEL_LOADER
    cls = model_loader._LOAD_FORMAT_TO_MODEL_LOADER[loaders.STREAMER_LOAD_FORMAT]
    assert cls.__name__ == "RunaiModelStreamerLoader"


def test_vllm_names_the_package_in_its_extra(vllm: ModuleType) -> None:
    requires = importlib.metadata.requires("vllm") or []
    extra = [r for r in requires if r.endswith(f'extra == "{loaders.STREAMER_EXTRA}"')]
    assert [r.split("[")[0] for r in extra] == [loaders.STREAMER_PACKAGE]


def test_vllms_own_error_for_the_missing_package_is_classified(vllm: ModuleType) -> None:
    """The test environment has no runai-model-streamer (as a slim image): the placeholder vLLM's weight
    iterator uses raises, and the classifier names the package and the remedy."""
    assert importlib.util.find_spec(loaders.STREAMER_MODULE) is None, "the test needs the package absent"
    weight_utils = importlib.import_module("vllm.model_executor.model_loader.weight_utils")
    with pytest.raises(ImportError) as raised, weight_utils.SafetensorsStreamer():  # the iterator's first use
        pass
    text = f"Traceback (most recent call last):\n{type(raised.value).__name__}: {raised.value}\n"
    cause = classify_termination(text, "Error", 1)
    assert cause.kind == RestartKind.INVALID_ENGINE_ARGS
    assert cause.detail is not None and loaders.STREAMER_PACKAGE in cause.detail
    assert "spec.model.loader" in cause.detail
