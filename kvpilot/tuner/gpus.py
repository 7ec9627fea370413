"""The GPU catalogue: what each GPU model gives vLLM, and how nodes name it.

Sits just above :mod:`kvpilot.tuner.types`; the CLI and the operator look a GPU up
here and hand its :class:`~kvpilot.tuner.types.GpuSpec` to the planner and the
memory model (which never import this module); the operator turns a node's GPU
Feature Discovery labels into one with :func:`build_gpu_from_labels`. Data and
lookups only: no I/O, no environment.

Memory figures (see ``shared/research/vllm_reference.md`` §7.1 and §8):

* ``total_bytes`` is the total CUDA reports (``cudaMemGetInfo``, torch's "total
  capacity"), which is what vLLM multiplies by ``--gpu-memory-utilization``. It is
  below the marketing size and below NVML's figure. Values come from vLLM start-up
  logs and torch OOM messages (two decimals of GiB); where the sources disagree the
  lower one is kept, so plans err towards fitting.
* ``nvml_total_bytes`` is NVML's total, i.e. the ``nvidia.com/gpu.memory`` label in
  MiB. vLLM 0.33 picks its batch defaults from it.

fp8 KV cache: vLLM's FP8 attention paths are Hopper/Ada-and-newer features, so
the catalogue marks ``fp8_kv`` for NVIDIA compute capability >= 8.9 and for
MI300X. (Older GPUs can *store* an fp8 cache through the Triton backend, with a
software cast; the planner does not choose that.)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from kvpilot.tuner import errors
from kvpilot.tuner.types import GIB, GpuSpec

MIB = 1 << 20

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
FAMILY_LABEL = "nvidia.com/gpu.family"
CC_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
CC_MINOR_LABEL = "nvidia.com/gpu.compute.minor"

FP8_KV_MIN_CC = (8, 9)
"""Lowest NVIDIA compute capability on which the planner may choose an fp8 KV cache."""

_FAMILY_CC = {
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ada-lovelace": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}
"""Lowest compute capability of each ``nvidia.com/gpu.family`` value (GFD's mapping)."""


def _gib(value: float) -> int:
    return round(value * GIB)


def estimate_cuda_total(nvml_total_bytes: int) -> int:
    """CUDA-visible memory of a GPU known only by its NVML total: conservative.

    Observed gaps between NVML's and CUDA's totals are 0.3-0.9 GiB (§8 of the vLLM
    reference); keeping back ``max(1 GiB, 1 %)`` stays below every catalogue entry.
    The result is rounded down to a MiB.
    """
    reserve = max(GIB, nvml_total_bytes // 100)
    return max(0, (nvml_total_bytes - reserve) // MIB * MIB)


CATALOGUE: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="B200",
        total_bytes=_gib(178.35),
        compute_capability=(10, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-B200",),
        nvml_total_bytes=183_359 * MIB,
    ),
    GpuSpec(
        # GH200 144GB (HBM3e): NVML name "NVIDIA GH200 144G HBM3e" (vllm#18390's collect_env).
        # CUDA total: cuDeviceTotalMem 153,008,209,920 B (142.50 GiB) in a public CUDA-driver
        # fixture for this device; NVML's MiB unpublished, so None (batch defaults: >= 70 GiB
        # either way).
        name="GH200-144GB",
        total_bytes=153_008_209_920,
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-GH200-144G-HBM3e",),
    ),
    GpuSpec(
        name="H200",
        total_bytes=_gib(139.80),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-H200",),
        nvml_total_bytes=143_771 * MIB,
    ),
    GpuSpec(
        name="H100-SXM",
        total_bytes=_gib(79.18),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
        nvml_total_bytes=81_559 * MIB,
    ),
    GpuSpec(
        name="H100-PCIe",
        total_bytes=_gib(79.18),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-H100-PCIe",),
        nvml_total_bytes=81_559 * MIB,
    ),
    GpuSpec(
        # GH200 96GB (HBM3; sold as "480GB" / "120GB" for the superchip with its LPDDR5X):
        # nvidia-smi 97,871 MiB on public logs of "NVIDIA GH200 480GB" and "NVIDIA GH200
        # 120GB". No torch total published: CUDA total estimated from NVML's
        # (estimate_cuda_total). Not unified for vLLM: torch reports is_integrated False,
        # so vLLM measures HBM with cudaMemGetInfo as on an H100.
        name="GH200-96GB",
        total_bytes=estimate_cuda_total(97_871 * MIB),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-GH200-480GB", "NVIDIA-GH200-120GB"),
        nvml_total_bytes=97_871 * MIB,
    ),
    GpuSpec(
        # H20 96GB (HBM3): nvidia-smi 97,871 MiB on public logs of "NVIDIA H20"; no torch
        # total published, so estimated from NVML's (estimate_cuda_total).
        name="H20",
        total_bytes=estimate_cuda_total(97_871 * MIB),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-H20",),
        nvml_total_bytes=97_871 * MIB,
    ),
    GpuSpec(
        name="H100-NVL",
        total_bytes=_gib(93.00),
        compute_capability=(9, 0),
        fp8_kv=True,
        interconnect="nvlink",
        gfd_products=("NVIDIA-H100-NVL",),
        nvml_total_bytes=95_830 * MIB,
    ),
    GpuSpec(
        name="A100-80GB",
        total_bytes=_gib(79.15),
        compute_capability=(8, 0),
        fp8_kv=False,
        interconnect="nvlink",
        gfd_products=("NVIDIA-A100-SXM4-80GB",),
        nvml_total_bytes=81_920 * MIB,
    ),
    GpuSpec(
        name="A100-80GB-PCIe",
        total_bytes=_gib(79.15),
        compute_capability=(8, 0),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-A100-80GB-PCIe",),
        nvml_total_bytes=81_920 * MIB,
    ),
    GpuSpec(
        name="A100-40GB",
        total_bytes=_gib(39.39),
        compute_capability=(8, 0),
        fp8_kv=False,
        interconnect="nvlink",
        gfd_products=("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        nvml_total_bytes=40_960 * MIB,
    ),
    GpuSpec(
        name="A100-40GB-PCIe",
        total_bytes=_gib(39.39),
        compute_capability=(8, 0),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-A100-PCIE-40GB",),
        nvml_total_bytes=40_960 * MIB,
    ),
    GpuSpec(
        name="RTX-PRO-6000",
        total_bytes=_gib(95.01),
        compute_capability=(12, 0),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",),
        nvml_total_bytes=97_887 * MIB,
    ),
    GpuSpec(
        name="L40S",
        total_bytes=_gib(44.42),
        compute_capability=(8, 9),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-L40S",),
        nvml_total_bytes=46_068 * MIB,
    ),
    GpuSpec(
        name="RTX-A6000",
        total_bytes=_gib(47.53),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-RTX-A6000",),
        nvml_total_bytes=49_140 * MIB,
    ),
    GpuSpec(
        # A40 48GB GDDR6 (ECC on by default): nvidia-smi 46,068 MiB on two public logs of "NVIDIA A40";
        # no torch total published, so estimated from the NVML figure (estimate_cuda_total).
        name="A40",
        total_bytes=estimate_cuda_total(46_068 * MIB),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-A40",),
        nvml_total_bytes=46_068 * MIB,
    ),
    GpuSpec(
        name="L4",
        total_bytes=_gib(21.96),
        compute_capability=(8, 9),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-L4",),
        nvml_total_bytes=23_034 * MIB,
    ),
    GpuSpec(
        name="A10G",
        total_bytes=_gib(21.96),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-A10G",),
        nvml_total_bytes=23_028 * MIB,
    ),
    GpuSpec(
        # RTX 5090 32GB: torch "total capacity of 31.37 GiB" (Wan-Video/Wan2.1#465, a 5090);
        # nvidia-smi 32,607 MiB (noonghunna/club-3090#1322, "NVIDIA GeForce RTX 5090").
        name="RTX-5090",
        total_bytes=_gib(31.37),
        compute_capability=(12, 0),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-GeForce-RTX-5090",),
        nvml_total_bytes=32_607 * MIB,
    ),
    GpuSpec(
        name="RTX-4090",
        total_bytes=_gib(23.65),
        compute_capability=(8, 9),
        fp8_kv=True,
        interconnect="pcie",
        gfd_products=("NVIDIA-GeForce-RTX-4090",),
        nvml_total_bytes=24_564 * MIB,
    ),
    GpuSpec(
        name="RTX-3090",
        total_bytes=_gib(23.57),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-GeForce-RTX-3090",),
        nvml_total_bytes=24_576 * MIB,
    ),
    GpuSpec(
        # RTX 3090 Ti 24GB (GA102, compute capability 8.6, NVLink like the 3090): nvidia-smi 24,564 MiB
        # (noonghunna/club-3090#353, "NVIDIA GeForce RTX 3090 Ti | 24564 MiB"), the RTX 4090's NVML total,
        # whose torch total is 23.65 GiB. No torch total of a 3090 Ti is published; a vLLM 0.22.1 start
        # on one (tests/data/vllm_memory_cases_public_2x.json, case-109) implies 23.7 +/- 0.15 GiB from its
        # CUDA-graph utilisation adjustment (0.79 GiB / (0.9000 - 0.8667)). 23.65 is within both.
        name="RTX-3090-Ti",
        total_bytes=_gib(23.65),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-GeForce-RTX-3090-Ti",),
        nvml_total_bytes=24_564 * MIB,
    ),
    GpuSpec(
        # RTX A5000 24GB: nvidia-smi 24,564 MiB on public logs of "NVIDIA RTX A5000" (older
        # drivers show 24,576); no torch total published, so estimated from the lower NVML
        # figure (estimate_cuda_total).
        name="RTX-A5000",
        total_bytes=estimate_cuda_total(24_564 * MIB),
        compute_capability=(8, 6),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("NVIDIA-RTX-A5000",),
        nvml_total_bytes=24_564 * MIB,
    ),
    GpuSpec(
        name="T4",
        total_bytes=_gib(14.56),
        compute_capability=(7, 5),
        fp8_kv=False,
        interconnect="pcie",
        gfd_products=("Tesla-T4", "NVIDIA-Tesla-T4"),
        nvml_total_bytes=15_360 * MIB,
    ),
    GpuSpec(
        name="MI300X",
        total_bytes=_gib(191.69),
        compute_capability=(9, 4),
        fp8_kv=True,
        interconnect="infinity-fabric",
        vendor="amd",
    ),
)
"""Every GPU kvpilot knows, largest first. ``compute_capability`` for MI300X is what
torch reports for gfx942."""

ALIASES: Mapping[str, str] = {
    "b200-sxm": "B200",
    "h200-sxm": "H200",
    "h200-141gb": "H200",
    "h100": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100-sxm-80gb": "H100-SXM",
    "h100-hbm3": "H100-SXM",
    "h100-pcie-80gb": "H100-PCIe",
    "h100-94gb": "H100-NVL",
    "a100-sxm-80gb": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB",
    "a100-80gb-sxm": "A100-80GB",
    "a100-pcie-80gb": "A100-80GB-PCIe",
    "a100-sxm-40gb": "A100-40GB",
    "a100-sxm4-40gb": "A100-40GB",
    "a100-40gb-sxm": "A100-40GB",
    "a100-pcie-40gb": "A100-40GB-PCIe",
    "rtx-pro-6000-blackwell": "RTX-PRO-6000",
    "a6000": "RTX-A6000",
    "rtx4090": "RTX-4090",
    "4090": "RTX-4090",
    "geforce-rtx-4090": "RTX-4090",
    "rtx3090": "RTX-3090",
    "3090": "RTX-3090",
    "geforce-rtx-3090": "RTX-3090",
    "rtx3090ti": "RTX-3090-Ti",
    "3090-ti": "RTX-3090-Ti",
    "rtx-3090ti": "RTX-3090-Ti",
    "tesla-t4": "T4",
    "instinct-mi300x": "MI300X",
    "amd-instinct-mi300x": "MI300X",
    "rtx5090": "RTX-5090",
    "5090": "RTX-5090",
    "geforce-rtx-5090": "RTX-5090",
    "a5000": "RTX-A5000",
    "gh200": "GH200-96GB",
    "gh200-480gb": "GH200-96GB",
    "gh200-120gb": "GH200-96GB",
    "gh200-96gb": "GH200-96GB",
    "gh200-144gb": "GH200-144GB",
    "gh200-144g-hbm3e": "GH200-144GB",
    "h20-96gb": "H20",
}
"""Extra spellings (already normalised: lower case, dashes). Ambiguous ones such as
``a100`` are left out on purpose: the error lists both sizes."""


UNIFIED_MEMORY: Mapping[str, str] = {
    "gb10": "GB10 (DGX Spark)",
    "nvidia-gb10": "GB10 (DGX Spark)",
    "dgx-spark": "GB10 (DGX Spark)",
}
"""Unified-memory GPUs, refused by name (normalised spelling -> what to call it).

On these torch reports ``is_integrated`` and vLLM replaces the free memory it checks
against ``--gpu-memory-utilization`` with the host's ``psutil.virtual_memory().available``
(``vllm/utils/mem_utils.py``, ``MemorySnapshot.measure``): the budget moves with the
page cache and every other process on the machine, which kvpilot cannot see. (vLLM
0.33 also keeps GB10 on the small batch tier: :data:`kvpilot.tuner.vllm.GB10_EXCLUDED_SINCE`.)
GH200 is not among them: its HBM is measured with ``cudaMemGetInfo``."""

OTHER_VENDORS: Mapping[str, str] = {
    "intel": "an Intel GPU (vLLM's XPU platform)",
    "arc": "an Intel GPU (vLLM's XPU platform)",
    "gaudi": "an Intel Gaudi accelerator (the vllm-gaudi plugin's HPU platform)",
    "hpu": "an Intel Gaudi accelerator (the vllm-gaudi plugin's HPU platform)",
    "tpu": "a Google TPU (vLLM's TPU platform)",
    "ascend": "a Huawei Ascend NPU (the vllm-ascend plugin)",
    "npu": "a Huawei Ascend NPU (the vllm-ascend plugin)",
    "inferentia": "an AWS Neuron device (the vllm-neuron plugin)",
    "trainium": "an AWS Neuron device (the vllm-neuron plugin)",
    "neuron": "an AWS Neuron device (the vllm-neuron plugin)",
}
"""A word of a device's name (normalised) that says it is no CUDA or ROCm GPU -> what it is. vLLM serves
these through other platforms whose memory accounting kvpilot has not modelled: refused by what they are,
with what to do, instead of "did you mean" a catalogued NVIDIA GPU (an Intel Arc Pro B60 was offered the
RTX PRO 6000)."""

_COUNT_PREFIX = re.compile(r"^\d+\s*[x×*]\s*")
_PARENTHETICAL = re.compile(r"\([^)]*\)")


def _normalise(name: str) -> str:
    return re.sub(r"[-\s_]+", "-", name.strip().lower()).strip("-")


def _canonical(name: str) -> tuple[str, str | None]:
    """``name`` as an index key, and its MIG profile if it names a slice.

    Tolerates what people and nodes write around a GPU's name: a count (``4x NVIDIA
    H100``), a parenthetical (``NVIDIA A100 40GB (per log file name)``), GFD's
    ``-SHARED`` (time-slicing) and ``-MIG-<profile>`` suffixes, and the ``nvidia-``
    prefix.
    """
    text = _PARENTHETICAL.sub(" ", _COUNT_PREFIX.sub("", name.strip()))
    key, mig, profile = _normalise(text).removesuffix("-shared").partition("-mig-")
    return key.removeprefix("nvidia-"), profile if mig else None


def _refuse_unified_memory(name: str, key: str) -> None:
    device = UNIFIED_MEMORY.get(key) or UNIFIED_MEMORY.get(f"nvidia-{key}")
    if device is not None:
        raise errors.UnknownGpu(
            f"GPU {name!r} is {device}, a unified-memory GPU: vLLM budgets it from the host's available "
            "memory (page cache and other processes included), which kvpilot does not model. Run vLLM "
            "there with an explicit --kv-cache-memory-bytes sized by hand and without kvpilot's plan, or "
            "plan for a discrete GPU."
        )


def _refuse_other_vendor(name: str, key: str) -> None:
    words = (w.rstrip("0123456789") for w in key.split("-"))  # trainium2, gaudi3
    device = next((OTHER_VENDORS[w] for w in words if w in OTHER_VENDORS), None)
    if device is not None:
        raise errors.UnknownGpu(
            f"GPU {name!r} is {device}: kvpilot's memory model covers NVIDIA CUDA GPUs and the AMD GPUs "
            "its catalogue lists, not this platform's accounting. Size vLLM there by hand "
            "(--kv-cache-memory-bytes pins the KV pool), or plan for a catalogued GPU (kvpilot gpus)."
        )


def _build_index() -> dict[str, GpuSpec]:
    by_name = {spec.name: spec for spec in CATALOGUE}
    index: dict[str, GpuSpec] = {}
    for spec in CATALOGUE:
        index[_normalise(spec.name)] = spec
        for product in spec.gfd_products:
            index[_normalise(product).removeprefix("nvidia-")] = spec
    for alias, name in ALIASES.items():
        index[alias] = by_name[name]
    return index


_INDEX = _build_index()


def list_gpus() -> tuple[GpuSpec, ...]:
    """The whole catalogue, largest GPU first."""
    return CATALOGUE


def _suggest(name: str) -> str:
    key = _normalise(name)
    candidates = {_normalise(spec.name): spec.name for spec in CATALOGUE}
    candidates.update(ALIASES)
    names: list[str] = []
    close = [c for c in candidates if key and (key in c or c in key)]
    close += difflib.get_close_matches(key, list(candidates), n=6, cutoff=0.5)
    for match in close:
        if candidates[match] not in names:
            names.append(candidates[match])
    return f" Did you mean: {', '.join(names[:4])}?" if names else ""


def lookup_gpu(name: str) -> GpuSpec:
    """The catalogue entry called ``name``.

    Accepts catalogue names (``H100-SXM``), aliases (``h100``, ``a100-80gb``), NVML
    names (``NVIDIA H100 80GB HBM3``) and GFD product labels
    (``NVIDIA-A100-SXM4-80GB``, ``-SHARED`` allowed), case-insensitively, with a count
    or a parenthetical around them (``4x NVIDIA H100``). Raises
    :class:`~kvpilot.tuner.errors.UnknownGpu` with close matches otherwise, and by
    name for a MIG slice (its memory is the node's ``nvidia.com/gpu.memory`` label,
    not the whole GPU's), for unified-memory GPUs (:data:`UNIFIED_MEMORY`) and for other vendors'
    accelerators (:data:`OTHER_VENDORS`).
    """
    key, mig_profile = _canonical(name)
    _refuse_unified_memory(name, key)
    spec = _INDEX.get(key)
    if spec is None:
        _refuse_other_vendor(name, key)
        known = ", ".join(s.name for s in CATALOGUE)
        raise errors.UnknownGpu(
            f"GPU {name!r} is not in kvpilot's catalogue.{_suggest(key)} Known GPUs: {known}."
        )
    if mig_profile is not None:
        raise errors.UnknownGpu(
            f"GPU {name!r} is a MIG slice ({mig_profile}) of {spec.name}, with a fraction of its memory. "
            f"Let kvpilot read the slice from the node's labels (select the node with {PRODUCT_LABEL} in "
            f"spec.nodeSelector; GPU Feature Discovery sets {MEMORY_LABEL}), or name the whole GPU."
        )
    return spec


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise errors.UnknownGpu(f"Node label {key}={raw!r} is not an integer.") from None
    if value < 0:
        raise errors.UnknownGpu(f"Node label {key}={raw!r} is negative.")
    return value


def _compute_capability(labels: Mapping[str, str]) -> tuple[int, int] | None:
    major = _int_label(labels, CC_MAJOR_LABEL)
    if major is not None:
        return (major, _int_label(labels, CC_MINOR_LABEL) or 0)
    return _FAMILY_CC.get(str(labels.get(FAMILY_LABEL, "")).strip().lower())


def gpu_count_from_labels(labels: Mapping[str, str]) -> int | None:
    """``nvidia.com/gpu.count`` as an int, or ``None`` when the node lacks the label."""
    return _int_label(labels, COUNT_LABEL)


def build_gpu_from_labels(labels: Mapping[str, str]) -> GpuSpec:
    """The GPU a node's GPU Feature Discovery labels describe.

    * A product in the catalogue (``nvidia.com/gpu.product``, with GFD's ``-SHARED``
      suffix allowed) gives its catalogue entry.
    * A MIG slice (``<product>-MIG-<profile>``) or a product the catalogue lacks
      gives a derived entry, named after the product label, when the node has an
      ``nvidia.com/gpu.memory`` label (NVML MiB): CUDA-visible memory is estimated
      conservatively from it (:func:`estimate_cuda_total`), the compute capability
      is taken from ``nvidia.com/gpu.compute.major/minor`` or ``nvidia.com/gpu.family``
      (or the catalogue's base product).
    * Otherwise :class:`~kvpilot.tuner.errors.UnknownGpu` says which label or
      catalogue entry to add.
    """
    product = str(labels.get(PRODUCT_LABEL, "")).strip()
    memory_mib = _int_label(labels, MEMORY_LABEL)
    base_product, mig_profile = _canonical(product) if product else ("", None)
    _refuse_unified_memory(product, base_product)
    base = _INDEX.get(base_product) if base_product else None
    if base is not None and mig_profile is None:
        return base
    if not memory_mib:
        if not product:
            raise errors.UnknownGpu(
                f"The node has no {PRODUCT_LABEL} label, so kvpilot cannot tell its GPU. Install NVIDIA "
                f"GPU Feature Discovery (it sets {PRODUCT_LABEL} and {MEMORY_LABEL}), label the node "
                f"{MEMORY_LABEL}=<total MiB as nvidia-smi reports it>, or name the GPU in the spec."
            )
        raise errors.UnknownGpu(
            f"GPU product {product!r} is not in kvpilot's catalogue and the node has no {MEMORY_LABEL} "
            f"label. Label the node {MEMORY_LABEL}=<total MiB as nvidia-smi reports it>, or add a GpuSpec "
            f"with gfd_products=({product!r},) to kvpilot/tuner/gpus.py.{_suggest(base_product)}"
        )
    nvml_bytes = memory_mib * MIB
    cc = _compute_capability(labels) or (base.compute_capability if base else (0, 0))
    vendor = base.vendor if base else "nvidia"
    return GpuSpec(
        name=product or f"unknown-{memory_mib}MiB",
        total_bytes=estimate_cuda_total(nvml_bytes),
        compute_capability=cc,
        fp8_kv=base.fp8_kv if base else cc >= FP8_KV_MIN_CC,
        interconnect=base.interconnect if base and mig_profile is None else "pcie",
        vendor=vendor,
        gfd_products=(product,) if product else (),
        nvml_total_bytes=nvml_bytes,
    )
