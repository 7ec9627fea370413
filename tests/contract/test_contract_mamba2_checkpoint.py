"""Contract: a ``MambaMixer2`` hybrid (Nemotron-H) holds the pages vLLM 0.33 keeps per request.

0.33's ``MambaMixer2.get_kv_cache_spec`` adds one prefill-checkpoint block to every Mamba2 state
spec, so align mode (prefix caching on, the default for hybrids) holds ``2 + 1`` state pages per
request. vLLM's side runs that method itself (``kv_points.through_mixer2``) on the state spec built
from its calculators, then ``get_kv_cache_configs``; kvpilot's side is ``compute_kv_layout``. Blocks,
tokens and concurrency must be equal at 131k, and one Mamba head off in kvpilot's config must break it.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import kv_points as kp
import pytest
from test_contract_kv_cache import cuda_like_config, wheel  # noqa: F401  (fixtures)

from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"
NEMOTRON_H = (
    "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-FP8",
    "nvidia__Nemotron-H-56B-Base-8K",
)
POINTS = (
    kp.Point(1, 1, 16, "auto", 131_072, 40 * GIB + 98_765, (9, 0)),
    kp.Point(2, 1, 16, "fp8", 131_072, 20 * GIB + 3, (9, 0)),
    kp.Point(1, 2, 16, "auto", 32_768, 20 * GIB + 3, (9, 0)),
)


def _outcomes(m: dict[str, Any], vc: Any, config: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    theirs_spec = build_model_spec(copy.deepcopy(config))
    return kp.collect_misses(
        m,
        vc,
        build_model_spec(copy.deepcopy(ours)),
        POINTS,
        lambda point: kp.build_vllm_specs(m, vc, config, theirs_spec, point)[0],
    )


@pytest.mark.parametrize("name", NEMOTRON_H)
def test_mamba2_state_pages_are_vllms_own(
    wheel: dict[str, Any],  # noqa: F811
    cuda_like_config: Any,  # noqa: F811
    monkeypatch: Any,
    name: str,
) -> None:
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    config = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    spec = kp.through_mixer2(
        wheel, wheel["MambaSpec"](shapes=((1,),), dtypes=(wheel["torch"].float32,), block_size=16)
    )
    assert spec.num_prefill_checkpoint_blocks == 1  # what 0.33's MambaMixer2 declares
    assert not _outcomes(wheel, cuda_like_config, config, config)
    mutated = copy.deepcopy(config)
    mutated["mamba_num_heads"] = config["mamba_num_heads"] - 8  # still divides by the groups
    assert _outcomes(wheel, cuda_like_config, config, mutated)
