"""Every published config in tests/data/hf_configs/ is planned on 8 x B200, or refused with a reason.

``kvpilot plan --config FILE --gpu B200 --gpus 8`` answers one of three ways, as a new user would see it:
a plan (exit 0), a plan that explains why nothing fits (exit 1, "What would fit"), or a refusal that
says why (exit 2): the pinned vLLM does not serve the architecture ("vLLM 0.33 does not support ...").
A config holding a layout kvpilot does not model would be refused naming its architecture and field;
since DeepSeek-V4's compressed sparse attention and Kimi-K3's KDA layers are sized, no published one is.
Never a generic error.
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

COMPRESSED_OR_KDA = (
    "deepseek-ai__DeepSeek-V4-Flash",
    "deepseek-ai__DeepSeek-V4-Pro",
    "nvidia__DeepSeek-V4-Flash-NVFP4",
    "moonshotai__Kimi-K3",
)
"""Refused as not modelled before DeepSeek-V4's and Kimi-K3's caches were: now planned like the others."""


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
    else:
        assert rc in (cli.EXIT_OK, cli.EXIT_INFEASIBLE), err
        plan = json.loads(out)
        assert plan["feasible"] is (rc == cli.EXIT_OK)
        assert plan["tensor_parallel_size"] >= 1 and plan["budget"]["kv_bytes_per_token"] > 0


def test_the_count_sized() -> None:
    sized = [p for p in CONFIGS if p.stem not in NOT_SERVED]
    assert len(CONFIGS) == 99
    assert set(COMPRESSED_OR_KDA) <= {p.stem for p in sized}
    # 77, then 94 with the Qwen3.5 MoE, Nemotron-H, Gemma 4 E, Kimi-K2.5, DeciLM readers; 98 with these
    assert len(sized) == 98
    assert all(_plan(p)[0] in (cli.EXIT_OK, cli.EXIT_INFEASIBLE) for p in sized)
