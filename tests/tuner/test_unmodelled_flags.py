"""Flags that change vLLM's memory in ways kvpilot does not budget: named in the plan's warnings."""

from __future__ import annotations

import pytest

from kvpilot.tuner import gpus, vllm
from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import ServingBounds

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("args", "found"),
    [
        ([], ()),
        (["--enforce-eager", "--tool-call-parser", "hermes"], ()),
        (["--speculative-config", '{"method": "mtp"}'], ()),  # budgeted where kvpilot models the drafter
        (["--kv-transfer-config.kv_connector=LMCacheConnectorV1"], ("--kv-transfer-config",)),
        (
            ["--kv-offloading-size", "64", "--kv-offloading-backend", "native"],
            ("--kv-offloading-size", "--kv-offloading-backend"),
        ),
        (["--max-num-active-seqs", "64", "--enable-lora"], ()),  # an admission cap; LoRA is budgeted
        # warned by the model's quantization, not here (kvpilot.tuner.memory.describe_unbudgeted_moe_backend)
        (["--moe-backend", "flashinfer_cutlass", "--enable-lora"], ()),
    ],
)
def test_unmodelled_flags_are_found_in_any_spelling_once(args: list[str], found: tuple[str, ...]) -> None:
    assert vllm.list_unmodelled_flags(args) == found
    assert vllm.build_engine_flags(args).unmodelled == found


def test_the_plan_names_each_unmodelled_flag_with_what_to_do() -> None:
    model = build_model_spec(LLAMA_8B)
    eagle = '{"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 3}'
    engine = vllm.build_engine_flags(["--speculative-config", eagle, "--kv-offloading-size", "8"])
    plan = compute_plan(model, gpus.lookup_gpu("H100-SXM"), 1, ServingBounds(), engine=engine)
    named = [w for w in plan.warnings if "is not in kvpilot's memory model" in w]
    assert [w.split()[0] for w in named] == ["--speculative-config", "--kv-offloading-size"]
    assert "--kv-cache-memory-bytes" in named[0]
    plain = compute_plan(model, gpus.lookup_gpu("H100-SXM"), 1, ServingBounds())
    assert not [w for w in plain.warnings if "is not in kvpilot's memory model" in w]
    assert plain.settings == plan.settings  # a warning, not another plan
