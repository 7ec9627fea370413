"""kvpilot's per-release vLLM switches agree with each release's own code.

``tests/data/vllm_release_facts.json`` is written by ``bench/vllm_release_facts.py`` from the wheels
0.19-0.33 (no network here: only the data file is read). Each test names the fact and the release
so a wrong "since" fails on the release it is wrong for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpilot.tuner import vllm
from kvpilot.tuner.types import GIB, GpuSpec
from kvpilot.tuner.vllm import registry_data

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "vllm_release_facts.json").read_text())
RELEASES: dict[str, Any] = DATA["releases"]
IDS = sorted(RELEASES, key=vllm.parse_version)


def _v(minor: str) -> vllm.Version:
    return vllm.parse_version(minor)


def test_provenance_names_the_generator_and_every_wheel() -> None:
    assert DATA["generator"] == "bench/vllm_release_facts.py"
    assert [w.rsplit(".", 1)[0] for w in DATA["wheels"]] == IDS
    assert IDS[0] == "0.19" and IDS[-1] == ".".join(map(str, vllm.NEWEST_MODELLED))
    assert list(registry_data.REGISTRY_RELEASES) == IDS


@pytest.mark.parametrize("minor", IDS)
def test_model_runner_default(minor: str) -> None:
    fact = RELEASES[minor]["model_runner"]
    assert fact["env"] == vllm.V2_RUNNER_ENV
    version = _v(minor)
    if fact["rule"] == "v1":
        assert fact["env_default"] == "0"
        assert vllm.uses_model_runner_v2(version) is False
        assert vllm.uses_model_runner_v2(version, model=vllm.RunnerModel("Qwen3ForCausalLM")) is False
    elif fact["rule"] == "v2":
        assert vllm.uses_model_runner_v2(version) is True
        assert vllm.uses_model_runner_v2(version, model=vllm.RunnerModel("X", is_moe=True)) is True
    else:
        rule = vllm.RUNNER_RULES[version]
        assert (rule.rule, rule.hybrid, rule.attention_free) == (
            fact["rule"],
            fact["hybrid"],
            fact["attention_free"],
        )
        assert rule.architectures == frozenset(fact["architectures"])
    assert vllm.uses_model_runner_v2(version, override=False) is False


@pytest.mark.parametrize(
    ("minor", "model", "v2"),
    [
        ("0.22", vllm.RunnerModel("Qwen3ForCausalLM"), True),
        ("0.22", vllm.RunnerModel("Qwen3ForCausalLM", is_quantized=True), False),
        ("0.22", vllm.RunnerModel("LlamaForCausalLM"), False),
        ("0.24", vllm.RunnerModel("Qwen2MoeForCausalLM", is_moe=True), True),
        ("0.24", vllm.RunnerModel("GptOssForCausalLM", is_moe=True), False),
        ("0.25", vllm.RunnerModel("LlamaForCausalLM"), True),
        ("0.25", vllm.RunnerModel("Qwen3NextForCausalLM", is_moe=True, is_hybrid=True), False),
        ("0.27", vllm.RunnerModel("KimiK3ForConditionalGeneration", is_moe=True, is_hybrid=True), True),
        ("0.27", vllm.RunnerModel("MambaForCausalLM", is_attention_free=True), False),
        ("0.28", vllm.RunnerModel("MixtralForCausalLM", is_moe=True), False),
        ("0.31", vllm.RunnerModel("MixtralForCausalLM", is_moe=True), True),
    ],
)
def test_runner_choice_by_model(minor: str, model: vllm.RunnerModel, v2: bool) -> None:
    """``_is_default_v2_model_runner_model`` of 0.22-0.28, case by case (0.27.1 and 0.31.0 logs: V2)."""
    assert vllm.uses_model_runner_v2(_v(minor), model=model) is v2


@pytest.mark.parametrize("minor", IDS)
def test_mamba_align_mode(minor: str) -> None:
    fact = RELEASES[minor]["mamba_align"]
    assert vllm.uses_mamba_align_mode(_v(minor)) is fact["align_with_prefix_caching"]
    assert vllm.uses_mamba_align_mode(_v(minor), enable_prefix_caching=False) is False


@pytest.mark.parametrize("minor", IDS)
def test_null_block_in_fit_check(minor: str) -> None:
    fact = RELEASES[minor]["null_block"]
    assert vllm.reserves_null_block_in_check(_v(minor)) is fact["reserved_in_fit_check"]


@pytest.mark.parametrize("minor", IDS)
def test_where_the_fit_error_is_raised(minor: str) -> None:
    """The start-up traceback's frame above "To serve at least one request" (kv_cache_planning.py: 0.33+)."""
    assert vllm.kv_fit_error_raised_in(_v(minor)) == RELEASES[minor]["fit_error"]["raised_in"]


