"""SGLang's fp8 KV cache: planned exactly where vLLM's planner plans one (:func:`engines.plan_sglang_kv`).

Allowed (``allowFp8KvCache``), supported (the catalogue's ``fp8_kv``: not an A100) and useful (no
concurrency asked, or the asked one missed in 16 bits); SGLang's spelling (``fp8_e4m3``); a given dtype is
never changed.
"""

from __future__ import annotations

from kvpilot.tuner import engines, gpus, sglang
from kvpilot.tuner.model import build_model_spec, lookup_model_config

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
L4, A10G, A100, H100 = (gpus.lookup_gpu(n) for n in ("L4", "A10G", "A100-80GB", "H100-SXM"))


def test_fp8_is_planned_where_16_bits_misses_the_context_and_fp8_fits() -> None:
    """On an L4 Llama-3.1-8B's 16-bit pool holds ~24K tokens: a 32K request fits only in fp8."""
    settings = sglang.SglangSettings(context_length=32768)
    auto = engines.plan_sglang_kv(LLAMA, L4, settings)
    assert not auto.feasible and auto.settings.kv_cache_dtype == "auto" and not auto.notes
    fp8 = engines.plan_sglang_kv(LLAMA, L4, settings, allow_fp8_kv=True)
    assert fp8.feasible and fp8.settings.kv_cache_dtype == sglang.FP8_KV_CACHE_DTYPE == "fp8_e4m3"
    assert fp8.cell_bytes * 2 == auto.cell_bytes
    assert sglang.build_sglang_args(fp8.rendered)[-4:-2] == ["--kv-cache-dtype", "fp8_e4m3"]
    assert "--kv-cache-dtype" not in sglang.build_sglang_args(auto.rendered)
    (note,) = fp8.notes
    assert "fp8_e4m3" in note and "allowFp8KvCache" in note and note in engines.explain_sglang_budget(fp8)


def test_not_on_a_gpu_without_fp8_kv_nor_when_disallowed() -> None:
    settings = sglang.SglangSettings(context_length=32768)
    assert not A10G.fp8_kv and not A100.fp8_kv
    a10g = engines.plan_sglang_kv(LLAMA, A10G, settings, allow_fp8_kv=True)
    assert a10g.settings.kv_cache_dtype == "auto" and not a10g.feasible  # same pool as the L4's
    a100 = engines.plan_sglang_kv(
        LLAMA, A100, sglang.SglangSettings(max_running_requests=64), allow_fp8_kv=True
    )
    assert a100.settings.kv_cache_dtype == "auto" and not a100.notes
    assert engines.plan_sglang_kv(LLAMA, L4, settings).settings.kv_cache_dtype == "auto"


def test_a_concurrency_met_in_16_bits_keeps_16_bits_and_one_missed_takes_fp8() -> None:
    """As vLLM's ``_try_fp8_kv``: with a concurrency asked, fp8 only when 16 bits misses it."""
    met = sglang.SglangSettings(context_length=8192, max_running_requests=4)
    budget = engines.plan_sglang_kv(LLAMA, H100, met, allow_fp8_kv=True)
    assert budget.settings.kv_cache_dtype == "auto" and budget.full_context_requests >= 4
    missed = sglang.SglangSettings(context_length=131072, max_running_requests=5)
    auto = engines.plan_sglang_kv(LLAMA, H100, missed)
    assert auto.feasible and auto.full_context_requests < 5
    fp8 = engines.plan_sglang_kv(LLAMA, H100, missed, allow_fp8_kv=True)
    assert fp8.settings.kv_cache_dtype == "fp8_e4m3" and fp8.full_context_requests >= 5
    assert "5 full-context request(s)" in fp8.notes[0]


def test_without_a_concurrency_fp8_holds_as_many_requests_as_fit() -> None:
    """vLLM's planner takes fp8 when no concurrency is asked (as many sequences as fit): so does SGLang's."""
    budget = engines.plan_sglang_kv(
        LLAMA, H100, sglang.SglangSettings(context_length=8192), allow_fp8_kv=True
    )
    assert budget.settings.kv_cache_dtype == "fp8_e4m3" and "as many requests as fit" in budget.notes[0]


def test_a_given_dtype_is_never_changed() -> None:
    for given in ("auto", "bf16", "fp8_e5m2"):
        settings = sglang.SglangSettings(context_length=32768, kv_cache_dtype=given)
        budget = engines.plan_sglang_kv(LLAMA, L4, settings, allow_fp8_kv=True)
        assert budget.settings.kv_cache_dtype == given and not budget.notes
    assert budget.rendered.kv_cache_dtype == "fp8_e5m2"


def test_fp8_spellings() -> None:
    assert sglang.is_fp8_kv_cache_dtype("fp8_e4m3") and sglang.is_fp8_kv_cache_dtype("fp8_e5m2")
    assert not any(sglang.is_fp8_kv_cache_dtype(d) for d in (None, "auto", "bf16", "bfloat16"))
    assert sglang.FP8_KV_CACHE_DTYPE in sglang.KV_CACHE_DTYPE_BYTES
