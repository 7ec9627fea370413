"""The closed loop's PromQL against a real Prometheus scraping vLLM-format ``/metrics``.

Debian's ``prometheus`` (started by ``e2e.prometheus``, scrape interval 1 s) scrapes two
fake vLLM pods of one service (the e2e fleet's exposition: 0.33 names, and a pod with
the pre-rename names) plus a pod of *another* service that must not be selected.
Checks that every query parses, the selector picks the right pods, the fallbacks work
and the window has what the policy needs. A data-parallel pod (one API server over two engines, vLLM's
``engine`` label) is read as its worst engine against the per-engine ``--max-num-seqs``. A second real
Prometheus over the same pods serves its API
behind TLS and basic auth (``--web.config.file``, ``e2e.prometheus.make_web_security``), as teams run it:
read with the CA bundle and the credentials as files, and a wrong CA or password is a clear condition
reason. The binary is required (``make test`` installs it), never skipped.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.prometheus import serve_exposition
from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings, Secret, settings_from_env
from kvpilot.tuner.loop import PolicyConfig, compute_metrics_status


def test_the_prometheus_binary_is_installed() -> None:
    assert shutil.which("prometheus"), "prometheus is missing: `make e2e-tools` installs Debian's package"


Targets = list[dict[str, Any]]


@pytest.fixture(scope="module")
def pods() -> Iterator[tuple[Targets, dict[str, Any]]]:
    """The three fake vLLM pods serving ``/metrics``: (file_sd target groups, {pod: (metrics, KV tokens)})."""
    truth_mod = pytest.importorskip("e2e.fleet.truth")
    expo = pytest.importorskip("e2e.fleet.exposition")
    engine = pytest.importorskip("e2e.fleet.engine")

    truth = truth_mod.GroundTruth()
    pods: dict[str, Any] = {}
    servers = []
    for name, naming, gmu in (
        ("llm-5d8f7c-aaaaa", "current", 0.9),
        ("llm-5d8f7c-bbbbb", "legacy", 0.9),
        ("other-7b9c6d-ccccc", "current", 0.5),
    ):
        args = truth_mod.EngineArgs(
            model="m", max_model_len=8192, max_num_seqs=64, gpu_memory_utilization=gmu
        )
        metrics = expo.VllmMetrics(truth, args, naming=naming)
        usage = 0.97 if name.startswith("llm-5d8f7c-aaaaa") else (0.5 if name.startswith("llm") else 0.99)
        metrics.record(running=40, waiting=7, kv_usage=usage, deltas=engine.Deltas(preemptions=0))
        pods[name] = (metrics, truth.kv_tokens(args))
        servers.append((name, serve_exposition(metrics.render)))

    # a DP x EP pod of service "dp": one API server over two engines, the second full and preempting
    dp_args = truth_mod.EngineArgs(model="m", max_model_len=8192, max_num_seqs=64, gpu_memory_utilization=0.9)
    dp = [expo.VllmMetrics(truth, dp_args, engine=i) for i in range(2)]
    dp[0].record(running=12, waiting=0, kv_usage=0.31, deltas=engine.Deltas(preemptions=0), fb_used_gib=60.0)
    dp[1].record(running=64, waiting=9, kv_usage=0.96, deltas=engine.Deltas(preemptions=0), fb_used_gib=75.0)
    pods["dp-6c7d8e-eeeee"] = (dp, truth.kv_tokens(dp_args))
    servers.append(("dp-6c7d8e-eeeee", serve_exposition(lambda: expo.render_engines(dp))))

    def bump() -> None:  # preemption storms on pod aaaaa and the DP pod's engine 1: 5 per second
        while not stop.is_set():
            pods["llm-5d8f7c-aaaaa"][0].record(
                running=40, waiting=7, kv_usage=0.97, deltas=engine.Deltas(preemptions=1)
            )
            dp[1].record(running=64, waiting=9, kv_usage=0.96, deltas=engine.Deltas(preemptions=1))
            time.sleep(0.2)

    stop = threading.Event()
    threading.Thread(target=bump, daemon=True).start()
    targets = [
        {
            "targets": [f"127.0.0.1:{srv.server_address[1]}"],
            "labels": {"__meta_kubernetes_namespace": "ns1", "__meta_kubernetes_pod_name": name},
        }
        for name, srv in servers
    ]
    try:
        yield targets, pods
    finally:
        stop.set()
        for _, srv in servers:
            srv.shutdown()


def _scraping(prom: Any, targets: Targets) -> None:
    prom.write_targets(targets)
    prom.wait_for(
        'count(up{namespace="ns1"} == 1)', lambda r: bool(r) and r[0]["value"][1] == "4", timeout=60
    )
    time.sleep(6)  # a few scrapes for rate()


@pytest.fixture(scope="module")
def fleet(pods: tuple[Targets, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    prom_mod = pytest.importorskip("e2e.prometheus")
    with prom_mod.PrometheusServer(scrape_interval="1s") as prom:
        _scraping(prom, pods[0])
        yield prom.url, pods[1]


@pytest.fixture(scope="module")
def secure(
    pods: tuple[Targets, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any]]:
    """The real Prometheus behind TLS and basic auth (its ``--web.config.file``): (server, WebSecurity)."""
    from e2e.prometheus import PrometheusServer, make_web_security

    workdir = tmp_path_factory.mktemp("secure-prom")
    web = make_web_security(workdir / "web")
    with PrometheusServer(workdir, scrape_interval="1s", web=web) as prom:
        _scraping(prom, pods[0])
        yield prom, web


async def _observe(source: Any, service: str, pods: tuple[str, ...]) -> Any:
    """The window of ``pods``, once each of them reports: a scrape that times out on a loaded machine marks
    a target's series stale for a moment (one scrape a second, 1 s timeout), which is not what is tested."""
    w = None
    for _ in range(20):
        w = await prometheus.fetch_observations(
            source, "ns1", service, time.time(), pods=pods, window_seconds=10, step_seconds=1
        )
        if w.available and w.pods == len(pods):
            return w
        await asyncio.sleep(0.5)
    return w


