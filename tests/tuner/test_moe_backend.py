"""``--moe-backend``: read as vLLM reads it, refused where vLLM refuses it, budgeted where kvpilot read the
kernel (``cutlass`` on W4A4 NVFP4 experts: ``CutlassExpertsFp4``), named in the plan's warnings elsewhere."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpilot.tuner import errors, gpus, memory, vllm
from kvpilot.tuner.model import build_model_spec, build_quant_spec
from kvpilot.tuner.model.quantization import compute_bytes_per_weight
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

NVFP4_QC: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            "input_activations": {
                "num_bits": 4,
                "type": "float",
                "strategy": "tensor_group",
                "group_size": 16,
            },
        }
    },
    "ignore": ["lm_head"],
}

QWEN3_MOE: dict[str, Any] = {  # Qwen3-30B-A3B's geometry
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}


def _model(qc: dict[str, Any] | None = NVFP4_QC) -> Any:
    config = dict(QWEN3_MOE)
    if qc is not None:
        config["quantization_config"] = qc
    return build_model_spec(config)


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        ([], None),
        (["--moe-backend", "cutlass"], "cutlass"),
        (["--moe_backend=FLASHINFER-CUTLASS"], "flashinfer_cutlass"),  # the parser lowers and underscores
        (["--moe-backend", "cutlass", "--moe-backend", "auto"], None),  # the last wins; auto: vLLM chooses
    ],
)
def test_the_backend_is_read_as_vllm_keeps_it(args: list[str], backend: str | None) -> None:
    vllm.check_engine_flags(args)
    assert vllm.build_engine_flags(args).moe_backend == backend
    assert vllm.build_engine_flags(args).budget_kwargs()["moe_backend"] == backend


@pytest.mark.parametrize(
    "args", [["--moe-backend", "cutlas"], ["--moe-backend=fast"], ["--moe-back", "cutlass"]]
)
def test_a_backend_vllm_refuses_is_refused_by_name(args: list[str]) -> None:
    with pytest.raises(errors.InvalidEngineArgs, match="--moe-backend"):
        vllm.check_engine_flags(args)


def test_compressed_tensors_nvfp4_is_read_with_vllms_bytes() -> None:
    quant = build_quant_spec(NVFP4_QC)
    assert quant.nvfp4 and quant.nvfp4_activations
    assert compute_bytes_per_weight(quant) == 0.5 + 1 / 16  # e2m1 pairs + one fp8 scale per 16
    a16 = {**NVFP4_QC, "config_groups": {"g": {"weights": NVFP4_QC["config_groups"]["group_0"]["weights"]}}}
    assert build_quant_spec(a16).nvfp4 and not build_quant_spec(a16).nvfp4_activations  # NVFP4A16
    assert memory.nvfp4_experts(_model()) and not memory.nvfp4_experts(_model(a16))
    int4 = {
        **NVFP4_QC,
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}},
    }
    assert not build_quant_spec(int4).nvfp4


@pytest.mark.parametrize("gated", [True, False])
def test_the_cutlass_fp4_bytes_follow_the_kernels_shapes(gated: bool) -> None:
    m, top_k, k, inter, b = 4096, 8, 2048, 768, 2
    n = inter * (2 if gated else 1)  # w1's rows: gate and up when gated
    got = memory.compute_cutlass_fp4_moe_bytes(
        m, top_k=top_k, hidden_size=k, intermediate_size=inter, gated=gated, dtype_bytes=b
    )
    # workspace13 (M*topk, max(2N, K)) sharing its buffer with the (M, K) output, workspace2 (M*topk, N)
    assert got.workspace == m * top_k * max(2 * n, k) * b + m * top_k * n * b
    # the layer's output, three (M*topk, K) row sets, their (M, K) sum and two int32 row maps
    assert got.peak - got.workspace == m * k * b + 3 * m * top_k * k * b + m * k * b + 2 * m * top_k * 4


def test_the_workspace_takes_the_hidden_size_when_wider_and_whole_256_byte_parts() -> None:
    wide = memory.compute_cutlass_fp4_moe_bytes(
        10, top_k=2, hidden_size=4096, intermediate_size=256, gated=True, dtype_bytes=2
    )
    assert wide.workspace == 10 * 2 * 4096 * 2 + 10 * 2 * 512 * 2  # 2N = 1024 < K = 4096
    odd = memory.compute_cutlass_fp4_moe_bytes(
        3, top_k=1, hidden_size=100, intermediate_size=10, gated=False, dtype_bytes=2
    )
    assert odd.workspace == 768 + 256  # 600 B and 60 B, each rounded up to 256 (get_simultaneous)


def _activation(model: Any, backend: str | None, tokens: int, version: str = "0.33.0") -> int:
    return memory.compute_activation_bytes(
        model,
        tp=1,
        pp=1,
        pp_rank=0,
        max_num_batched_tokens=tokens,
        max_num_seqs=4,
        dtype="bfloat16",
        version=vllm.parse_version(version),
        moe_backend=backend,
    )


def test_cutlass_on_nvfp4_experts_replaces_the_fitted_moe_term() -> None:
    model = _model()
    default = _activation(model, None, 16384)
    cutlass = _activation(model, "cutlass", 16384)
    assert cutlass > default  # three top_k-wide row sets beside a workspace of the widest GEMM
    per_token = (_activation(model, "cutlass", 16384) - _activation(model, "cutlass", 8192)) / 8192
    kernel = memory.compute_cutlass_fp4_moe_bytes(
        8192, top_k=8, hidden_size=2048, intermediate_size=768, gated=True, dtype_bytes=2
    )
    assert per_token > kernel.peak / 8192  # the kernel's bytes are in, with the hidden-size copies beside
    # before 0.20 (not read), another backend, other experts: the fitted term stands
    assert _activation(model, "cutlass", 16384, "0.19.1") == _activation(model, None, 16384, "0.19.1")
    assert _activation(model, "flashinfer_cutlass", 16384) == default
    fp8 = _model({"quant_method": "fp8"})
    assert _activation(fp8, "cutlass", 16384) == _activation(fp8, None, 16384)


def test_the_budget_takes_the_backend_and_leaves_less_kv_cache() -> None:
    model, gpu = _model(), gpus.lookup_gpu("B200")
    settings = EngineSettings(max_model_len=8192, max_num_seqs=8, max_num_batched_tokens=16384)
    plain = memory.compute_budget(model, gpu, settings)
    cutlass = memory.compute_budget(model, gpu, settings, moe_backend="cutlass")
    assert cutlass.weights_gib == plain.weights_gib
    assert cutlass.available_kv_cache_gib < plain.available_kv_cache_gib
    assert cutlass.activation_gib - plain.activation_gib == pytest.approx(
        plain.available_kv_cache_gib - cutlass.available_kv_cache_gib
    )


def test_the_plan_warns_where_the_kernel_is_not_budgeted_and_refuses_what_vllm_refuses() -> None:
    gpu, bounds = gpus.lookup_gpu("B200"), ServingBounds()

    def moe_warnings(model: Any, backend: str) -> list[str]:
        engine = vllm.build_engine_flags(["--moe-backend", backend])
        plan = compute_plan(model, gpu, 1, bounds, engine=engine)
        return [w for w in plan.warnings if w.startswith("--moe-backend ")]

    assert moe_warnings(_model(), "cutlass") == []  # budgeted
    named = moe_warnings(_model(), "flashinfer_cutlass")
    assert len(named) == 1 and "lower --gpu-memory-utilization" in named[0]
    assert len(moe_warnings(_model({"quant_method": "fp8"}), "cutlass")) == 1  # CutlassExpertsFp8: not read
    dense = dataclasses.replace(_model(), moe=None)
    assert moe_warnings(dense, "triton") == []  # no experts: the flag changes nothing
    with pytest.raises(errors.InvalidEngineArgs, match="not supported for NVFP4"):
        moe_warnings(_model(), "triton")  # map_nvfp4_backend has no triton kernel


def test_a_case_reads_its_quantization_stand_in_and_its_moe_backend() -> None:
    case: dict[str, Any] = {
        "id": "c",
        "hf_config": QWEN3_MOE,
        "quantization_config": NVFP4_QC,
        "gpu_total_gib": 180.0,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 8192,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 16384,
        "vllm_version": "0.20.0",
    }
    assert memory.nvfp4_experts(memory.estimate.build_case_model(case))
    plain, cutlass, refused = memory.compute_estimates(
        [
            case,
            {**case, "engine_args": ["--moe-backend", "cutlass"]},
            {**case, "engine_args": ["--moe-backend", "x"]},
        ]
    )
    assert cutlass["activation_gib"] > plain["activation_gib"]
    assert cutlass["available_kv_cache_gib"] < plain["available_kv_cache_gib"]
    assert refused["error"] is not None and "--moe-backend" in refused["error"]