@pytest.mark.parametrize("minor", IDS)
def test_cuda_graphs_subtracted(minor: str) -> None:
    fact = RELEASES[minor]["cuda_graphs"]
    assert vllm.subtracts_cuda_graphs(_v(minor)) is fact["subtracted"]
    if fact["subtracted"]:
        assert fact["where"].endswith("Worker.determine_available_memory")


@pytest.mark.parametrize("minor", IDS)
def test_model_runner_v2_subtracts_its_graphs_where_its_release_estimates_them(minor: str) -> None:
    """0.22-0.28's V2 ``profile_cudagraph_memory`` returns 0: a V2 engine of those releases captures its
    graphs outside the budget; the V1 runner's estimate is subtracted in every release that subtracts."""
    fact = RELEASES[minor]["cuda_graphs"]
    version = _v(minor)
    v2_subtracts = fact["subtracted"] and fact["v2_estimates"]
    assert vllm.subtracts_cuda_graphs(version, model_runner_v2=True) is v2_subtracts
    assert vllm.subtracts_cuda_graphs(version, model_runner_v2=False) is fact["subtracted"]


@pytest.mark.parametrize("minor", IDS)
def test_logged_peak_activation_holds_the_graph_estimate(minor: str) -> None:
    """0.27+ log ``transient_peak_headroom + cudagraph_memory_estimate_applied`` as "peak activation"."""
    fact = RELEASES[minor]["profiler"]
    assert vllm.logs_graph_estimate_in_activation(_v(minor)) is fact["activation_includes_graph_estimate"]
    assert fact["activation_logged_at"].startswith("vllm/v1/worker/gpu_worker.py:")


@pytest.mark.parametrize("minor", IDS)
def test_communicators_are_built_before_the_init_snapshot(minor: str) -> None:
    """The buffers of vLLM's own communicators are outside the budget in every modelled release: what tensor
    parallelism adds to non-torch memory is created after the snapshot."""
    fact = RELEASES[minor]["profiler"]
    assert _v(minor) >= vllm.COMMUNICATORS_BEFORE_SNAPSHOT_SINCE
    assert fact["snapshot_after_distributed_init"], (fact["distributed_init_at"], fact["snapshot_at"])


@pytest.mark.parametrize("minor", IDS)
def test_graph_estimate_is_first_capture_plus_per_graph(minor: str) -> None:
    assert RELEASES[minor]["profiler"]["graph_estimate_per_mode"]


@pytest.mark.parametrize("minor", IDS)
def test_nvlink_class_collectives(minor: str) -> None:
    fact = RELEASES[minor]["collectives"]
    assert tuple(fact["allreduce_fusion_capabilities"]) == vllm.ALLREDUCE_FUSION_CAPABILITIES
    assert tuple(fact["allreduce_fusion_capability_families"]) == vllm.ALLREDUCE_FUSION_CAPABILITY_FAMILIES
    assert fact["custom_allreduce_pcie_limit_at"] is not None
    assert vllm.CUSTOM_ALLREDUCE_MAX_PCIE_GPUS == 2


@pytest.mark.parametrize("minor", IDS)
def test_sampler_warmup_belongs_to_the_v2_runner(minor: str) -> None:
    """``for_sampler_warmup`` is used only by Model Runner V2 (``v1/worker/gpu/``): kvpilot keys the
    warm-up term on the runner, not on the release."""
    fact = RELEASES[minor]["sampler_warmup"]
    assert fact["for_sampler_warmup"]
    assert fact["used_by"] and all(w.startswith("vllm/v1/worker/gpu/") for w in fact["used_by"])


