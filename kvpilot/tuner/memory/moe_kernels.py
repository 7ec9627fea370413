"""What an explicitly chosen MoE kernel takes in the profile run, where it differs from the fitted MoE term.

:func:`kvpilot.tuner.memory.budget.compute_activation_bytes` sizes a MoE layer's share of the profile run's
peak with a fitted width (the triton ``fused_experts`` path vLLM chooses by default). ``--moe-backend``
(:mod:`kvpilot.tuner.vllm.moe_backends`) can put another kernel there; where kvpilot has read that kernel's
code, its bytes replace the fitted term:

* ``cutlass`` on W4A4 NVFP4 experts runs ``CutlassExpertsFp4`` through vLLM's modular kernel
  (``model_executor/layers/fused_moe/experts/cutlass_moe.py`` and ``modular_kernel.py``, the same in 0.20.0,
  0.20.2, 0.22.1 and 0.33.0; line numbers below are 0.20.0's). For ``M`` tokens (all of the profile run's
  ``max_num_batched_tokens``: ``_fused_experts`` passes ``M_full`` as the chunk, ``modular_kernel.py:1232``),
  ``top_k`` experts a token, hidden size ``K`` and ``N`` the width of ``w1`` (``moe_problem_size``:
  ``w1.shape[1]``, twice the expert's intermediate size when the activation is gated), in the model's dtype:

  - the workspace (``_allocate_buffers``, ``modular_kernel.py:1040-1102``; ``workspace_shapes``,
    ``cutlass_moe.py:738-752``): ``workspace13`` of ``M x top_k x max(2N, K)`` elements, sharing its buffer
    with the ``M x K`` output, beside ``workspace2`` of ``M x top_k x N``, one allocation of the workspace
    manager (``v1/worker/workspace.py::get_simultaneous``, line 104 in 0.20.0: each part rounded up to 256
    bytes) that persists after the profile run;
  - the layer's own output, ``torch.empty_like(hidden_states)`` (``modular_kernel.py:1372-1376``: NVFP4
    kernels are built with ``inplace=False``, ``oracle/nvfp4.py:510``; 0.33 always allocates it,
    ``hidden_states.new_empty``, ``modular_kernel.py:1536``);
  - in ``run_cutlass_moe_fp4`` (``cutlass_moe.py:483-665``), at its last step, alive together: the input
    rows gathered per expert (``a = ops.shuffle_rows(a, a_map)``, ``M x top_k x K``, held to the end), the
    second GEMM's rows put back in token order (``c3 = ops.shuffle_rows(c3, c_map)``, ``M x top_k x K``),
    their product with the router weights (``M x top_k x K``) and its sum over the experts (``M x K``),
    and the two int32 row maps (``a_map``, ``c_map``: ``M x top_k`` each). The FP4-quantized copies of the
    inputs are freed before (``del rep_a_fp4, rep_a_blockscale``; ``del int_fp4, int_blockscale``), and the
    router weights cast to the model's dtype (``M x top_k``) are freed once multiplied, before the sum.

  The per-expert offsets and problem sizes (``E + 1`` and ``E x 3`` int32) are left out: a few KiB.

Pure arithmetic; the release facts (which flag value runs which class) are :mod:`kvpilot.tuner.vllm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.arith import round_up
from kvpilot.tuner.model import ModelSpec

WORKSPACE_ALIGN = 256
"""The workspace manager rounds each part up to this many bytes (``get_simultaneous``: ``round_up(actual,
256)``)."""
INDEX_BYTES = 4
"""``a_map`` / ``c_map`` are int32 (``cutlass_moe.py:577-578``, 0.20.0)."""


@dataclass(frozen=True, slots=True)
class MoeKernelBytes:
    """A MoE kernel's bytes in the profile run on one rank."""

    workspace: int
    """What stays allocated after the layer returns (the workspace manager's buffer)."""
    peak: int
    """The layer's peak: the workspace plus what its forward holds at its widest step."""


def nvfp4_experts(model: ModelSpec) -> bool:
    """Whether the routed experts are W4A4 NVFP4, the experts whose kernel ``select_nvfp4_moe_backend``
    chooses: ModelOpt NVFP4 (``modelopt_fp4``) or compressed-tensors NVFP4 weights and activations."""
    q = model.quantization
    if model.moe is None or q is None:
        return False
    return q.method == "nvfp4" or (q.nvfp4 and q.nvfp4_activations)


def compute_cutlass_fp4_moe_bytes(
    tokens: int, *, top_k: int, hidden_size: int, intermediate_size: int, gated: bool, dtype_bytes: int
) -> MoeKernelBytes:
    """``CutlassExpertsFp4``'s bytes for ``tokens`` tokens (module docstring): ``intermediate_size`` is one
    expert's on this rank; ``gated``: its activation multiplies gate and up (``w1`` is twice as wide)."""
    m, k, b = tokens, hidden_size, dtype_bytes
    n = intermediate_size * (2 if gated else 1)  # w1.shape[1]: moe_problem_size's N
    workspace13 = max(m * top_k * max(2 * n, k), m * k) * b  # shared with the (M, K) fused output
    workspace2 = m * top_k * n * b
    workspace = round_up(workspace13, WORKSPACE_ALIGN) + round_up(workspace2, WORKSPACE_ALIGN)
    output = m * k * b  # torch.empty_like(hidden_states)
    rows = m * top_k * k * b
    transient = 3 * rows + m * k * b + 2 * m * top_k * INDEX_BYTES  # a, c3, their weighted product, its sum
    return MoeKernelBytes(workspace=workspace, peak=workspace + output + transient)


def compute_moe_kernel_bytes(
    model: ModelSpec,
    moe_backend: str | None,
    version: vllm.Version,
    *,
    tokens: int,
    intermediate_size: int,
    dtype_bytes: int,
) -> MoeKernelBytes | None:
    """The bytes of the MoE kernel ``--moe-backend`` runs on this model, or ``None`` when kvpilot has not read
    that kernel (the fitted MoE term then stands; the plan names the flag,
    :func:`describe_unbudgeted_moe_backend`). ``tokens``: the tokens the MoE layers see on the rank;
    ``intermediate_size``: one expert's on the rank."""
    moe = model.moe
    if moe is None or not vllm.budgets_cutlass_fp4(
        moe_backend, nvfp4_experts=nvfp4_experts(model), version=version
    ):
        return None
    return compute_cutlass_fp4_moe_bytes(
        tokens,
        top_k=moe.experts_per_token,
        hidden_size=model.hidden_size,
        intermediate_size=intermediate_size,
        gated=model.mlp_gated,
        dtype_bytes=dtype_bytes,
    )


def check_moe_backend_model(model: ModelSpec, moe_backend: str | None) -> None:
    """Refuse what vLLM refuses at load for this model: an explicit backend NVFP4 experts have no kernel for
    (:func:`kvpilot.tuner.vllm.check_nvfp4_moe_backend`)."""
    if nvfp4_experts(model):
        vllm.check_nvfp4_moe_backend(moe_backend)


def describe_unbudgeted_moe_backend(
    model: ModelSpec, moe_backend: str | None, vllm_version: str
) -> str | None:
    """The plan's warning for a ``--moe-backend`` whose kernel kvpilot does not budget on this model, or
    ``None`` (none given, a dense model, which has no experts to run, or a budgeted kernel)."""
    if moe_backend is None or model.moe is None:
        return None
    version = vllm.parse_version(vllm_version)
    if vllm.budgets_cutlass_fp4(moe_backend, nvfp4_experts=nvfp4_experts(model), version=version):
        return None
    return vllm.describe_unbudgeted_moe_backend(moe_backend)
