"""``spec.engine.kind``: the engine a service runs, as the operator renders, plans and refuses it.

SGLang and TGI are each planned with their own memory model and rendered from the tuner's seam; the
kind is fixed at creation (a CEL transition rule the API server runs: the e2e
suite changes it on a real one, ``e2e/test_operator.py``). The flags parse with SGLang's own parser in
``tests/contract/test_contract_sglang_render.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import logging
import typing
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from closed_loop_fakes import FakePods, LoopHarness, window
from closed_loop_fakes import pod as fake_pod
from operator_fakes import Harness, condition, isvc

from kvpilot import cli
from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import FIELD_MANAGER
from kvpilot.operator.inferenceservice import desired, drift, handlers, render
from kvpilot.operator.loop import engine_profiles
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import pod_reading, sglang_pods
from kvpilot.tuner import engines, gpus, sglang, tgi
from kvpilot.tuner.loop import PolicyConfig, SglangMemory, sglang_fit
from kvpilot.tuner.model import build_model_spec, lookup_model_config

ROOT = Path(__file__).resolve().parents[2]
SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def _engine_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"])


def _kind_schema() -> dict[str, Any]:
    return dict(_engine_schema()["properties"]["kind"])


def sglang_isvc(**spec: Any) -> dict[str, Any]:
    engine = {"kind": "SGLang", "image": SGLANG_IMAGE, **spec.pop("engine", {})}
    return isvc(engine=engine, **spec)


def container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_the_kinds_are_the_seams_and_the_crds() -> None:
    assert typing.get_args(api.EngineKind) == engines.KINDS == tuple(_kind_schema()["enum"])
    assert _kind_schema()["default"] == api.Engine().kind == "vLLM"


def test_the_kind_is_fixed_at_creation_by_a_cel_rule_that_says_what_to_do() -> None:
    (rule,) = _kind_schema()["x-kubernetes-validations"]
    assert rule["rule"] == "self == oldSelf"
    assert (
        "engine.kind cannot change" in rule["message"] and "create a new InferenceService" in rule["message"]
    )


def test_another_engine_with_the_vllm_image_is_refused_naming_its_own_image() -> None:
    for kind, repository in (
        ("SGLang", sglang.serving.IMAGE_REPOSITORY),
        ("TGI", tgi.serving.IMAGE_REPOSITORY),
    ):
        with pytest.raises(errors.InvalidSpec, match="engine.image is a vLLM image") as info:
            desired.parse_spec({"model": {"id": LLAMA_8B}, "engine": {"kind": kind}})
        assert f"{kind}'s image ({repository})" in str(info.value)
        # the CRD's CEL rule refuses it before the operator sees it, naming each engine's image
        (cel,) = _engine_schema()["x-kubernetes-validations"]
        assert "vllm/" in cel["rule"] and repository in " ".join(cel["message"].split())
    desired.parse_spec({"model": {"id": LLAMA_8B}, "engine": {"kind": "SGLang", "image": SGLANG_IMAGE}})


def test_sglang_renders_the_seams_container_and_sglangs_plan() -> None:
    body = sglang_isvc(serving={"maxContextLength": 16384})
    c = container(render.build_manifests(body))
    serving = engines.lookup_engine("SGLang").serving
    assert (c["name"], c["command"], c["image"]) == (
        serving.container_name,
        list(serving.command),
        SGLANG_IMAGE,
    )
    assert c["ports"] == [{"name": "http", "containerPort": serving.port, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": serving.health_path, "port": "http"}
    args = c["args"]
    assert args[:2] == [sglang.MODEL_FLAG, LLAMA_8B] and flag(args, sglang.PORT_FLAG) == str(serving.port)
    assert sglang.ENABLE_METRICS_FLAG in args
    spec = build_model_spec(lookup_model_config(LLAMA_8B))
    settings = sglang.SglangSettings(context_length=16384, tp_size=1)
    budget = engines.plan_sglang_budget(spec, gpus.lookup_gpu("L4"), settings)
    assert budget.feasible
    for name, value in (
        ("--context-length", "16384"),
        ("--mem-fraction-static", str(budget.settings.mem_fraction_static)),
        ("--chunked-prefill-size", str(budget.settings.chunked_prefill_size)),
        ("--tp-size", "1"),
    ):
        assert flag(args, name) == value, name
    assert not any(a.startswith("--gpu-memory-utilization") or a == "--max-model-len" for a in args)


def test_sglang_pod_annotations_and_service_reach_its_port() -> None:
    manifests = render.build_manifests(sglang_isvc(serving={"maxContextLength": 8192}))
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    service = next(m for m in manifests if m["kind"] == "Service")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "30000" and annotations["prometheus.io/path"] == "/metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "http"  # the named port: 30000 in the pod


def test_sglang_shortens_a_context_that_does_not_fit_its_pool_but_not_below_the_minimum() -> None:
    """On an L4, Llama-3.1-8B's SGLang pool holds ~24K tokens: 32K does not fit one request."""
    args = container(render.build_manifests(sglang_isvc(serving={"maxContextLength": 32768})))["args"]
    context = int(flag(args, "--context-length") or 0)
    assert 16384 <= context < 32768 and context % 1024 == 0
    body = sglang_isvc(serving={"minContextLength": 30000, "maxContextLength": 32768})
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(body)
    assert info.value.reason == "Infeasible" and "SGLang 0.5.23" in info.value.message


