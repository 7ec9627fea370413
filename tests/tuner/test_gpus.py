"""The GPU catalogue: memory figures, lookups, and GPU Feature Discovery labels."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpilot.tuner import errors, gpus
from kvpilot.tuner.types import GIB

MIB = 1 << 20

REQUIRED = [
    "H200",
    "H100-SXM",
    "H100-PCIe",
    "A100-40GB",
    "A100-80GB",
    "A100-80GB-PCIe",
    "L40S",
    "L4",
    "A10G",
    "T4",
    "RTX-4090",
    "RTX-3090",
    "RTX-3090-Ti",
    "RTX-A6000",
    "B200",
    "MI300X",
    "RTX-5090",
    "GH200-96GB",
    "GH200-144GB",
    "H20",
    "RTX-A5000",
    "A40",
]


def test_catalogue_has_the_required_gpus() -> None:
    names = {g.name for g in gpus.list_gpus()}
    assert set(REQUIRED) <= names


def test_names_and_products_are_unique() -> None:
    names = [g.name for g in gpus.CATALOGUE]
    products = [p for g in gpus.CATALOGUE for p in g.gfd_products]
    assert len(names) == len(set(names))
    assert len(products) == len(set(products))


@pytest.mark.parametrize("gpu", gpus.CATALOGUE, ids=lambda g: g.name)
def test_cuda_total_sits_just_below_nvml_total(gpu: gpus.GpuSpec) -> None:
    assert gpu.total_bytes > 0
    if gpu.nvml_total_bytes is not None:
        assert 0 < gpu.nvml_total_bytes - gpu.total_bytes < 1.5 * GIB


@pytest.mark.parametrize("gpu", gpus.CATALOGUE, ids=lambda g: g.name)
def test_fp8_kv_follows_compute_capability(gpu: gpus.GpuSpec) -> None:
    if gpu.vendor == "nvidia":
        assert gpu.fp8_kv == (gpu.compute_capability >= (8, 9))
    else:
        assert gpu.fp8_kv


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("H100-SXM", 79.11, 79.25),
        ("H200", 139.72, 139.81),
        ("B200", 178.35, 178.36),
        ("A100-40GB", 39.39, 39.56),
        ("RTX-5090", 31.37, 31.37),
        ("GH200-144GB", 142.50, 142.50),
    ],
)
def test_totals_match_logged_figures(name: str, low: float, high: float) -> None:
    """vllm_reference.md §8: totals as torch/vLLM logs them."""
    assert low - 0.005 <= gpus.lookup_gpu(name).total_gib <= high + 0.005


def test_interconnects() -> None:
    assert gpus.lookup_gpu("H100-SXM").interconnect == "nvlink"
    assert gpus.lookup_gpu("H100-PCIe").interconnect == "pcie"
    assert gpus.lookup_gpu("MI300X").interconnect == "infinity-fabric"
    assert gpus.lookup_gpu("MI300X").vendor == "amd"


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("H100-SXM", "H100-SXM"),
        ("h100", "H100-SXM"),
        ("H100 SXM", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM"),
        ("nvidia-h100-pcie", "H100-PCIe"),
        ("a100-80gb", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB-PCIe"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-PCIE-40GB", "A100-40GB-PCIe"),
        ("NVIDIA-L4", "L4"),
        ("l40s", "L40S"),
        ("Tesla-T4", "T4"),
        ("NVIDIA-GeForce-RTX-4090", "RTX-4090"),
        ("rtx3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX-3090-Ti"),
        ("NVIDIA-GeForce-RTX-3090-Ti", "RTX-3090-Ti"),
        ("2 x RTX 3090Ti", "RTX-3090-Ti"),
        ("a6000", "RTX-A6000"),
        ("NVIDIA-B200", "B200"),
        ("mi300x", "MI300X"),
        ("NVIDIA-GeForce-RTX-5090", "RTX-5090"),
        ("NVIDIA GeForce RTX 5090", "RTX-5090"),
        ("NVIDIA-H100-NVL", "H100-NVL"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("NVIDIA-GH200-120GB", "GH200-96GB"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA-H20", "H20"),
        ("NVIDIA RTX A5000", "RTX-A5000"),
        ("NVIDIA A40 (48 GB)", "A40"),
        ("NVIDIA-A40", "A40"),
        ("4x NVIDIA H100", "H100-SXM"),
        ("8 x H200", "H200"),
        ("NVIDIA A100 40GB (per log file name)", "A100-40GB"),
        ("NVIDIA-L4-SHARED", "L4"),
    ],
)
def test_lookup_accepts_names_aliases_and_products(query: str, name: str) -> None:
    assert gpus.lookup_gpu(query).name == name


@pytest.mark.parametrize("gpu", gpus.CATALOGUE, ids=lambda g: g.name)
def test_every_product_label_finds_its_entry(gpu: gpus.GpuSpec) -> None:
    assert gpus.lookup_gpu(gpu.name) is gpu
    for product in gpu.gfd_products:
        assert gpus.lookup_gpu(product) is gpu
        assert gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: product}) is gpu


def test_ambiguous_name_lists_both_sizes() -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu("a100")
    assert "A100-80GB" in info.value.message
    assert "A100-40GB" in info.value.message


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu("H10")
    assert "Did you mean" in info.value.message
    assert "H100-SXM" in info.value.message
    assert info.value.reason == "UnknownGpu"


def test_labels_of_a_known_product() -> None:
    labels = {gpus.PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", gpus.MEMORY_LABEL: "81559", gpus.COUNT_LABEL: "8"}
    assert gpus.build_gpu_from_labels(labels).name == "H100-SXM"
    assert gpus.gpu_count_from_labels(labels) == 8


def test_time_sliced_product_is_the_base_gpu() -> None:
    assert gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: "NVIDIA-L4-SHARED"}).name == "L4"


def test_mig_slice_is_derived_from_its_memory_label() -> None:
    gpu = gpus.build_gpu_from_labels(
        {gpus.PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", gpus.MEMORY_LABEL: "19968"}
    )
    assert gpu.nvml_total_bytes == 19968 * MIB
    assert gpu.total_bytes < 19968 * MIB - GIB // 2
    assert gpu.compute_capability == (8, 0)
    assert not gpu.fp8_kv


def test_unknown_product_with_memory_is_derived_conservatively() -> None:
    labels = {
        gpus.PRODUCT_LABEL: "NVIDIA-RTX-PRO-4500-Blackwell",
        gpus.MEMORY_LABEL: "32607",
        gpus.CC_MAJOR_LABEL: "12",
        gpus.CC_MINOR_LABEL: "0",
    }
    gpu = gpus.build_gpu_from_labels(labels)
    assert gpu.name == "NVIDIA-RTX-PRO-4500-Blackwell"
    assert gpu.gfd_products == ("NVIDIA-RTX-PRO-4500-Blackwell",)
    assert gpu.compute_capability == (12, 0)
    assert gpu.fp8_kv
    assert gpu.interconnect == "pcie"
    assert 32607 * MIB - 1.5 * GIB < gpu.total_bytes <= 32607 * MIB - GIB


def test_unknown_product_takes_compute_capability_from_the_family() -> None:
    labels = {gpus.PRODUCT_LABEL: "NVIDIA-A16", gpus.MEMORY_LABEL: "15356", gpus.FAMILY_LABEL: "ampere"}
    gpu = gpus.build_gpu_from_labels(labels)
    assert gpu.compute_capability == (8, 0)
    assert not gpu.fp8_kv


def test_unknown_product_without_family_or_capability_gets_no_fp8() -> None:
    gpu = gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: "Mystery-GPU", gpus.MEMORY_LABEL: "16384"})
    assert gpu.compute_capability == (0, 0)
    assert not gpu.fp8_kv


def test_unknown_product_without_memory_says_what_to_add() -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: "NVIDIA-RTX-PRO-4500-Blackwell"})
    message = info.value.message
    assert "nvidia.com/gpu.memory" in message
    assert "kvpilot/tuner/gpus.py" in message
    assert "gfd_products=('NVIDIA-RTX-PRO-4500-Blackwell',)" in message


def test_node_without_gpu_labels_says_what_to_install() -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.build_gpu_from_labels({})
    assert "nvidia.com/gpu.product" in info.value.message
    assert "GPU Feature Discovery" in info.value.message


@pytest.mark.parametrize("value", ["eighty", "-5", "1.5"])
def test_malformed_memory_label_is_an_unknown_gpu(value: str) -> None:
    with pytest.raises(errors.UnknownGpu, match="nvidia.com/gpu.memory"):
        gpus.build_gpu_from_labels({gpus.PRODUCT_LABEL: "Mystery", gpus.MEMORY_LABEL: value})


def test_count_label() -> None:
    assert gpus.gpu_count_from_labels({}) is None
    assert gpus.gpu_count_from_labels({gpus.COUNT_LABEL: "4"}) == 4
    with pytest.raises(errors.UnknownGpu):
        gpus.gpu_count_from_labels({gpus.COUNT_LABEL: "four"})


@pytest.mark.parametrize("gpu", [g for g in gpus.CATALOGUE if g.nvml_total_bytes], ids=lambda g: g.name)
def test_estimate_from_nvml_never_exceeds_the_catalogue(gpu: gpus.GpuSpec) -> None:
    """Entries with a logged CUDA total sit above the estimate; the others are the estimate."""
    assert gpu.nvml_total_bytes is not None
    assert gpus.estimate_cuda_total(gpu.nvml_total_bytes) <= gpu.total_bytes


LABELS = sorted(value for name, value in vars(gpus).items() if name.endswith("_LABEL"))


@given(st.dictionaries(st.sampled_from(LABELS), st.text()))
def test_any_labels_give_a_gpu_or_unknown_gpu(labels: dict[str, str]) -> None:
    try:
        gpu = gpus.build_gpu_from_labels(labels)
    except errors.UnknownGpu as exc:
        assert exc.message
    else:
        assert gpu.total_bytes >= 0


@pytest.mark.parametrize("name", ["NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"])
def test_a_mig_slice_is_refused_by_name_not_planned_as_the_whole_gpu(name: str) -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu(name)
    assert "MIG slice" in info.value.message
    assert gpus.MEMORY_LABEL in info.value.message


@pytest.mark.parametrize("name", ["GB10", "NVIDIA GB10", "DGX Spark"])
def test_unified_memory_gb10_is_refused_by_name_with_what_to_do(name: str) -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu(name)
    assert "GB10" in info.value.message and "unified-memory" in info.value.message
    assert "--kv-cache-memory-bytes" in info.value.message


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("Intel Arc Pro B60 (24 GB)", "XPU"),
        ("Intel Data Center GPU Max 1550", "XPU"),
        ("Gaudi 3", "HPU"),
        ("TPU v5e", "TPU"),
        ("Ascend 910B", "vllm-ascend"),
        ("AWS Trainium2", "Neuron"),
    ],
)
def test_other_vendors_accelerators_are_refused_by_what_they_are(name: str, what: str) -> None:
    """Not "did you mean RTX-PRO-6000" for an Intel Arc Pro B60 (a public 0.28 log, case-101)."""
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu(name)
    assert what in info.value.message and "Did you mean" not in info.value.message
    assert "--kv-cache-memory-bytes" in info.value.message


def test_gb10_node_labels_are_refused_even_with_a_memory_label() -> None:
    labels = {
        gpus.PRODUCT_LABEL: "NVIDIA-GB10",
        gpus.MEMORY_LABEL: "124610",
        gpus.CC_MAJOR_LABEL: "12",
        gpus.CC_MINOR_LABEL: "1",
    }
    with pytest.raises(errors.UnknownGpu, match="unified-memory"):
        gpus.build_gpu_from_labels(labels)


def test_an_unknown_gpu_is_still_refused_by_name() -> None:
    with pytest.raises(errors.UnknownGpu) as info:
        gpus.lookup_gpu("4x NVIDIA B300")
    assert "'4x NVIDIA B300' is not in kvpilot's catalogue" in info.value.message
    assert "B200" in info.value.message
