"""Prometheus access settings (kvpilot/operator/clients/prometheus_settings.py): parsed from the operator's
environment at start-up, and used by the closed loop's queries (auth, headers, label names) against the stub
Prometheus; and the aggregated queries: one per metric per tick for every service."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_stub import NOW, PODS, Stub, serve_stub

from kvpilot.operator.clients import prometheus
from kvpilot.operator.clients import prometheus_settings as ps
from kvpilot.tuner.loop import ObservationWindow


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    yield from serve_stub()


def test_defaults_verify_with_the_system_cas_and_send_no_credentials() -> None:
    s = ps.settings_from_env({ps.URL_ENV: "https://prom.monitoring:9090/"})
    assert s.url == "https://prom.monitoring:9090"
    assert s.verify is True and s.build_auth() is None and s.headers == ()
    assert (s.pod_label, s.namespace_label) == ("pod", "namespace")
    assert ps.settings_from_env({}).url == ""


def test_every_setting_is_read(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("pem")
    s = ps.settings_from_env(
        {
            ps.URL_ENV: "https://mimir/prometheus",
            ps.USERNAME_FILE_ENV: str(tmp_path / "u"),
            ps.PASSWORD_ENV: "p",
            ps.CA_FILE_ENV: str(tmp_path / "ca.crt"),
            ps.HEADERS_ENV: '{"X-Scope-OrgID": "team-a", "X-Extra": "1"}',
            ps.POD_LABEL_ENV: "kubernetes_pod_name",
            ps.NAMESPACE_LABEL_ENV: "kubernetes_namespace",
        }
    )
    assert s.username == ps.Secret(file=str(tmp_path / "u")) and s.password == ps.Secret(value="p")
    assert s.verify == str(tmp_path / "ca.crt")
    assert s.headers == (("X-Extra", "1"), ("X-Scope-OrgID", "team-a"))
    assert (s.pod_label, s.namespace_label) == ("kubernetes_pod_name", "kubernetes_namespace")
    assert ps.settings_from_env({ps.INSECURE_ENV: "true"}).verify is False
    assert "p" not in repr(s.password) and "<inline>" in repr(s.password)  # never log a credential


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({ps.URL_ENV: "prometheus:9090"}, "expected http(s)://"),
        ({ps.BEARER_TOKEN_ENV: "t", ps.USERNAME_ENV: "u"}, "not both"),
        ({ps.BEARER_TOKEN_ENV: "t", ps.BEARER_TOKEN_FILE_ENV: "/f"}, "not both"),
        ({ps.PASSWORD_ENV: "p"}, "needs KVPILOT_PROMETHEUS_USERNAME"),
        ({ps.INSECURE_ENV: "yes"}, "expected true or false"),
        ({ps.CA_FILE_ENV: "/ca", ps.INSECURE_ENV: "true"}, "contradict"),
        ({ps.POD_LABEL_ENV: "pod-name"}, "not a Prometheus label name"),
        ({ps.POD_LABEL_ENV: "ns", ps.NAMESPACE_LABEL_ENV: "ns"}, "must differ"),
        ({ps.HEADERS_ENV: "X-Scope-OrgID: a"}, "not JSON"),
        ({ps.HEADERS_ENV: '["a"]'}, "expected a JSON object"),
        ({ps.HEADERS_ENV: '{"Authorization": "Bearer x"}'}, "not in headers"),
        ({ps.HEADERS_ENV: '{"X-A": "a\\r\\nX-B: b"}'}, "invalid header"),
        ({ps.HEADERS_ENV: '{"X A": "a"}'}, "invalid header"),
        ({ps.HEADERS_ENV: '{"X-A": 1}'}, "invalid header"),
    ],
)
def test_invalid_settings_stop_the_operator_at_start_up(env: dict[str, str], complaint: str) -> None:
    with pytest.raises(ps.PrometheusConfigError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        ps.settings_from_env(env)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_basic_auth_from_files_follows_a_rotated_secret(stub: tuple[Stub, str], tmp_path: Path) -> None:
    state, url = stub
    (tmp_path / "username").write_text("kvpilot\n")
    (tmp_path / "password").write_text("one\n")
    s = ps.settings_from_env(
        {
            ps.URL_ENV: url,
            ps.USERNAME_FILE_ENV: str(tmp_path / "username"),
            ps.PASSWORD_FILE_ENV: str(tmp_path / "password"),
            ps.HEADERS_ENV: '{"X-Scope-OrgID": "team-a"}',
        }
    )
    state.require = {"Authorization": _basic("kvpilot", "one"), "X-Scope-OrgID": "team-a"}
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW, pods=PODS)
    assert w.available, w.unavailable_reason
    state.require["Authorization"] = _basic(
        "kvpilot", "two"
    )  # the Secret rotates; the kubelet rewrites the file
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW + 30, pods=PODS)
    assert not w.available and w.unavailable_code == "PrometheusUnauthorized", w.unavailable_reason
    (tmp_path / "password").write_text("two\n")
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW + 60, pods=PODS)
    assert w.available, w.unavailable_reason  # no restart needed
    (tmp_path / "password").unlink()
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW + 90, pods=PODS)
    assert w.unavailable_code == "PrometheusCredentialsUnreadable", w.unavailable_reason


async def test_a_bearer_token_is_sent(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.require = {"Authorization": "Bearer s3cret"}
    s = ps.settings_from_env({ps.URL_ENV: url, ps.BEARER_TOKEN_ENV: "s3cret"})
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW, pods=PODS)
    assert w.available, w.unavailable_reason
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)  # no token: refused
    assert w.unavailable_code == "PrometheusUnauthorized" and url in (w.unavailable_reason or "")


async def test_relabelled_pod_and_namespace_label_names(stub: tuple[Stub, str]) -> None:
    state, url = stub
    state.pod_label, state.namespace_label = "kubernetes_pod_name", "kubernetes_namespace"
    w = await prometheus.fetch_observations(url, "ns1", "llm", NOW, pods=PODS)
    assert not w.available  # the default names find no pod: no series of the service
    s = ps.settings_from_env(
        {
            ps.URL_ENV: url,
            ps.POD_LABEL_ENV: "kubernetes_pod_name",
            ps.NAMESPACE_LABEL_ENV: "kubernetes_namespace",
        }
    )
    w = await prometheus.fetch_observations(s, "ns1", "llm", NOW, pods=PODS)
    assert w.available and w.pods == 2 and w.samples[-1].kv_usage == 0.99, w.unavailable_reason
    last_tick = state.queries[-prometheus.QUERIES_PER_TICK :]
    assert all(
        "by (kubernetes_namespace, kubernetes_pod_name" in q
        or q == 'vllm:cache_config_info{kubernetes_pod_name!=""}'
        for q in last_tick
    ), last_tick


async def test_one_tick_asks_each_metric_once_for_every_service(stub: tuple[Stub, str]) -> None:
    state, url = stub
    services = [(f"svc{i}", (f"svc{i}-5d8f7c-aaaaa", f"svc{i}-5d8f7c-bbbbb")) for i in range(200)]
    services.append(("llm", PODS))

    async def tick(now: float) -> list[ObservationWindow]:
        return list(
            await asyncio.gather(
                *(
                    prometheus.fetch_observations(url, "ns1", name, now, pods=pods, max_age_seconds=30)
                    for name, pods in services
                )
            )
        )

    windows = await tick(NOW)
    assert len(state.queries) == prometheus.QUERIES_PER_TICK  # not 201 x 14
    assert windows[-1].available and windows[-1].pods == 2
    assert not any(w.available for w in windows[:-1])  # the other services have no series: not llm's
    await tick(NOW + 10)  # the same tick interval: the snapshot is shared
    assert len(state.queries) == prometheus.QUERIES_PER_TICK
    await tick(NOW + 30)  # the next tick asks again, once
    assert len(state.queries) == 2 * prometheus.QUERIES_PER_TICK
