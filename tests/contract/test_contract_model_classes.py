"""kvpilot's reading of published configs against vLLM 0.33's own model classes on the meta device.

For each config below (tests/data/hf_configs, with their provenance in its INDEX.md), vLLM builds the
architecture's class on the meta device (:mod:`model_classes`) and kvpilot reads the same config. Two
facts must agree, layer by layer and byte for byte:

* the KV specs: every decoder layer's kind (full, sliding, MLA, Mamba / linear attention), KV heads,
  K and V head sizes and sliding window, against the specs the layers declare;
* the parameter bytes at TP 1 (:func:`kvpilot.tuner.memory.weights.compute_weight_breakdown`), and on
  every rank at TP 2 or PP 2 for the :data:`PARALLEL` points (:data:`RANK_GAPS` where they differ).

Where kvpilot's bytes are known to differ, :data:`PARAM_GAPS` holds the gap and why, exactly (a fix
or a new gap fails the test until the table says so); :data:`NOT_BUILT` lists the architectures vLLM
cannot build on CPU, with the reason, and a test proves each still fails as described.

Cost: about 1 min with vLLM's model-info cache warm; about 5.5 min cold on 2 cores (``ModelConfig`` has
vLLM inspect each class in a subprocess once, cached under ``~/.cache/vllm/modelinfos``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import types
from typing import Any

import model_classes as mcl
import pytest

from kvpilot.tuner.memory.weights import compute_weight_breakdown
from kvpilot.tuner.model import LINEAR, NO_KV, ModelSpec, build_model_spec

HF_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_configs"

BUILT = (
    "meta-llama__Llama-3.2-1B-Instruct",  # LlamaForCausalLM
    "mistralai__Mistral-7B-Instruct-v0.3",  # MistralForCausalLM
    "mistralai__Mixtral-8x7B-Instruct-v0.1",  # MixtralForCausalLM (MoE)
    "Qwen__Qwen3-8B",  # Qwen3ForCausalLM (q/k norms)
    "Qwen__Qwen3-30B-A3B",  # Qwen3MoeForCausalLM
    "google__gemma-2-2b-it",  # Gemma2ForCausalLM (sliding window every other layer)
    "google__gemma-3-4b-it",  # Gemma3ForConditionalGeneration (5:1 sliding, vision tower)
    "nvidia__Nemotron-H-56B-Base-8K",  # NemotronHForCausalLM (Mamba2 hybrid, MLP-only blocks)
    "Qwen__Qwen3-Next-80B-A3B-Instruct",  # Qwen3NextForCausalLM (gated DeltaNet hybrid)
    "Qwen__Qwen3.5-9B",  # Qwen3_5ForConditionalGeneration (gated DeltaNet hybrid, vision tower)
    "microsoft__Phi-3-mini-4k-instruct",  # Phi3ForCausalLM (model-level sliding window 2047)
    "microsoft__phi-4",  # Phi3ForCausalLM
    "ibm-granite__granite-3.1-8b-instruct",  # GraniteForCausalLM
    "deepseek-ai__DeepSeek-V2-Lite-Chat",  # DeepseekV2ForCausalLM (MLA, MoE)
    "meta-llama__Llama-4-Scout-17B-16E-Instruct",  # Llama4ForConditionalGeneration (chunked local attention)
    "google__gemma-4-E2B-it",  # Gemma4ForConditionalGeneration (KV sharing, per-layer embeddings, audio)
    "Qwen__Qwen3-VL-2B-Instruct",  # Qwen3VLForConditionalGeneration
    "google__gemma-4-E4B-it",  # Gemma4ForConditionalGeneration (KV sharing, per-layer inputs)
    "google__gemma-4-31B-it",  # Gemma4ForConditionalGeneration (512-wide global heads)
    "google__gemma-4-26B-A4B",  # Gemma4ForConditionalGeneration (MoE)
    "Qwen__Qwen2.5-7B-Instruct",  # Qwen2ForCausalLM (QKV bias)
    "google__gemma-7b",  # GemmaForCausalLM
    "codellama__CodeLlama-7b-hf",  # LlamaForCausalLM (rope theta 1e6)
)

PARAM_GAPS: dict[str, tuple[int, str]] = {
    "google__gemma-3-4b-it": (
        2_868_512,
        "the SigLIP vision tower (generic read_vision_params) is counted high",
    ),
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": (
        -30_146_560,
        "the vision tower (generic read_vision_params) is counted 15 M params low",
    ),
}
"""kvpilot's bytes minus vLLM's, for the configs where they differ, and why (found by this contract)."""

NOT_BUILT: dict[str, tuple[str, str]] = {
    "XiaomiMiMo__MiMo-V2-Flash": ("ValueError", "Failed to find a kernel that can implement the ScaledMM"),
    "deepseek-ai__DeepSeek-V3": ("ValueError", "Failed to find a kernel that can implement the ScaledMM"),
    "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (
        "NotImplementedError",
        "is_act_and_mul=False is supported only for CUDA",
    ),
    "openai__gpt-oss-20b": (
        "NotImplementedError",
        "No MXFP4 MoE backend supports the deployment configuration",
    ),
}
"""Configs vLLM 0.33 cannot build on the CPU platform: (exception, the start of its message). fp8 block
checkpoints (MiMo-V2-Flash, DeepSeek-V3) need a CUDA ScaledMM kernel; MXFP4 MoE (gpt-oss) a GPU MoE
backend; Nemotron-3's relu2 MoE experts a CUDA/XPU/ROCm activation. Their KV layouts are held to vLLM's
spec classes by the KV contracts (test_contract_kv_cache.py, test_contract_mimo_v2.py)."""


def _config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def built(vllm: types.ModuleType) -> dict[str, mcl.Built]:
    from vllm.config import DeviceConfig, VllmConfig

    mcl.init_single_rank(VllmConfig, DeviceConfig)
    return {name: mcl.build_on_meta(_config(name)) for name in BUILT}


def _kvpilot_layers(spec: ModelSpec) -> dict[int, list[mcl.LayerKv]]:
    out: dict[int, list[mcl.LayerKv]] = {}
    for idx, layer in enumerate(spec.layers):
        if layer.kind == NO_KV:
            continue
        if layer.kind == LINEAR:
            kv = mcl.LayerKv(LINEAR, 0, 0, 0, None)
        else:
            kv = mcl.LayerKv(layer.kind, layer.num_kv_heads, layer.head_dim, layer.head_dim_v, layer.window)
        out[idx] = [kv, mcl.LayerKv(LINEAR, 0, 0, 0, None)] if layer.with_state else [kv]
    return out


def _kv_misses(spec: ModelSpec, theirs: mcl.Built) -> list[str]:
    ours = _kvpilot_layers(spec)
    return [
        f"layer {i}: kvpilot {ours.get(i)} vLLM {theirs.layers.get(i)}"
        for i in sorted(set(ours) | set(theirs.layers))
        if ours.get(i) != theirs.layers.get(i)
    ]


@pytest.mark.parametrize("name", BUILT)
def test_kv_specs_are_the_ones_vllms_layers_declare(built: dict[str, mcl.Built], name: str) -> None:
    spec = build_model_spec(copy.deepcopy(_config(name)))
    assert spec.architecture == built[name].architecture
    misses = _kv_misses(spec, built[name])
    assert not misses, f"{name}: {len(misses)} layers differ:\n" + "\n".join(misses[:10])


@pytest.mark.parametrize("name", BUILT)
def test_parameter_bytes_are_the_ones_vllm_builds(built: dict[str, mcl.Built], name: str) -> None:
    spec = build_model_spec(copy.deepcopy(_config(name)))
    gap = compute_weight_breakdown(spec).params - built[name].param_bytes
    expected, why = PARAM_GAPS.get(name, (0, "exact"))
    assert gap == expected, f"{name}: kvpilot - vLLM = {gap} bytes (table: {expected}, {why})"


PARALLEL = (
    ("meta-llama__Llama-3.2-1B-Instruct", 2, 1),  # vocabulary and every linear split; GQA KV heads
    ("meta-llama__Llama-3.2-1B-Instruct", 1, 2),  # tied embeddings: both stages hold a copy
    ("Qwen__Qwen3-30B-A3B", 2, 1),  # FusedMoE experts split by their intermediate size
    ("google__gemma-4-E2B-it", 2, 1),  # one KV head replicated; the vision and audio towers
    ("Qwen__Qwen3.5-9B", 2, 1),  # the Qwen3 vision tower: split linears, whole norms, embeddings, biases
)
"""(config, TP, PP) points whose every rank vLLM builds in a real two-rank group (~1 min each)."""

RANK_GAPS: dict[tuple[str, int, int], tuple[tuple[int, ...], str]] = {}
"""kvpilot's bytes minus vLLM's, rank by rank, where they differ at TP 2 or PP 2, and why."""


@pytest.mark.parametrize(("name", "tp", "pp"), PARALLEL)
def test_parameter_bytes_per_rank_are_the_ones_vllm_shards(
    vllm: types.ModuleType, name: str, tp: int, pp: int
) -> None:
    spec = build_model_spec(copy.deepcopy(_config(name)))
    theirs = mcl.build_ranks_on_meta(_config(name), tp, pp)
    ours = [
        compute_weight_breakdown(
            spec, tensor_parallel_size=tp, pipeline_parallel_size=pp, pp_rank=rank // tp
        ).params
        for rank in range(tp * pp)
    ]
    gaps = tuple(o - t for o, t in zip(ours, theirs, strict=True))
    expected, why = RANK_GAPS.get((name, tp, pp), ((0,) * (tp * pp), "exact"))
    assert gaps == expected, f"{name} TP {tp} PP {pp}: kvpilot - vLLM per rank = {gaps} ({expected}, {why})"


def test_one_head_count_off_is_caught(built: dict[str, mcl.Built]) -> None:
    """The mutation: a layer read with one KV head fewer fails the comparison."""
    name = "google__gemma-2-2b-it"
    spec = build_model_spec(copy.deepcopy(_config(name)))
    layers = list(spec.layers)
    layers[1] = dataclasses.replace(layers[1], num_kv_heads=layers[1].num_kv_heads - 1)
    misses = _kv_misses(dataclasses.replace(spec, layers=tuple(layers)), built[name])
    assert misses == [misses[0]] and misses[0].startswith("layer 1:")


@pytest.mark.parametrize("name", sorted(NOT_BUILT))
def test_architectures_vllm_cannot_build_on_cpu_fail_as_listed(
    built: dict[str, mcl.Built], name: str
) -> None:
    error, message = NOT_BUILT[name]
    with pytest.raises(Exception) as info:
        mcl.build_on_meta(_config(name))
    assert type(info.value).__name__ == error and str(info.value).startswith(message)
