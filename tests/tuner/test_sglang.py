"""SGLang's facts (:mod:`kvpilot.tuner.sglang`), its budget and the engine seam.

The defaults are checked against SGLang's own ``ServerArgs`` in ``tests/contract/test_contract_sglang.py``;
here: the hand-worked figures of ``handle_gpu_memory_settings`` for a few GPUs, the failure texts
round-tripped through their parser, the budget's arithmetic, and what each engine answers at the seam.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner import engines, errors, gpus, sglang
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.vllm import serving as vllm_serving

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))


@pytest.mark.parametrize(
    ("gpu_mib", "tp", "chunk", "graph_bs", "fraction"),
    [
        # 16 GiB: 512 + 2048 x 1.5 + 128 + 8 x 2 = 3728 MiB; (16384 - 3728) / 16384 = 0.7725 -> 0.772
        (16 * 1024, 1, 2048, 8, 0.772),
        # 24 GiB: 512 + 6144 + 128 + 96 = 6880; 17696 / 24576 = 0.72005
        (24 * 1024, 1, 4096, 48, 0.72),
        # 40 GiB at TP 4: 512 + 6144 + 512 + 160 x 2 = 7488; 33472 / 40960 = 0.8172
        (40 * 1024, 4, 4096, 160, 0.817),
        # H100 (nvidia-smi 81559 MiB): 512 + 12288 + 128 + 512 = 13440 > 10 GiB floor; 68119 / 81559 = 0.8352
        (81559, 1, 8192, 256, 0.835),
        # H200 (143771 MiB): same reserve; 130331 / 143771 = 0.9065
        (143771, 1, 8192, 256, 0.907),
        # B200 (183359 MiB): 512 + 24576 + 128 + 1024 = 26240; 157119 / 183359 = 0.8569
        (183359, 1, 16384, 512, 0.857),
    ],
)
def test_tier_defaults_and_fraction(
    gpu_mib: int, tp: int, chunk: int, graph_bs: int, fraction: float
) -> None:
    assert sglang.default_chunked_prefill_size(gpu_mib) == chunk
    assert sglang.default_cuda_graph_max_bs(gpu_mib, tp) == graph_bs
    reserve = sglang.compute_reserve(
        gpu_mib, chunked_prefill_size=chunk, cuda_graph_max_bs=graph_bs, tp_size=tp
    )
    assert sglang.default_mem_fraction_static(gpu_mib, reserve) == fraction


def test_the_10_gib_floor_applies_only_above_60_gib() -> None:
    small = sglang.compute_reserve(48 * 1024, chunked_prefill_size=2048, cuda_graph_max_bs=8)
    large = sglang.compute_reserve(61 * 1024, chunked_prefill_size=2048, cuda_graph_max_bs=8)
    assert small.large_gpu_floor_mib == 0 and small.total_mib < 10 * 1024
    assert large.total_mib == 10 * 1024


def test_max_running_requests_caps_the_decode_graph() -> None:
    assert sglang.default_cuda_graph_max_bs(81559, 1, max_running_requests=16) == 16


def test_bad_input_is_refused_with_the_flag() -> None:
    with pytest.raises(ValueError, match="positive"):
        sglang.gpu_tier(0)
    with pytest.raises(errors.InvalidEngineArgs, match="nvfp4"):
        sglang.build_sglang_args(sglang.SglangSettings(kv_cache_dtype="nvfp4"))
    with pytest.raises(errors.InvalidEngineArgs, match="--mem-fraction-static"):
        sglang.build_sglang_args(sglang.SglangSettings(mem_fraction_static=1.2))
    with pytest.raises(errors.InvalidEngineArgs, match="--max-running-requests"):
        sglang.build_sglang_args(sglang.SglangSettings(max_running_requests=0))


def test_rendering_names_every_set_field_once() -> None:
    assert sglang.build_sglang_args(sglang.SglangSettings()) == []
    args = sglang.build_sglang_args(
        sglang.SglangSettings(context_length=8192, mem_fraction_static=0.8, tp_size=2)
    )
    assert args == ["--context-length", "8192", "--mem-fraction-static", "0.8", "--tp-size", "2"]


@pytest.mark.parametrize(
    ("text", "kind", "direction"),
    [
        (sglang.no_kv_pool_error(0.835), "no_kv_pool", sglang.RAISE),
        (sglang.no_kv_pool_error(None), "no_kv_pool", sglang.RAISE),
        (sglang.weights_exceed_static_error(0.7, 0.81234), "weights_exceed_static", sglang.RAISE),
        (
            "RuntimeError: Capture cuda graph failed: CUDA out of memory.\nPossible solutions:",
            "graph_capture_oom",
            -1,
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom", sglang.LOWER),
        (sglang.kv_pool_full_warning(3, 1024) + "\n" + sglang.kv_pool_full_warning(2, 10), "kv_pool_full", 0),
    ],
)
def test_failure_texts_round_trip(text: str, kind: str, direction: int) -> None:
    found = sglang.classify_log("[2026-12-05 10:00:00] INFO warming up\n" + text + "\n")
    assert found is not None and found.kind == kind and found.fraction_direction == direction
    assert found.line and found.line in text


def test_cuda_oom_reads_the_running_requests_its_batch_lines_logged_before_it() -> None:
    """SGLang logs every prefill batch and every 40th decode step with ``#running-req``; a CUDA OOM while
    serving carries the most of them before the traceback (lines after it, or a start-up log, do not)."""
    log = "\n".join(
        [
            "[2026-12-05 18:30:58 TP0] Prefill batch, #new-seq: 5, #new-token: 7500, #cached-token: 0, "
            "#token: 90112, token usage: 0.21, #running-req: 91, #queue-req: 1203, #pending-token: 0, ",
            "[2026-12-05 18:30:59 TP0] "
            + sglang.decode_batch_line(96, 144000, 0.34)
            + "cuda graph: True, gen throughput (token/s): 2871.40, #queue-req: 1198, ",
            "[2026-12-05 18:31:00 TP0] Decode batch. #running-req: 12, #token: 9000, token usage: 0.02, ",
            "[2026-12-05 18:31:04 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.",
            "[2026-12-05 18:31:05 TP0] Decode batch, #running-req: 400, #token: 9000, token usage: 0.02, ",
        ]
    )
    found = sglang.classify_log(log)
    assert found is not None and found.kind == "cuda_oom" and found.running_requests == 96
    bare = sglang.classify_log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.")
    assert bare is not None and bare.running_requests is None
    assert sglang.running_before_oom("[TP0] Decode batch [1200], #running-req: 7, #token: 1, ") == 7
    assert sglang.running_before_oom("#running-req: 7") is None  # not a batch line


def test_failure_parsers_read_the_numbers() -> None:
    weights = sglang.classify_log(sglang.weights_exceed_static_error(0.7, 0.81234))
    assert weights is not None and (weights.mem_fraction_static, weights.minimum_fraction) == (
        0.7,
        0.8123,
    )  # printed to 4 places
    assert "above 0.813 " in sglang.weights_exceed_static_error(0.7, 0.81234)
    pool = sglang.classify_log(sglang.no_kv_pool_error(0.835))
    assert pool is not None and pool.mem_fraction_static == 0.835
    full = sglang.classify_log(
        sglang.kv_pool_full_warning(3, 1024) + "\n" + sglang.kv_pool_full_warning(2, 10)
    )
    assert full is not None and full.retracted_requests == 5
    assert sglang.classify_log("Application startup complete.") is None


def test_budget_is_fraction_of_free_memory_less_weights() -> None:
    h100 = gpus.lookup_gpu("H100-SXM")
    budget = engines.compute_sglang_budget(LLAMA, h100, sglang.SglangSettings(context_length=8192))
    assert budget.settings.mem_fraction_static == 0.835  # SGLang's default on an H100
    assert budget.pool_bytes == int(budget.pre_load_bytes * 0.835) - budget.weight_bytes
    assert budget.cell_bytes == 8 * (128 + 128) * 32 * 2  # KV heads x (K + V) x layers x bf16
    assert budget.max_total_tokens == budget.pool_bytes // budget.cell_bytes
    fp8 = engines.compute_sglang_budget(
        LLAMA, h100, sglang.SglangSettings(kv_cache_dtype="fp8_e4m3", tp_size=2)
    )
    assert fp8.cell_bytes == budget.cell_bytes // 4  # half the heads per rank, half the bytes
    paged = engines.compute_sglang_budget(
        LLAMA, h100, sglang.SglangSettings(page_size=64, max_total_tokens=10**9)
    )
    assert paged.max_total_tokens % 64 == 0


def test_a_given_fraction_is_kept_and_too_small_a_one_says_raise_it() -> None:
    budget = engines.compute_sglang_budget(
        LLAMA, gpus.lookup_gpu("L4"), sglang.SglangSettings(mem_fraction_static=0.5)
    )
    assert not budget.feasible and budget.max_total_tokens == 0 and not budget.fraction_is_default
    assert "Please try to increase --mem-fraction-static" in engines.explain_sglang_budget(budget)[-1]


def test_the_plan_halves_the_prefill_chunk_until_it_fits() -> None:
    l4, settings = gpus.lookup_gpu("L4"), sglang.SglangSettings(context_length=8192)
    default = engines.compute_sglang_budget(LLAMA, l4, settings)
    planned = engines.plan_sglang_budget(LLAMA, l4, settings)
    assert not default.feasible and default.settings.chunked_prefill_size == 4096
    assert planned.feasible and planned.settings.chunked_prefill_size == 2048
    assert (planned.settings.mem_fraction_static or 0) > (default.settings.mem_fraction_static or 0)
    pinned = dataclasses.replace(settings, chunked_prefill_size=4096)
    assert not engines.plan_sglang_budget(LLAMA, l4, pinned).feasible  # a given chunk is kept


def test_unmodelled_architectures_are_refused() -> None:
    mistral = build_model_spec(lookup_model_config("mistralai/Mistral-7B-Instruct-v0.1"))  # sliding window
    with pytest.raises(errors.InvalidEngineArgs, match="full-attention and MLA models only"):
        engines.compute_sglang_budget(mistral, gpus.lookup_gpu("H100-SXM"))
    glm5 = build_model_spec(lookup_model_config("zai-org/GLM-5"))  # MLA with a DSA indexer
    with pytest.raises(errors.InvalidEngineArgs, match="sparse-attention indexer"):
        engines.compute_sglang_budget(glm5, gpus.lookup_gpu("H200"))
    kimi = build_model_spec(lookup_model_config("moonshotai/Kimi-K2.5"))  # MLA with a vision tower
    with pytest.raises(errors.InvalidEngineArgs, match="adjust_mem_fraction_for_vlm"):
        engines.compute_sglang_budget(kimi, gpus.lookup_gpu("H200"))


def test_an_mla_cell_is_the_latent_replicated_on_every_rank() -> None:
    deepseek = build_model_spec(lookup_model_config("deepseek-ai/DeepSeek-V3"))
    h200 = gpus.lookup_gpu("H200")
    for tp in (1, 8):
        budget = engines.compute_sglang_budget(deepseek, h200, sglang.SglangSettings(tp_size=tp))
        assert budget.cell_bytes == (512 + 64) * 61 * 2  # (kv_lora_rank + qk_rope_head_dim) x layers x bf16


def test_the_seam_maps_each_engines_meanings() -> None:
    vllm_engine, sglang_engine = engines.lookup_engine("vllm"), engines.lookup_engine("SGLang")
    assert (
        vllm_engine.serving.port == vllm_serving.PORT
        and vllm_engine.metrics.kv_usage == vllm_serving.KV_USAGE
    )
    assert vllm_engine.knobs.memory_share == "--gpu-memory-utilization"
    assert sglang_engine.serving.port == 30000 and sglang_engine.serving.metrics_args == ("--enable-metrics",)
    assert sglang_engine.metrics.preemptions == "sglang:num_retracted_requests_total"
    assert sglang_engine.metrics.kv_capacity_tokens == "sglang:max_total_num_tokens"
    assert sglang_engine.knobs.sequences == "--max-running-requests"
    assert sglang_engine.knobs.batched_tokens == "--chunked-prefill-size"
    with pytest.raises(ValueError, match="vLLM, SGLang, TGI"):
        engines.lookup_engine("trt-llm")


def test_the_memory_share_moves_the_right_way_for_each_engine() -> None:
    sglang_engine, vllm_engine = engines.ENGINES["SGLang"], engines.ENGINES["vLLM"]
    start = sglang_engine.classify_failure(sglang.no_kv_pool_error(0.8))
    runtime = sglang_engine.classify_failure("torch.OutOfMemoryError: CUDA out of memory.")
    pressure = sglang_engine.classify_failure(sglang.kv_pool_full_warning(1, 1))
    assert start is not None and (start.kind, start.memory_share_direction) == ("start_memory_short", 1)
    assert runtime is not None and (runtime.kind, runtime.memory_share_direction) == ("runtime_oom", -1)
    assert pressure is not None and (pressure.kind, pressure.memory_share_direction) == ("kv_pressure", 0)
    no_blocks = vllm_engine.classify_failure("ValueError: No available memory for the cache blocks. Try ...")
    assert no_blocks is not None and (no_blocks.kind, no_blocks.memory_share_direction) == (
        "start_memory_short",
        1,
    )
    assert vllm_engine.classify_failure("INFO Application startup complete.") is None


def test_the_rendered_flags_parse_back_into_the_settings() -> None:
    settings = sglang.SglangSettings(
        context_length=8192,
        mem_fraction_static=0.81,
        max_running_requests=48,
        kv_cache_dtype="fp8_e4m3",
        tp_size=2,
    )
    args = ["--model-path", "m", *sglang.build_sglang_args(settings), "--enable-metrics"]
    assert sglang.parse_sglang_args(args) == settings
    assert sglang.parse_sglang_args(["--chunked-prefill-size=4096"]).chunked_prefill_size == 4096
    with pytest.raises(errors.InvalidEngineArgs, match="--context-length"):
        sglang.parse_sglang_args(["--context-length", "long"])
