"""The planner models the release the image runs: its tag, or spec.engine.vllmVersion; else the pinned
release with a VersionAssumed warning (status.warnings and an event, as every plan warning)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import memory, vllm

META = {"name": "llama", "namespace": "ml", "uid": "u1", "generation": 1}


def _spec(**engine: Any) -> dict[str, Any]:
    return {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpu": {"count": 1, "product": "H100-SXM"},
        "serving": {"maxContextLength": 8192},
        "engine": engine,
    }


def _plan(**engine: Any) -> Any:
    spec = desired.parse_spec(_spec(**engine))
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    return desired.build_desired(META, spec, inputs).decision.plan


def test_the_default_image_plans_the_pinned_release_without_a_warning() -> None:
    plan = _plan()
    assert plan.vllm_version == vllm.PINNED_VLLM_VERSION
    assert not any(w.startswith("VersionAssumed") for w in plan.warnings)


def test_the_image_tag_chooses_the_release() -> None:
    old = _plan(image="vllm/vllm-openai:v0.19.1")
    new = _plan(image="vllm/vllm-openai:v0.33.0")
    assert old.vllm_version == "0.19.1"
    assert old.budget.sampler_state_gib == 0 < new.budget.sampler_state_gib  # V2 runs in 0.33 only
    spec = desired.parse_spec(_spec())
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    model, gpu = inputs.model.spec, inputs.gpu.gpu
    assert old.budget == memory.compute_budget(model, gpu, old.settings, vllm_version="0.19.1")
    assert old.budget != memory.compute_budget(model, gpu, old.settings, vllm_version="0.33.0")


@pytest.mark.parametrize(
    "image", ["vllm/vllm-openai:latest", "vllm/vllm-openai@sha256:" + "c" * 64, "acme/vllm:prod"]
)
def test_an_unreadable_tag_warns_and_plans_the_pinned_release(image: str) -> None:
    plan = _plan(image=image)
    assert plan.vllm_version == vllm.PINNED_VLLM_VERSION
    assert plan.warnings[0].startswith("VersionAssumed") and image in plan.warnings[0]


def test_the_explicit_version_wins() -> None:
    plan = _plan(image="acme/vllm:prod", vllmVersion="0.19.0")
    assert plan.vllm_version == "0.19.0"
    assert not any(w.startswith("VersionAssumed") for w in plan.warnings)


@pytest.mark.parametrize("bad", ["latest", "v0.19", "0.19.x", "1"])
def test_a_malformed_explicit_version_is_an_invalid_spec(bad: str) -> None:
    with pytest.raises(errors.InvalidSpec, match="vllmVersion"):
        desired.parse_spec(_spec(vllmVersion=bad))


def test_vllm_use_v2_model_runner_0_in_the_env_plans_the_v1_runner() -> None:
    v1 = _plan(env=[{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}])
    v2 = _plan(env=[{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}])
    secret = _plan(
        env=[{"name": "VLLM_USE_V2_MODEL_RUNNER", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    )
    assert v1.budget.sampler_state_gib == 0
    assert v2.budget.sampler_state_gib > 0 and v2.budget == _plan().budget  # 1 is the 0.33 default
    assert secret.budget == _plan().budget  # not read: the release's default


def test_the_extra_args_engine_flags_are_planned_for() -> None:
    """``--enforce-eager`` captures no CUDA graphs, so the plan neither reserves nor subtracts them;
    ``--performance-mode interactivity`` captures every size from 1 to 32, more graph memory than
    ``balanced``; the last of ``--enforce-eager`` / ``--no-enforce-eager`` wins, as in vLLM's parser."""
    default = _plan()
    eager = _plan(extraArgs=["--enforce-eager"])
    undone = _plan(extraArgs=["--enforce-eager", "--no-enforce-eager"])
    interactive = _plan(extraArgs=["--performance-mode", "interactivity"])
    assert default.budget.cuda_graph_gib > 0 and eager.budget.cuda_graph_gib == 0
    assert eager.budget.kv_cache_tokens >= default.budget.kv_cache_tokens
    assert undone.budget == default.budget
    assert interactive.budget.cuda_graph_gib > default.budget.cuda_graph_gib


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--performance-mode", "fast"], "not a vLLM 0.33 performance mode"),
        (["--enforce-eager=true"], "takes no value"),
        (["--enforce"], "abbreviates --enforce-eager"),
        (["--perf", "throughput"], "abbreviates --performance-mode"),
    ],
)
def test_a_misspelt_engine_flag_is_refused_by_name(args: list[str], match: str) -> None:
    spec = desired.parse_spec(_spec(extraArgs=args))
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    with pytest.raises(tuner_errors.InvalidEngineArgs, match=match):
        desired.build_desired(META, spec, inputs)
