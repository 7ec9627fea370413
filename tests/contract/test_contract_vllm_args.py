"""Contract: the flags kvpilot renders and parses are the ones vLLM 0.33's own parser accepts."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.types import EngineSettings

pytestmark = pytest.mark.contract

SETTINGS_GRID = [
    EngineSettings(
        max_model_len=mml,
        max_num_seqs=seqs,
        gpu_memory_utilization=util,
        kv_cache_dtype=dtype,
        tensor_parallel_size=tp,
        max_num_batched_tokens=mnbt,
    )
    for mml, seqs, util, dtype, tp, mnbt in itertools.product(
        (None, 1, 4096, 131072, -1),
        (None, 1, 256),
        (None, 0.5, 0.9, 0.925, 1.0),
        (None, "auto", "fp8", "fp8_e5m2"),
        (None, 1, 8),
        (None, 256, 16384),
    )
    if not (seqs and mnbt and mnbt < seqs)
]


def _values(namespace: Any) -> dict[str, object]:
    return {name: getattr(namespace, name) for name in kv_vllm.FLAGS}


def _expected(settings: EngineSettings, parser: Any) -> dict[str, object]:
    defaults = {name: parser.get_default(name) for name in kv_vllm.FLAGS}
    return {**defaults, **settings.as_dict()}


def test_kv_cache_dtypes_are_vllms(vllm_cache_dtypes: tuple[str, ...]) -> None:
    assert vllm_cache_dtypes == kv_vllm.KV_CACHE_DTYPES


def test_settings_grid_is_large() -> None:
    assert len(SETTINGS_GRID) > 2000


def test_every_rendered_grid_point_parses_with_vllm(vllm_parser: Any) -> None:
    for settings in SETTINGS_GRID:
        args = kv_vllm.build_vllm_args(settings)
        assert _values(vllm_parser.parse_args(list(args))) == _expected(settings, vllm_parser), args
        assert kv_vllm.parse_vllm_args(args) == (settings, ())


@pytest.mark.parametrize(
    "settings",
    [
        EngineSettings(8192, 64, 0.9, "fp8", 4, 8192),
        EngineSettings(max_model_len=-1, gpu_memory_utilization=0.92),
        EngineSettings(max_model_len=131072, kv_cache_dtype="auto", tensor_parallel_size=8),
    ],
)
def test_rendered_args_round_trip_to_engine_args(
    settings: EngineSettings, vllm_parser: Any, engine_args_cls: Any, local_model_dir: Path
) -> None:
    args = kv_vllm.build_vllm_args(settings, ("--model", str(local_model_dir)))
    engine_args = engine_args_cls.from_cli_args(vllm_parser.parse_args(list(args)))
    for name, value in settings.as_dict().items():
        assert getattr(engine_args, name) == value, name


@pytest.mark.parametrize(
    "args",
    [
        ["--max_model_len=32K", "-tp", "4", "--enable-prefix-caching", "--device-memory-utilization", "0.85"],
        ["--max-model-len", "25.6k", "--max-num-batched-tokens=2K", "--max_num_seqs", "12"],
        ["-tp=2", "--kv_cache_dtype=fp8_e4m3", "--max-model-len", "auto", "--block-size", "32"],
        ["--max-num-seqs", "8", "--max-num-seqs", "16", "--gpu_memory_utilization=0.7"],
    ],
)
def test_parse_agrees_with_vllm(args: list[str], vllm_parser: Any) -> None:
    settings, rest = kv_vllm.parse_vllm_args(args)
    assert _values(vllm_parser.parse_args(args)) == _expected(settings, vllm_parser)
    # What we hand back untouched still parses, and sets none of the tuned values.
    assert _values(vllm_parser.parse_args(list(rest))) == _expected(EngineSettings(), vllm_parser)


@pytest.mark.parametrize(
    "text", ["1", "4096", "1k", "1K", "25.6k", "32k", "32K", "2M", "1g", " 64 ", "1.5K", "abc", "1e3", "-5"]
)
def test_human_readable_ints_match_vllm(text: str, vllm: Any) -> None:
    from vllm.utils.argparse_utils import human_readable_int

    try:
        expected: object = human_readable_int(text)
    except Exception:
        expected = "error"
    try:
        ours: object = kv_vllm.parse_human_int(text)
    except ValueError:
        ours = "error"
    assert ours == expected


def test_aliases_cover_every_spelling_vllm_accepts(vllm_option_strings: dict[str, set[str]]) -> None:
    by_dest = vllm_option_strings
    for name, flag in kv_vllm.FLAGS.items():
        ours = {flag} | {alias for alias, target in kv_vllm.FLAG_ALIASES.items() if target == flag}
        assert by_dest[name] == ours, name


def test_no_vllm_flag_abbreviates_a_tuned_flag(vllm_option_strings: dict[str, set[str]]) -> None:
    """validate_extra_args refuses abbreviations of tuned flags; no real flag may be one."""
    tuned = set(kv_vllm.FLAGS.values()) | set(kv_vllm.FLAG_ALIASES)
    for option in {o for options in vllm_option_strings.values() for o in options} - tuned:
        assert not any(flag.startswith(option) for flag in kv_vllm.FLAGS.values()), option


def test_abbreviated_sizing_overrides_are_real_and_refused(vllm_parser: Any) -> None:
    """vLLM takes --num-gpu-blocks as --num-gpu-blocks-override (unique prefix); kvpilot refuses it."""
    parsed = vllm_parser.parse_args(["--num-gpu-blocks", "100"])
    assert parsed.num_gpu_blocks_override == 100
    with pytest.raises(errors.InvalidEngineArgs, match="abbreviates --num-gpu-blocks-override"):
        kv_vllm.validate_extra_args(["--num-gpu-blocks", "100"])


@pytest.mark.parametrize("flag", sorted(kv_vllm.UNSUPPORTED_FLAGS))
def test_unsupported_flags_are_rejected_by_vllm_or_override_sizing(
    flag: str, vllm_parser: Any, vllm_option_strings: dict[str, set[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    known = {o for options in vllm_option_strings.values() for o in options}
    if flag in kv_vllm.SIZING_OVERRIDE_FLAGS:
        assert flag in known  # refused by policy, not because vLLM lacks it
        return
    assert flag not in known
    with pytest.raises(SystemExit) as exit_info:
        vllm_parser.parse_args([flag, "1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_serve_repeated_is_rejected_by_vllm(vllm_parser: Any) -> None:
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["serve", "--max-model-len", "4096"])


def test_topology_short_forms_and_dtypes_are_vllms(
    vllm_parser: Any, vllm_option_strings: dict[str, set[str]]
) -> None:
    """The spellings find_flag_values / find_pod_flags read, and check_dtype's dtypes, are vLLM's own."""
    from kvpilot.tuner.vllm import args as kv_args

    by_dest = vllm_option_strings
    for alias, flag in kv_args.TOPOLOGY_ALIASES.items():
        assert by_dest[flag[2:].replace("-", "_")] == {flag, alias}
    (dtype,) = [a for a in vllm_parser._actions if a.dest == "dtype"]
    assert set(dtype.choices) == {"auto", *kv_args.DTYPE_BYTES}
    for flag in ("--model", "--revision", "--data-parallel-size"):  # the serve CLI adds --host, --port, ...
        assert flag in by_dest[flag[2:].replace("-", "_")], flag