def test_sglang_plans_an_fp8_kv_cache_where_allowed_and_it_holds_the_context() -> None:
    """On the fixtures' L4 (fp8 KV supported) 32K does not fit Llama-3.1-8B's 16-bit pool: with
    allowFp8KvCache the plan keeps the context in fp8 (SGLang's fp8_e4m3), and says so in Planned."""
    body = sglang_isvc(serving={"maxContextLength": 32768}, tuning={"allowFp8KvCache": True})
    args = container(render.build_manifests(body))["args"]
    assert flag(args, "--kv-cache-dtype") == "fp8_e4m3" and flag(args, "--context-length") == "32768"
    spec = desired.parse_spec(body["spec"])
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ns1", None), resolve.read_gpu(spec, None))
    plan = desired.build_desired(body["metadata"], spec, inputs).engine_plan
    assert plan is not None and any("fp8 KV cache (--kv-cache-dtype fp8_e4m3" in x for x in plan.explanation)
    fp16 = container(render.build_manifests(sglang_isvc(serving={"maxContextLength": 32768})))["args"]
    assert "--kv-cache-dtype" not in fp16 and int(flag(fp16, "--context-length") or 0) < 32768
    shortened = sglang_isvc(serving={"maxContextLength": 65536}, tuning={"allowFp8KvCache": True})
    args = container(render.build_manifests(shortened))["args"]  # fp8 kept when the context is shortened
    assert flag(args, "--kv-cache-dtype") == "fp8_e4m3" and int(flag(args, "--context-length") or 0) > 32768


def test_an_infeasible_sglang_plan_says_an_fp8_kv_cache_would_fit_and_how_to_allow_it() -> None:
    """On the fixtures' L4, a 32K minimum context misses Llama-3.1-8B's 16-bit pool (~24K) and fits the fp8
    one (~48K): Infeasible names the fp8 cache and spec.tuning.allowFp8KvCache, as vLLM's plan does; at a
    64K minimum even fp8 misses, and nothing is said of it."""
    body = sglang_isvc(serving={"minContextLength": 32768, "maxContextLength": 65536})
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(body)
    message = info.value.message
    assert info.value.reason == "Infeasible" and "Does not fit" in message
    assert "An fp8 KV cache (--kv-cache-dtype fp8_e4m3) fits at the minimum context 32768" in message
    assert "spec.tuning.allowFp8KvCache: true" in message
    at_full = sglang_isvc(serving={"minContextLength": 32768, "maxContextLength": 32768})
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(at_full)
    assert "An fp8 KV cache (--kv-cache-dtype fp8_e4m3) fits (" in info.value.message
    longer = sglang_isvc(serving={"minContextLength": 65536, "maxContextLength": 65536})
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(longer)
    assert "fp8" not in info.value.message


@pytest.mark.parametrize(
    ("product", "allow", "fp8"), [("L4", True, True), ("L4", False, False), ("A100-80GB", True, False)]
)
def test_sglangs_loop_may_switch_to_fp8_only_where_allowed_and_supported(
    product: str, allow: bool, fp8: bool
) -> None:
    body = sglang_isvc(gpu={"count": 1, "product": product}, tuning={"allowFp8KvCache": allow})
    spec = desired.parse_spec(body["spec"])
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ns1", None), resolve.read_gpu(spec, None))
    context = engine_profiles.build_sglang_context(spec, inputs, PolicyConfig())
    assert context.bounds.allow_fp8_kv is fp8


def test_sglang_modes_recommend_and_off_leave_the_memory_to_sglang() -> None:
    for mode in ("Recommend", "Off"):
        args = container(render.build_manifests(sglang_isvc(tuning={"mode": mode})))["args"]
        assert "--mem-fraction-static" not in args and "--context-length" not in args
        assert sglang.ENABLE_METRICS_FLAG in args


