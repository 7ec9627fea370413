"""Contract: the Mamba / Mamba2 / short-conv families are sized as vLLM 0.33 sizes them, integer for integer.

The families (Mamba, FalconMamba, Mamba2, Jamba, Falcon-H1, Granite-4.0-H, LFM2, LFM2-MoE) come from
``tests/data/mamba_family_configs.json`` (transformers config classes' defaults; the file says what was
set). vLLM's side of every point is the wheel's own: its ``ModelConfig`` reads the config through
transformers, ``ModelRegistry`` resolves the model class, whose ``get_mamba_state_shape_from_config`` /
``get_mamba_state_dtype_from_config`` (``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``) give the
state; which layer is attention and which a mixer is read from the transformers config as each model file
reads it (``layers_block_type``, ``layer_types``; Falcon-H1: both in every layer); the attention specs take
``ModelConfig.get_num_kv_heads`` / ``get_head_size``; prefix caching on puts the state in align mode (its
block the attention block), off gives ``mamba_cache_mode`` "none" and a state block of ``max_model_len``.
Then ``get_kv_cache_configs`` and ``get_kv_cache_capacity`` as in ``kv_points``. kvpilot's side is
``compute_kv_layout`` per PP rank. The grid is full: TP 1/2/4/8 x PP 1/2 x block 16/64 x ``auto``/``fp8`` x
4k/32k x two pool sizes x prefix caching on/off. A point vLLM cannot build (a TP that does not divide a
mixer's heads or channels: ``divide`` asserts) is counted as such, never skipped silently.
"""

from __future__ import annotations

import copy
import itertools
import json
import pathlib
import sys
import types
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kv_points as kp
import pytest

from kvpilot.tuner.model import LINEAR, MAMBA2, ModelSpec, build_model_spec
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "mamba_family_configs.json"
FAMILIES = json.loads(DATA.read_text())["configs"]
TPS, PPS, BLOCKS, DTYPES = (1, 2, 4, 8), (1, 2), (16, 64), ("auto", "fp8")
LENGTHS = (4096, 32768)
AVAILABLE = (2 * GIB + 12_345, 30 * GIB + 777)
NOT_SHARDABLE = "vLLM cannot shard this model at this TP (divide() asserts)"


def _attention_layers(hf: Any, model_type: str, num_layers: int) -> list[bool]:
    """Which layers hold an attention layer, as each vLLM model file decides it."""
    if model_type in ("mamba", "falcon_mamba", "mamba2"):
        return [False] * num_layers
    if model_type == "falcon_h1":
        return [True] * num_layers
    if model_type == "jamba":  # JambaModel: ALL_DECODER_LAYER_TYPES[config.layers_block_type[i]]
        return [t == "attention" for t in hf.layers_block_type]
    return [t == "full_attention" for t in hf.layer_types]  # granitemoehybrid, lfm2, lfm2_moe


def _state_layers(hf: Any, model_type: str, num_layers: int) -> list[bool]:
    if model_type == "falcon_h1":  # FalconH1ParallelHybrid: a Mamba2 mixer in every layer
        return [True] * num_layers
    return [not a for a in _attention_layers(hf, model_type, num_layers)]


@pytest.fixture(scope="module")
def families(
    vllm: types.ModuleType,
    model_dir_factory: Callable[[Mapping[str, object]], Path],
    vllm_model_config: Callable[[Path], Any],
) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """(name, config, vLLM's ModelConfig, vLLM's model class) of every family."""
    from vllm.model_executor.models import ModelRegistry

    built = []
    for entry in FAMILIES:
        mc = vllm_model_config(model_dir_factory(entry["config"]))
        cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        built.append((entry["name"], entry["config"], mc, cls))
    return built


@pytest.fixture(scope="module")
def wheel(vllm: types.ModuleType) -> dict[str, Any]:
    import torch
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core import kv_cache_utils as utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode

    return {
        "torch": torch,
        "get_pp_indices": get_pp_indices,
        "STR_DTYPE_TO_TORCH_DTYPE": STR_DTYPE_TO_TORCH_DTYPE,
        "FullAttentionSpec": FullAttentionSpec,
        "MambaSpec": MambaSpec,
        "MambaMixer2": MambaMixer2,
        "get_kv_quant_mode": get_kv_quant_mode,
        "get_global_kv_cache_groups": planning.get_global_kv_cache_groups,
        "get_kv_cache_configs": planning.get_kv_cache_configs,
        "get_kv_cache_configs_unchecked": kp.unchecked(planning),
        "generate_scheduler_kv_cache_config": utils.generate_scheduler_kv_cache_config,
        "get_kv_cache_capacity": utils.get_kv_cache_capacity,
    }


