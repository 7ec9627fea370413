"""The release a service runs is chosen in one place (release.resolve_release) and every budget follows it."""

from __future__ import annotations

import copy

from kvpilot.operator.inferenceservice import desired, loop_reading
from kvpilot.operator.planning import release, resolve
from kvpilot.tuner import memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import LoopState, PolicyConfig
from kvpilot.tuner.types import EngineSettings, MemoryBudget

SERVICE = {
    "metadata": {"name": "llama-8b", "namespace": "ml"},
    "spec": {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpu": {"product": "H100-80GB", "count": 1},
        "engine": {"image": "vllm/vllm-openai:v0.19.1"},
        "serving": {"maxContextLength": 32768},
    },
}


def _spec(image: str | None = None, version: str | None = None):  # type: ignore[no-untyped-def]
    doc = copy.deepcopy(SERVICE["spec"])
    if image is not None:
        doc["engine"]["image"] = image
    if version is not None:
        doc["engine"]["vllmVersion"] = version
    return desired.parse_spec(doc)


def test_the_release_is_the_images_or_the_explicit_one() -> None:
    assert release.resolve_release(_spec()).version == "0.19.1"
    assert release.resolve_release(_spec(version="0.27")).version == "0.27.0"
    assumed = release.resolve_release(_spec(image="vllm/vllm-openai:latest"))
    assert assumed.version == vllm.PINNED_VLLM_VERSION and assumed.image.warning


def test_the_loop_budgets_with_the_release_the_image_runs() -> None:
    """The closed loop's budget of the running settings is the plan's, for 0.19.1, not the pinned 0.33."""
    spec = _spec()
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    wanted = desired.build_desired(SERVICE["metadata"], spec, inputs)
    settings = wanted.decision.plan.settings
    budget = loop_reading.budget_for(inputs, spec, settings)
    assert budget == wanted.decision.plan.budget
    pinned = memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        settings.replace(tensor_parallel_size=1),
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    assert budget != pinned  # 0.19 has no V2 sampler state and other terms: the release matters here
    old = memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        settings.replace(tensor_parallel_size=1),
        vllm_version="0.19.1",
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    assert budget == old


def test_the_loop_knows_the_admission_cap_of_the_extra_args() -> None:
    """``--max-num-active-seqs`` in ``spec.engine.extraArgs`` reaches the closed loop's context: the sequence
    rules compare the running requests with it (kvpilot.tuner.vllm.active_seqs)."""
    doc = copy.deepcopy(SERVICE["spec"])
    doc["engine"]["extraArgs"] = ["--max-num-active-seqs", "48"]
    spec = desired.parse_spec(doc)
    engine = release.resolve_release(spec)
    assert engine.flags.max_num_active_seqs == 48
    svc = loop_reading.Service({}, {}, {}, None, spec, EngineSettings(), LoopState(EngineSettings()), 0.0)
    gpu = lookup_gpu("H100-SXM")
    budget = vllm_budget()
    resolved = loop_reading.Resolved(PolicyConfig(), None, None, engine, budget, gpu, 32768)
    assert loop_reading.build_context(svc, resolved).max_num_active_seqs == 48
    plain = desired.parse_spec(copy.deepcopy(SERVICE["spec"]))
    svc = loop_reading.Service({}, {}, {}, None, plain, EngineSettings(), LoopState(EngineSettings()), 0.0)
    resolved = loop_reading.Resolved(
        PolicyConfig(), None, None, release.resolve_release(plain), budget, gpu, 32768
    )
    assert loop_reading.build_context(svc, resolved).max_num_active_seqs is None


def vllm_budget() -> MemoryBudget:
    """A budget for a context test: :func:`loop_reading.build_context` does not read it."""
    return MemoryBudget(
        gpu_total_gib=79.19,
        requested_gib=72.85,
        weights_gib=14.99,
        activation_gib=2.5,
        non_torch_gib=0.4,
        cuda_graph_gib=0.5,
        available_kv_cache_gib=54.46,
        kv_bytes_per_token=131072,
        num_gpu_blocks=27883,
        kv_cache_tokens=446128,
        max_concurrency=13.6,
        starts=True,
    )