@pytest.mark.parametrize(
    ("engine", "match"),
    [
        ({"extraArgs": ["--port", "9000"]}, "--port in spec.engine.extraArgs"),
        ({"extraArgs": ["--mem-fraction-static=0.5"]}, "--mem-fraction-static in spec.engine.extraArgs"),
        ({"pinned": {"maxNumSeqs": 8}}, "engine.pinned holds vLLM flags"),
    ],
)
def test_sglang_refuses_what_it_does_not_take(engine: dict[str, Any], match: str) -> None:
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(sglang_isvc(engine=engine))
    assert info.value.reason == "InvalidSpec" and match in info.value.message


def test_sglang_over_several_nodes_is_a_leader_worker_set_of_one_engine() -> None:
    """gpu.nodesPerReplica 2 of 8 H100s: SGLang's tensor parallelism over the group's 16 GPUs, planned as one
    budget per GPU, rendered as a LeaderWorkerSet whose pods carry SGLang's node flags; the Service reaches
    the leaders (rank 0 alone serves the API), the workers have no port or probes."""
    manifests = render.build_manifests(
        sglang_isvc(
            model={"id": LLAMA_70B}, replicas=2, gpu={"count": 8, "product": "H100-SXM", "nodesPerReplica": 2}
        )
    )
    kinds = [m["kind"] for m in manifests]
    assert "Deployment" not in kinds and kinds.count("LeaderWorkerSet") == 1
    service = next(m for m in manifests if m["kind"] == "Service")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    group = next(m for m in manifests if m["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    worker = group["workerTemplate"]["spec"]["containers"][0]
    assert leader["name"] == worker["name"] == "sglang"
    for c, rank in ((leader, "0"), (worker, "$(LWS_WORKER_INDEX)")):
        assert flag(c["args"], "--tp-size") == "16" and flag(c["args"], "--nnodes") == "2"
        assert flag(c["args"], "--node-rank") == rank
        assert flag(c["args"], "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" in leader and "ports" in leader
    assert "readinessProbe" not in worker and "ports" not in worker
    budget = next(m for m in manifests if m["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_sglang_node_flags_are_kvpilots_to_render() -> None:
    with pytest.raises(render.RenderError, match="--nnodes in spec.engine.extraArgs"):
        render.build_manifests(
            sglang_isvc(
                engine={"extraArgs": ["--nnodes", "2"]},
                gpu={"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
            )
        )


def test_tgi_over_several_nodes_is_refused_by_name() -> None:
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(tgi_isvc(gpu={"count": 8, "product": "H100-SXM", "nodesPerReplica": 2}))
    assert info.value.reason == "EngineNotSupported" and "TGI shards within one node" in info.value.message


async def test_sglang_reconciles_with_its_plan_in_status(harness: Harness) -> None:
    body = sglang_isvc(serving={"maxContextLength": 16384})
    await harness.run(body)
    service, deployment = harness.kube.applied
    assert (service["kind"], deployment["kind"]) == ("Service", "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["name"] == "sglang"
    st = body["status"]
    assert condition(body, "Ready")["status"] == "True" and "SGLang" in condition(body, "Ready")["message"]
    planned = condition(body, "Planned")
    assert planned["status"] == "True" and "--mem-fraction-static" in planned["message"]
    assert "KV pool" in planned["message"] and "tokens" in planned["message"]
    assert "applied" not in st and "budget" not in st  # vLLM's settings: the closed loop waits on them
    assert st["gpu"]["catalogueName"] == "L4" and st["gpu"]["count"] == 1
    normal = [(reason, text) for type_, reason, text in harness.emitter.events if type_ == "Normal"]
    assert [reason for reason, _ in normal] == ["Planned"] and "SGLang 0.5.23" in normal[0][1]


def tgi_isvc(**spec: Any) -> dict[str, Any]:
    engine = {"kind": "TGI", "image": TGI_IMAGE, **spec.pop("engine", {})}
    return isvc(engine=engine, **spec)


def test_tgi_renders_the_seams_container_and_tgis_plan_in_mode_auto() -> None:
    body = tgi_isvc(serving={"maxContextLength": 8192, "concurrency": 64})
    c = container(render.build_manifests(body))
    serving = engines.lookup_engine("TGI").serving
    assert (c["name"], c["command"], c["image"]) == (serving.container_name, list(serving.command), TGI_IMAGE)
    assert c["ports"] == [{"name": "http", "containerPort": serving.port, "protocol": "TCP"}]
    args = c["args"]
    assert args[:2] == [tgi.MODEL_FLAG, LLAMA_8B] and flag(args, tgi.PORT_FLAG) == "80"
    spec = build_model_spec(lookup_model_config(LLAMA_8B))
    settings = tgi.TgiSettings(max_total_tokens=8192, max_concurrent_requests=64, num_shard=1)
    budget = engines.plan_tgi_budget(spec, gpus.lookup_gpu("L4"), settings)
    assert budget.feasible
    assert " ".join(tgi.build_tgi_args(budget.rendered)) in " ".join(args)
    assert (flag(args, "--max-total-tokens"), flag(args, "--max-concurrent-requests")) == ("8192", "64")
    assert "--num-shard" not in args and "--max-batch-total-tokens" not in args
    sharded = container(render.build_manifests(tgi_isvc(gpu={"count": 2, "product": "L4"})))["args"]
    assert flag(sharded, "--num-shard") == "2"


def test_tgi_plans_as_kvpilot_plan_engine_tgi_does() -> None:
    body = tgi_isvc(gpu={"count": 1, "product": "H100-SXM"}, serving={"maxContextLength": 32768})
    args = container(render.build_manifests(body))["args"]
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan", "--engine", "tgi", "--model", LLAMA_8B, "--gpu", "H100-SXM", "--max-context", "32768"]
    assert cli.main([*argv, "--json"], out=out, err=err) == 0, err.getvalue()
    assert " ".join(json.loads(out.getvalue())["args"]) in " ".join(args)


def test_tgi_modes_recommend_and_off_leave_the_memory_to_tgi() -> None:
    for mode in ("Recommend", "Off"):
        args = container(render.build_manifests(tgi_isvc(tuning={"mode": mode})))["args"]
        assert args == [tgi.MODEL_FLAG, LLAMA_8B, tgi.HOSTNAME_FLAG, "0.0.0.0", tgi.PORT_FLAG, "80"]


@pytest.mark.parametrize(
    ("spec", "reason", "match"),
    [
        ({"engine": {"extraArgs": ["--max-total-tokens=4096"]}}, "InvalidSpec", "--max-total-tokens in"),
        ({"engine": {"pinned": {"maxNumSeqs": 8}}}, "InvalidSpec", "engine.pinned holds vLLM flags"),
        ({"gpu": {"count": 2, "product": "L4", "tensorParallelSize": 1}}, "InvalidSpec", "TGI shards"),
        ({"gpu": {"count": 16, "product": "H100-SXM", "nodesPerReplica": 2}}, "EngineNotSupported", "node"),
        ({"model": {"id": "Qwen/Qwen3-8B"}}, "InvalidEngineArgs", "model_type 'qwen3'"),
        ({"serving": {"minContextLength": 100000}}, "Infeasible", "serving.minContextLength"),
        ({"model": {"id": "meta-llama/Llama-3.1-70B-Instruct"}}, "Infeasible", "shard the model"),
    ],
)
def test_tgi_refuses_what_it_does_not_take_or_cannot_start(
    spec: dict[str, Any], reason: str, match: str
) -> None:
    with pytest.raises(render.RenderError) as info:
        render.build_manifests(tgi_isvc(**spec))
    assert info.value.reason == reason and match in info.value.message, info.value.message


async def test_tgi_reconciles_with_its_plan_in_status(harness: Harness) -> None:
    body = tgi_isvc(serving={"maxContextLength": 8192})
    await harness.run(body)
    service, deployment = harness.kube.applied
    assert deployment["spec"]["template"]["spec"]["containers"][0]["name"] == "tgi"
    assert condition(body, "Ready")["status"] == "True" and "TGI" in condition(body, "Ready")["message"]
    planned = condition(body, "Planned")
    assert planned["status"] == "True" and "--max-total-tokens 8192" in planned["message"]
    assert "max batch total" in planned["message"]


SGLANG_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


L4_LLAMA = SglangMemory(gpus.lookup_gpu("L4"), build_model_spec(lookup_model_config(LLAMA_8B)))


def _sglang_runs(args: list[str]) -> sglang.SglangSettings:
    """What SGLang runs with ``args`` on the fixtures' L4: its defaults filled in (the tuner's model)."""
    return sglang_fit.compute_effective(sglang.parse_sglang_args(args), L4_LLAMA)


def _series_fetches(loop: LoopHarness) -> list[Any]:
    """Wrap the harness's metrics fetch to record the series each call asks for."""
    seen: list[Any] = []
    fetch = loop.deps.fetch_window

    async def recording(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("series"))
        return await fetch(*args, **kw)

    loop.deps.fetch_window = recording
    return seen


@pytest.mark.parametrize("mode", ["Recommend"])
async def test_the_closed_loop_recommends_less_memory_outside_the_share_after_an_sglang_oom(
    harness: Harness, mode: str
) -> None:
    """A crash-looping SGLang pod with a CUDA OOM at run time: SGLang's rule (a *lower*
    ``--mem-fraction-static``: activations need room outside the static share) is recommended in SGLang's
    flags, the flags that failed are recorded, vLLM's remedies and settings are never touched, the Deployment
    is left alone, and a later tick that sees the same writes nothing again."""
    loop = LoopHarness(harness)
    series = _series_fetches(loop)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": mode})
    await harness.run(body)
    applied = len(harness.kube.applied)
    loop.window = window(loop.now, kv=0.5, waiting=0)
    loop.healthy_pods(restarts=2, message=SGLANG_OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    ran = loop.deployment_args()
    assert await loop.tick(body) is None
    st = body["status"]
    closed = condition(body, "ClosedLoop")
    assert (closed["status"], closed["reason"]) == ("True", "Recommending")
    assert "mode Recommend" in closed["message"]
    before, after = _sglang_runs(ran), _sglang_runs(st["recommendation"]["engineArgs"])
    # less memory outside the static share: a lower fraction, or (the pool at its floor: on the L4 the
    # 8B's weights leave it a few hundred tokens) a smaller prefill chunk with the fraction held, never raised
    assert sglang_fit.fraction_of(after) <= sglang_fit.fraction_of(before)
    assert sglang_fit.fraction_of(after) < sglang_fit.fraction_of(before) or (
        (after.chunked_prefill_size or 0) < (before.chunked_prefill_size or 0)
        and sglang.parse_sglang_args(st["recommendation"]["engineArgs"]).mem_fraction_static is not None
    )
    assert st["recommendation"]["trigger"] == "RuntimeOOM"
    assert "CUDA out of memory" in st["recommendation"]["reason"]
    # with the most requests the window saw running before the crash (window(): 40)
    failed = {"args": sglang.build_sglang_args(before), "failure": "runtime_oom", "runningRequests": 40}
    assert st["failedEngineArgs"] == [failed]
    assert {"RuntimeOOM", "Recommended"} <= set(harness.emitter.reasons)
    assert series == [engines.lookup_engine("SGLang").metrics]  # SGLang's series, through the seam
    assert len(harness.kube.applied) == applied and "applied" not in st and "failedSettings" not in st
    events = len(harness.emitter.events)
    for _ in range(2):
        assert await loop.tick(body) is None
    assert len(harness.emitter.events) == events  # the same advice is not announced twice
    assert harness.kube.take_status_patches("ns1", "llm") == []


def _tuned(args: list[str]) -> list[str]:
    """The flags kvpilot tunes among a container's arguments, as ``status.appliedEngineArgs`` spells them."""
    return sglang.build_sglang_args(sglang.parse_sglang_args(args))


async def test_auto_rolls_sglang_flags_out_judges_them_and_rolls_a_crash_back(harness: Harness) -> None:
    """Mode Auto: the plan's flags become good once Ready; retractions under pressure retune and the
    Deployment follows (``appliedEngineArgs``, ``rollout``, ``Retuned``); the new pods Ready put the flags on
    probation; not Ready at its end rolls back to the last good flags (``RolledBack``) and rules exactly the
    new ones out; a resumed reconcile keeps what the loop applied. (An OOM of the new flags would not roll
    back to flags that need as much memory or more: SGLang's crash rules cure it instead.)"""
    loop = LoopHarness(harness)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Auto"})
    await harness.run(body)
    planned = body["status"]["appliedEngineArgs"]
    assert planned and _tuned(loop.deployment_args()) == planned
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.5, waiting=0)
    await loop.tick(body)
    assert body["status"]["lastGoodEngineArgs"] == planned
    assert condition(body, "ClosedLoop")["reason"] == "Tuning"
    loop.window = window(loop.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await loop.tick(body)
    st = body["status"]
    new = st["appliedEngineArgs"]
    assert new != planned and _tuned(loop.deployment_args()) == new
    assert st["rollout"]["engineArgs"] == new and st["rollout"]["phase"] == "RollingOut"
    assert "Retuned" in harness.emitter.reasons and "Recommended" not in harness.emitter.reasons
    assert condition(body, "RolloutInProgress")["status"] == "True"
    loop.healthy_pods()  # the new flags' pods, Ready
    await loop.tick(body)
    assert body["status"]["rollout"]["phase"] == "Probation"
    assert condition(body, "RolloutInProgress")["reason"] == "Probation"
    loop.healthy_pods(ready=False)  # unready again, without a crash, past the end of probation
    await loop.tick(body, advance=PolicyConfig().rollout_deadline_seconds + 30)
    st = body["status"]
    assert st["appliedEngineArgs"] == planned and _tuned(loop.deployment_args()) == planned
    assert {"args": new, "failure": "rollout_failed"} in st["failedEngineArgs"]
    rolled_back = [m for _, reason, m in harness.emitter.events if reason == "RolledBack"]
    assert rolled_back and "not Ready at the end of probation" in rolled_back[-1]
    assert st["rollout"]["engineArgs"] == planned
    await harness.run(body, trigger=handlers.RESUMED)
    assert body["status"]["appliedEngineArgs"] == planned and _tuned(loop.deployment_args()) == planned


async def test_a_resumed_reconcile_keeps_the_flags_the_loop_rolled_out(harness: Harness) -> None:
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Auto"})
    await harness.run(body)
    loop = LoopHarness(harness)
    kept = sglang.build_sglang_args(
        dataclasses.replace(
            sglang.parse_sglang_args(body["status"]["appliedEngineArgs"]), max_running_requests=7
        )
    )
    body["status"]["appliedEngineArgs"] = kept
    await harness.run(body, trigger=handlers.RESUMED)
    assert _tuned(loop.deployment_args()) == kept and body["status"]["appliedEngineArgs"] == kept
    assert "kept" in condition(body, "Planned")["message"]
    await harness.run(body, trigger=handlers.CREATED)  # a first visit plans again
    assert body["status"]["appliedEngineArgs"] != kept


async def test_sglang_retractions_recommend_more_pool_then_fewer_running_requests(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Recommend"})
    await harness.run(body)
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await loop.tick(body)
    rec = body["status"]["recommendation"]
    assert rec["trigger"] == "KvPressure"
    # SGLang's defaults run at their fraction's ceiling: a smaller prefill chunk lifts it, for more pool
    grown = sglang.parse_sglang_args(rec["engineArgs"])
    assert grown.chunked_prefill_size is not None and grown.mem_fraction_static is not None
    assert grown.max_running_requests is None  # the requests kept
    assert condition(body, "MetricsAvailable")["status"] == "True"


async def test_a_resume_keeps_the_loops_sglang_recommendation_and_a_new_plan_voids_it(
    harness: Harness,
) -> None:
    loop = LoopHarness(harness)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Recommend"})
    await harness.run(body)
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.97, preempt=0.5, running=40, waiting=5)
    await loop.tick(body)
    rec = body["status"]["recommendation"]
    assert rec is not None and rec["trigger"] == "KvPressure"
    await harness.run(body, trigger=handlers.RESUMED)  # the operator restarted: the plan stands
    assert body["status"]["recommendation"] == rec
    await harness.run(body, trigger=handlers.CREATED)  # a first visit plans again
    assert body["status"].get("recommendation") is None


async def test_the_sglang_loop_reports_replicas_availability_and_a_crash_loop(harness: Harness) -> None:
    """As for vLLM: ``replicas``/``readyReplicas`` (the scale subresource, ``kubectl get``'s READY) and the
    ``Available`` and ``Degraded`` conditions come from the pods the SGLang loop reads."""
    loop = LoopHarness(harness)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Auto"})
    await harness.run(body)
    loop.healthy_pods(n=2)
    loop.window = window(loop.now + 30, kv=0.3, running=2)
    await loop.tick(body)
    st = body["status"]
    assert (st["replicas"], st["readyReplicas"]) == (2, 2)
    assert (
        condition(body, "Available")["status"] == "True" and condition(body, "Degraded")["status"] == "False"
    )
    loop.healthy_pods(n=2, restarts=3, message=SGLANG_OOM, finished=loop.now, ready=False, crash_loop=True)
    await loop.tick(body)
    st = body["status"]
    assert (st["replicas"], st["readyReplicas"]) == (2, 0)
    assert condition(body, "Available")["status"] == "False"
    degraded = condition(body, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CrashLoopBackOff")
    assert "CUDA out of memory" in degraded["message"]


def test_a_groups_worker_is_no_replica_of_its_own() -> None:
    """An SGLang group over two nodes is one replica: its leader (worker index 0) counts, the rank-1 worker
    (no API server) does not; a start-up failure SGLang explains degrades the service."""
    args = ["--model-path", LLAMA_8B, "--tp-size", "16", "--nnodes", "2"]
    leader, worker = fake_pod("g-0-aaaaa", args), fake_pod("g-0-1-bbbbb", args)
    leader["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
    worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] = "1"
    views = [sglang_pods.build_sglang_pod(p) for p in (leader, worker)]
    assert [v.group_worker for v in views] == [False, True]
    current = sglang.SglangSettings(tp_size=16)
    serving = sglang_pods.compute_sglang_serving(views, current)
    assert (serving.replicas, serving.ready_replicas, serving.available) == (1, 1, True)
    # a crash the pod index filed after LWS deleted the group: evidence against its flags, no replica
    gone = fake_pod(
        "g-0-zzzzz", args, ready=False, restarts=1, message="torch.OutOfMemoryError: CUDA out of memory"
    )
    gone["metadata"]["annotations"] = {"kvpilot.io/gone": "true"}
    filed = sglang_pods.build_sglang_pod(gone)
    assert filed.terminating and filed.restart is not None and filed.restart.failure is not None
    assert sglang_pods.compute_sglang_serving([*views, filed], current).replicas == 1
    short = fake_pod("g-0-aaaaa", args, ready=False, restarts=1, message=sglang.no_kv_pool_error(0.6))
    failed = sglang_pods.compute_sglang_serving([sglang_pods.build_sglang_pod(short), views[1]], current)
    assert (failed.ready_replicas, failed.degraded_reason) == (0, "StartupFailure")
    assert "increase --mem-fraction-static" in failed.message


async def test_sglang_in_mode_off_is_left_alone(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = sglang_isvc(serving={"maxContextLength": 16384}, tuning={"mode": "Off"})
    await harness.run(body)
    loop.window = window(loop.now, kv=0.99, preempt=1.0, waiting=40)
    loop.healthy_pods(restarts=2, message=SGLANG_OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    assert await loop.tick(body) is None
    assert loop.fetches == 0 and "recommendation" not in body["status"]
    assert all(c["type"] != "ClosedLoop" for c in body["status"]["conditions"])


def test_an_unexplained_sglang_restart_is_classified_from_its_previous_log_once() -> None:
    reader = FakePods()
    args = ["--model-path", LLAMA_8B, "--mem-fraction-static", "0.6"]
    reader.pods = [fake_pod("llm-5d8f7c-00000", args, restarts=1, message=None, finished=1000.0)]
    reader.logs["llm-5d8f7c-00000"] = "INFO loading\n" + sglang.no_kv_pool_error(0.6)
    logs = pod_reading.LogCache()
    (view,) = sglang_pods.read_sglang_pods(reader, "ns1", "llm", logs)
    assert view.settings == sglang.SglangSettings(mem_fraction_static=0.6)
    assert view.restart is not None and view.restart.failure is not None
    assert (view.restart.failure.kind, view.restart.time) == ("start_memory_short", 1000.0)
    sglang_pods.read_sglang_pods(reader, "ns1", "llm", logs)
    assert reader.log_reads == 1  # once per restart
    reader.logs.clear()
    silent = sglang_pods.read_sglang_pods(reader, "ns1", "llm", pod_reading.LogCache())
    assert silent[0].restart is not None and silent[0].restart.failure is None


async def test_the_closed_loop_does_not_hold_a_vllm_service(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = isvc(serving={"maxContextLength": 16384})
    await harness.run(body)
    loop.healthy_pods()
    await loop.tick(body)
    assert loop.fetches == 1
    assert all(c["type"] != "ClosedLoop" for c in body["status"]["conditions"])


def render_example(engine: str) -> dict[str, Any]:
    """``kvpilot render`` of ``examples/<engine>/llama-3.1-8b-on-l4.yaml``: a Service and a Deployment,
    whose engine container it returns."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(
        ["render", "-f", str(ROOT / "examples" / engine / "llama-3.1-8b-on-l4.yaml")], out=out, err=err
    )
    assert code == 0, err.getvalue()
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert [d["kind"] for d in docs] == ["Service", "Deployment"]
    return container(docs)


def test_kvpilot_render_prints_the_sglang_example() -> None:
    c = render_example("sglang")
    assert c["command"] == ["python3", "-m", "sglang.launch_server"] and c["image"] == SGLANG_IMAGE
    assert int(flag(c["args"], "--context-length") or 0) == 23552  # 32K shortened to the L4's pool


def test_kvpilot_render_prints_the_tgi_example() -> None:
    c = render_example("tgi")
    assert c["image"].startswith(tgi.serving.IMAGE_REPOSITORY + ":")
    assert flag(c["args"], tgi.FLAGS["max_total_tokens"]) == "8192"  # serving.maxContextLength fits the L4
    assert flag(c["args"], tgi.PORT_FLAG) == str(tgi.serving.PORT)


async def test_drift_repair_covers_the_sglang_container(harness: Harness) -> None:
    """A hand edit of the SGLang container's args is drift and is put back; a deleted SGLang Deployment is
    recreated, though an SGLang service records no ``status.applied``."""
    body = sglang_isvc(serving={"maxContextLength": 16384})
    await harness.run(body)
    harness.kube.services[("ns1", "llm")] = body
    wanted = harness.kube.last("Deployment")
    field, path = next(f for f in drift.MANAGED_FIELDS["Deployment"] if f[0].endswith("[sglang].args"))
    live = copy.deepcopy(wanted)
    every = {"manager": FIELD_MANAGER, "operation": "Update", "fieldsV1": {}}
    edit: dict[str, Any] = {"manager": "kubectl-patch", "operation": "Update", "fieldsV1": {}}
    node = edit["fieldsV1"]
    for key in path:
        node = node.setdefault(key, {})
    live["metadata"]["managedFields"] = [every, edit]
    live["spec"]["template"]["spec"]["containers"][0]["args"] = ["--mem-fraction-static", "0.99"]
    assert [d.field for d in drift.compute_drift(live, wanted)] == [field]

    async def repair(event: str, obj: dict[str, Any]) -> list[str]:
        return await drift.apply_repair(
            "Deployment",
            event,
            obj,
            kube=harness.kube,
            hub=harness.deps.hub,
            emit=harness.emitter,
            logger=logging.getLogger("test"),
            read_owner=harness.kube.read_inference_service,
            owners=harness.deps.owners,
        )

    assert await repair("MODIFIED", live) == [field]
    assert container([harness.kube.last("Deployment")])["args"] == container([wanted])["args"]
    harness.kube.applied.clear()
    assert await repair("DELETED", wanted) == ["deleted"]
    assert container([harness.kube.last("Deployment")])["name"] == "sglang"


def test_sglang_splits_the_pods_gpus_into_tensor_parallel_and_pipeline_stages() -> None:
    body = sglang_isvc(gpu={"count": 4, "product": "L4", "tensorParallelSize": 2})
    args = container(render.build_manifests(body))["args"]
    assert (flag(args, "--tp-size"), flag(args, "--pp-size")) == ("2", "2")
    args = container(render.build_manifests(sglang_isvc(gpu={"count": 2, "product": "L4"})))["args"]
    assert flag(args, "--tp-size") == "2" and "--pp-size" not in args


async def test_the_closed_loop_leaves_a_refused_engine_service_to_the_reconcilers_verdict(
    harness: Harness,
) -> None:
    loop = LoopHarness(harness)
    body = tgi_isvc(model={"id": "Qwen/Qwen3-8B"})  # TGI 3.3.7 has no model of its own for qwen3
    with pytest.raises(kopf.PermanentError):
        await harness.run(body)
    assert await loop.tick(body) is None
    assert [c["type"] for c in body["status"]["conditions"] if c["type"] == "ClosedLoop"] == []
    assert condition(body, "Ready")["status"] == "False" and loop.fetches == 0
    assert harness.kube.applied == [] and "Held" not in harness.emitter.reasons


def test_sglang_plans_as_kvpilot_plan_engine_sglang_does() -> None:
    """``serving.concurrency`` becomes ``--max-running-requests``; a context above the model's is capped to
    the model's (Qwen2.5-7B: 32K), as ``kvpilot plan --engine sglang --max-context`` caps it."""
    body = sglang_isvc(
        model={"id": "Qwen/Qwen2.5-7B-Instruct"},
        gpu={"count": 1, "product": "H100-SXM"},
        serving={"maxContextLength": 65536, "concurrency": 32},
    )
    args = container(render.build_manifests(body))["args"]
    assert (flag(args, "--context-length"), flag(args, "--max-running-requests")) == ("32768", "32")
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan", "--engine", "sglang", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100-SXM"]
    argv += ["--max-context", "65536", "--concurrency", "32", "--json"]
    assert cli.main(argv, out=out, err=err) == 0, err.getvalue()
    planned = json.loads(out.getvalue())["args"]
    assert " ".join(planned) in " ".join(args)  # the CLI's flags, in its order, in the pod
