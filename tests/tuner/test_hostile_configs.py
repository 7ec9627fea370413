"""Hostile config.json files: every one is refused with InvalidModelConfig naming the field, or planned.

The property takes the published configs that parse (tests/data/hf_configs and the catalogue) and
mutates whatever the parser reads -- wrong JSON types, zero, negative, NaN, Infinity, huge values,
deep nesting, deleted keys, a whole sub-object replaced by a scalar. Only InvalidModelConfig may come
out of :func:`build_model_spec`; a spec that comes out must plan (a Plan or a TunerError) on a
catalogue GPU; each config within 1 s of CPU and 50 MB traced (on main a 3,000,000-layer config took
54 s and 1.28 GB). The table tests pin each finding of the attack on main.
"""

from __future__ import annotations

import copy
import json
import math
import os
import pathlib
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import model_configs_for_tests as cfg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpilot.tuner import errors
from kvpilot.tuner.gpus import list_gpus, lookup_gpu
from kvpilot.tuner.model import MAX_CONFIG_BYTES, MAX_JSON_DEPTH, fields, parse_config_json
from kvpilot.tuner.model.configs import ENTRIES
from kvpilot.tuner.model.fields import MAX_CONTEXT, MAX_LAYERS, nests_deeper_than, strip_json_strings
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
TIME_LIMIT_S = 1.0
MEMORY_LIMIT_BYTES = 50 << 20


def _parses(config: dict[str, Any]) -> bool:
    try:
        build_model_spec(config)
    except errors.InvalidModelConfig:  # an architecture not modelled yet: not a seed
        return False
    return True


def _published() -> list[tuple[str, dict[str, Any]]]:
    found = [(path.stem, json.loads(path.read_text())) for path in sorted(HF_CONFIGS.glob("*.json"))]
    found += [(entry.id, copy.deepcopy(dict(entry.config))) for entry in ENTRIES]
    return found


SEEDS = [(name, config) for name, config in _published() if _parses(config)]

SUB_OBJECTS = (
    "text_config",
    "language_config",
    "vision_config",
    "rope_scaling",
    "rope_parameters",
    "quantization_config",
)
READ_KEYS = (
    # what spec.py, readers.py and quantization.py read (present in a seed or not)
    *SUB_OBJECTS,
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "hidden_size",
    "n_embd",
    "d_model",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "num_kv_heads",
    "multi_query",
    "head_dim",
    "vocab_size",
    "padded_vocab_size",
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "intermediate_size_mlp",
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "original_max_position_embeddings",
    "rope_type",
    "type",
    "factor",
    "sliding_window",
    "sliding_window_pattern",
    "use_sliding_window",
    "layer_types",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "full_attention_interval",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "num_global_key_value_heads",
    "global_head_dim",
    "num_kv_shared_layers",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "decoder_sparse_step",
    "mlp_only_layers",
    "interleave_moe_layer_step",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "enable_moe_block",
    "partial_rotary_factor",
    "attention_bias",
    "quant_method",
    "bits",
    "group_size",
    "load_in_8bit",
    "config_groups",
    "ignore",
    "embed_dim",
    "depth",
    "patch_size",
    "num_channels",
    "hidden_act",
    "vision_output_dim",
)


