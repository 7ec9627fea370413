"""TGI's closed loop in the operator (:mod:`kvpilot.operator.inferenceservice.tgi_loop`): its pods read in
TGI's flags, its crash texts remedied, what it would change recorded (Recommend) or rolled out, judged and
kept (Auto), its Prometheus series from :mod:`kvpilot.tuner.tgi.serving`, as SGLang's loop does."""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

from closed_loop_fakes import LoopHarness, pod, window
from operator_fakes import Harness, condition, isvc

from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients.kube import FIELD_MANAGER
from kvpilot.operator.inferenceservice import drift, handlers
from kvpilot.operator.planning import engines as planning_engines
from kvpilot.operator.pods import engine_pods
from kvpilot.tuner import engines, tgi
from kvpilot.tuner.tgi import serving

TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"


def tgi_isvc(**spec: Any) -> dict[str, Any]:
    engine = {"kind": "TGI", "image": TGI_IMAGE, **spec.pop("engine", {})}
    return isvc(engine=engine, **spec)


def _runs(args: list[str]) -> tgi.TgiSettings:
    return tgi.parse_tgi_args(args)


def _series_fetches(loop: LoopHarness) -> list[Any]:
    seen: list[Any] = []
    fetch = loop.deps.fetch_window

    async def recording(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("series"))
        return await fetch(*args, **kw)

    loop.deps.fetch_window = recording
    return seen


def test_tgi_has_a_closed_loop_of_its_own() -> None:
    assert "TGI" in planning_engines.RECOMMENDING_KINDS


def test_tgis_usage_is_its_batch_tokens_over_its_capacity() -> None:
    queries = prometheus.build_queries(300, series=engines.lookup_engine("TGI").metrics)
    usage = queries.ranged["kv_usage"]
    assert serving.BATCH_CURRENT_MAX_TOKENS in usage and serving.BATCH_MAX_TOTAL_TOKENS in usage
    assert serving.QUEUE_SIZE in queries.ranged["waiting"]
    assert serving.BATCH_CURRENT_SIZE in queries.ranged["running"]
    assert "preemption_rate" not in queries.ranged


def test_tgis_429s_are_the_rate_of_its_overloaded_failures_per_pod() -> None:
    """TGI counts a request refused at ``--max-concurrent-requests`` in
    ``tgi_request_failure{err="overloaded"}`` (no ``_total``: its exporter appends none); the loop reads its
    rate per pod like a preemption rate."""
    series = engines.lookup_engine("TGI").metrics
    assert series.rejected == serving.REQUEST_OVERLOADED
    assert series.rejected == 'tgi_request_failure{err="overloaded"}'  # TGI's router, verbatim
    rejected = prometheus.build_queries(300, series=series).ranged["rejected_rate"]
    assert (
        rejected == f"max by (namespace, pod) (rate({serving.REQUEST_OVERLOADED}[{prometheus.RATE_WINDOW}]))"
    )
    for other in ("vLLM", "SGLang"):
        assert engines.lookup_engine(other).metrics.rejected is None
        assert (
            "rejected_rate"
            not in prometheus.build_queries(300, series=engines.lookup_engine(other).metrics).ranged
        )
    assert "rejected_rate" not in prometheus.build_queries(300).ranged  # vLLM's own queries


def test_tgis_429_rate_fills_the_samples_and_an_absent_counter_is_none_refused() -> None:
    """The worst pod's rate at each sample; TGI writes the counter only once it first refuses, so a sample
    whose KV gauges were scraped without it is 0 refused -- and for an engine with no such series, ``None``.
    """
    now = 1_000_000.0
    pods = ["llm-5d8f7c-00000", "llm-5d8f7c-00001"]

    def vector(pod: str, values: list[float]) -> dict[str, Any]:
        points = [[now - 60 + 30 * i, str(v)] for i, v in enumerate(values)]
        return {"metric": {"namespace": "ns1", "pod": pod}, "values": points}

    kv = [vector(pods[0], [0.2, 0.2, 0.2]), vector(pods[1], [0.1, 0.1, 0.1])]
    refusing = [vector(pods[1], [1.5, 2.5]), vector("other-7b9c6d-ccccc", [99.0, 99.0, 99.0])]
    instant = {"last_scrape": [{"metric": {"namespace": "ns1", "pod": pods[0]}, "value": [now, str(now)]}]}
    kv_series = serving.BATCH_CURRENT_MAX_TOKENS

    def samples(ranged: dict[str, Any]) -> list[float | None]:
        snapshot = prometheus.build_fleet_snapshot(ranged, instant, now, kv_series=kv_series)
        return [
            s.rejected_rate for s in prometheus.build_service_window(snapshot, "ns1", pods, 300, 30).samples
        ]

    assert samples({"kv_usage": kv, "rejected_rate": refusing}) == [1.5, 2.5, 0.0]
    assert samples({"kv_usage": kv, "rejected_rate": []}) == [0.0, 0.0, 0.0]  # asked, never refused
    assert samples({"kv_usage": kv}) == [None, None, None]  # not asked: no such series


