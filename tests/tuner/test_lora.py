"""``--enable-lora``: the flags kvpilot reads, the LoRA buffers it budgets and what the plan says of them.

The figures are written out from vLLM 0.33's buffer shapes (:mod:`kvpilot.tuner.vllm.lora`) for
Llama-3.1-8B: 32 layers, hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, vocabulary 128256,
bfloat16. ``tests/contract/test_contract_lora.py`` checks the same arithmetic against vLLM's own layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import GIB, EngineSettings, ServingBounds

LLAMA = build_model_spec(cfg.LLAMA_31_8B)
TOKENS, SEQS = 8192, 256
H, Q, KV, MLP, VOCAB, LAYERS = 4096, 4096, 1024, 14336, 128256, 32


def _flags(*args: str) -> vllm.LoraFlags:
    flags = vllm.read_lora_flags(["--enable-lora", *args])
    assert flags is not None
    return flags


def _llama_elements(n: int, r: int, tp: int = 1) -> int:
    """Llama-3.1-8B's LoRA elements on one rank, wrapper by wrapper (not fully sharded)."""
    qkv = 3 * n * r * H + n * (Q + 2 * KV) // tp * r  # A replicated per slice, B split
    o_proj = n * r * Q // tp + n * H * r  # A split, B whole
    gate_up = 2 * (n * r * H + n * MLP // tp * r)
    down = n * r * MLP // tp + n * H * r
    vocab = 2 * (n * VOCAB * r + n * H * r)  # embedding and LM head, never split
    return LAYERS * (qkv + o_proj + gate_up + down) + vocab


def _punica(n: int) -> int:
    return 8 * (4 * TOKENS + 3 * SEQS) + 4 * 2 * (2 * TOKENS + 2 * (n + 1) + n + 2)


def _bytes(flags: vllm.LoraFlags, tensor_parallel_size: int = 1) -> int:
    """Llama-3.1-8B's LoRA bytes on one rank at 8192 batched tokens and 256 sequences."""
    return memory.compute_lora_bytes(
        LLAMA,
        flags,
        tensor_parallel_size=tensor_parallel_size,
        max_num_batched_tokens=TOKENS,
        max_num_seqs=SEQS,
    )


def test_llama_8b_at_four_loras_of_rank_64_costs_1_38_gib() -> None:
    flags = _flags("--max-loras", "4", "--max-lora-rank", "64")
    assert flags == vllm.LoraFlags(max_loras=4, max_lora_rank=64)
    assert _llama_elements(4, 64) == 738_852_864
    assert _bytes(flags) == 2 * 738_852_864 + _punica(4) == 1_478_105_216
    assert _bytes(flags) / GIB == pytest.approx(1.3766, abs=1e-4)


def test_only_enable_lora_means_vllms_defaults_one_lora_of_rank_16() -> None:
    flags = _flags()
    assert flags == vllm.LoraFlags(max_loras=vllm.DEFAULT_MAX_LORAS, max_lora_rank=vllm.DEFAULT_MAX_LORA_RANK)
    assert (flags.max_loras, flags.max_lora_rank, flags.lora_dtype, flags.fully_sharded) == (
        1,
        16,
        None,
        False,
    )
    assert _bytes(flags) == 2 * _llama_elements(1, 16) + _punica(1)


def test_tensor_parallelism_halves_the_sharded_side_of_each_pair() -> None:
    flags = _flags("--max-loras", "4", "--max-lora-rank", "64")
    tp2 = _bytes(flags, tensor_parallel_size=2)
    index_map = 8 * VOCAB  # the LM head's int64 sharded-to-full map (128256 is a multiple of 64)
    assert tp2 == 2 * _llama_elements(4, 64, tp=2) + index_map + _punica(4)
    split_half = LAYERS * 4 * 64 * ((Q + 2 * KV) // 2 + Q // 2 + 2 * MLP // 2 + MLP // 2)  # elements
    assert _bytes(flags) - tp2 == 2 * split_half - index_map


def test_fully_sharded_loras_split_the_replicated_side_too() -> None:
    plain = _bytes(_flags("--max-loras", "4", "--max-lora-rank", "64"), tensor_parallel_size=2)
    sharded = _bytes(
        _flags("--max-loras", "4", "--max-lora-rank", "64", "--fully-sharded-loras"), tensor_parallel_size=2
    )
    replicated_half = LAYERS * 4 * 64 * (3 * H + H + 2 * H + H) // 2  # column A ranks, row B rows
    assert plain - sharded == 2 * replicated_half
    assert _bytes(_flags("--fully-sharded-loras")) == _bytes(_flags())  # nothing to split at TP 1


@pytest.mark.parametrize(("rank", "loras"), [(32, 4), (128, 4), (64, 3), (64, 8)])
def test_the_term_scales_with_rank_and_loras_so_a_wrong_rank_would_fail(rank: int, loras: int) -> None:
    expected = 1_478_105_216 - _punica(4)
    other = _bytes(_flags("--max-loras", str(loras), "--max-lora-rank", str(rank))) - _punica(loras)
    assert other != expected
    assert other * 64 * 4 == expected * rank * loras


def test_the_lora_dtype_is_the_served_dtype_unless_given() -> None:
    index = memory.compute_punica_bytes(_flags(), 0, 0)  # int32 and int64 whatever the dtype

    def buffers(*args: str, dtype: str | None = None) -> int:
        return memory.compute_lora_bytes(LLAMA, _flags(*args), dtype=dtype) - index

    auto = buffers(dtype="float32")  # --dtype float32
    assert buffers("--lora-dtype", "bfloat16", dtype="float32") * 2 == auto
    assert buffers("--lora-dtype", "auto") * 2 == auto
    assert buffers("--lora-dtype", "float16") * 2 == auto


def test_pipeline_stages_hold_their_layers_the_first_the_embedding_the_last_the_head() -> None:
    flags = _flags()
    stages = [memory.compute_lora_bytes(LLAMA, flags, pipeline_parallel_size=2, pp_rank=k) for k in (0, 1)]
    assert stages[0] == stages[1]  # 16 layers each; the embedding's A and B match the head's B and A
    assert sum(stages) == memory.compute_lora_bytes(LLAMA, flags) + memory.compute_punica_bytes(flags, 0, 0)


def test_moe_experts_the_router_and_a_model_without_vocabulary_lora() -> None:
    qwen = build_model_spec(cfg.QWEN3_30B_A3B)
    flags = _flags()
    dense = memory.compute_lora_bytes(LLAMA, flags)
    assert memory.compute_lora_bytes(qwen, flags) > 0
    mistral = build_model_spec(cfg.MISTRAL_7B_V03)  # MistralForCausalLM lists no embedding modules
    assert memory.compute_lora_bytes(mistral, flags) < dense
    assert mistral.architecture not in vllm.LORA_EMBEDDING_ARCHITECTURES


def test_layers_kvpilot_cannot_count_are_named_not_guessed() -> None:
    for config in (cfg.DEEPSEEK_V3, cfg.QWEN3_NEXT_80B):
        model = build_model_spec(config)
        assert memory.lora_unbudgeted_reason(model) is not None
        assert memory.compute_lora_bytes(model, _flags()) == 0
    assert memory.lora_unbudgeted_reason(LLAMA) is None


def test_the_budget_loads_the_buffers_with_the_weights() -> None:
    gpu = lookup_gpu("H100-SXM")
    settings = EngineSettings(max_model_len=8192, max_num_seqs=SEQS, max_num_batched_tokens=TOKENS)
    flags = _flags("--max-loras", "4", "--max-lora-rank", "64")
    plain = memory.compute_budget(LLAMA, gpu, settings)
    lora = memory.compute_budget(LLAMA, gpu, settings, lora=flags)
    assert lora.lora_gib * GIB == pytest.approx(1_478_105_216) and plain.lora_gib == 0.0
    assert lora.weights_gib - plain.weights_gib == pytest.approx(lora.lora_gib)
    assert plain.available_kv_cache_gib - lora.available_kv_cache_gib == pytest.approx(lora.lora_gib)
    assert lora.kv_cache_tokens < plain.kv_cache_tokens


def test_the_plan_names_the_lora_term_with_its_gib_and_no_longer_calls_it_unmodelled() -> None:
    gpu = lookup_gpu("H100-SXM")
    engine = vllm.build_engine_flags(["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"])
    assert engine.unmodelled == () and engine.lora == vllm.LoraFlags(4, 64)
    plan = compute_plan(LLAMA, gpu, 1, ServingBounds(), engine=engine)
    said = [w for w in plan.warnings if w.startswith("--enable-lora")]
    assert said == [
        f"--enable-lora: vLLM preallocates {plan.budget.lora_gib:.2f} GiB of LoRA buffers per GPU at load "
        "(4 x rank 64 in the model's dtype), counted in the weights."
    ]
    assert plan.budget.lora_gib > 1.3
    plain = compute_plan(LLAMA, gpu, 1, ServingBounds())
    assert plain.budget.kv_cache_tokens > plan.budget.kv_cache_tokens
    mla = compute_plan(build_model_spec(cfg.DEEPSEEK_V3), gpu, 8, ServingBounds(), engine=engine)
    assert any(w.startswith("--enable-lora is not in kvpilot's memory model") for w in mla.warnings)


def test_the_last_spelling_wins_and_vllms_refusals_are_refused() -> None:
    assert vllm.read_lora_flags(["--max-loras", "4"]) is None  # sizes without --enable-lora: LoRA is off
    assert vllm.read_lora_flags(["--enable-lora", "--no-enable-lora"]) is None
    assert vllm.read_lora_flags(["--enable-lora", "--disable-lora"]) is None
    assert vllm.read_lora_flags(["--disable-lora", "--enable-lora"]) == vllm.LoraFlags()
    assert vllm.read_lora_flags(["--enable-lora", "--max_loras=2", "--max-loras", "3"]) == vllm.LoraFlags(3)
    flags = vllm.read_lora_flags(["--enable-lora", "--fully-sharded-loras", "--no-fully-sharded-loras"])
    assert flags == vllm.LoraFlags()
    assert vllm.read_lora_flags(["--enable-lora", "--max-lora-rank", "48"]) == vllm.LoraFlags()
    for args, flag in (
        (["--max-lora-rank", "48"], "--max-lora-rank"),
        (["--lora-dtype", "float32"], "--lora-dtype"),
        (["--max-loras", "0"], "--max-loras"),
        (["--enable-lora=1"], "--enable-lora"),
        (["--max-lora", "2"], "--max-lora"),  # an abbreviation of two flags kvpilot reads
    ):
        with pytest.raises(errors.InvalidEngineArgs) as raised:
            vllm.check_engine_flags(args)
        assert raised.value.flag == flag
    vllm.check_engine_flags(
        ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "320", "--lora-dtype", "auto"]
    )


def test_a_class_that_fuses_qkv_and_gate_up_holds_one_a_each() -> None:
    phi3 = json.loads(
        (
            Path(__file__).parents[1] / "data" / "hf_configs" / "microsoft__Phi-3-mini-4k-instruct.json"
        ).read_text()
    )
    assert phi3["architectures"] == ["Phi3ForCausalLM"]
    fused = build_model_spec(phi3)
    unfused = build_model_spec({**phi3, "architectures": ["LlamaForCausalLM"]})  # same shapes, q/k/v packed
    flags = _flags("--max-loras", "4", "--max-lora-rank", "64")
    a_slices = (3 - 1) + (2 - 1)  # qkv_proj: 1 A instead of 3; gate_up_proj: 1 instead of 2
    element = 2  # bfloat16
    per_layer = a_slices * 4 * 64 * phi3["hidden_size"] * element
    saved = memory.compute_lora_bytes(unfused, flags) - memory.compute_lora_bytes(fused, flags)
    assert saved == phi3["num_hidden_layers"] * per_layer
