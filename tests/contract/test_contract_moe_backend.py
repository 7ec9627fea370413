"""Contract: ``--moe-backend`` as vLLM 0.33 parses and maps it, and the workspace of the one kernel kvpilot
budgets (``CutlassExpertsFp4``) sized by vLLM's own shape code and workspace manager, on CPU."""

from __future__ import annotations

import inspect
import math
import re
import typing
from typing import Any

import pytest

from kvpilot.tuner import errors, memory
from kvpilot.tuner import vllm as kv_vllm

pytestmark = pytest.mark.contract


def test_the_backends_are_vllms_choices(vllm: Any) -> None:
    from vllm.config.kernel import MoEBackend

    assert typing.get_args(MoEBackend) == kv_vllm.MOE_BACKENDS


@pytest.mark.parametrize(
    "args",
    [
        ["--moe-backend", "cutlass"],
        ["--moe-backend", "FlashInfer-Cutlass"],
        ["--moe_backend=marlin"],
        ["--moe-backend", "auto"],
        ["--moe-backend", "cutlass", "--moe-backend", "triton"],
        [],
    ],
)
def test_the_backend_is_read_as_vllms_parser_keeps_it(args: list[str], vllm_parser: Any) -> None:
    parsed = vllm_parser.parse_args(args)
    kv_vllm.check_engine_flags(args)
    expected = None if parsed.moe_backend == "auto" else parsed.moe_backend
    assert kv_vllm.read_moe_backend(args) == expected


def test_a_backend_vllms_parser_refuses_is_refused(vllm_parser: Any) -> None:
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["--moe-backend", "cutlas"])
    with pytest.raises(errors.InvalidEngineArgs):
        kv_vllm.check_engine_flags(["--moe-backend", "cutlas"])


def test_the_nvfp4_backends_are_map_nvfp4_backends(vllm: Any) -> None:
    """``NVFP4_MOE_BACKENDS`` is vLLM's ``map_nvfp4_backend``: the values it maps, each to the
    ``NvFp4MoeBackend`` member of the name kvpilot keeps; the others are refused as vLLM refuses them at load.
    The name kvpilot keeps for ``cutlass`` finds the experts class :mod:`kvpilot.tuner.memory.moe_kernels`
    sizes."""
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4

    mapped: dict[str, str] = {}
    for backend in kv_vllm.MOE_BACKENDS:
        try:
            mapped[backend] = nvfp4.map_nvfp4_backend(backend).name
        except ValueError:
            if backend != "auto":
                with pytest.raises(errors.InvalidEngineArgs):
                    kv_vllm.check_nvfp4_moe_backend(backend)
    assert dict(kv_vllm.NVFP4_MOE_BACKENDS) == mapped
    for backend, name in kv_vllm.NVFP4_MOE_BACKENDS.items():
        assert nvfp4.map_nvfp4_backend(backend) is nvfp4.NvFp4MoeBackend[name], backend
        kv_vllm.check_nvfp4_moe_backend(backend)  # accepted, as vLLM maps it
    cutlass = nvfp4.NvFp4MoeBackend[kv_vllm.NVFP4_MOE_BACKENDS["cutlass"]]
    kernels = nvfp4.backend_to_kernel_cls(cutlass)
    assert [k.__name__ for k in kernels] == ["CutlassExpertsFp4"]  # the class memory.moe_kernels sizes


@pytest.mark.parametrize(
    ("m", "top_k", "hidden", "inter", "gated"),
    [
        (16384, 8, 2048, 512, True),  # Qwen3.6-35B-A3B
        (16384, 8, 2816, 704, True),  # Gemma-4-26B-A4B
        (4096, 8, 7168, 2048, True),  # DeepSeek-V3's experts
        (3, 1, 100, 10, False),  # an up/down expert, sizes off the 256-byte grid
        (8192, 22, 2688, 1856, False),  # Nemotron-3-Nano's relu2 experts
    ],
)
def test_the_cutlass_fp4_workspace_is_vllms(
    m: int, top_k: int, hidden: int, inter: int, gated: bool, vllm: Any
) -> None:
    """vLLM's ``workspace_shapes`` and ``_allocate_buffers``' request to its workspace manager, run on CPU."""
    import torch
    from vllm.model_executor.layers.fused_moe.experts.cutlass_moe import CutlassExpertsFp4
    from vllm.v1.worker import workspace

    n = inter * (2 if gated else 1)  # moe_problem_size's N: w1.shape[1]
    ws13, ws2, out = CutlassExpertsFp4.workspace_shapes(None, m, n, hidden, top_k, 8, 8, None, None)  # type: ignore[arg-type]
    workspace.init_workspace_manager(torch.device("cpu"))
    try:
        manager = workspace.current_workspace_manager()
        # _allocate_buffers (modular_kernel.py): one buffer for workspace13 and the output, and workspace2
        manager.get_simultaneous(
            ((max(math.prod(ws13), math.prod(out)),), torch.bfloat16), (ws2, torch.bfloat16)
        )
        held = manager._workspace_size_bytes(manager._current_workspaces[0])
    finally:
        workspace.reset_workspace_manager()
    got = memory.compute_cutlass_fp4_moe_bytes(
        m, top_k=top_k, hidden_size=hidden, intermediate_size=inter, gated=gated, dtype_bytes=2
    )
    assert got.workspace == held


def test_the_temporaries_kvpilot_counts_are_in_run_cutlass_moe_fp4(vllm: Any) -> None:
    """What :mod:`kvpilot.tuner.memory.moe_kernels` counts beside the workspace is the function's last step;
    its lines are still there (the kernels themselves need a Blackwell GPU)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel
    from vllm.model_executor.layers.fused_moe.experts import cutlass_moe

    source = inspect.getsource(cutlass_moe.run_cutlass_moe_fp4)
    for line in (
        "a = ops.shuffle_rows(a, a_map)",  # held to the end
        "a_map = torch.empty((topk_ids.numel()), dtype=torch.int32",
        "c_map = torch.empty((topk_ids.numel()), dtype=torch.int32",
        "del rep_a_fp4, rep_a_blockscale",
        "del int_fp4, int_blockscale",
        "c3 = ops.shuffle_rows(c3, c_map)",
        "* topk_weights.view(m, num_topk, 1).to(out_dtype)",
        ").sum(dim=1)",
    ):
        assert line in source, line
    fused = inspect.getsource(modular_kernel.FusedMoEKernelModularImpl._fused_experts)
    # no chunking: the whole batch at once (M_chunk = M_full)
    assert re.search(r"_allocate_buffers\(\s*in_dtype,\s*a1q\.device,\s*M_full,\s*M_full,", fused)
    apply = inspect.getsource(modular_kernel.FusedMoEKernelModularImpl.apply)
    assert "output = hidden_states.new_empty(" in apply  # the layer's own (M, K) output