def test_a_tgi_pod_is_read_in_tgis_flags_and_its_crash_text_classified() -> None:
    args = ["--model-id", "m", "--max-batch-prefill-tokens", "8192", "--max-total-tokens", "8192"]
    view = engine_pods.build_engine_pod(
        engine_pods.TGI, pod("llm-5d8f7c-00000", args, restarts=1, message=tgi.prefill_tokens_error(8192))
    )
    assert view.settings == tgi.TgiSettings(max_total_tokens=8192, max_batch_prefill_tokens=8192)
    assert view.restart is not None and view.restart.failure is not None
    assert view.restart.failure.kind == "start_oom"


async def test_recommend_records_a_lower_prefill_after_tgis_warmup_failed(harness: Harness) -> None:
    loop = LoopHarness(harness)
    series = _series_fetches(loop)
    body = tgi_isvc(serving={"maxContextLength": 8192}, tuning={"mode": "Recommend"})
    await harness.run(body)
    applied = len(harness.kube.applied)
    loop.window = window(loop.now, kv=0.5, running=4, waiting=0)
    text = "ERROR warmup\n" + tgi.prefill_tokens_error(4096)
    loop.healthy_pods(restarts=2, message=text, finished=loop.now + 10, ready=False, crash_loop=True)
    await loop.tick(body)
    st = body["status"]
    closed = condition(body, "ClosedLoop")
    assert (closed["status"], closed["reason"]) == ("True", "Recommending")
    assert "TGI flags" in closed["message"]
    recommended = _runs(st["recommendation"]["engineArgs"])
    assert recommended.max_batch_prefill_tokens == 2048 and st["recommendation"]["trigger"] == "StartOOM"
    (failed,) = st["failedEngineArgs"]
    assert failed["failure"] == "start_oom"
    assert series == [engines.lookup_engine("TGI").metrics]
    assert len(harness.kube.applied) == applied  # Recommend: the Deployment is left alone
    assert condition(body, "Degraded")["reason"] == "StartupFailure"