@pytest.mark.parametrize("minor", IDS)
def test_the_v2_profile_run_samples_in_fp32_where_its_release_does(minor: str) -> None:
    """The V2 profile run's ``_dummy_sampler_run`` (``v1/worker/gpu/model_runner.py``) uses the warm-up
    parameters in this release's own code exactly where kvpilot budgets the fp32 sampling pipeline for it."""
    used_by = RELEASES[minor]["sampler_warmup"]["used_by"]
    in_profile = "vllm/v1/worker/gpu/model_runner.py::_dummy_sampler_run" in used_by
    assert vllm.profile_samples_in_fp32(_v(minor)) is in_profile


def _token_reports() -> list[tuple[str, str]]:
    reports = [(f["wheel"], f["kv_tokens_report"]["report"]) for f in RELEASES.values()]
    reports += [(wheel, f["kv_tokens_report"]["report"]) for wheel, f in DATA["patches"].items()]
    return reports


@pytest.mark.parametrize(("wheel", "report"), _token_reports())
def test_the_kv_token_count_is_read_as_each_release_logs_it(wheel: str, report: str) -> None:
    """Per group before 0.20.1, concurrency x length from it: read from each wheel, patches included."""
    assert report in {"per_group", "concurrency"}
    assert vllm.reports_tokens_per_group(vllm.parse_version(wheel)) is (report == "per_group")


_BIG = GpuSpec(name="B200", total_bytes=180 * GIB, compute_capability=(10, 0), fp8_kv=True)
_GB10 = GpuSpec(name="GB10", total_bytes=119 * GIB, compute_capability=(12, 1), fp8_kv=True)


@pytest.mark.parametrize("minor", IDS)
def test_batch_default_tiers(minor: str) -> None:
    fact = RELEASES[minor]["batch_defaults"]
    version = _v(minor)
    assert (vllm.default_batch_limits(version, _BIG).max_num_batched_tokens == 16384) is fact["tier_160gib"]
    small = vllm.default_batch_limits(version, _GB10).max_num_seqs == 256
    assert small is fact["gb10_excluded"]
    doubled = vllm.default_batch_limits(version, _BIG, "throughput").max_num_seqs == 2048
    assert doubled is fact["performance_mode_throughput"]


def test_an_architecture_the_release_does_not_serve_is_refused_by_name() -> None:
    from kvpilot.tuner import errors

    with pytest.raises(errors.InvalidModelConfig) as caught:
        vllm.check_architecture_registered("LlamaForCausalLm", (0, 33))
    assert "vLLM 0.33 does not support architecture LlamaForCausalLm" in caught.value.message
    assert "supported close names: LlamaForCausalLM" in caught.value.message
    assert caught.value.field == "architectures"
    vllm.check_architecture_registered("LlamaForCausalLM", (0, 33))
    vllm.check_architecture_registered("NoSuchModelForCausalLM", (0, 18))  # before any registry read


def test_registry_spans_follow_the_releases() -> None:
    """An architecture vLLM added later is refused on the older release it did not exist in."""
    added = [name for name, spans in registry_data.SERVED.items() if spans[0][0] != "0.19"]
    assert added
    name = added[0]
    first = vllm.parse_version(registry_data.SERVED[name][0][0])
    assert name in vllm.served_architectures(first)
    assert name not in vllm.served_architectures((0, 19))


def test_release_newer_than_modelled_warns_and_unparseable_is_refused() -> None:
    from kvpilot.tuner import errors

    assert vllm.check_release("0.33.0") == ((0, 33, 0), None)
    assert vllm.check_release(None) == (vllm.PINNED_VERSION, None)
    version, warning = vllm.check_release("9.9.9")
    assert version == (9, 9, 9)
    assert warning is not None and "9.9.9" in warning and vllm.PINNED_VLLM_VERSION in warning
    with pytest.raises(errors.InvalidEngineArgs, match="'nightly'"):
        vllm.check_release("nightly")
