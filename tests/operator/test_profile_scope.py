"""Tenants who do not trust each other (kvpilot.operator.planning.profile_scope and the profile edge): whose
TuningProfiles a service reads and teaches, which observations are refused, freezing, the sharing setting."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from operator_fakes import FakeStore, Harness, ProfileKube, isvc

from kvpilot.operator import api, main
from kvpilot.operator.clients import metrics
from kvpilot.operator.planning import profile_scope, profiles, resolve
from kvpilot.tuner.plan import profiles as learning
from kvpilot.tuner.types import EngineSettings

LOG = logging.getLogger("test")
DIGEST, GPU = "0123456789abcdef", "L4"
APPLIED = EngineSettings(kv_cache_dtype="auto", tensor_parallel_size=1)
SERVING = {"serving": {"maxContextLength": 4096, "concurrency": 4}}
HF = ["--hf-overrides", '{"num_hidden_layers": 1}']


def spec(**fields: Any) -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": 1, "product": "L4"}, **fields}
    )


def keys(ns: str, shared: frozenset[str] = frozenset(), **fields: Any) -> profile_scope.Keys:
    return profile_scope.compute_keys(DIGEST, GPU, spec(**fields), APPLIED, ns, shared_with=shared)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    profiles.clear_cache()
    profile_scope.configure_sharing(frozenset())
    yield
    profile_scope.configure_sharing(frozenset())


# --- the setting ---------------------------------------------------------------------------------------


def test_the_shared_namespaces_are_read_and_checked_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    env = profile_scope.SHARED_NAMESPACES_ENV
    assert profile_scope.sharing_from_env({}) == frozenset()
    assert profile_scope.sharing_from_env({env: " team-a, team-b ,"}) == {"team-a", "team-b"}
    for bad, why in (
        ("team-a,Team_B", "not a namespace name"),
        ("team-a", "at least two"),
        ("team-a,team-a", "at least two"),
    ):
        with pytest.raises(profile_scope.SharingConfigError, match=why):
            profile_scope.sharing_from_env({env: bad})
    monkeypatch.setenv(env, "only-one")
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    with pytest.raises(kopf.PermanentError, match="at least two"):  # the operator stops, not mid-loop
        main.configure(settings=kopf.OperatorSettings())
    assert profile_scope.shared_namespaces() == frozenset()


# --- keys: the namespace, the engine, what may be shared --------------------------------------------------


def test_each_namespace_has_its_own_profile_and_none_is_shared_by_default() -> None:
    a, b = keys("team-a"), keys("team-b")
    assert a.own.namespace == "team-a" and a.own.name != b.own.name
    assert a.shared is None and not a.teaches_shared and a.teaches_ooms
    assert a.own.engine_digest == b.own.engine_digest  # the same engine, another tenant


def test_listed_namespaces_read_and_teach_one_shared_profile() -> None:
    both = frozenset({"team-a", "team-b"})
    a, b, c = keys("team-a", both), keys("team-b", both), keys("team-c", both)
    assert a.shared is not None and a.shared == b.shared and a.shared.shared and a.teaches_shared
    assert c.shared is None and not c.teaches_shared  # not listed: learns alone


@pytest.mark.parametrize(
    "fields",
    [
        {"engine": {"extraArgs": HF}},
        {"engine": {"extraArgs": ["--quantization", "fp8"]}},
        {"engine": {"extraArgs": ["--enforce-eager"]}},
        {"engine": {"extraArgs": ["--some-future-flag"]}},  # unknown: may change memory
        {"engine": {"env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}]}},
        {"engine": {"image": "registry.example/vllm-patched:v0.33.0"}},
    ],
)
def test_another_engine_is_another_profile_and_never_the_shared_one(fields: dict[str, Any]) -> None:
    both = frozenset({"team-a", "team-b"})
    plain, other = keys("team-a", both), keys("team-a", both, **fields)
    assert other.own.name != plain.own.name and other.own.engine_digest != plain.own.engine_digest
    if "image" not in fields["engine"]:  # a custom image shares with the same image; flags never do
        assert other.shared is None and not other.teaches_shared


def test_flags_that_leave_memory_alone_keep_the_plain_engine() -> None:
    neutral = ["--served-model-name", "chat", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    both = frozenset({"team-a", "team-b"})
    assert keys("team-a", both, engine={"extraArgs": neutral}) == keys("team-a", both)


@pytest.mark.parametrize(
    "fields",
    [
        {"engine": {"pinned": {"gpuMemoryUtilization": 0.3}}},
        {"engine": {"extraArgs": ["--max-model-len", "2048"]}},  # a tuned flag is a pinned setting
        {"tuning": {"bounds": {"gpuMemoryUtilization": {"max": 0.3}}}},
        {"tuning": {"bounds": {"maxNumSeqs": {"max": 8}}}},
    ],
)
def test_pinned_or_bounded_services_teach_no_shared_profile_and_no_oom(fields: dict[str, Any]) -> None:
    k = keys("team-a", frozenset({"team-a", "team-b"}), **fields)
    assert not k.teaches_shared and not k.teaches_ooms and k.why_not_shared
    assert k.shared is not None  # they still read it: being planned from the fleet harms no one


def test_context_bounds_and_the_default_range_constrain_nothing() -> None:
    default = {"gpuMemoryUtilization": {"min": 0.5, "max": 0.95}, "maxModelLen": {"max": 8192}}
    k = keys("team-a", frozenset({"team-a", "team-b"}), tuning={"bounds": default})
    assert k.teaches_shared and k.teaches_ooms


# --- writes: routed, bounded, frozen ----------------------------------------------------------------------


def _budget() -> Any:
    from kvpilot.tuner import gpus
    from kvpilot.tuner.model import catalogue
    from kvpilot.tuner.model.spec import build_model_spec
    from kvpilot.tuner.plan import compute_plan
    from kvpilot.tuner.types import ServingBounds

    model = build_model_spec(catalogue.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    return compute_plan(model, gpus.lookup_gpu("L4"), 1, ServingBounds(max_context=4096)).budget


def _learned(store: FakeStore, key: learning.ProfileKey) -> learning.Learned | None:
    obj = store.objects.get(key.name)
    return profiles.build_learned(obj, key) if obj is not None else None


async def _observe(store: FakeStore, k: profile_scope.Keys, source: str, **kw: Any) -> None:
    await profiles.record_observations(
        store, k, "m", source, budget=_budget(), now="t", logger=LOG, window_s=0.0, **kw
    )


async def test_a_kv_report_the_gpu_could_not_hold_is_refused_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, k, budget = FakeStore(), keys("evil"), _budget()
    refused = metrics.PROFILE_SAMPLES_REFUSED.labels(reason=profiles.REFUSED_KV_ABOVE_DEVICE)
    before = refused._value.get()
    with caplog.at_level(logging.WARNING):
        await _observe(store, k, "evil/x", observed_kv_tokens=budget.kv_cache_tokens * 33)
    assert refused._value.get() == before + 1 and "refused evil/x's report" in caplog.text
    assert k.own.name not in store.objects  # nothing learned, nothing written
    await _observe(store, k, "evil/x", observed_kv_tokens=budget.kv_cache_tokens)  # a plausible one lands
    assert [s["observedTokens"] for s in store.objects[k.own.name]["status"]["kvSamples"]] == [
        budget.kv_cache_tokens
    ]


async def test_a_bounded_services_oom_is_learned_nowhere_but_its_measurements_teach_its_namespace() -> None:
    store = FakeStore()
    both = frozenset({"evil", "team-b"})
    bounded = keys("evil", both, tuning={"bounds": {"gpuMemoryUtilization": {"max": 0.3}}})
    oom = EngineSettings(gpu_memory_utilization=0.3, max_num_seqs=8)
    await _observe(store, bounded, "evil/x", oom=oom, startup_seconds=40.0)
    status = store.objects[bounded.own.name]["status"]
    assert status["oomSamples"] == [] and status["startupSamples"][0]["source"] == "evil/x"
    assert bounded.shared is not None and bounded.shared.name not in store.objects


async def test_a_plain_services_samples_teach_its_namespace_and_the_shared_profile_when_listed() -> None:
    store = FakeStore()
    both = frozenset({"team-a", "team-b"})
    k = keys("team-a", both)
    await _observe(store, k, "team-a/x", oom=EngineSettings(gpu_memory_utilization=0.91))
    assert k.shared is not None
    own, shared = _learned(store, k.own), _learned(store, k.shared)
    assert own is not None and own.utilization_ceiling == pytest.approx(0.89)
    assert shared is not None and shared.shared and shared.utilization_ceiling is None  # one service
    assert store.objects[k.shared.name]["spec"]["scope"] == "Shared"
    assert "namespace" not in store.objects[k.shared.name]["spec"]
    labels = store.objects[k.own.name]["metadata"]["labels"]
    assert labels["profiles.kvpilot.io/namespace"] == "team-a"
    assert labels["profiles.kvpilot.io/scope"] == "Namespace"


async def test_a_frozen_profile_is_read_but_never_written() -> None:
    store, k = FakeStore(), keys("team-a")
    await _observe(store, k, "team-a/x", oom=EngineSettings(gpu_memory_utilization=0.91))
    store.objects[k.own.name]["spec"]["frozen"] = True  # kubectl patch kvtp ... '{"spec":{"frozen":true}}'
    patches = store.patches
    assert await profiles.apply_samples(store, k.own, "m", _oom_update("team-a/y", 0.6), "t") is None
    await _observe(store, k, "team-a/y", oom=EngineSettings(gpu_memory_utilization=0.6))
    assert store.patches == patches
    learned = await profiles.fetch_learned(store, k.own, LOG)
    assert learned is not None and learned.utilization_ceiling == pytest.approx(0.89)  # still used


def _oom_update(source: str, util: float) -> profiles.Update:
    update = profiles.build_update(source, oom=EngineSettings(gpu_memory_utilization=util))
    assert update is not None
    return update


async def test_a_profile_of_another_namespace_under_this_name_is_not_used() -> None:
    store, k = FakeStore(), keys("team-a")
    await _observe(store, k, "team-a/x", oom=EngineSettings(gpu_memory_utilization=0.91))
    store.objects[k.own.name]["spec"]["namespace"] = "team-b"  # hand-edited
    assert await profiles.fetch_learned(store, k.own, LOG) is None


# --- the attacks, through the reconcile -------------------------------------------------------------------


async def _plan(planner: Harness, name: str, ns: str, **fields: Any) -> dict[str, Any]:
    obj = isvc(name, namespace=ns, **{**SERVING, **fields})
    await planner.run(obj)
    return dict(obj["status"]["applied"])


async def _keys_of(planner: Harness, ns: str, **fields: Any) -> profile_scope.Keys:
    parsed = api.InferenceServiceSpec.model_validate(isvc("x", namespace=ns, **{**SERVING, **fields})["spec"])
    inputs = await resolve.fetch_inputs(parsed, ns, planner.kube, planner.deps.hub)
    return profile_scope.compute_keys(inputs.model.config_key, inputs.gpu.gpu.name, parsed, APPLIED, ns)


@pytest.mark.parametrize("shared", [frozenset(), frozenset({"evil", "team-b"})])
async def test_one_tenants_oom_at_her_own_bound_moves_no_other_plan(planner: Harness, shared: Any) -> None:
    """The attack: one CUDA OOM at gpu-memory-utilization 0.30 from a service with her own bounds cut another
    tenant's next plan to the spec's minimum. Now it moves no plan: not another namespace's, shared or not,
    and not her own namespace's plain services' either."""
    profile_scope.configure_sharing(shared)
    baseline = await _plan(planner, "before", "team-b")
    bound = {"tuning": {"bounds": {"gpuMemoryUtilization": {"max": 0.3}}}}
    k = await _keys_of(planner, "evil", **bound)
    store = planner.kube
    assert isinstance(store, ProfileKube)
    await _observe(store, k, "evil/x", oom=EngineSettings(gpu_memory_utilization=0.3, max_num_seqs=8))
    profiles.clear_cache()
    assert await _plan(planner, "after", "team-b") == baseline
    assert await _plan(planner, "mine", "evil") == baseline  # the same plain plan in her own namespace


async def test_one_tenants_hf_overrides_teach_no_one_else(planner: Harness) -> None:
    """The attack: three services with --hf-overrides '{"num_hidden_layers": 1}' taught a KV ratio of 33 and
    raised another tenant's max_num_seqs. Their reports are refused (more than the GPU holds), and their
    engine is another profile's anyway."""
    profile_scope.configure_sharing(frozenset({"evil", "team-b"}))
    baseline = await _plan(planner, "before", "team-b")
    k = await _keys_of(planner, "evil", engine={"extraArgs": HF})
    store = planner.kube
    assert isinstance(store, ProfileKube) and not k.teaches_shared
    tokens = _budget().kv_cache_tokens
    for i in range(3):
        await _observe(store, k, f"evil/s{i}", observed_kv_tokens=33 * tokens)
    assert k.own.name not in store.objects  # every report refused
    profiles.clear_cache()
    assert await _plan(planner, "after", "team-b") == baseline
    assert await _plan(planner, "plain", "evil") == baseline