def _nested(depth: int) -> Any:
    """A list nested ``depth`` deep, built without recursion."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = st.one_of(
    st.sampled_from(
        [
            0,
            -1,
            -8,
            1,
            2,
            3,
            7,
            3_000_000,
            2**31,
            2**62,
            2**64,
            10**30,
            10**400,
            4096.0,
            0.5,
            -0.0,
            1e308,
            math.nan,
            math.inf,
            -math.inf,
            True,
            False,
            None,
            "",
            "32",
            "4096",
            "bfloat16",
            "yarn",
            "linear",
            "llama4_text",
            "qwen3_next",
            "gemma3_text",
            "mamba",
            [],
            [1],
            ["full_attention"],
            [None],
            {},
            {"a": 1},
            {"rope_type": "yarn", "factor": 1e300},
            {"quant_method": "gptq", "bits": 0},
        ]
    ),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-2, 4) | st.sampled_from(["full_attention", "sliding_attention"]), max_size=6),
    st.integers(min_value=MAX_JSON_DEPTH, max_value=20_000).map(_nested),
)


def _containers(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of ``config`` the parser reads from: the top, its sub-objects and theirs."""
    found = [config]
    for holder in list(found):
        for key in SUB_OBJECTS:
            if isinstance(holder.get(key), dict):
                found.append(holder[key])
    for holder in list(found):
        groups = holder.get("config_groups")
        if isinstance(groups, dict):
            schemes = [g for g in groups.values() if isinstance(g, dict)]
            found += schemes + [g["weights"] for g in schemes if isinstance(g.get("weights"), dict)]
    return found


@st.composite
def hostile_configs(draw: st.DrawFn) -> dict[str, Any]:
    _, seed = draw(st.sampled_from(SEEDS))
    config = copy.deepcopy(seed)  # before any hostile value goes in (deepcopy would recurse on one)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        holder = draw(st.sampled_from(_containers(config)))
        key = draw(st.sampled_from(sorted(set(holder) | set(READ_KEYS))))
        if draw(st.integers(0, 4)) == 0:
            holder.pop(key, None)
        else:
            holder[key] = draw(HOSTILE)
    return config


GPUS = [gpu.name for gpu in list_gpus()]


def _bounded(call: Callable[[], Any]) -> Any:
    """``call()`` within the time and memory limits; returns what it returns."""
    tracemalloc.start()
    started = time.process_time()  # CPU time: other processes on a busy machine do not count
    try:
        return call()
    finally:
        elapsed = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert elapsed < TIME_LIMIT_S, f"took {elapsed:.2f} s of CPU"
        assert peak < MEMORY_LIMIT_BYTES, f"peaked at {peak >> 20} MiB"


def _spec_and_plan(config: dict[str, Any], gpu: str, count: int, bounds: ServingBounds) -> None:
    try:
        spec = build_model_spec(config)
    except errors.InvalidModelConfig as exc:
        assert "config.json" in exc.message or "quantization_config" in exc.message, exc.message
        event("refused")
        return
    try:
        plan = compute_plan(spec, lookup_gpu(gpu), count, bounds)
    except errors.TunerError as exc:
        event(f"plan raised {exc.reason}")
        return
    event("feasible plan" if plan.feasible else "infeasible plan")


@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "300")),  # more: HOSTILE_EXAMPLES=5000
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(
    hostile_configs(),
    st.sampled_from(GPUS),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([ServingBounds(), ServingBounds(min_context=4096, concurrency=16, allow_fp8_kv=True)]),
)
def test_a_hostile_config_is_refused_or_planned(config, gpu, count, bounds) -> None:
    _bounded(lambda: _spec_and_plan(config, gpu, count, bounds))


NOT_MODELLED_YET = frozenset(
    {
        # Mllama, which vLLM 0.33 no longer serves (DeepSeek-V4 and Kimi-K3 are sized now)
        "meta-llama__Llama-3.2-11B-Vision",
    }
)
"""The published configs refused before the typed readers: architectures not modelled yet."""


def test_no_published_config_is_refused_but_the_architectures_not_modelled_yet() -> None:
    # The readers' types, ranges and limits refuse no real config: every one that parsed still does
    # (and to the identical ModelSpec: bench/fingerprint.py reports no difference).
    seeds = {name for name, _ in SEEDS}
    refused = {path.stem for path in HF_CONFIGS.glob("*.json")} - seeds
    assert refused <= NOT_MODELLED_YET
    assert all(entry.id in seeds for entry in ENTRIES)  # the whole catalogue parses
    assert len(SEEDS) >= 80


# --------------------------------------------------------------------------- the attack's findings