async def test_real_prometheus_window(fleet: tuple[str, dict[str, Any]]) -> None:
    url, pods = fleet
    w = await _observe(url, "llm", ("llm-5d8f7c-aaaaa", "llm-5d8f7c-bbbbb"))
    now = time.time()
    assert w.available, w.unavailable_reason
    assert w.pods == 2  # the other service's pod is not selected
    # a foreign pod named like the service's (llm-<hash>-<suffix>) is not the service's pod: not selected
    only_one = await prometheus.fetch_observations(
        url, "ns1", "llm", now, pods=("llm-5d8f7c-bbbbb",), window_seconds=10, step_seconds=1
    )
    assert only_one.pods == 1 and only_one.samples[-1].kv_usage == pytest.approx(0.5)
    last = w.samples[-1]
    assert last.kv_usage == pytest.approx(0.97)  # the worst pod, across the current and legacy names
    assert (last.running, last.waiting) == (40, 7)
    assert last.preemption_rate is not None and last.preemption_rate > 0.05  # the policy's storm threshold
    assert now - (w.last_sample_time or 0) < 5
    # the current-naming pod reports kv_cache_size_tokens, the legacy one blocks x block size: same figure
    assert w.kv_capacity_tokens == pods["llm-5d8f7c-aaaaa"][1]
    assert w.reported_gpu_memory_utilization == 0.9 and w.reported_kv_cache_dtype == "auto"


async def test_a_data_parallel_pod_is_read_as_its_worst_engine(fleet: tuple[str, dict[str, Any]]) -> None:
    """A DP x EP replica's API server serves every engine's series, told apart by ``engine``; each engine has
    its own ``--max-num-seqs`` and KV pool. The loop must see the full engine (not the pod's sum or mean):
    KV usage, running and waiting of engine 1, its preemptions alone, one engine's KV capacity, and the
    fuller of the pod's two GPUs."""
    url, pods = fleet
    truth = pytest.importorskip("e2e.fleet.truth").GroundTruth()
    w = await _observe(url, "dp", ("dp-6c7d8e-eeeee",))
    assert w.available, w.unavailable_reason
    assert w.pods == 1
    last = w.samples[-1]
    assert last.kv_usage == pytest.approx(0.96)  # engine 1; the mean of the two would be 0.635
    assert (last.running, last.waiting) == (64, 9)  # engine 1 at its 64: the sum, 76, is above any limit
    assert last.preemption_rate is not None and 0.05 < last.preemption_rate < 10
    assert w.kv_capacity_tokens == pods["dp-6c7d8e-eeeee"][1]  # one engine's pool, not the pod's two
    assert last.gpu_memory_free_gib == pytest.approx(truth.gpu_memory_gib - 75.0, abs=0.01)  # the fuller GPU