async def test_auto_rolls_a_lower_prefill_out_and_the_flags_become_good(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = tgi_isvc(serving={"maxContextLength": 8192}, tuning={"mode": "Auto"})
    await harness.run(body)
    planned = body["status"]["appliedEngineArgs"]
    assert planned and tgi.build_tgi_args(_runs(loop.deployment_args())) == planned
    prefill = _runs(planned).max_batch_prefill_tokens
    assert prefill is not None
    loop.window = window(loop.now, kv=0.5, running=4, waiting=0)
    text = tgi.prefill_tokens_error(prefill)
    loop.healthy_pods(restarts=1, message=text, finished=loop.now + 10, ready=False, crash_loop=True)
    await loop.tick(body)
    st = body["status"]
    new = st["appliedEngineArgs"]
    assert _runs(new).max_batch_prefill_tokens == prefill // 2
    assert tgi.build_tgi_args(_runs(loop.deployment_args())) == new  # the Deployment follows
    assert st["rollout"]["engineArgs"] == new and st["rollout"]["phase"] == "RollingOut"
    assert "Retuned" in harness.emitter.reasons and "StartOOM" in harness.emitter.reasons
    loop.healthy_pods()  # the new flags' pods, Ready
    loop.window = window(loop.now + 30, kv=0.5, running=4, waiting=0)
    await loop.tick(body)
    assert body["status"]["rollout"]["phase"] == "Probation"
    await loop.tick(body, advance=400)
    assert body["status"]["lastGoodEngineArgs"] == new
    assert "RolloutSucceeded" in harness.emitter.reasons
    await harness.run(body, trigger=handlers.RESUMED)  # the reconciler keeps what the loop rolled out
    assert body["status"]["appliedEngineArgs"] == new
    assert tgi.build_tgi_args(_runs(loop.deployment_args())) == new
    assert "kept" in condition(body, "Planned")["message"]


async def test_a_crash_on_probation_rolls_tgi_back_to_the_last_good_flags(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = tgi_isvc(serving={"maxContextLength": 8192, "concurrency": 16}, tuning={"mode": "Auto"})
    await harness.run(body)
    planned = body["status"]["appliedEngineArgs"]
    loop.healthy_pods()
    loop.window = window(loop.now + 30, kv=0.5, running=4, waiting=0)
    await loop.tick(body)
    assert body["status"]["lastGoodEngineArgs"] == planned
    loop.window = window(loop.now + 400, kv=0.4, running=12, waiting=4)  # the admission limit binds
    await loop.tick(body, advance=400)
    new = body["status"]["appliedEngineArgs"]
    assert _runs(new).max_concurrent_requests == 26  # the KV's room: 0.88 x 12 running / 0.4 used
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
    loop.healthy_pods()
    await loop.tick(body)
    loop.healthy_pods(restarts=1, message=oom, finished=loop.now + 5, ready=False)
    await loop.tick(body)
    st = body["status"]
    assert st["appliedEngineArgs"] == planned and tgi.build_tgi_args(_runs(loop.deployment_args())) == planned
    (failed,) = st["failedEngineArgs"]  # the new flags as TGI ran them (its defaults filled in)
    assert (failed["failure"], failed["runningRequests"]) == ("runtime_oom", 12)
    assert _runs(failed["args"]).max_concurrent_requests == 26
    assert "RolledBack" in harness.emitter.reasons


async def test_drift_repair_puts_back_the_flags_the_loop_rolled_out(harness: Harness) -> None:
    """A hand edit of the TGI container's args is drift: the repair renders ``status.appliedEngineArgs`` (the
    loop's flags, kept), not a new plan."""
    body = tgi_isvc(serving={"maxContextLength": 8192}, tuning={"mode": "Auto"})
    await harness.run(body)
    kept = tgi.build_tgi_args(
        dataclasses.replace(_runs(body["status"]["appliedEngineArgs"]), max_concurrent_requests=7)
    )
    body["status"]["appliedEngineArgs"] = kept
    harness.kube.services[("ns1", "llm")] = body
    wanted = harness.kube.last("Deployment")
    field, path = next(f for f in drift.MANAGED_FIELDS["Deployment"] if f[0].endswith("[tgi].args"))
    live = copy.deepcopy(wanted)
    edit: dict[str, Any] = {"manager": "kubectl-patch", "operation": "Update", "fieldsV1": {}}
    node = edit["fieldsV1"]
    for key in path:
        node = node.setdefault(key, {})
    live["metadata"]["managedFields"] = [
        {"manager": FIELD_MANAGER, "operation": "Update", "fieldsV1": {}},
        edit,
    ]
    live["spec"]["template"]["spec"]["containers"][0]["args"] = ["--max-concurrent-requests", "999"]
    repaired = await drift.apply_repair(
        "Deployment",
        "MODIFIED",
        live,
        kube=harness.kube,
        hub=harness.deps.hub,
        emit=harness.emitter,
        logger=logging.getLogger("test"),
        read_owner=harness.kube.read_inference_service,
        owners=harness.deps.owners,
    )
    assert repaired == [field]
    args = harness.kube.last("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert tgi.build_tgi_args(_runs(args)) == kept


def test_tgis_queries_read_its_prompt_lengths_for_the_latency_rule() -> None:
    queries = prometheus.build_queries(300, series=engines.lookup_engine("TGI").metrics)
    assert f"{serving.INPUT_LENGTH}_sum[300s]" in queries.instant["prompt_sum"]
    assert f"{serving.INPUT_LENGTH}_count[300s]" in queries.instant["prompt_count"]


async def test_the_itl_objective_of_spec_serving_reaches_tgis_loop(harness: Harness) -> None:
    loop = LoopHarness(harness)
    slo = {"maxContextLength": 8192, "slo": {"interTokenLatencyP95Seconds": 0.05}}
    body = tgi_isvc(serving=slo, tuning={"mode": "Recommend"})
    await harness.run(body)
    loop.healthy_pods()
    slow = window(loop.now + 1000, kv=0.5, running=40, waiting=0)
    samples = tuple(dataclasses.replace(s, itl_p95=0.08) for s in slow.samples)
    loop.window = dataclasses.replace(slow, samples=samples)
    await loop.tick(body, advance=1000)
    recommendation = body["status"]["recommendation"]
    assert recommendation["trigger"] == "LatencySlo", recommendation
    assert _runs(recommendation["engineArgs"]).max_concurrent_requests == 25  # 40 x 0.05 / 0.08