async def test_a_namespace_learns_from_its_own_services(planner: Harness) -> None:
    """What isolation keeps: a plain service's OOM lowers the next plan of its own namespace."""
    baseline = await _plan(planner, "a", "team-a")
    k = await _keys_of(planner, "team-a")
    store = planner.kube
    assert isinstance(store, ProfileKube)
    u = float(baseline["gpuMemoryUtilization"])
    await _observe(store, k, "team-a/a", oom=EngineSettings(gpu_memory_utilization=u))
    profiles.clear_cache()
    assert (await _plan(planner, "b", "team-a"))["gpuMemoryUtilization"] == pytest.approx(
        u - learning.UTILIZATION_MARGIN
    )
    assert await _plan(planner, "c", "team-b") == baseline


# --- the closed loop's tick teaches through the same routing ----------------------------------------------

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB."


@pytest.mark.parametrize("bounded", [False, True])
async def test_a_ticks_cuda_oom_reaches_its_namespaces_profile_unless_its_bounds_chose_it(
    harness: Harness, bounded: bool
) -> None:
    from closed_loop_fakes import LoopHarness

    harness.kube = ProfileKube()
    harness.deps.kube = harness.kube
    loop = LoopHarness(harness)
    bounds = {"tuning": {"bounds": {"gpuMemoryUtilization": {"min": 0.9}}}} if bounded else {}
    body = isvc("llm", namespace="team-a", gpu={"count": 1, "product": "H100-SXM"}, **bounds)
    await harness.run(body)
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    decision = await loop.tick(body)
    assert decision is not None and decision.trigger == "CudaOOM"
    store = harness.kube
    assert isinstance(store, ProfileKube)
    written = [o for o in store.objects.values() if o["spec"].get("namespace") == "team-a"]
    ooms = [s for o in written for s in (o.get("status") or {}).get("oomSamples", [])]
    assert all(o["spec"]["scope"] == "Namespace" for o in store.objects.values())  # nothing shared
    if bounded:
        assert ooms == []
    else:
        assert [s["source"] for s in ooms] == ["team-a/llm"]
