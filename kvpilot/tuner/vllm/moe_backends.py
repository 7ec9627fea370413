"""``--moe-backend``: which kernels run a MoE model's routed experts, as vLLM reads the flag.

vLLM 0.33's parser (``engine/arg_utils.py:1843-1845``) takes ``--moe-backend`` with the choices of
``KernelConfig.moe_backend`` (the ``MoEBackend`` literal, ``config/kernel.py:122-147``), the value lowered and
its dashes made underscores first (``type=lambda s: s.lower().replace("-", "_")``); anything else is refused.
``auto`` (the default) lets vLLM choose by model and GPU; any other value is handed to the MoE method of the
model's quantization (``EngineArgs.create_engine_config``: ``if self.moe_backend != "auto"``), whose oracle
maps it to one experts class or raises at load.

NVFP4 experts (ModelOpt ``modelopt_fp4``, compressed-tensors W4A4 NVFP4) choose through
``model_executor/layers/fused_moe/oracle/nvfp4.py::select_nvfp4_moe_backend``: an explicit value goes through
``map_nvfp4_backend`` (0.33: lines 163-182; 0.20.0: lines 132-147), which raises ``ValueError`` for a value
outside its table (:data:`NVFP4_MOE_BACKENDS`), and ``cutlass`` is ``NvFp4MoeBackend.VLLM_CUTLASS``, whose one
experts class is ``CutlassExpertsFp4`` (``backend_to_kernel_cls``). What that class takes on the GPU in the
profile run (its workspaces and the temporaries of ``run_cutlass_moe_fp4``) is the arithmetic of
:mod:`kvpilot.tuner.memory.moe_kernels`; it was read in 0.20.0, 0.20.2, 0.22.1 and 0.33.0 (identical in all
four: ``model_executor/layers/fused_moe/experts/cutlass_moe.py``, 0.20.0 lines 483-665 and 738-752; the
modular kernel's ``_allocate_buffers``, ``modular_kernel.py:1040-1102``), so kvpilot budgets it from
:data:`CUTLASS_FP4_BUDGETED_SINCE`. Its weights are those of the other NVFP4 backends: only the block scales
are swizzled (``prepare_nvfp4_moe_layer_for_fi_or_cutlass``, padded to whole 128 x 4 tiles), nothing is
repacked.

Every other backend value, and ``cutlass`` for other quantizations (FP8 runs ``CutlassExpertsFp8``), is not
budgeted: the plan warns by name (:data:`kvpilot.tuner.vllm.unmodelled.MOE_BACKEND_UNBUDGETED`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import find_flag_values
from kvpilot.tuner.vllm.versions import Version

MOE_BACKEND_FLAG = "--moe-backend"

AUTO = "auto"

MOE_BACKENDS: tuple[str, ...] = (
    "auto",
    "triton",
    "batched_triton",
    "deep_gemm",
    "deep_gemm_mega_moe",
    "cutlass",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
    "flashinfer_cutedsl",
    "flashinfer_moe_ep_cutedsl",
    "flashinfer_b12x",
    "b12x",
    "flashinfer_moe_ep_mega_deep_gemm",
    "marlin",
    "humming",
    "triton_unfused",
    "aiter",
    "aiter_mega_moe",
    "aiter_triton_mxfp4_bf16",
    "aiter_triton_mxfp4_mxfp4",
    "flydsl",
    "hpc",
    "emulation",
    "rdna3",
)
"""vLLM 0.33's choices of ``--moe-backend`` (``config/kernel.py:122-147``, the ``MoEBackend`` literal)."""

NVFP4_MOE_BACKENDS: Mapping[str, str] = {
    "b12x": "B12X",
    "cutlass": "VLLM_CUTLASS",
    "flashinfer_trtllm": "FLASHINFER_TRTLLM",
    "flashinfer_cutlass": "FLASHINFER_CUTLASS",
    "flashinfer_cutedsl": "FLASHINFER_CUTEDSL",
    "flashinfer_moe_ep_cutedsl": "FLASHINFER_MOE_EP_CUTEDSL",
    "flashinfer_b12x": "FLASHINFER_B12X",
    "marlin": "MARLIN",
    "humming": "HUMMING",
    "emulation": "EMULATION",
}
"""vLLM 0.33's ``map_nvfp4_backend`` (``fused_moe/oracle/nvfp4.py:163-182``): the ``--moe-backend`` values an
NVFP4 MoE model accepts, each with the name of its ``NvFp4MoeBackend``; any other explicit value raises at
load. The names are the contract's to check: ``tests/contract/test_contract_moe_backend.py`` asserts the table
is ``map_nvfp4_backend``'s, and finds ``cutlass``'s experts class (the one kvpilot sizes) by its name here."""

CUTLASS = "cutlass"

CUTLASS_FP4_BUDGETED_SINCE: Version = (0, 20)
"""The first release whose ``CutlassExpertsFp4`` kvpilot budgets: its code was read in 0.20.0, 0.20.2, 0.22.1
and 0.33.0 and is the same in all (the releases between are taken to hold it too)."""


def _normalise(value: str) -> str:
    """The parser's ``type``: lowered, dashes made underscores (``engine/arg_utils.py:1844``)."""
    return value.lower().replace("-", "_")


def read_moe_backend(args: Sequence[str]) -> str | None:
    """The ``--moe-backend`` of ``args`` as vLLM keeps it (the last value, normalised); ``None`` when it is
    absent or ``auto`` (vLLM chooses). A value the parser refuses is :func:`check_moe_backend`'s to report."""
    values = find_flag_values(args, MOE_BACKEND_FLAG)
    if not values:
        return None
    value = _normalise(values[-1])
    return None if value == AUTO else value


def check_moe_backend(args: Sequence[str]) -> None:
    """Refuse a ``--moe-backend`` value vLLM 0.33's parser refuses (not one of :data:`MOE_BACKENDS` once
    normalised). An abbreviation of the flag is :func:`.engine_flags.check_engine_flags`' to refuse."""
    for value in find_flag_values(args, MOE_BACKEND_FLAG):
        if _normalise(value) not in MOE_BACKENDS:
            raise errors.InvalidEngineArgs(
                f"{MOE_BACKEND_FLAG} {value[:40]!r} is not a vLLM 0.33 MoE backend (vLLM refuses it); valid "
                f"values are: {', '.join(MOE_BACKENDS)}",
                flag=MOE_BACKEND_FLAG,
            )


def check_nvfp4_moe_backend(backend: str | None) -> None:
    """Refuse, as vLLM 0.33 does at load (``map_nvfp4_backend``'s ``ValueError``), an explicit backend an
    NVFP4 MoE model has no kernel for."""
    if backend is not None and backend not in NVFP4_MOE_BACKENDS:
        raise errors.InvalidEngineArgs(
            f"{MOE_BACKEND_FLAG} {backend} is not supported for NVFP4 MoE experts: vLLM 0.33 refuses it at "
            f"load (map_nvfp4_backend); use one of {', '.join(NVFP4_MOE_BACKENDS)}, or auto",
            flag=MOE_BACKEND_FLAG,
        )


def budgets_cutlass_fp4(backend: str | None, *, nvfp4_experts: bool, version: Version) -> bool:
    """Whether the engine runs ``CutlassExpertsFp4`` (``--moe-backend cutlass`` on W4A4 NVFP4 experts) in a
    release whose code kvpilot read for it."""
    return backend == CUTLASS and nvfp4_experts and version >= CUTLASS_FP4_BUDGETED_SINCE