def _state_of(cls: Any, mc: Any, tp: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The model class's own state shapes and dtypes (``--mamba-cache-dtype`` / ``--mamba-ssm-cache-dtype``
    auto, no speculative tokens), on a config that holds what these classmethods read."""
    stub = types.SimpleNamespace(
        model_config=mc,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp),
        cache_config=types.SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto"),
        num_speculative_tokens=0,
    )
    shapes = cls.get_mamba_state_shape_from_config(stub)
    return tuple(shapes), tuple(cls.get_mamba_state_dtype_from_config(stub))


def _vllm_workers(
    m: dict[str, Any], mc: Any, cls: Any, p: kp.Point, prefix_caching: bool
) -> list[dict[str, Any]]:
    """Every layer's KV spec on vLLM's side, split into PP workers."""
    hf = mc.hf_config
    n = mc.get_total_num_hidden_layers()
    attention, state = _attention_layers(hf, mc.hf_config.model_type, n), _state_layers(hf, hf.model_type, n)
    kv_dtype = mc.dtype if p.dtype == "auto" else m["STR_DTYPE_TO_TORCH_DTYPE"][p.dtype]
    quant = m["get_kv_quant_mode"](p.dtype)
    kv_heads = max(1, mc.get_total_num_kv_heads() // p.tp)

    def attn(block: int) -> Any:
        return m["FullAttentionSpec"](
            block_size=block,
            num_kv_heads=kv_heads,
            head_size=mc.get_head_size(),
            dtype=kv_dtype,
            kv_quant_mode=quant,
        )

    shapes, dtypes = _state_of(cls, mc, p.tp)
    mamba_page = m["MambaSpec"](shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    block, padded = p.block, None
    if any(attention):  # hybrid: Platform._align_hybrid_block_size (no checkpoint: Mamba / short conv)
        block, padded = kp.align_hybrid_block_size(p.block, False, None, mamba_page, attn(1))
        padded = None if padded == mamba_page else padded
    state_block = block if prefix_caching else p.max_len  # MambaModelConfig's mamba_block_size
    mixer2 = "MambaMixer2" in vars(sys.modules[cls.__module__])  # its layers' get_kv_cache_spec
    named: dict[str, tuple[int, Any]] = {}
    for i in range(n):
        if attention[i]:
            named[f"model.layers.{i}.self_attn.attn"] = (i, attn(block))
        if state[i]:
            named[f"model.layers.{i}.mixer"] = (
                i,
                m["MambaSpec"](
                    shapes=shapes,
                    dtypes=dtypes,
                    block_size=state_block,
                    page_size_padded=padded,
                    mamba_cache_mode="align" if prefix_caching else "none",
                ),
            )
            if mixer2:
                named[f"model.layers.{i}.mixer"] = (
                    i,
                    kp.through_mixer2(m, named[f"model.layers.{i}.mixer"][1]),
                )
    workers = []
    for rank in range(p.pp):
        start, end = m["get_pp_indices"](n, rank, p.pp)
        workers.append({name: s for name, (i, s) in named.items() if start <= i < end})
    return workers


@pytest.fixture(scope="module")
def cuda_like(vllm: types.ModuleType, families: list[tuple[str, dict[str, Any], Any, Any]]) -> Any:
    """A ``VllmConfig`` set as a CUDA start sets it (hybrid manager, async scheduling, V2 runner)."""
    return kp.build_cuda_like_config(families[0][2])


def test_mamba_family_kv_arithmetic_is_vllms_own(
    wheel: dict[str, Any],
    families: list[tuple[str, dict[str, Any], Any, Any]],
    cuda_like: Any,
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(type(cuda_like), "use_v2_model_runner", property(lambda self: True))
    vc = cuda_like
    checked, exact = 0, 0
    exceptions: Counter[str] = Counter()
    misses: list[str] = []
    per_family: dict[str, int] = {}
    for name, config, mc, cls in families:
        spec = build_model_spec(copy.deepcopy(config))
        assert any(layer.kind == LINEAR or layer.with_state for layer in spec.layers), name
        grid = itertools.product(TPS, PPS, BLOCKS, DTYPES, LENGTHS, AVAILABLE, (True, False))
        for tp, pp, block, dtype, length, available, prefix_caching in grid:
            point = kp.Point(tp, pp, block, dtype, length, available, (9, 0))
            checked += 1
            try:
                workers = _vllm_workers(wheel, mc, cls, point, prefix_caching)
            except AssertionError:
                exceptions[NOT_SHARDABLE] += 1
                continue
            vc.cache_config.mamba_cache_mode = "align" if prefix_caching else "none"
            ours, theirs = kp.compare_outcomes(wheel, vc, workers, spec, point, prefix_caching)
            if ours == theirs:
                exact += 1
                per_family[name] = per_family.get(name, 0) + 1
            else:
                misses.append(f"{name} {point} prefix_caching={prefix_caching}: kvpilot {ours} vLLM {theirs}")
    vc.cache_config.mamba_cache_mode = "align"
    summary = f"{checked} points over {len(families)} families: {exact} exact, exceptions {dict(exceptions)}"
    print(summary, per_family)
    assert not misses, f"{summary}; {len(misses)} differ:\n" + "\n".join(misses[:20])
    assert exact + sum(exceptions.values()) == checked
    assert set(per_family) == {name for name, *_ in families}  # every family has exact points


def test_mamba_family_weights_are_transformers_parameter_count(vllm: types.ModuleType) -> None:
    """kvpilot's parameters on one GPU (bf16, TP 1) equal the parameters of transformers' own model built
    from the same config on the meta device, up to vLLM's vocabulary padding (to a multiple of 64) and the
    attention layers' q/k norms, which kvpilot does not count for any model (LFM2: 1,280 parameters, 4e-7)."""
    for entry in FAMILIES:
        ours, theirs = _parameter_counts(entry["config"])
        assert abs(ours - theirs) <= theirs // 1_000_000, (entry["name"], ours, theirs)


