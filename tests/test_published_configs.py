"""Every published config in tests/data/hf_configs/ is planned on 8 x B200, or refused with a reason.

``kvpilot plan --config FILE --gpu B200 --gpus 8`` answers one of three ways, as a new user would see it:
a plan (exit 0), a plan that explains why nothing fits (exit 1, "What would fit"), or a refusal that
says why (exit 2): the pinned vLLM does not serve the architecture ("vLLM 0.33 does not support ..."),
or the config holds a layout kvpilot does not model, named with its architecture and field. Never a
generic error.
"""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from kvpilot import cli

HF_CONFIGS = pathlib.Path(__file__).resolve().parent / "data" / "hf_configs"
CONFIGS = sorted(HF_CONFIGS.glob("*.json"))

NOT_SERVED = {"meta-llama__Llama-3.2-11B-Vision": "MllamaForConditionalGeneration"}
"""Architectures vLLM 0.33 removed (its registry's ``_PREVIOUSLY_SUPPORTED_MODELS``)."""

NOT_MODELLED = {
    "deepseek-ai__DeepSeek-V4-Flash": ("DeepseekV4ForCausalLM", "compress_ratios"),
    "deepseek-ai__DeepSeek-V4-Pro": ("DeepseekV4ForCausalLM", "compress_ratios"),
    "nvidia__DeepSeek-V4-Flash-NVFP4": ("DeepseekV4ForCausalLM", "compress_ratios"),
    "moonshotai__Kimi-K3": ("KimiK3ForConditionalGeneration", "linear_attn_config"),
}
"""Served by vLLM 0.33, but a KV layout kvpilot does not model yet: refused, naming architecture and field."""


def _plan(path: pathlib.Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["plan", "--config", str(path), "--gpu", "B200", "--gpus", "8", "--json"], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_published_config_is_planned_or_refused_with_a_reason(path: pathlib.Path) -> None:
    rc, out, err = _plan(path)
    if path.stem in NOT_SERVED:
        assert rc == cli.EXIT_USAGE
        assert f"vLLM 0.33 does not support {NOT_SERVED[path.stem]}" in err
    elif path.stem in NOT_MODELLED:
        architecture, field = NOT_MODELLED[path.stem]
        assert rc == cli.EXIT_USAGE
        assert architecture in err and field in err and "not modelled" in err
    else:
        assert rc in (cli.EXIT_OK, cli.EXIT_INFEASIBLE), err
        plan = json.loads(out)
        assert plan["feasible"] is (rc == cli.EXIT_OK)
        assert plan["tensor_parallel_size"] >= 1 and plan["budget"]["kv_bytes_per_token"] > 0


def test_the_count_sized() -> None:
    sized = [p for p in CONFIGS if p.stem not in NOT_SERVED and p.stem not in NOT_MODELLED]
    assert len(CONFIGS) == 99
    assert len(sized) == 94  # was 77 before the Qwen3.5 MoE, Nemotron-H, Gemma 4 E, Kimi-K2.5, DeciLM readers
    assert all(_plan(p)[0] in (cli.EXIT_OK, cli.EXIT_INFEASIBLE) for p in sized)
