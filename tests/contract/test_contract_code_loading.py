"""The code-loading flags and JSON keys (kvpilot.tuner.vllm.code_loading) are the pinned vLLM's own."""

from __future__ import annotations

import inspect
import typing
from types import ModuleType

import pytest

from kvpilot.tuner import vllm as kv

pytestmark = pytest.mark.contract


def test_every_code_loading_flag_is_a_flag_of_vllm_serve(
    vllm_option_strings: dict[str, set[str]], vllm: ModuleType
) -> None:
    """The engine's parser, or the OpenAI server's own arguments (the fields of
    ``entrypoints/common/cli_args.py``,
    whose parser needs a device to build: read as text)."""
    spellings = set().union(*vllm_option_strings.values())
    cli_args = __import__("vllm.entrypoints.common", fromlist=["cli_args"]).__path__[0] + "/cli_args.py"
    with open(cli_args) as f:
        frontend = f.read()
    rest = [f for f in kv.CODE_LOADING_FLAGS if f != "--config" and f not in spellings]
    fields = [f[2:].replace("-", "_") + ":" for f in rest]  # dataclass fields, flags by kebab-casing
    assert rest and [f for f in fields if f"\n    {f}" not in frontend] == []


def test_config_is_a_yaml_file_of_flags_the_parser_reads(vllm: ModuleType) -> None:
    """``--config`` is not an engine argument: FlexibleArgumentParser pulls flags from the file it names."""
    argparse_utils = __import__("vllm.utils.argparse_utils", fromlist=["FlexibleArgumentParser"])
    source = inspect.getsource(argparse_utils.FlexibleArgumentParser)
    assert "'--config'" in source or '"--config"' in source
    assert "yaml" in source


def test_the_json_flag_aliases_are_the_parsers(
    vllm_option_strings: dict[str, set[str]], vllm: ModuleType
) -> None:
    assert {"--compilation-config", "-cc"} <= vllm_option_strings["compilation_config"]
    argparse_utils = __import__("vllm.utils.argparse_utils", fromlist=["FlexibleArgumentParser"])
    source = inspect.getsource(argparse_utils.FlexibleArgumentParser)
    assert 'startswith("-O")' in source and "--compilation-config" in source  # -O3, -O.key=value


def test_the_compilation_keys_are_imported_by_qualified_name(vllm: ModuleType) -> None:
    compilation = __import__("vllm.config.compilation", fromlist=["CompilationConfig"])
    fields = set(compilation.CompilationConfig.__dataclass_fields__)
    assert set(kv.CODE_LOADING_KEYS["--compilation-config"]) <= fields
    source = inspect.getsource(compilation)
    assert "resolve_obj_by_qualname(self.backend)" in source
    assert "self.inductor_passes.items()" in source and "qualified name" in source


def test_trust_is_read_only_from_its_flag(engine_args_cls: typing.Any, vllm_parser: typing.Any) -> None:
    """A ``trust_remote_code`` key inside a JSON flag does not set the engine's trust: refused anyway (it is
    an attempt, or a later release's way in)."""
    args = vllm_parser.parse_args(["--hf-overrides", '{"trust_remote_code": true}'])
    assert args.trust_remote_code is False and args.hf_overrides == {"trust_remote_code": True}
    assert kv.ANY_FLAG_CODE_KEYS == ("trust_remote_code",)
    assert "trust_remote_code" in engine_args_cls.__dataclass_fields__
