"""The Prometheus edge of the closed loop, through prometheus-api-client against a stub HTTP server.

The stub (``prometheus_stub``) answers like Prometheus does, one series per pod, and records every query.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_stub import NOW, PODS, Stub, serve_stub

from kvpilot.operator.clients import prometheus
from kvpilot.operator.pods.pod_summary import compute_pod_summary
from kvpilot.operator.pods.pod_view import build_pod_view
from kvpilot.tuner.engines import SglangEngine, TgiEngine
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.sglang import serving as sglang_serving
from kvpilot.tuner.types import EngineSettings


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    yield from serve_stub()


async def test_no_pods_is_unavailable_and_asks_nothing(stub: tuple[Stub, str]) -> None:
    state, url = stub
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=())
    assert not w.available and "no running pods" in (w.unavailable_reason or "")
    assert state.queries == []


@pytest.mark.parametrize(
    ("field", "value"), [("kv", 1e308), ("kv", -0.5), ("running", 1e308), ("waiting", -3)]
)
async def test_an_impossible_value_is_an_invalid_sample(
    stub: tuple[Stub, str], field: str, value: float
) -> None:
    """Issue 16: with every value at 1e308 both services were retuned on "KV usage 1e308"."""
    state, url = stub
    if field == "kv":
        state.kv = [0.5, 0.6, value, 0.6, 0.5]
    else:
        setattr(state, field, value)
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)
    assert not w.available and "invalid sample" in (w.unavailable_reason or ""), w


async def test_fetch_observations_reads_every_series(stub: tuple[Stub, str]) -> None:
    state, url = stub
    w = await prometheus.fetch_observations(
        url, "ns1", "llm", NOW, pods=PODS, window_seconds=300, step_seconds=30
    )
    assert w.available and w.unavailable_reason is None
    assert [s.kv_usage for s in w.samples] == [0.5, 0.6, 0.95, 0.97, 0.99]
    assert [s.preemption_rate for s in w.samples] == [0.0, 0.0, 0.2, 0.4, 0.5]
    assert [s.running for s in w.samples][-1] == 64 and [s.waiting for s in w.samples][-1] == 12
    assert w.prompt_tokens is not None and w.prompt_tokens.mean == 1800.5
    assert w.generation_tokens is None
    assert w.kv_capacity_tokens == 416000  # the smaller pod
    assert (w.reported_gpu_memory_utilization, w.reported_kv_cache_dtype, w.pods) == (0.9, "auto", 2)
    # one query per metric for every service: no pod names in PromQL, the split is the operator's
    assert len(state.queries) == prometheus.QUERIES_PER_TICK
    assert not any("llm-5d8f7c" in q for q in state.queries)
    assert all("by (namespace, pod" in q or q.startswith("vllm:cache_config_info") for q in state.queries)
    assert any("vllm:gpu_cache_usage_perc" in q for q in state.queries)  # the pre-rename fallback
    assert any("vllm:num_preemptions_total" in q and "(vllm:num_preemptions[" in q for q in state.queries)


async def test_legacy_cache_config_uses_blocks_times_block_size(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.legacy = True
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)
    assert w.kv_capacity_tokens == 26000 * 16


async def test_points_after_the_newest_scrape_are_not_observations(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.last_scrape = NOW - 200  # the target vanished; Prometheus keeps answering from its lookback
    state.kv = [0.5] * 11
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS, step_seconds=30)
    assert max(s.time for s in w.samples) <= NOW - 170
    assert w.last_sample_time is not None and NOW - w.last_sample_time > 120  # so the policy calls it stale


async def test_no_series_is_unavailable(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.kv = None
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)
    assert not w.available and "no vllm:kv_cache_usage_perc series" in (w.unavailable_reason or "")
    assert len(state.queries) == 1  # nothing else is asked once the main series is missing


async def test_prometheus_error_is_unavailable_not_an_exception(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.status = 400
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)
    assert not w.available and (w.unavailable_reason or "").startswith("Prometheus query failed")


async def test_unreachable_prometheus_is_unavailable() -> None:
    w = await prometheus.fetch_observations("http://127.0.0.1:9", "ns1", "llm", NOW, pods=PODS)
    assert not w.available and (w.unavailable_reason or "").startswith("Prometheus query failed")


async def test_no_url_is_unavailable() -> None:
    w = await prometheus.fetch_observations("", "ns1", "llm", NOW, pods=PODS)
    assert "KVPILOT_PROMETHEUS_URL" in (w.unavailable_reason or "")


def test_queries_use_the_pinned_vllm_names() -> None:
    q = prometheus.build_queries(300)
    assert q.ranged["kv_usage"] == (
        "max by (namespace, pod) (vllm:kv_cache_usage_perc)"
        " or max by (namespace, pod) (vllm:gpu_cache_usage_perc)"
    )
    assert "rate(vllm:request_prompt_tokens_sum[300s])" in q.instant["prompt_sum"]
    assert q.instant["cache_config"] == 'vllm:cache_config_info{pod!=""}'
    relabelled = prometheus.build_queries(300, pod_label="kubernetes_pod_name", namespace_label="kube_ns")
    assert all("by (kube_ns, kubernetes_pod_name" in x for x in list(relabelled.ranged.values())[:4])
    assert len(q.all) == prometheus.QUERIES_PER_TICK


def test_pinned_vllm_declares_these_names() -> None:
    """The names in the queries are the ones vLLM 0.33's PrometheusStatLogger declares."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm not installed")
    source = (pathlib.Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    p = prometheus
    for name in (
        p.KV_USAGE,
        p.PREEMPTIONS_BARE,
        p.RUNNING,
        p.WAITING,
        p.PROMPT_TOKENS,
        p.GENERATION_TOKENS,
        p.CACHE_CONFIG_INFO,
    ):
        assert f'"{name}"' in source, name


# --- pods ------------------------------------------------------------------------------------------


def _pod(args: list[str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llm-5d8f7c-aaaaa"},
        "spec": {"containers": [{"name": "vllm", "args": args}]},
        "status": {"containerStatuses": [{"name": "vllm", **status}]},
    }


ARGS = ["m", "--port", "8000", "--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]
CURRENT = EngineSettings(max_model_len=8192, gpu_memory_utilization=0.9)


def test_pod_view_classifies_the_last_termination() -> None:
    view = build_pod_view(
        _pod(
            ARGS,
            ready=False,
            restartCount=2,
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            lastState={
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "finishedAt": "2027-01-15T08:00:00Z",
                    "message": "x\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allo",
                }
            },
        )
    )
    assert view.settings == CURRENT
    assert view.restart is not None
    assert (view.restart.cause.kind, view.restart.restart_count, view.restart.crash_looping) == (
        RestartKind.CUDA_OOM,
        2,
        True,
    )
    assert view.restart.time == 1_800_000_000.0
    assert not view.needs_log


def test_pod_view_asks_for_the_log_when_the_message_is_silent() -> None:
    pod = _pod(ARGS, restartCount=1, lastState={"terminated": {"exitCode": 1, "reason": "Error"}})
    assert build_pod_view(pod).needs_log
    killed = _pod(ARGS, restartCount=1, lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    assert not build_pod_view(killed).needs_log
    view = build_pod_view(pod, log_tail="No available memory for the cache blocks. Try increasing")
    assert view.restart is not None and view.restart.cause.kind == RestartKind.NO_CACHE_BLOCKS


def test_pod_summary_needs_every_replica_on_the_current_settings() -> None:
    ready = build_pod_view(_pod(ARGS, ready=True, restartCount=0))
    other = build_pod_view(_pod(["m", "--max-model-len", "4096"], ready=True, restartCount=0))
    assert compute_pod_summary([ready], CURRENT, 1).ready
    assert not compute_pod_summary([ready], CURRENT, 2).ready
    assert not compute_pod_summary([ready, other], CURRENT, 1).ready
    gone = build_pod_view(dict(_pod(["m"], ready=True), metadata={"name": "x", "deletionTimestamp": "t"}))
    assert compute_pod_summary([ready, gone], CURRENT, 1).ready


def _framebuffer_snapshot(
    frees: dict[str, list[float]], useds: dict[str, list[float]]
) -> tuple[prometheus.FleetSnapshot, list[str]]:
    """A snapshot of two instants (t=0, 30) with KV usage and dcgm-exporter's framebuffer per pod (GiB)."""

    def series(pod: str, values: list[float]) -> dict[str, Any]:
        points = [[t * 30, str(v)] for t, v in enumerate(values)]
        return {"metric": {"namespace": "ns1", "pod": pod}, "values": points}

    pods = sorted(frees)
    ranged = {
        "kv_usage": [series(p, [0.5, 0.5]) for p in pods],
        "gpu_memory_free_gib": [series(p, frees[p]) for p in pods],
        "gpu_memory_used_gib": [series(p, useds[p]) for p in pods],
    }
    instant = {"last_scrape": [{"metric": {"namespace": "ns1", "pod": p}, "value": [30, "30"]} for p in pods]}
    return prometheus.build_fleet_snapshot(ranged, instant, 30.0), pods


def test_a_framebuffer_read_as_nothing_is_no_reading() -> None:
    """A GPU the exporter has not read yet shows 0 MiB free and 0 MiB used (the HA test's pod at start-up):
    the worst-pod minimum took it for a full GPU and the loop lowered the utilisation of a healthy pod."""
    snapshot, pods = _framebuffer_snapshot(
        {"a": [0.0, 0.0], "b": [0.0, 20.0]}, {"a": [0.0, 0.0], "b": [0.0, 60.0]}
    )
    w = prometheus.build_service_window(snapshot, "ns1", pods, 300, 30)
    assert [(s.gpu_memory_free_gib, s.gpu_memory_used_gib) for s in w.samples] == [(None, None), (20.0, 60.0)]
    alone = prometheus.build_service_window(snapshot, "ns1", ["a"], 300, 30)
    assert w.available and all(s.gpu_memory_free_gib is None for s in alone.samples)


def test_a_full_framebuffer_is_a_reading() -> None:
    """0 MiB free beside 80 GiB used is a full GPU: the early warning must see it."""
    snapshot, pods = _framebuffer_snapshot({"a": [0.0, 1.0]}, {"a": [80.0, 79.0]})
    w = prometheus.build_service_window(snapshot, "ns1", pods, 300, 30)
    assert [(s.gpu_memory_free_gib, s.gpu_memory_used_gib) for s in w.samples] == [(0.0, 80.0), (1.0, 79.0)]


@pytest.mark.parametrize("engine", [SglangEngine(), TgiEngine()], ids=["sglang", "tgi"])
def test_an_engines_window_carries_dcgm_exporters_framebuffer(engine: SglangEngine | TgiEngine) -> None:
    """SGLang's and TGI's loops read the GPU memory early warning as vLLM's (issue 29): the tick asks
    dcgm-exporter's framebuffer with the engine's own series, and the service's window carries its pods'
    (the lowest free, the highest used; another service's pod not in it) into the rules."""
    series = engine.metrics
    q = prometheus.build_queries(300, series=series)
    assert q.ranged["gpu_memory_free_gib"] == f"min by (namespace, pod) ({prometheus.FB_FREE}) / 1024"
    assert q.ranged["gpu_memory_used_gib"] == f"max by (namespace, pod) ({prometheus.FB_USED}) / 1024"
    pods = ["llm-5d8f7c-00000", "llm-5d8f7c-00001"]

    def vector(pod: str, values: list[float]) -> dict[str, Any]:
        return {
            "metric": {"namespace": "ns1", "pod": pod},
            "values": [[NOW - 30 + 30 * i, str(v)] for i, v in enumerate(values)],
        }

    ranged = {
        "kv_usage": [vector(pods[0], [0.5, 0.6]), vector(pods[1], [0.4, 0.4])],
        "gpu_memory_free_gib": [
            vector(pods[0], [3.0, 0.5]),
            vector(pods[1], [2.0, 4.0]),
            vector("other-7b9c6d-ccccc", [0.1, 0.1]),
        ],
        "gpu_memory_used_gib": [vector(pods[0], [77.0, 79.5]), vector(pods[1], [78.0, 76.0])],
    }
    instant = {"last_scrape": [{"metric": {"namespace": "ns1", "pod": pods[0]}, "value": [NOW, str(NOW)]}]}
    kv_series = series.kv_usage or series.kv_used_tokens or ""
    snapshot = prometheus.build_fleet_snapshot(ranged, instant, NOW, kv_series=kv_series)
    w = prometheus.build_service_window(snapshot, "ns1", pods, 300, 30)
    assert w.available and w.pods == 2
    assert [(s.gpu_memory_free_gib, s.gpu_memory_used_gib) for s in w.samples] == [(2.0, 78.0), (0.5, 79.5)]


def test_sglang_queries_read_the_seams_series_and_no_vllm_name() -> None:
    series = SglangEngine().metrics
    q = prometheus.build_queries(300, series=series)
    assert q.ranged["kv_usage"] == f"max by (namespace, pod) ({series.kv_usage})"
    assert q.ranged["waiting"] == f"max by (namespace, pod) ({series.queued})"
    assert f"rate({series.preemptions}[" in q.ranged["preemption_rate"]
    assert f"{series.ttft}_bucket" in q.ranged["ttft_p95"] and f"{series.itl}_bucket" in q.ranged["itl_p95"]
    assert not any("vllm:" in x for x in q.all)
    assert set(q.instant) == {"last_scrape", "prompt_sum", "prompt_count"}  # no cache_config_info


def test_sglang_prompt_lengths_are_its_histograms_mean_over_the_services_pods() -> None:
    """SGLang's prompt-length histogram (``sglang:prompt_tokens_histogram``, observed per finished request)
    is read as vLLM's and TGI's: the rate of its ``_sum`` over the rate of its ``_count``, summed over the
    service's pods (another service's pod is not in it), into the window's mean prompt."""
    q = prometheus.build_queries(300, series=SglangEngine().metrics)
    histogram = sglang_serving.PROMPT_TOKENS_HISTOGRAM
    assert q.instant["prompt_sum"] == f"sum by (namespace, pod) (rate({histogram}_sum[300s]))"
    assert q.instant["prompt_count"] == f"sum by (namespace, pod) (rate({histogram}_count[300s]))"
    pods = ["llm-5d8f7c-00000", "llm-5d8f7c-00001"]

    def vector(*pairs: tuple[str, float]) -> list[dict[str, Any]]:
        return [{"metric": {"namespace": "ns1", "pod": p}, "value": [NOW, str(v)]} for p, v in pairs]

    ranged = {"kv_usage": [{"metric": {"namespace": "ns1", "pod": pods[0]}, "values": [[NOW - 30, "0.5"]]}]}
    instant = {
        "last_scrape": vector((pods[0], NOW - 30)),
        "prompt_sum": vector((pods[0], 3 * 6000.0), (pods[1], 1000.0), ("other-7b9c6d-ccccc", 1e6)),
        "prompt_count": vector((pods[0], 3.0), (pods[1], 1.0), ("other-7b9c6d-ccccc", 1.0)),
    }
    snapshot = prometheus.build_fleet_snapshot(ranged, instant, NOW, kv_series=sglang_serving.TOKEN_USAGE)
    w = prometheus.build_service_window(snapshot, "ns1", pods, 300, 30)
    assert w.prompt_tokens is not None and w.prompt_tokens.mean == 4750.0  # (18000 + 1000) / 4
    idle = dict(instant, prompt_sum=vector((pods[0], 0.0)), prompt_count=vector((pods[0], 0.0)))
    none = prometheus.build_fleet_snapshot(ranged, idle, NOW, kv_series=sglang_serving.TOKEN_USAGE)
    assert prometheus.build_service_window(none, "ns1", pods, 300, 30).prompt_tokens is None  # 0 / 0


def test_an_sglang_window_is_its_pods_worst_and_names_its_series_when_absent() -> None:
    series = SglangEngine().metrics
    pods = ["llm-5d8f7c-00000", "llm-5d8f7c-00001"]

    def vector(pod: str, values: list[float]) -> dict[str, Any]:
        points = [[NOW - 60 + 30 * i, str(v)] for i, v in enumerate(values)]
        return {"metric": {"namespace": "ns1", "pod": pod}, "values": points}

    ranged = {
        "kv_usage": [vector(pods[0], [0.2, 0.3, 0.4]), vector(pods[1], [0.5, 0.1, 0.1])],
        "preemption_rate": [vector(pods[1], [0.0, 0.5, 1.0])],
    }
    instant = {"last_scrape": [{"metric": {"namespace": "ns1", "pod": pods[0]}, "value": [NOW, str(NOW)]}]}
    snapshot = prometheus.build_fleet_snapshot(ranged, instant, NOW, kv_series=series.kv_usage or "")
    w = prometheus.build_service_window(snapshot, "ns1", pods, 300, 30)
    assert w.available and w.pods == 2
    assert [s.kv_usage for s in w.samples] == [0.5, 0.3, 0.4]
    assert [s.preemption_rate for s in w.samples] == [0.0, 0.5, 1.0]
    empty = prometheus.build_fleet_snapshot({"kv_usage": []}, {}, NOW, kv_series=series.kv_usage or "")
    gone = prometheus.build_service_window(empty, "ns1", pods, 300, 30)
    assert not gone.available and f"no {series.kv_usage} series" in (gone.unavailable_reason or "")
