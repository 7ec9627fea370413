"""Fixtures for the contract tests: the pinned vLLM release, imported on its CPU platform.

vLLM picks its platform the first time ``vllm.platforms.current_platform`` is
read. ``VLLM_TARGET_DEVICE=cpu`` makes that choice authoritative
(``vllm/platforms/__init__.py::resolve_current_platform_cls_qualname``), so these
tests import vLLM and build its configs on a machine without a GPU, and on one
with a GPU too. The environment is set here, before anything imports vLLM, and
the Hub is switched off: every "model" is a local folder holding a config.json.

These tests never skip. Without the ``vllm`` extra they fail, loudly: the
contract is the point of them.
"""

from __future__ import annotations

import importlib
import json
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import pytest

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from kvpilot.tuner.vllm import PINNED_VLLM_VERSION as PINNED_VLLM  # noqa: E402


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or vLLM failing to initialise
        pytest.fail(
            f"vLLM {PINNED_VLLM} is required for the contract tests and `import {name}` failed: "
            f"{type(exc).__name__}: {exc}. Install the vllm extra: `make install` "
            "(pip install -e '.[dev,vllm]').",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def vllm() -> ModuleType:
    """The vllm package, checked to be the pinned release."""
    module = _import("vllm")
    version = getattr(module, "__version__", "?")
    assert version.split("+")[0] == PINNED_VLLM, f"contract tests pin vLLM {PINNED_VLLM}, found {version}"
    return module


@pytest.fixture(scope="session")
def vllm_parser(vllm: ModuleType) -> typing.Any:
    """``vllm serve``'s engine-argument parser: ``EngineArgs.add_cli_args(FlexibleArgumentParser())``."""
    arg_utils = _import("vllm.engine.arg_utils")
    argparse_utils = _import("vllm.utils.argparse_utils")
    parser = argparse_utils.FlexibleArgumentParser(prog="vllm serve")
    return arg_utils.EngineArgs.add_cli_args(parser)


@pytest.fixture(scope="session")
def vllm_option_strings(vllm_parser: typing.Any) -> dict[str, set[str]]:
    """Every spelling of every ``vllm serve`` flag, by the engine argument it sets."""
    by_dest: dict[str, set[str]] = {}
    for action in vllm_parser._actions:
        by_dest.setdefault(action.dest, set()).update(action.option_strings)
    return by_dest


@pytest.fixture(scope="session")
def engine_args_cls(vllm: ModuleType) -> typing.Any:
    return _import("vllm.engine.arg_utils").EngineArgs


@pytest.fixture(scope="session")
def vllm_cache_dtypes(vllm: ModuleType) -> tuple[str, ...]:
    """The values of vLLM's ``CacheDType`` literal (``vllm/config/cache.py``)."""
    return tuple(typing.get_args(_import("vllm.config.cache").CacheDType))


@pytest.fixture(scope="session")
def model_dir_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Mapping[str, object]], Path]:
    """Write a config.json into a fresh folder: a local "model" vLLM can read without the Hub."""

    def make(config: Mapping[str, object]) -> Path:
        folder = tmp_path_factory.mktemp("model")
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    return make


@pytest.fixture(scope="session")
def local_model_dir(model_dir_factory: Callable[[Mapping[str, object]], Path]) -> Path:
    """A Llama 3.1 8B folder, for EngineArgs round trips (vLLM resolves ``--model`` first)."""
    from kvpilot.tuner.model import catalogue as models

    return model_dir_factory(models.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))


@pytest.fixture(scope="session")
def vllm_model_config(vllm: ModuleType) -> Callable[[Path], typing.Any]:
    """Build vLLM's own ``ModelConfig`` for a local model folder (no tokenizer, no network)."""
    config_module = _import("vllm.config")

    def build(folder: Path) -> typing.Any:
        return config_module.ModelConfig(model=str(folder), skip_tokenizer_init=True)

    return build


@pytest.fixture(scope="session")
def parallel_config(vllm: ModuleType) -> Callable[[int], typing.Any]:
    config_module = _import("vllm.config")
    return lambda tp: config_module.ParallelConfig(tensor_parallel_size=tp)


@pytest.fixture(scope="session")
def catalogue_model_config(
    model_dir_factory: Callable[[Mapping[str, object]], Path], vllm_model_config: Callable[[Path], typing.Any]
) -> Callable[[str], typing.Any]:
    """vLLM's ``ModelConfig`` of a catalogue model, built once per session."""
    from kvpilot.tuner.model import catalogue as models

    cache: dict[str, typing.Any] = {}

    def get(model_id: str) -> typing.Any:
        if model_id not in cache:
            cache[model_id] = vllm_model_config(model_dir_factory(models.lookup_model_config(model_id)))
        return cache[model_id]

    return get
