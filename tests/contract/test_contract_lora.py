"""kvpilot's LoRA term against the buffers vLLM 0.33's own LoRA layers allocate, and its LoRA flags
against vLLM's parser and registry.

The bytes come from vLLM's ``LoRAModelManager`` wrapping vLLM's model class on the meta device
(:mod:`.lora_layers` says how, and which two parts are vLLM's shape code called directly because the
CPU platform cannot build them: the routed experts' wrapper and the GPU Punica wrapper's kernel
metadata). The configs are published ones cut to two decoder layers (and a MoE to eight experts) so
that every rank builds in seconds; every per-layer term is exercised all the same. Each rank runs in a
spawned process of a real gloo group, TP 1 and TP 2.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import lora_layers
import pytest

from kvpilot.tuner import memory
from kvpilot.tuner import vllm as facts
from kvpilot.tuner.model import build_model_spec

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
TOKENS, SEQS = 8192, 256
"""The scheduler sizes the Punica wrapper is built for (:func:`.lora_layers.lora_bytes_at_tp`)."""


def _config(name: str, **cut: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / name).read_text())
    config.update(num_hidden_layers=2, **cut)
    return config


LLAMA = _config("meta-llama__Llama-3.1-8B-Instruct.json")
PHI3 = _config("microsoft__Phi-3-mini-4k-instruct.json")  # qkv_proj and gate_up_proj fused in the checkpoint
QWEN3_MOE = _config("Qwen__Qwen3-30B-A3B.json", num_experts=8, num_experts_per_tok=2)

CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "llama-4x64": (LLAMA, ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]),
    "llama-defaults": (LLAMA, ["--enable-lora"]),
    "llama-fp16-fully-sharded": (
        LLAMA,
        ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "32", "--lora-dtype", "float16",
         "--fully-sharded-loras"],
    ),
    "phi3-fused-4x64": (PHI3, ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]),
    "qwen3-moe-4x64": (QWEN3_MOE, ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]),
    "qwen3-moe-fully-sharded": (
        QWEN3_MOE, ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--fully-sharded-loras"]
    ),
}  # fmt: skip


def _lora_config(flags: facts.LoraFlags) -> dict[str, Any]:
    """The ``LoRAConfig`` fields vLLM's ``EngineArgs`` would set from the same arguments."""
    fields: dict[str, Any] = {
        "max_loras": flags.max_loras,
        "max_lora_rank": flags.max_lora_rank,
        "fully_sharded_loras": flags.fully_sharded,
    }
    if flags.lora_dtype is not None:
        fields["lora_dtype"] = flags.lora_dtype
    return fields


def _flags(args: list[str]) -> facts.LoraFlags:
    flags = facts.read_lora_flags(args)
    assert flags is not None
    return flags


@pytest.fixture(scope="module")
def theirs(vllm: types.ModuleType) -> dict[int, dict[str, dict[str, int]]]:
    """vLLM's LoRA bytes on rank 0 of each case, at TP 1 and TP 2."""
    jobs = [(config, _lora_config(_flags(args))) for config, args in CASES.values()]
    return {tp: dict(zip(CASES, lora_layers.lora_bytes_at_tp(jobs, tp), strict=True)) for tp in (1, 2)}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_kvpilot_counts_the_bytes_vllms_lora_layers_allocate(
    theirs: dict[int, dict[str, dict[str, int]]], case: str, tp: int
) -> None:
    config, args = CASES[case]
    vllm_bytes = theirs[tp][case]
    ours = memory.compute_lora_bytes(
        build_model_spec(config),
        _flags(args),
        tensor_parallel_size=tp,
        max_num_batched_tokens=TOKENS,
        max_num_seqs=SEQS,
    )
    assert vllm_bytes["punica"] == memory.compute_punica_bytes(_flags(args), TOKENS, SEQS)
    assert vllm_bytes["vocab"] > 0  # Llama, Phi-3 and Qwen3-MoE wrap their embedding and LM head
    if "moe" in case:
        assert vllm_bytes["experts"] > 0
    assert ours == vllm_bytes["modules"] + vllm_bytes["experts"] + vllm_bytes["punica"], vllm_bytes


def test_the_lora_flags_and_defaults_are_vllms(vllm_parser: Any) -> None:
    from vllm.config.lora import LoRAConfig

    defaults = LoRAConfig()
    assert (defaults.max_loras, defaults.max_lora_rank) == (
        facts.DEFAULT_MAX_LORAS,
        facts.DEFAULT_MAX_LORA_RANK,
    )
    assert defaults.lora_dtype == "auto" and defaults.fully_sharded_loras is False
    parsed = vllm_parser.parse_args(["--enable-lora", "--max-loras", "3", "--max-lora-rank", "320"])
    assert (parsed.enable_lora, parsed.max_loras, parsed.max_lora_rank) == (True, 3, 320)
    for args, enabled, sharded in (
        (["--enable-lora", "--no-enable-lora"], False, None),
        (["--enable-lora", "--disable-lora"], False, None),
        (["--enable-lora", "--fully-sharded-loras"], True, True),
        (["--enable-lora", "--fully-sharded-loras", "--no-fully-sharded-loras"], True, False),
    ):
        parsed = vllm_parser.parse_args(args)
        assert bool(parsed.enable_lora) is enabled
        ours = facts.read_lora_flags(args)
        assert (ours is not None) is enabled
        if ours is not None and sharded is not None:
            assert parsed.fully_sharded_loras is sharded and ours.fully_sharded is sharded
    for rank in facts.MAX_LORA_RANKS:
        assert vllm_parser.parse_args(["--max-lora-rank", rank]).max_lora_rank == int(rank)
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["--max-lora-rank", "48"])
    for dtype in facts.LORA_DTYPES:
        assert vllm_parser.parse_args(["--lora-dtype", dtype]).lora_dtype == dtype
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["--lora-dtype", "float32"])


def test_the_architecture_sets_are_vllms_registry(vllm: types.ModuleType) -> None:
    """Every registered class that supports LoRA: its ``embedding_modules`` and ``is_3d_moe_weight``."""
    from vllm.model_executor.models.registry import _VLLM_MODELS, ModelRegistry

    embedding, lm_head, three_d, fused_qkv, fused_gate_up = set(), set(), set(), set(), set()
    for architecture in _VLLM_MODELS:
        try:
            cls = ModelRegistry._try_load_model_cls(architecture)
        except Exception:  # a model whose optional dependency is absent from the CPU build
            continue
        if cls is None or not getattr(cls, "supports_lora", False):
            continue
        names = getattr(cls, "embedding_modules", None) or {}
        if any(name != "lm_head" for name in names):
            embedding.add(architecture)
        if "lm_head" in names:
            lm_head.add(architecture)
        if getattr(cls, "is_3d_moe_weight", False):
            three_d.add(architecture)
        packed = getattr(cls, "packed_modules_mapping", None) or {}
        if packed.get("qkv_proj") == ["qkv_proj"]:
            fused_qkv.add(architecture)
        if packed.get("gate_up_proj") == ["gate_up_proj"]:
            fused_gate_up.add(architecture)
    assert embedding == facts.LORA_EMBEDDING_ARCHITECTURES
    assert lm_head == facts.LORA_LM_HEAD_ARCHITECTURES
    assert three_d == facts.LORA_3D_MOE_ARCHITECTURES
    assert fused_qkv == facts.LORA_FUSED_QKV_ARCHITECTURES
    assert fused_gate_up == facts.LORA_FUSED_GATE_UP_ARCHITECTURES