def _refused(config: dict[str, Any]) -> errors.InvalidModelConfig:
    with pytest.raises(errors.InvalidModelConfig) as caught:
        _bounded(lambda: build_model_spec(config))
    return caught.value


LLAMA = cfg.LLAMA_31_8B
VISION_LAYERS_1E9 = {**cfg.GEMMA_3_27B["vision_config"], "num_hidden_layers": 10**9}


@pytest.mark.parametrize(
    ("change", "field", "found"),
    [
        ({"num_attention_heads": -8}, "num_attention_heads", "must be a positive integer, got -8"),
        ({"num_attention_heads": 0}, "num_attention_heads", "got 0"),
        ({"num_key_value_heads": -2}, "num_key_value_heads", "got -2"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers", "got the string '32'"),
        ({"hidden_size": "4096"}, "hidden_size", "positive integer, got the string '4096'"),
        ({"vocab_size": {}}, "vocab_size", "got an object"),
        ({"vocab_size": [128256]}, "vocab_size", "got a list"),
        ({"hidden_size": True}, "hidden_size", "got true"),
        ({"hidden_size": 4096.5}, "hidden_size", "got the number 4096.5"),
        ({"intermediate_size": math.nan}, "intermediate_size", "got NaN"),
        ({"max_position_embeddings": math.inf}, "max_position_embeddings", "got Infinity"),
        ({"rope_scaling": {**LLAMA["rope_scaling"], "factor": math.nan}}, "rope_scaling.factor", "got NaN"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -math.inf}}, "rope_scaling.factor", "-Infinity"),
        ({"rope_scaling": "llama3"}, "rope_scaling", "must be an object, got the string 'llama3'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 10**400}}, "rope_scaling.factor", "401 digits"),
        ({"partial_rotary_factor": 10**400}, "partial_rotary_factor", "at most 1"),
        ({"max_position_embeddings": 2**62}, "max_position_embeddings", f"at most {MAX_CONTEXT.maximum}"),
        ({"max_position_embeddings": 10**400}, "max_position_embeddings", "an integer of about 401 digits"),
        ({"head_dim": 0}, "head_dim", "got 0"),
        ({"num_key_value_heads": 48}, "num_key_value_heads", "a divisor of num_attention_heads (32), got 48"),
        ({"num_key_value_heads": 5}, "num_key_value_heads", "a divisor"),
        ({"head_dim": None, "num_attention_heads": 24}, "num_attention_heads", "must divide hidden_size"),
        ({"torch_dtype": ["bfloat16"]}, "torch_dtype", "must be a string, got a list"),
        ({"architectures": "LlamaForCausalLM"}, "architectures", "a list of class names"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "true or false"),
        ({"sliding_window": 0}, "sliding_window", "got 0"),
        ({"sliding_window": -4096}, "sliding_window", "got -4096"),
        ({"model_max_length": 0}, "model_max_length", "got 0"),
    ],
)
def test_each_finding_is_refused_naming_the_field(change: dict[str, Any], field: str, found: str) -> None:
    error = _refused({**LLAMA, **change})
    assert error.field == field
    assert error.message.startswith("config.json")
    assert found in error.message


def test_three_million_layers_are_refused_at_once_naming_the_limit() -> None:
    error = _refused({**LLAMA, "num_hidden_layers": 3_000_000})  # 54 s and 1.28 GB on main
    assert error.field == "num_hidden_layers"
    assert f"at most {MAX_LAYERS.maximum}" in error.message and "got 3000000" in error.message
    assert "Llama-3.1-405B" in error.message  # the largest published model is named


def test_the_largest_allowed_model_plans_within_the_bounds() -> None:
    config = {**LLAMA, "num_hidden_layers": MAX_LAYERS.maximum, "rope_scaling": None}
    config["max_position_embeddings"] = MAX_CONTEXT.maximum
    spec = _bounded(lambda: build_model_spec(config))
    plan = _bounded(lambda: compute_plan(spec, lookup_gpu("H100"), 8, ServingBounds(min_context=131072)))
    assert not plan.feasible and plan.reasons  # far too large, and it says so