async def test_real_prometheus_other_service_and_missing_service(fleet: tuple[str, dict[str, Any]]) -> None:
    url, _ = fleet
    other = await prometheus.fetch_observations(
        url, "ns1", "other", time.time(), pods=("other-7b9c6d-ccccc",), window_seconds=10, step_seconds=1
    )
    assert other.available and other.samples[-1].kv_usage == pytest.approx(0.99)
    assert other.reported_gpu_memory_utilization == 0.5
    none = await prometheus.fetch_observations(
        url, "ns2", "llm", time.time(), pods=("llm-5d8f7c-aaaaa",), window_seconds=10, step_seconds=1
    )
    assert not none.available and "no vllm:kv_cache_usage_perc series" in (none.unavailable_reason or "")


def _secure_settings(prom: Any, web: Any, tmp: Any, **overrides: Any) -> PrometheusSettings:
    """What the chart gives the operator: the URL, the basic-auth Secret mounted as files, the CA bundle."""
    (tmp / "username").write_text(web.username + "\n")
    (tmp / "password").write_text(web.password + "\n")
    env = {
        "KVPILOT_PROMETHEUS_URL": prom.url,
        "KVPILOT_PROMETHEUS_USERNAME_FILE": str(tmp / "username"),
        "KVPILOT_PROMETHEUS_PASSWORD_FILE": str(tmp / "password"),
        "KVPILOT_PROMETHEUS_CA_FILE": str(web.ca_file),
        "KVPILOT_PROMETHEUS_HEADERS": '{"X-Scope-OrgID": "team-a"}',
    }
    env.update(overrides)
    return settings_from_env({k: v for k, v in env.items() if v})


async def test_real_prometheus_behind_tls_and_basic_auth(secure: tuple[Any, Any], tmp_path: Any) -> None:
    prom, web = secure
    assert prom.url.startswith("https://")
    settings = _secure_settings(prom, web, tmp_path)
    w = await _observe(settings, "llm", ("llm-5d8f7c-aaaaa", "llm-5d8f7c-bbbbb"))
    assert w.available, w.unavailable_reason
    assert w.pods == 2 and w.samples[-1].kv_usage == pytest.approx(0.97)
    assert w.samples[-1].preemption_rate is not None and w.samples[-1].preemption_rate > 0.05


def _status(w: Any) -> Any:
    return compute_metrics_status(w, PolicyConfig(), time.time())


async def test_real_prometheus_wrong_ca_is_a_clear_reason(secure: tuple[Any, Any], tmp_path: Any) -> None:
    from e2e.prometheus import make_ca

    prom, web = secure
    wrong = make_ca(tmp_path / "other", "some-other-ca")
    settings = _secure_settings(prom, web, tmp_path, KVPILOT_PROMETHEUS_CA_FILE=str(wrong))
    w = await prometheus.fetch_observations(
        settings, "ns1", "llm", time.time(), pods=("llm-5d8f7c-aaaaa",), window_seconds=10, step_seconds=1
    )
    status = _status(w)
    assert not status.available and status.reason == "PrometheusTLSError", status
    assert prom.url in status.message and "certificate" in status.message.lower(), status.message
    # verification is on by default: the system's CAs do not know this one either
    default = _secure_settings(prom, web, tmp_path, KVPILOT_PROMETHEUS_CA_FILE="")
    assert default.verify is True
    w = await prometheus.fetch_observations(
        default, "ns1", "llm", time.time(), pods=("llm-5d8f7c-aaaaa",), window_seconds=10, step_seconds=1
    )
    assert _status(w).reason == "PrometheusTLSError"


async def test_real_prometheus_wrong_password_is_unauthorized(secure: tuple[Any, Any], tmp_path: Any) -> None:
    prom, web = secure
    for settings in (
        PrometheusSettings(url=prom.url, ca_file=str(web.ca_file)),  # no credentials
        PrometheusSettings(
            url=prom.url,
            ca_file=str(web.ca_file),
            username=Secret(value=web.username),
            password=Secret(value="not-the-password"),
        ),
    ):
        w = await prometheus.fetch_observations(
            settings,
            "ns1",
            "llm",
            time.time(),
            pods=("llm-5d8f7c-aaaaa",),
            window_seconds=10,
            step_seconds=1,
        )
        status = _status(w)
        assert not status.available and status.reason == "PrometheusUnauthorized", status
