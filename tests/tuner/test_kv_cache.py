"""KV-cache geometry: pages, grouping of hybrid models, blocks, capacity, the fit check."""

from __future__ import annotations

import dataclasses

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import vllm
from kvpilot.tuner.memory import kv_cache
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.types import GIB

V019 = (0, 19, 0)
V033 = (0, 33, 0)


def test_worked_example_of_the_reference() -> None:
    # vllm_reference §1.4: Llama-3.1-8B, TP 1, block 16, "Available KV cache memory: 52.31 GiB".
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.LLAMA_31_8B))
    assert layout.groups[0].page_bytes == 65_536
    assert layout.bytes_per_block == 2 * 1024 * 1024
    assert layout.bytes_per_token == 128 * 1024
    capacity = kv_cache.compute_capacity(layout, int(52.31 * GIB), 32768, 8192, V033)
    assert capacity.num_blocks == 26_782
    assert capacity.blocks_per_request == 2048
    assert round(capacity.max_concurrency, 2) == 13.08
    assert capacity.tokens == pytest.approx(26_782 * 16, rel=0.001)
    assert capacity.fits


@pytest.mark.parametrize(("tp", "per_token"), [(1, 131072), (2, 65536), (4, 32768), (8, 16384), (16, 16384)])
def test_tensor_parallel_divides_kv_heads_until_one(tp: int, per_token: int) -> None:
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.LLAMA_31_8B), tensor_parallel_size=tp)
    assert layout.bytes_per_token == per_token


def test_fp8_halves_the_page() -> None:
    spec = build_model_spec(cfg.LLAMA_31_8B)
    auto = kv_cache.compute_kv_layout(spec)
    fp8 = kv_cache.compute_kv_layout(spec, kv_cache_dtype="fp8")
    assert fp8.bytes_per_block * 2 == auto.bytes_per_block


def test_mla_latent_is_not_divided_by_tp() -> None:
    spec = build_model_spec(cfg.DEEPSEEK_V3)
    for tp in (1, 8):
        layout = kv_cache.compute_kv_layout(spec, tensor_parallel_size=tp)
        assert layout.bytes_per_token == 61 * 576 * 2  # 70,272 B
    assert kv_cache.compute_kv_layout(spec, kv_cache_dtype="fp8").bytes_per_token == 35_136


def test_gpt_oss_two_groups_of_twelve_and_the_logged_concurrency() -> None:
    # vLLM 0.19, TP 2, 323,972 blocks -> 2,591,776 tokens and 316.07x at 8,192 tokens.
    layout = kv_cache.compute_kv_layout(
        build_model_spec(cfg.GPT_OSS_20B), tensor_parallel_size=2, vllm_version=V019
    )
    assert [g.layers for g in layout.groups] == [12, 12]
    assert layout.bytes_per_block == 16 * 4 * 2 * 64 * 2 * 12
    capacity = kv_cache.compute_capacity(layout, 0, 8192, 8192, V019, num_blocks=323_972)
    assert capacity.tokens == 2_591_776
    assert round(capacity.max_concurrency, 2) == 316.07


def test_gemma3_groups_of_ten() -> None:
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.GEMMA_3_27B), vllm_version=V019)
    assert len(layout.groups) == 7  # 52 sliding in 6 groups of <= 10, 10 full in 1
    assert layout.bytes_per_block == 10 * 16 * 16 * 2 * 128 * 2
    capacity = kv_cache.compute_capacity(layout, 0, 8192, 8192, V019, num_blocks=15_997)
    assert capacity.tokens == 36_560  # the logged "GPU KV cache size"


def test_llama4_chunked_local_layers_keep_their_groups_in_019_and_033() -> None:
    spec = build_model_spec(cfg.LLAMA_4_SCOUT)
    old = kv_cache.compute_kv_layout(spec, tensor_parallel_size=4, vllm_version=V019)
    new = kv_cache.compute_kv_layout(spec, tensor_parallel_size=4, vllm_version=V033)
    assert len(old.groups) == 4 and old.bytes_per_block == 12 * 16 * 2 * 2 * 128 * 2
    assert new == old  # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 in 0.33
    capacity = kv_cache.compute_capacity(old, 0, 8192, 8192, V019, num_blocks=91_495)
    assert capacity.tokens == 365_968 and round(capacity.max_concurrency, 2) == 44.68  # as logged