@pytest.mark.parametrize("length", [2**31, 2**62, 10**30])
def test_an_oversized_pinned_max_model_len_is_an_infeasible_plan(length: int) -> None:
    spec = build_model_spec(LLAMA)  # the config's own maximum is bounded, so vLLM's check refuses the pin
    plan = _bounded(
        lambda: compute_plan(
            spec, lookup_gpu("H100"), 1, ServingBounds(), pinned=EngineSettings(max_model_len=length)
        )
    )
    assert not plan.feasible
    assert f"User-specified max_model_len ({length}) is greater than the derived" in plan.reasons[0]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**cfg.GPT_OSS_20B, "num_experts_per_tok": 64}, "num_experts_per_tok"),
        ({**cfg.GPT_OSS_20B, "num_local_experts": -1}, "num_local_experts"),
        ({**cfg.GPT_OSS_20B, "layer_types": cfg.GPT_OSS_20B["layer_types"][:-1]}, "layer_types"),
        (
            {**cfg.GPT_OSS_20B, "layer_types": [*cfg.GPT_OSS_20B["layer_types"], "full_attention"]},
            "layer_types",
        ),
        ({**cfg.GPT_OSS_20B, "layer_types": [1] * cfg.GPT_OSS_20B["num_hidden_layers"]}, "layer_types[0]"),
        ({**cfg.DEEPSEEK_V3, "first_k_dense_replace": 62}, "first_k_dense_replace"),
        ({**cfg.DEEPSEEK_V3, "qk_rope_head_dim": -64}, "qk_rope_head_dim"),
        (
            {**cfg.DEEPSEEK_V3, "rope_scaling": {**cfg.DEEPSEEK_V3["rope_scaling"], "factor": 1e300}},
            "rope_scaling.factor",
        ),
        ({**cfg.GEMMA_2_9B, "sliding_window": "4096"}, "sliding_window"),
        ({**cfg.GPT_OSS_20B, "quantization_config": "mxfp4"}, "quantization_config"),
        ({**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 0}}, "quantization_config.bits"),
        (
            {**LLAMA, "quantization_config": {"quant_method": "awq", "group_size": "128"}},
            "quantization_config.group_size",
        ),
        (
            {
                **LLAMA,
                "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": 4}},
            },
            "quantization_config.config_groups.g",
        ),
        ({**cfg.GEMMA_3_27B, "vision_config": 7}, "vision_config"),
        ({**cfg.GEMMA_3_27B, "text_config": [1]}, "text_config"),
        ({**cfg.GEMMA_3_27B, "vision_config": VISION_LAYERS_1E9}, "vision_config.num_hidden_layers"),
    ],
)
def test_inconsistent_geometry_is_refused(config: dict[str, Any], field: str) -> None:
    assert _refused(config).field == field


def test_a_nested_text_config_is_read_one_level_deep() -> None:
    inner = dict(LLAMA)
    for _ in range(10_000):
        inner = {"text_config": inner}  # text_config in text_config...: never followed
    error = _refused({"architectures": ["LlamaForCausalLM"], "text_config": inner})
    assert error.field == "text_config.num_hidden_layers"


def test_a_deep_value_in_a_read_field_is_refused_without_recursion() -> None:
    for field in ("torch_dtype", "architectures", "layer_types", "rope_scaling", "vocab_size"):
        assert (_refused({**LLAMA, field: _nested(200_000)}).field or "").startswith(field)


# --------------------------------------------------------------------------- the JSON edge