def _parameter_counts(config: Mapping[str, Any]) -> tuple[int, int]:
    """kvpilot's parameters of ``config`` (bf16, TP 1, as stored; less vLLM's vocabulary padding) and those of
    transformers' own model built from it on the meta device."""
    import torch
    import transformers

    from kvpilot.tuner.memory import weights

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "quantization_config")}
    hf = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    theirs = sum(p.numel() for p in model.parameters())
    spec = build_model_spec(copy.deepcopy(dict(config)))
    padding = (weights.padded_vocab_size(spec) - spec.vocab_size) * spec.hidden_size
    tables = 1 if spec.tie_word_embeddings else 2
    ours = weights.compute_weight_breakdown(spec, dtype="bfloat16", loaded=False).params // 2
    return ours - tables * padding - _fp32_a_extra(spec), theirs


def _fp32_a_extra(spec: ModelSpec) -> int:
    """vLLM keeps each Mamba2 mixer's ``A`` in fp32 (``mamba_mixer2.py``), which kvpilot's 16-bit bytes
    count as two parameters per head; transformers counts one."""
    state = spec.linear_state
    if state is None or state.family != MAMBA2:
        return 0
    return sum(1 for layer in spec.layers if layer.kind == LINEAR or layer.with_state) * state.num_heads


NEMOTRON_H = sorted(
    p
    for p in (pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs").glob("nvidia__*.json")
    if json.loads(p.read_text()).get("model_type") == "nemotron_h"
)


@pytest.mark.parametrize("path", NEMOTRON_H, ids=lambda p: p.stem)
def test_nemotron_h_weights_are_transformers_parameter_count(vllm: types.ModuleType, path: Path) -> None:
    """Nemotron-H's published configs (Nemotron-H 56B, Nemotron 3 Nano, Super, Ultra): each block holds one
    of a Mamba2 mixer, attention, an MLP or a MoE, the MLPs and experts are relu2 (up and down only), and
    Super and Ultra's experts work in ``moe_latent_size``. kvpilot's parameters (bf16, TP 1, as stored) equal
    transformers' model built on the meta device, up to vLLM's vocabulary padding. Before, every block was
    charged attention and an MLP as well, and gated experts: 47.5 B for the 31.6 B Nano."""
    ours, theirs = _parameter_counts(json.loads(path.read_text()))
    assert ours == theirs, (path.stem, ours, theirs)
