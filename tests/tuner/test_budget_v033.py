"""The 0.33 budget, term by term: Model Runner V2's sampler state, PP + 1 in-flight batches, the
batch defaults (GB10, ``--performance-mode``), capture sizes, auto-fit and ``--kv-cache-memory-bytes``.

Expected numbers are derived from the 0.33 wheel's code as each test says (the tensors' shapes,
the reservation formula); ``tests/contract/test_contract_runner.py`` checks the same functions
against vLLM's own classes.
"""

from __future__ import annotations

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import budget as memory
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec

H100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink", nvml_total_bytes=81_559 << 20)
B200 = GpuSpec("B200", int(178.4 * GIB), (10, 0), True, "nvlink")
GB10 = GpuSpec("GB10", int(119.7 * GIB), (12, 1), True, "pcie")
LLAMA = build_model_spec(cfg.LLAMA_31_8B)
MISTRAL_V01 = build_model_spec(cfg.MISTRAL_7B_V01)
AT_32K = EngineSettings(max_model_len=32768, gpu_memory_utilization=0.92)


def test_sampler_state_is_output_bin_counts_plus_two_bitmasks() -> None:
    # penalties.py: output_bin_counts (seqs x vocab int32) + prompt_bin_mask (seqs x cdiv(vocab, 32)
    # int32); structured_outputs.py: grammar_bitmask (seqs x cdiv(vocab, 32) int32) + logits_indices.
    seqs, vocab = 1024, 128256
    words = -(-vocab // 32)
    assert vllm.compute_sampler_state_bytes(seqs, vocab) == seqs * 4 * (vocab + words) + seqs * 4 * (
        words + 1
    )
    assert vllm.compute_sampler_state_bytes(2 * seqs, vocab) == 2 * vllm.compute_sampler_state_bytes(
        seqs, vocab
    )


def test_v2_sampler_state_comes_out_of_the_kv_cache_under_the_v2_runner_only() -> None:
    new = memory.compute_budget(LLAMA, H100, AT_32K)
    v1 = memory.compute_budget(LLAMA, H100, AT_32K, model_runner_v2=False)  # VLLM_USE_V2_MODEL_RUNNER=0
    old = memory.compute_budget(LLAMA, H100, AT_32K, vllm_version="0.21.0")  # V1 runner by default
    state = vllm.compute_sampler_state_bytes(1024, LLAMA.vocab_size)
    assert new.sampler_state_gib == pytest.approx(state / GIB)
    assert v1.sampler_state_gib == 0 and old.sampler_state_gib == 0
    assert v1.available_kv_cache_gib - new.available_kv_cache_gib == pytest.approx(state / GIB, abs=1e-9)
    assert new.kv_cache_tokens < v1.kv_cache_tokens


def test_sampler_state_scales_with_max_num_seqs() -> None:
    small = memory.compute_budget(LLAMA, H100, AT_32K.replace(max_num_seqs=56))
    assert small.sampler_state_gib * GIB == vllm.compute_sampler_state_bytes(56, LLAMA.vocab_size)
    assert small.sampler_state_gib < 0.03  # the audit's "~27 MiB" for the planner's 56 sequences


def test_sampler_state_sits_on_the_last_pipeline_stage() -> None:
    pp = memory.compute_budget(LLAMA, H100, AT_32K, pipeline_parallel_size=2)
    assert pp.sampler_state_gib == 0  # reported for the first stage; the last one holds it
    last_only = memory.compute_budget(LLAMA, H100, AT_32K, pipeline_parallel_size=2, model_runner_v2=False)
    assert pp.num_gpu_blocks <= last_only.num_gpu_blocks


@pytest.mark.parametrize(
    ("version", "pp", "v2", "batches"),
    [
        ("0.33.0", 1, None, 2),
        ("0.33.0", 2, None, 3),  # V2 + async: PP + 1
        ("0.33.0", 4, None, 5),
        ("0.33.0", 2, False, 2),  # VLLM_USE_V2_MODEL_RUNNER=0: PP
        ("0.32.0", 2, None, 3),  # V2 by default from 0.29
        ("0.28.0", 2, None, 1),  # before async scheduling: one batch
        ("0.29.0", 2, None, 1),
    ],
)
def test_in_flight_batches(version: str, pp: int, v2: bool | None, batches: int) -> None:
    assert vllm.in_flight_batches(vllm.parse_version(version), pp, v2) == batches


def test_sliding_window_reservation_at_pp2_holds_pp_plus_one_batches() -> None:
    # The audit's Mistral-7B-v0.1 case: window 4,096, PP 2, L = 32,768, 8192 batched tokens:
    # cdiv(min(4095 + 3 x 8192, 32768), 16) + 1 = 1793 blocks per request (kv_cache_interface.py).
    budget = memory.compute_budget(MISTRAL_V01, H100, AT_32K, pipeline_parallel_size=2)
    per_request = -(-min(4095 + 3 * 8192, 32768) // 16) + 1
    assert per_request == 1793
    assert budget.num_gpu_blocks / budget.max_concurrency == pytest.approx(per_request)
    v1 = memory.compute_budget(MISTRAL_V01, H100, AT_32K, pipeline_parallel_size=2, model_runner_v2=False)
    assert v1.num_gpu_blocks / v1.max_concurrency == pytest.approx(-(-min(4095 + 2 * 8192, 32768) // 16) + 1)


def test_gb10_stays_on_the_small_batch_tier_from_033() -> None:
    assert vllm.default_batch_limits((0, 33), GB10) == vllm.BatchDefaults(2048, 256)
    assert vllm.default_batch_limits((0, 19), GB10) == vllm.BatchDefaults(8192, 1024)


def test_performance_mode_throughput_doubles_the_defaults() -> None:
    base = vllm.default_batch_limits((0, 33), H100)
    fast = vllm.default_batch_limits((0, 33), H100, "throughput")
    assert (fast.max_num_batched_tokens, fast.max_num_seqs) == (
        2 * base.max_num_batched_tokens,
        2 * base.max_num_seqs,
    )
    budget = memory.compute_budget(LLAMA, H100, AT_32K, performance_mode="throughput")
    assert budget.sampler_state_gib * GIB == vllm.compute_sampler_state_bytes(2048, LLAMA.vocab_size)


def test_capture_sizes_cap_at_batched_tokens_and_add_max_num_seqs() -> None:
    grid = vllm.cuda_graph_capture_sizes((0, 33), H100, 256, 8192)
    assert grid == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # min(2 x 256, 512) = 512
    assert len(grid) == 51
    assert 100 in vllm.cuda_graph_capture_sizes((0, 33), H100, 100, 8192)  # off the grid: appended
    capped = vllm.cuda_graph_capture_sizes((0, 33), H100, 256, 100)
    assert max(capped) == 100 and 100 in capped
    assert max(vllm.cuda_graph_capture_sizes((0, 33), B200, 1024, 16384)) == 1024  # SM100: 1024
    interactive = vllm.cuda_graph_capture_sizes((0, 33), H100, 256, 8192, "interactivity")
    assert set(range(1, 33)) <= set(interactive) and len(interactive) == 32 + len(grid) - 7


def test_fewer_capture_sizes_cost_less_graph_memory() -> None:
    wide = memory.compute_budget(LLAMA, H100, AT_32K.replace(max_num_seqs=256))
    narrow = memory.compute_budget(LLAMA, H100, AT_32K.replace(max_num_seqs=256, max_num_batched_tokens=256))
    assert narrow.cuda_graph_gib < wide.cuda_graph_gib


def test_auto_fit_derives_the_config_maximum_and_keeps_it_when_it_fits() -> None:
    # Audit item 10: Llama-3.1-8B on one H100 pinned to -1: vLLM keeps 131,072 (it fits), batch
    # defaults from it (8192 / 1024), about 3.6 sequences of the full context.
    budget = memory.compute_budget(LLAMA, H100, EngineSettings(max_model_len=-1))
    assert budget.starts and budget.max_model_len == 131072
    assert budget.activation_gib > 0
    assert 3.0 < budget.max_concurrency < 4.0
    assert budget.kv_cache_tokens == int(budget.max_concurrency * 131072)


def test_auto_fit_shortens_to_what_the_cache_holds() -> None:
    small = memory.compute_budget(LLAMA, H100, EngineSettings(max_model_len=-1, gpu_memory_utilization=0.3))
    pinned = memory.compute_budget(
        LLAMA, H100, EngineSettings(max_model_len=131072, gpu_memory_utilization=0.3)
    )
    assert small.starts and not pinned.starts
    assert small.max_model_len == pinned.longest_fitting_len


def test_kv_cache_memory_bytes_is_the_pool_exactly() -> None:
    pool = 20 * GIB + 12345
    a = memory.compute_budget(LLAMA, H100, AT_32K, kv_cache_memory_bytes=pool)
    b = memory.compute_budget(
        LLAMA, H100, AT_32K.replace(gpu_memory_utilization=0.6), kv_cache_memory_bytes=pool
    )
    assert a.available_kv_cache_gib * GIB == pool
    assert a.num_gpu_blocks == pool // (2 << 20) == b.num_gpu_blocks  # utilisation ignored for the pool
    assert a.starts and b.starts


def test_kv_cache_memory_bytes_too_large_for_the_gpu_is_an_oom() -> None:
    budget = memory.compute_budget(LLAMA, H100, AT_32K, kv_cache_memory_bytes=70 * GIB)
    assert not budget.starts
    assert budget.error is not None and "CUDA out of memory" in budget.error
    assert "--kv-cache-memory-bytes" in budget.error


@pytest.mark.parametrize(
    ("value", "parsed"), [(None, None), ("0", False), ("1", True), (" 0 ", False), ("yes", None)]
)
def test_the_runner_env_is_read_as_vllm_reads_it(value: str | None, parsed: bool | None) -> None:
    assert vllm.parse_v2_runner_env(value) is parsed


def test_in_flight_tokens_are_batches_times_the_effective_batch() -> None:
    eff = vllm.compute_effective_settings(EngineSettings(max_model_len=32768), H100, (0, 33), 131072)
    assert eff.max_num_batched_tokens == 8192
    assert vllm.compute_in_flight_tokens(eff, (0, 33), 2) == 3 * 8192
    assert vllm.compute_in_flight_tokens(eff, (0, 33), 2, model_runner_v2=False) == 2 * 8192
    assert vllm.compute_in_flight_tokens(eff, (0, 33), 1) == 2 * 8192
