"""Contract: the untuned flags kvpilot plans for are read as vLLM 0.33's own parser reads them."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner import vllm as kv_vllm
from kvpilot.tuner.vllm.engine_flags import ENGINE_FLAGS

pytestmark = pytest.mark.contract

CASES = [
    [],
    ["--enforce-eager"],
    ["--enforce_eager"],
    ["--enforce-eager", "--no-enforce-eager"],
    ["--no-enforce-eager", "--enforce-eager"],
    ["--performance-mode", "interactivity"],
    ["--performance-mode=throughput"],
    ["--performance_mode", "balanced", "--performance-mode", "interactivity"],
    ["--enable-prefix-caching"],
    ["--no-enable-prefix-caching"],
    ["--disable-prefix-caching"],
    ["--enable-prefix-caching", "--no-enable-prefix-caching"],
    ["--max-model-len", "4096", "--enforce-eager", "--enable-prefix-caching", "--block-size", "32"],
]


@pytest.mark.parametrize("args", CASES)
def test_engine_flags_read_as_vllm_parses_them(args: list[str], vllm_parser: Any) -> None:
    parsed = vllm_parser.parse_args(args)
    flags = kv_vllm.build_engine_flags(args)
    kv_vllm.check_engine_flags(args)  # vLLM accepts them all: so does kvpilot
    assert flags.enforce_eager == bool(parsed.enforce_eager)
    assert flags.enable_prefix_caching == parsed.enable_prefix_caching
    given = any(a.replace("_", "-").startswith(kv_vllm.PERFORMANCE_MODE_FLAG) for a in args)
    assert flags.performance_mode == (parsed.performance_mode if given else None)


def test_every_spelling_vllm_has_for_these_flags_is_read(
    vllm_parser: Any, vllm_option_strings: dict[str, set[str]]
) -> None:
    by_dest = vllm_option_strings
    spellings = by_dest["enforce_eager"] | by_dest["enable_prefix_caching"] | by_dest["performance_mode"]
    for dest in ("enable_lora", "max_loras", "max_lora_rank", "lora_dtype", "fully_sharded_loras"):
        spellings |= by_dest[dest]  # the LoRA flags (kvpilot.tuner.vllm.lora)
    for dest in ("speculative_config", "spec_method", "spec_model", "spec_tokens"):
        spellings |= by_dest[dest]  # speculative decoding (kvpilot.tuner.vllm.speculative), -sc included
    for dest in (
        "data_parallel_size",
        "data_parallel_size_local",
        "data_parallel_rank",
        "enable_expert_parallel",
    ):
        spellings |= by_dest[dest]  # data-parallel engines (kvpilot.tuner.vllm.parallel), -dp/-ep included
    spellings |= by_dest["moe_backend"]  # the MoE kernels (kvpilot.tuner.vllm.moe_backends)
    # vLLM's parser also takes --no-enable-prefix-caching (it is in CASES) and --no-enable-lora, not option
    # strings of their own
    assert spellings == set(ENGINE_FLAGS) - {"--no-enable-prefix-caching", "--no-enable-lora"}
    choices = next(a.choices for a in vllm_parser._actions if a.dest == "performance_mode")
    assert set(choices) == set(kv_vllm.PERFORMANCE_MODES)


def test_no_vllm_flag_is_taken_for_an_abbreviation(vllm_option_strings: dict[str, set[str]]) -> None:
    """check_engine_flags refuses a prefix of these flags; no real vLLM flag may be one."""
    ours = set(ENGINE_FLAGS)
    for option in {o for options in vllm_option_strings.values() for o in options} - ours:
        assert not any(flag.startswith(option) for flag in ours), option


DATA_PARALLEL_CASES = [
    ["-dp", "8", "-ep"],
    ["--data-parallel-size=4", "--enable-expert-parallel", "--disable-expert-parallel"],
    ["--data_parallel_size", "4", "-dpl", "2"],
    ["-dp", "16", "--data-parallel-size-local=8", "-ep"],
    ["-dp", "8", "-dpn", "3", "-ep"],
    ["--enable-expert-parallel", "--tensor-parallel-size", "8"],
    ["-dp", "1"],
]


@pytest.mark.parametrize("args", DATA_PARALLEL_CASES)
def test_data_parallel_flags_read_as_vllm_parses_them(args: list[str], vllm_parser: Any) -> None:
    """The ranks a pod starts follow ``EngineArgs.create_engine_config``'s one-node reading: the local size
    as given, 1 for an externally balanced rank, else the whole group."""
    parsed = vllm_parser.parse_args(args)
    kv_vllm.check_engine_flags(args)  # vLLM parses them all: so does kvpilot
    dp = kv_vllm.build_engine_flags(args).data_parallel
    if parsed.data_parallel_size <= 1 and not parsed.enable_expert_parallel:
        assert dp is None
        return
    assert dp is not None
    assert (dp.size, dp.expert_parallel) == (parsed.data_parallel_size, parsed.enable_expert_parallel)
    if parsed.data_parallel_rank is not None:
        local = 1
    else:
        local = parsed.data_parallel_size_local or parsed.data_parallel_size
    assert dp.local == local


@pytest.mark.parametrize(
    "args",
    [["--enforce-eager=true"], ["--performance-mode", "fast"], ["--enforce"], ["--perf", "throughput"]],
)
def test_what_kvpilot_refuses_vllm_refuses_or_reads_as_these_flags(args: list[str], vllm_parser: Any) -> None:
    with pytest.raises(errors.InvalidEngineArgs):
        kv_vllm.check_engine_flags(args)
    try:
        parsed = vllm_parser.parse_args(args)
    except SystemExit:
        return  # vLLM refuses it too
    # vLLM takes a unique prefix for the flag: kvpilot would have planned without it
    assert parsed.enforce_eager or parsed.performance_mode != "balanced"


def test_every_unmodelled_memory_flag_is_one_of_vllms(vllm_option_strings: dict[str, set[str]]) -> None:
    """The flags the plan warns about exist in vLLM 0.33's parser (a renamed flag would go unnoticed)."""
    spellings = set().union(*vllm_option_strings.values())
    assert set(kv_vllm.UNMODELLED_MEMORY_FLAGS) <= spellings


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--max-num-active-seqs", "32"],
        ["--max_num_active_seqs=48"],
        ["--max-num-active-seqs", "32", "--max-num-active-seqs", "16"],
        ["--max-num-active-seqs", "32", "--max-num-active-seqs", "None"],
    ],
)
def test_the_admission_cap_is_read_as_vllm_parses_it(args: list[str], vllm_parser: Any) -> None:
    kv_vllm.check_engine_flags(args)
    assert kv_vllm.find_active_seqs(args) == vllm_parser.parse_args(args).max_num_active_seqs


