"""Contract: the flags fleet learning treats as leaving GPU memory alone are vLLM 0.33 ``vllm serve`` flags
(a misspelt entry would make the real flag a sizing one, or worse, hide a rename), and the sizing flags the
docs name exist too."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from kvpilot.tuner import vllm as kv_vllm

pytestmark = pytest.mark.contract

NAMED_SIZING_FLAGS = [
    "--hf-overrides",
    "--quantization",
    "--load-format",
    "--enable-lora",
    "--speculative-config",
    "--cpu-offload-gb",
    "--block-size",
    "--compilation-config",
    "--enable-expert-parallel",
    "--limit-mm-per-prompt",
    "--kv-offloading-size",
    "--enforce-eager",
]
"""The flags kvpilot/tuner/vllm/sizing.py names as changing memory."""


@pytest.fixture(scope="module")
def serve_options(vllm: ModuleType) -> set[str]:
    """Every option string of the whole ``vllm serve`` parser (engine and OpenAI-server arguments)."""
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    cli_args = importlib.import_module("vllm.entrypoints.common.cli_args")
    parser: Any = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
    return {option for action in parser._actions for option in action.option_strings}


def test_every_memory_neutral_flag_is_a_vllm_serve_flag(serve_options: set[str]) -> None:
    assert not kv_vllm.MEMORY_NEUTRAL_FLAGS - serve_options


def test_the_sizing_flags_named_exist_and_are_not_neutral(serve_options: set[str]) -> None:
    assert not set(NAMED_SIZING_FLAGS) - serve_options
    for flag in NAMED_SIZING_FLAGS:
        assert kv_vllm.compute_sizing_args([flag, "x"])[0] == flag