def test_llama4_scout_033_matches_vllms_own_planning() -> None:
    # Audit of the 0.33.0 wheel, 3.3: TP 1, bf16, 40 GiB, L = 32,768 -> 54,613 blocks, 268,864 tokens.
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.LLAMA_4_SCOUT), vllm_version=V033)
    capacity = kv_cache.compute_capacity(layout, 40 * GIB, 32768, 2 * 8192, V033)
    assert (capacity.num_blocks, capacity.tokens) == (54_613, 268_864)


def test_sliding_window_holds_only_the_window_per_request() -> None:
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.MISTRAL_7B_V01))
    # 0.33: window - 1 + 2 x 8192 in flight, +1 block; a full-attention model would need 2048 blocks.
    assert layout.blocks_per_request(32768, 2 * 8192) == -(-(4095 + 16384) // 16) + 1


@pytest.mark.parametrize(
    ("capability", "block", "pages", "blocks", "tokens"),
    [
        ((9, 0), 576, 3, 3_034, 1_506_335),  # H100: FlashInfer GDN, 64-token alignment, a checkpoint page
        ((8, 0), 544, 2, 3_212, None),  # A100: Triton GDN, align mode's two pages
    ],
)
def test_qwen3_next_align_mode_matches_vllms_own_planning(
    capability: tuple[int, int], block: int, pages: int, blocks: int, tokens: int | None
) -> None:
    """Audit of the 0.33.0 wheel, 3.3: Qwen3-Next TP 1, bf16, 40 GiB, L = 32,768."""
    spec = build_model_spec(cfg.QWEN3_NEXT_80B)
    layout = kv_cache.compute_kv_layout(spec, compute_capability=capability)
    assert layout.block_size == block
    assert len(layout.groups) == 4 and layout.state_groups == 3  # 36 linear layers in 3 groups, 12 full
    assert layout.state_blocks_per_request() == 3 * pages
    assert layout.blocks_per_request(262144, 16384) == 3 * pages + -(-262144 // block)
    capacity = kv_cache.compute_capacity(layout, 40 * GIB, 32768, 16384, V033)
    assert capacity.num_blocks == blocks
    if tokens is not None:
        assert capacity.tokens == tokens
    no_prefix = kv_cache.compute_kv_layout(spec, compute_capability=capability, enable_prefix_caching=False)
    assert no_prefix.block_size == 544 and no_prefix.state_blocks_per_request() == 3


def test_fit_check_reserves_the_null_block_in_033() -> None:
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.LLAMA_31_8B))
    exact = 2048 * layout.bytes_per_block  # one 32k request, nothing to spare
    assert kv_cache.compute_capacity(layout, exact, 32768, 8192, V019).fits
    tight = kv_cache.compute_capacity(layout, exact, 32768, 8192, V033)
    assert not tight.fits and tight.longest_fitting_len == 32768 - 16


def test_longest_fitting_len_of_an_empty_cache_is_zero() -> None:
    layout = kv_cache.compute_kv_layout(build_model_spec(cfg.LLAMA_31_8B))
    assert kv_cache.compute_longest_fitting_len(layout, 0, 8192, 8192) == 0
    unused = dataclasses.replace(layout)
    assert kv_cache.compute_num_blocks(-5, unused) == 0


@pytest.mark.parametrize("dtype", vllm.KV_CACHE_DTYPES)
def test_every_vllm_kv_dtype_is_sized_or_refused_with_a_domain_error(dtype: str) -> None:
    """Defect (issue 9, #4): an unmodelled dtype raised a bare ValueError; now it is sized or refused,
    and the refusal names the dtype. The modelled list is exactly what the API accepts."""
    from kvpilot.tuner import errors, memory
    from kvpilot.tuner.types import EngineSettings, GpuSpec

    spec = build_model_spec(cfg.LLAMA_31_8B)
    h100 = GpuSpec("H100-SXM", 85_031_714_816, (9, 0), True, "nvlink")
    settings = EngineSettings(max_model_len=8192, kv_cache_dtype=dtype)
    if dtype in vllm.MODELLED_KV_CACHE_DTYPES:
        assert memory.compute_budget(spec, h100, settings).kv_bytes_per_token > 0
    else:
        with pytest.raises(errors.InvalidEngineArgs, match=dtype):
            memory.compute_budget(spec, h100, settings)
