"""TGI 3.3.7's warm-up budget (:mod:`kvpilot.tuner.engines.tgi_budget`) against TGI's own formulas.

Every expected figure is derived here from TGI's code as written at tag v3.3.7 (the constants spelled out
with their file and line, not read back from kvpilot), from the model's config numbers; kvpilot's own
estimates (CUDA context, weights) are the inputs the budget reports. Changing a TGI constant in
:mod:`kvpilot.tuner.tgi.warmup` (the wiggle room, a block size, a card's flops) fails a test here.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvpilot.tuner import engines, errors, gpus, tgi
from kvpilot.tuner.engines import tgi_budget
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.tgi import warmup

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MIB = 1 << 20
# server/text_generation_server/models/globals.py line 32, utils/dist.py line 13
WIGGLE, FRACTION = 0.90, 1.0
# launcher/src/main.rs line 1806; f16 flops, lines 1762, 1773, 1776
LAUNCHER_WIGGLE = 0.95
CARD_FLOPS = {"L4": 121 * 10**12, "A100-80GB": 312 * 10**12, "H100-SXM": 900 * 10**12}


def spec_of(model: str = LLAMA):  # type: ignore[no-untyped-def]
    return build_model_spec(lookup_model_config(model))


def llama_flop() -> int:
    """``Config::flop`` (launcher/src/main.rs lines 281-308) for Llama-3.1-8B's config.json."""
    heads, kv, d, h, inter, layers = 32, 8, 128, 4096, 14336, 32
    attn = 2 * heads * d * h * 3 + 2 * kv * d * h * 2
    return (attn + 2 * 3 * h * inter) * layers


