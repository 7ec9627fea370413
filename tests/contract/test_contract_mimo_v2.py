"""Contract: MiMo-V2-Flash's KV cache is the one vLLM 0.33's ``mimo_v2`` model class builds.

vLLM's side: each layer classified by the class's own ``MiMoV2FlashDecoderLayer.is_compressed_softmax_layer``
(``hybrid_layer_pattern``), given the geometry the class passes to ``MiMoV2Attention`` (sliding layers:
``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``, ``sliding_window_size``; full layers:
``num_key_value_heads``, ``head_dim``, ``v_head_dim``), KV heads split over TP, as vLLM's own
``SlidingWindowSpec`` / ``FullAttentionSpec``, then ``get_kv_cache_configs``. kvpilot's side is
``compute_kv_layout`` on its reading (:mod:`kvpilot.tuner.model.mimo`). Blocks, tokens and
concurrency must be equal; one sliding KV head count off in kvpilot's config must break it.
"""

from __future__ import annotations

import copy
import json
import pathlib
import types
from typing import Any

import kv_points as kp
import pytest
from test_contract_kv_cache import cuda_like_config, wheel  # noqa: F401  (fixtures)

from kvpilot.tuner.model import build_model_spec
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

CONFIG = json.loads(
    (
        pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "XiaomiMiMo__MiMo-V2-Flash.json"
    ).read_text()
)
POINTS = tuple(
    kp.Point(tp, pp, 16, dtype, length, available, (9, 0))
    for tp, pp in ((1, 1), (4, 1), (8, 1), (4, 2))
    for dtype in ("auto", "fp8")
    for length in (32_768, 131_072)
    for available in (20 * GIB + 3, 40 * GIB + 98_765)
)


def _vllm_workers(m: dict[str, Any], p: kp.Point) -> list[dict[str, Any]]:
    from vllm.model_executor.models.mimo_v2 import MiMoV2FlashDecoderLayer

    c = types.SimpleNamespace(**CONFIG)
    torch = m["torch"]
    kv_dtype = torch.bfloat16 if p.dtype == "auto" else m["STR_DTYPE_TO_TORCH_DTYPE"][p.dtype]
    named = {}
    for i in range(c.num_hidden_layers):
        probe = types.SimpleNamespace(config=c, layer_id=i)
        if MiMoV2FlashDecoderLayer.is_compressed_softmax_layer(probe):
            heads, size, size_v = (
                c.swa_num_key_value_heads,
                c.swa_head_dim,
                getattr(c, "swa_v_head_dim", None),
            )
            window: int | None = c.sliding_window_size
        else:
            heads, size, size_v, window = (
                c.num_key_value_heads,
                c.head_dim,
                getattr(c, "v_head_dim", None),
                None,
            )
        common = dict(
            block_size=p.block,
            num_kv_heads=max(1, heads // p.tp),
            head_size=size,
            head_size_v=size_v or size,
            dtype=kv_dtype,
            kv_quant_mode=m["get_kv_quant_mode"](p.dtype),
        )
        spec = (
            m["SlidingWindowSpec"](**common, sliding_window=window)
            if window
            else m["FullAttentionSpec"](**common)
        )
        named[f"model.layers.{i}.self_attn.attn"] = (i, spec)
    workers = []
    for rank in range(p.pp):
        start, end = m["get_pp_indices"](c.num_hidden_layers, rank, p.pp)
        workers.append({n: s for n, (i, s) in named.items() if start <= i < end})
    return workers


def _misses(m: dict[str, Any], vc: Any, ours_config: dict[str, Any]) -> list[str]:
    spec = build_model_spec(copy.deepcopy(ours_config))
    return kp.collect_misses(m, vc, spec, POINTS, lambda point: _vllm_workers(m, point))


def test_mimo_v2_flash_kv_is_vllms_own(
    wheel: dict[str, Any],  # noqa: F811
    cuda_like_config: Any,  # noqa: F811
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(type(cuda_like_config), "use_v2_model_runner", property(lambda self: True))
    misses = _misses(wheel, cuda_like_config, CONFIG)
    assert not misses, "\n".join(misses[:10])
    mutated = dict(CONFIG, swa_num_key_value_heads=CONFIG["swa_num_key_value_heads"] - 4)
    assert _misses(wheel, cuda_like_config, mutated)