def test_parse_config_json_refuses_deep_nesting_without_recursion_error() -> None:
    for text in ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", '{"a": ' + "[" * 40 + "]" * 40 + "}"):
        with pytest.raises(errors.InvalidModelConfig, match="nests objects or lists deeper than 32"):
            _bounded(lambda text=text: parse_config_json(text, "ConfigMap ns/cfg key 'config.json'"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"a": ' + "[" * 30_000 + '"]]"' + "]" * 30_000 + "}", "nests objects or lists deeper than 32"),
        ('{"a": [' + "{}," * 30_000 + '"{,"]}', "holds about 60003 JSON values"),
    ],
)
def test_a_hostile_config_is_stripped_of_its_strings_once(
    text: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The string-stripping regex is the costly pass over a hostile megabyte: the value count and the
    nesting check share its output."""
    calls: list[int] = []

    def counted(raw: bytes) -> bytes:
        calls.append(len(raw))
        return strip_json_strings(raw)

    monkeypatch.setattr(fields, "strip_json_strings", counted)
    with pytest.raises(errors.InvalidModelConfig, match=match):
        parse_config_json(text, "config.json")
    assert calls == [len(text)]
    calls.clear()
    parse_config_json(json.dumps(LLAMA), "config.json")
    assert calls == []  # a real config's cheap bound suffices: no stripping at all


def test_parse_config_json_refuses_an_oversized_config() -> None:
    text = json.dumps({**LLAMA, "padding": "x" * MAX_CONFIG_BYTES})
    with pytest.raises(errors.InvalidModelConfig, match="at most 1048576"):
        parse_config_json(text, "config.json")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"vocab_size": 1' + "0" * 5000 + "}", "not valid JSON"),  # beyond Python's int digit limit
        (b'{"model_type": "\xff"}', "not valid JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_parse_config_json_refuses_what_is_not_a_config(text: str | bytes, match: str) -> None:
    with pytest.raises(errors.InvalidModelConfig, match=match):
        parse_config_json(text, "config.json")


def test_parse_config_json_reads_every_published_config() -> None:
    for path in sorted(HF_CONFIGS.glob("*.json")):
        assert parse_config_json(path.read_text(), path.name) == json.loads(path.read_text())


def test_what_published_configs_legitimately_hold_is_accepted() -> None:
    # GPTQ's group_size -1 (one group per channel), zero shared experts, null optional fields
    gptq = build_model_spec(
        {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1}}
    )
    assert gptq.quantization is not None and gptq.quantization.group_size == 128  # sized as the default
    qwen = build_model_spec({**cfg.QWEN3_30B_A3B, "shared_expert_intermediate_size": 0, "head_dim": None})
    assert qwen.moe is not None and qwen.moe.shared_intermediate_size == 0
    assert (
        build_model_spec({**LLAMA, "num_key_value_heads": None}).num_kv_heads == LLAMA["num_attention_heads"]
    )


@given(
    opens=st.lists(st.sampled_from(["[", '{"k":']), min_size=1, max_size=40),
    limit=st.integers(min_value=1, max_value=40),
    decoy=st.text(alphabet='[]{}",\\ a', max_size=20),
)
def test_the_nesting_check_is_exact_and_skips_strings(opens: list[str], limit: int, decoy: str) -> None:
    """``nests_deeper_than`` answers as Python's own parse does, for any mix of lists and objects, whatever
    brackets a string holds (its answer picks the message of a refused config; it must be cheap on a
    hostile megabyte, so it never parses)."""
    closes = ["]" if o == "[" else "}" for o in reversed(opens)]
    text = "".join(opens) + json.dumps(decoy) + "".join(closes)
    parsed: Any = json.loads(text)
    depth = 0
    while isinstance(parsed, (list, dict)):
        depth, parsed = depth + 1, (parsed[0] if isinstance(parsed, list) else parsed["k"])
    assert depth == len(opens)
    assert nests_deeper_than(text.encode(), limit) == (depth > limit)
    bare = strip_json_strings(text.encode())  # as parse_config_json hands it over, stripped once
    assert nests_deeper_than(bare, limit, strings_stripped=True) == (depth > limit)