def tgi_num_blocks(total: int, used: int, block_bytes: int, warmup_blocks: int, fraction: float) -> int:
    """``flash_causal_lm.py`` lines 1556-1563 with ``get_cuda_free_memory`` (``import_utils.py`` 13-17)."""
    free_now = total - used
    free = max(0, free_now - (1 - fraction * WIGGLE) * total)
    return int(free // block_bytes) + warmup_blocks


@pytest.mark.parametrize("gpu_name", sorted(CARD_FLOPS))
def test_default_prefill_is_the_launchers_compute_optimal(gpu_name: str) -> None:
    gpu = gpus.lookup_gpu(gpu_name)
    budget = engines.compute_tgi_budget(spec_of(), gpu)
    optimal = CARD_FLOPS[gpu_name] // llama_flop()
    # vram_maximum (lines 62-89): nvidia-smi MiB x 2^20 x fraction x 0.95 - model_vram, over token_vram
    params = (3 * 14336 * 4096 + (32 + 2 * 8) * 128 + 32 * 128 * 4096) * 32 + 2 * 4096 * 128256
    per_token = 8 * 2 * 128 * 2 * 32 + (14336 + 14336 // 2) * 2 * 3
    vram_cap = (
        int(float((gpu.nvml_total_bytes or 0) // MIB * MIB) * LAUNCHER_WIGGLE) - params * 2
    ) // per_token
    assert budget.prefill_default is not None
    assert budget.prefill_default.compute_optimal == optimal
    assert budget.prefill_default.vram_maximum == vram_cap
    assert budget.max_batch_prefill_tokens == min(optimal, 131072, vram_cap)


def test_unknown_card_falls_back_to_4096() -> None:
    gpu = gpus.lookup_gpu("RTX-4090")  # nvidia-smi's "NVIDIA GeForce RTX 4090" is not the launcher's key
    budget = engines.compute_tgi_budget(spec_of(), gpu)
    assert budget.prefill_default is not None and budget.prefill_default.card is None
    assert budget.max_batch_prefill_tokens == min(4096, budget.prefill_default.vram_maximum or 4096)


@pytest.mark.parametrize("gpu_name", sorted(CARD_FLOPS))
@pytest.mark.parametrize("max_total", [None, 8192])
def test_max_batch_total_tokens_is_tgis_warmup_formula(gpu_name: str, max_total: int | None) -> None:
    gpu = gpus.lookup_gpu(gpu_name)
    settings = tgi.TgiSettings(max_batch_prefill_tokens=4096, max_total_tokens=max_total)
    budget = engines.compute_tgi_budget(spec_of(), gpu, settings)
    # Llama-3.1-8B: head_dim 128 -> flashinfer, BLOCK_SIZE 1 (globals.py line 42); K and V in bf16
    block_bytes = 1 * 8 * 128 * 32 * 2 * 2
    assert (budget.attention, budget.block_size, budget.block_bytes) == ("flashinfer", 1, block_bytes)
    # grpc_client.rs lines 119-194: one request of 4096 (no --max-input-tokens), max_total - 4096 new
    blocks = (max_total - 1) if max_total else 4096
    assert [(r.prompt_tokens, r.blocks) for r in budget.warmup_requests] == [(4096, blocks)]
    # the launcher's per-token MLP estimate (main.rs lines 320-328) for the prefill's activations
    activation = 4096 * (14336 + 14336 // 2) * 2 * 3
    assert budget.activation_bytes == activation
    used = budget.non_torch_bytes + budget.weight_bytes + blocks * block_bytes + activation
    expected = tgi_num_blocks(gpu.total_bytes, used, block_bytes, blocks, FRACTION)
    assert budget.max_batch_total_tokens == expected * 1
    assert budget.max_total_tokens == (max_total or min(expected, 131072))
    assert budget.concurrency == expected // budget.max_total_tokens
    assert budget.feasible


def test_a_wiggle_room_mutation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = gpus.lookup_gpu("H100-SXM")
    settings = tgi.TgiSettings(max_batch_prefill_tokens=4096)
    before = engines.compute_tgi_budget(spec_of(), gpu, settings).max_batch_total_tokens
    monkeypatch.setattr(warmup, "TGI_WIGGLE_ROOM", 0.80)
    after = engines.compute_tgi_budget(spec_of(), gpu, settings).max_batch_total_tokens
    assert after != before  # so test_max_batch_total_tokens_is_tgis_warmup_formula would fail


def test_the_memory_fraction_scales_what_is_kept_back() -> None:
    gpu = gpus.lookup_gpu("A100-80GB")
    settings = tgi.TgiSettings(max_batch_prefill_tokens=4096, cuda_memory_fraction=0.8)
    budget = engines.compute_tgi_budget(spec_of(), gpu, settings)
    used = budget.non_torch_bytes + budget.weight_bytes + budget.warmup_kv_bytes + budget.activation_bytes
    expected = tgi_num_blocks(gpu.total_bytes, used, budget.block_bytes, budget.warmup_blocks, 0.8)
    assert budget.num_blocks == expected
    assert budget.rendered.cuda_memory_fraction == 0.8
    assert engines.compute_tgi_budget(spec_of(), gpu).rendered.cuda_memory_fraction is None


def test_warmup_batch_splits_by_max_input_and_rounds_to_blocks() -> None:
    # flashdecoding's 256-token blocks; paged's 16 (globals.py lines 39-46)
    requests = warmup.warmup_batch(10_000, 4000, 4096, 16)
    assert [r.prompt_tokens for r in requests] == [4000, 4000, 2000]
    assert {r.blocks for r in requests} == {math.ceil((4096 - 1) / 16)}
    assert [r.blocks for r in warmup.warmup_batch(1000, None, None, 256)] == [math.ceil(1000 / 256)]


def test_attention_backend_and_block_size() -> None:
    # launcher/src/main.rs lines 146-199
    assert warmup.resolve_attention(128, "llama", (9, 0)) == "flashinfer"
    assert warmup.resolve_attention(96, "phi3", (8, 0)) == "flashdecoding"
    assert warmup.resolve_attention(128, "falcon", (8, 9)) == "flashdecoding"
    assert warmup.resolve_attention(96, "phi3", (7, 5)) == "paged"
    assert [warmup.BLOCK_SIZES[a] for a in ("flashinfer", "flashdecoding", "paged")] == [1, 256, 16]
    assert not warmup.supports_chunking("paged") and warmup.supports_chunking("flashinfer")


def test_without_chunking_the_prefill_must_hold_an_input() -> None:
    # a head size flashinfer does not take (main.rs line 155) on a compute capability 7.5 GPU: paged
    config = dict(lookup_model_config("Qwen/Qwen2.5-1.5B-Instruct"), head_dim=96)
    spec = build_model_spec(config)
    t4 = gpus.lookup_gpu("T4")
    settings = tgi.TgiSettings(max_total_tokens=4096, max_input_tokens=4000, max_batch_prefill_tokens=2048)
    budget = engines.compute_tgi_budget(spec, t4, settings)
    assert budget.attention == "paged" and not budget.chunking and budget.block_size == 16
    assert any("`max_batch_prefill_tokens` must be >= `max_input_tokens`" in r for r in budget.refusals)
    plan = engines.plan_tgi_budget(spec, t4)
    assert plan.feasible and plan.max_input_tokens <= plan.max_batch_prefill_tokens
    ampere = dataclasses.replace(t4, compute_capability=(8, 0))
    assert engines.compute_tgi_budget(spec, ampere, settings).attention == "flashdecoding"


def test_fp8_kv_cache_halves_the_block() -> None:
    gpu = gpus.lookup_gpu("H100-SXM")
    settings = tgi.TgiSettings(max_batch_prefill_tokens=4096)
    bf16 = engines.compute_tgi_budget(spec_of(), gpu, settings)
    fp8 = engines.compute_tgi_budget(spec_of(), gpu, settings, kv_cache_dtype="fp8_e4m3fn")
    assert fp8.block_bytes * 2 == bf16.block_bytes
    assert fp8.max_batch_total_tokens > bf16.max_batch_total_tokens
    with pytest.raises(errors.InvalidEngineArgs, match="kv-cache-dtype 'fp8'"):
        engines.compute_tgi_budget(spec_of(), gpu, settings, kv_cache_dtype="fp8")


def test_refusals_are_tgis_own_texts() -> None:
    l4 = gpus.lookup_gpu("L4")
    too_long = engines.compute_tgi_budget(spec_of(), l4, tgi.TgiSettings(max_batch_prefill_tokens=4096))
    settings = tgi.TgiSettings(
        max_batch_prefill_tokens=4096, max_total_tokens=too_long.max_batch_total_tokens * 4
    )
    budget = engines.compute_tgi_budget(spec_of(), l4, settings)
    assert not budget.prefill_fits  # the warm-up's own KV reservation does not fit beside the weights
    assert budget.refusals == [tgi.prefill_tokens_error(4096)]
    big = engines.compute_tgi_budget(spec_of(), l4, tgi.TgiSettings(max_batch_prefill_tokens=4096))
    assert big.feasible
    wide = dataclasses.replace(big, settings=dataclasses.replace(big.settings, max_total_tokens=10**6))
    assert tgi.max_total_tokens_error(10**6) in wide.refusals
    seventy = engines.plan_tgi_budget(
        spec_of("meta-llama/Llama-3.1-70B-Instruct"), gpus.lookup_gpu("H100-SXM")
    )
    assert not seventy.weights_fit and not seventy.feasible
    assert "shard the model over more GPUs" in engines.explain_tgi_budget(seventy)[-1]


def test_plan_pins_tgis_defaults_and_starts() -> None:
    for gpu_name in CARD_FLOPS:
        gpu = gpus.lookup_gpu(gpu_name)
        default = engines.compute_tgi_budget(spec_of(), gpu)
        plan = engines.plan_tgi_budget(spec_of(), gpu)
        assert plan.feasible, gpu_name
        assert plan.max_total_tokens == default.max_total_tokens
        assert plan.max_input_tokens == plan.max_total_tokens - 1
        assert plan.max_batch_total_tokens >= plan.max_total_tokens
        args = tgi.build_tgi_args(plan.rendered)
        assert args[:2] == ["--max-input-tokens", str(plan.max_input_tokens)]
        assert "--max-batch-total-tokens" not in args and "--num-shard" not in args


def test_plan_halves_the_prefill_until_it_fits() -> None:
    spec = spec_of("meta-llama/Llama-3.1-70B-Instruct")
    first = engines.compute_tgi_budget(spec, gpus.lookup_gpu("L40S"), tgi.TgiSettings(num_shard=4))
    plan = engines.plan_tgi_budget(spec, gpus.lookup_gpu("L40S"), tgi.TgiSettings(num_shard=4))
    assert plan.feasible and plan.rendered.num_shard == 4
    assert plan.max_batch_prefill_tokens <= first.max_batch_prefill_tokens


def test_shards_split_kv_heads_and_more_shards_than_heads_is_refused() -> None:
    spec = spec_of("Qwen/Qwen2.5-1.5B-Instruct")  # 2 KV heads
    two = engines.compute_tgi_budget(spec, gpus.lookup_gpu("L4"), tgi.TgiSettings(num_shard=2))
    one = engines.compute_tgi_budget(spec, gpus.lookup_gpu("L4"))
    assert two.block_bytes * 2 == one.block_bytes
    with pytest.raises(errors.InvalidEngineArgs, match="num_kv_heads > 0"):
        engines.compute_tgi_budget(spec, gpus.lookup_gpu("L4"), tgi.TgiSettings(num_shard=4))


@pytest.mark.parametrize(
    ("model", "text"),
    [
        ("Qwen/Qwen3-8B", "no model of its own for model_type 'qwen3'"),
        ("google/gemma-3-27b-it", "'gemma3_text' model has a vision tower"),
        ("deepseek-ai/DeepSeek-V3", "model_type 'deepseek_v3'"),
        ("openai/gpt-oss-20b", "model_type 'gpt_oss'"),
    ],
)
def test_models_tgi_does_not_serve_or_kvpilot_does_not_size_are_refused_by_name(
    model: str, text: str
) -> None:
    with pytest.raises(errors.InvalidEngineArgs, match=text):
        engines.plan_tgi_budget(spec_of(model), gpus.lookup_gpu("H100-SXM"))


def test_unloadable_quantization_is_refused() -> None:
    config = dict(lookup_model_config(LLAMA))
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(errors.InvalidEngineArgs, match="'bitsandbytes' quantization"):
        engines.plan_tgi_budget(build_model_spec(config), gpus.lookup_gpu("L4"))


def test_explanation_names_every_step() -> None:
    plan = engines.plan_tgi_budget(spec_of(), gpus.lookup_gpu("L4"))
    text = "\n".join(engines.explain_tgi_budget(plan))
    for part in (
        "compute-optimal",
        "Attention flashinfer",
        f"KV block {plan.block_bytes} bytes",
        "Warm-up batch",
        f"(1 - 1.0 x {warmup.TGI_WIGGLE_ROOM})",
        f"max batch total tokens {plan.max_batch_total_tokens}",
        f"= {plan.concurrency} request(s) at once",
    ):
        assert part in text, part
    assert tgi_budget.MIN_PREFILL_TOKENS == 256