def test_the_admission_cap_is_vllms_flag_with_its_default(
    vllm_parser: Any, vllm_option_strings: dict[str, set[str]], engine_args_cls: Any
) -> None:
    """``--max-num-active-seqs`` exists with the default kvpilot records (``None``: the limit is
    ``max_num_seqs``), and it is not an abbreviation kvpilot would refuse."""
    assert vllm_option_strings["max_num_active_seqs"] == {kv_vllm.ACTIVE_SEQS_FLAG}
    assert vllm_parser.parse_args([]).max_num_active_seqs is None
    assert engine_args_cls.max_num_active_seqs is None


@pytest.mark.parametrize(("seqs", "cap"), [(8, 16), (8, 0), (8, 8)])
def test_vllm_refuses_the_caps_kvpilot_refuses(seqs: int, cap: int, vllm: Any) -> None:
    """A cap above ``max_num_seqs`` or below 1 fails vLLM's ``SchedulerConfig`` as it fails kvpilot."""
    scheduler = _import_scheduler_config()
    refused = False
    try:
        kv_vllm.check_engine_flags([kv_vllm.ACTIVE_SEQS_FLAG, str(cap)])
        kv_vllm.check_active_below_seqs(cap, seqs)
    except errors.InvalidEngineArgs:
        refused = True
    try:
        scheduler(
            max_model_len=4096,
            is_encoder_decoder=False,
            max_num_batched_tokens=8192,
            max_num_seqs=seqs,
            max_num_active_seqs=cap,
        )
    except ValueError:  # pydantic's ValidationError is one
        assert refused
    else:
        assert not refused


def _import_scheduler_config() -> Any:
    import importlib

    return importlib.import_module("vllm.config.scheduler").SchedulerConfig
