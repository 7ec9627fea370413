"""Credentials and upstream text never reach tenant-visible status: each Prometheus failure is a class with a
fixed text and the HTTP status; the operator's log alone keeps the upstream body, redacted and truncated."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from closed_loop_fakes import LoopHarness
from operator_fakes import Harness, condition, isvc
from prometheus_stub import NOW, PODS, Stub, serve_stub

from kvpilot.operator.clients import prometheus, prometheus_errors
from kvpilot.operator.clients.prometheus_settings import (
    PrometheusConfigError,
    PrometheusSettings,
    Secret,
    settings_from_env,
)
from kvpilot.tuner.loop import ObservationWindow

TOKEN = "s3cr3t-t0ken-7f9a"
PASSWORD = "hunter2-pa55"


class EchoingGateway(Stub):
    """An auth gateway that quotes the request's Authorization header in its error body."""

    def __init__(self, status: int, body: Any = None) -> None:
        super().__init__()
        self.status, self.body = status, body

    def answer(self, path: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, Any]:
        self.queries.append(params.get("query", ""))
        if self.body is not None:
            return self.status, self.body
        auth = headers.get("Authorization", "")
        return self.status, {"status": "error", "error": f"denied: Authorization: {auth} token={TOKEN}"}


def _serve(state: Stub) -> Iterator[tuple[Stub, str]]:
    yield from serve_stub(state)


async def _window(state: Stub) -> tuple[str, str]:
    gen = _serve(state)
    _, url = next(gen)
    try:
        settings = PrometheusSettings(url=url, bearer_token=Secret(value=TOKEN))
        w = await prometheus.fetch_observations(settings, "ns1", "llm", NOW, pods=PODS, max_age_seconds=0)
    finally:
        gen.close()
    return w.unavailable_code or "", w.unavailable_reason or ""


def test_credentials_in_the_url_are_refused_at_start_up_without_echoing_them() -> None:
    with pytest.raises(PrometheusConfigError) as err:
        settings_from_env({"KVPILOT_PROMETHEUS_URL": f"https://user:{PASSWORD}@prom:9090/"})
    assert PASSWORD not in str(err.value)
    assert "KVPILOT_PROMETHEUS_PASSWORD_FILE" in str(err.value) and "prometheus.auth.basic" in str(err.value)
    assert settings_from_env({"KVPILOT_PROMETHEUS_URL": "https://prom:9090/p"}).url == "https://prom:9090/p"


@pytest.mark.parametrize(
    ("status", "body", "reason", "text"),
    [
        (401, None, "PrometheusUnauthorized", "(HTTP 401)"),
        (403, None, "PrometheusForbidden", "(HTTP 403)"),
        (404, None, "PrometheusNotFound", "(HTTP 404)"),
        (500, None, "PrometheusUnavailable", "(HTTP 500)"),
        (503, None, "PrometheusUnavailable", "(HTTP 503)"),  # after urllib3's one retry
        (400, None, "PrometheusQueryFailed", "(HTTP 400)"),
        (200, f"<html>login as {TOKEN}</html>", "PrometheusBadResponse", "not Prometheus' JSON"),
    ],
)
async def test_each_failure_has_its_class_and_no_upstream_text(
    status: int, body: Any, reason: str, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    code, message = await _window(EchoingGateway(status, body))
    assert code == reason and text in message, (code, message)
    assert TOKEN not in message and "denied" not in message and "login" not in message
    assert TOKEN not in caplog.text
    assert reason in caplog.text  # the operator's owner still learns what happened


async def test_an_unreachable_prometheus_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    settings = PrometheusSettings(url="http://127.0.0.1:9")
    w = await prometheus.fetch_observations(settings, "ns1", "llm", NOW, pods=PODS, max_age_seconds=0)
    assert w.unavailable_code == "PrometheusUnreachable"


def test_an_unreadable_credentials_file_is_its_own_class() -> None:
    assert prometheus_errors.compute_error_class(FileNotFoundError(2, "no such file"))[0] == (
        "PrometheusCredentialsUnreadable"
    )


def test_the_log_text_is_redacted_and_truncated() -> None:
    raw = (
        f'Authorization: Bearer {TOKEN} "token": "{TOKEN}" https://u:{PASSWORD}@prom/x api_key={TOKEN}&a=1 '
        + "x" * 2000
    )
    out = prometheus_errors.redact_text(raw)
    assert TOKEN not in out and PASSWORD not in out and len(out) <= prometheus_errors.LOG_BODY_CHARS
    assert out.startswith("Authorization: Bearer ***")
    assert prometheus_errors.redact_url(f"https://u:{PASSWORD}@prom:9090/p?x=1") == "https://***@prom:9090/p"


async def test_status_and_events_of_a_tenant_never_carry_the_secret(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = isvc(gpu={"count": 1, "product": "H100-SXM"})
    await harness.run(body)
    loop = LoopHarness(harness)
    loop.healthy_pods()
    code, message = await _window(EchoingGateway(401))
    loop.window = ObservationWindow.unavailable(message, loop.now, code)
    sent: list[Any] = []
    take = harness.kube.take_status_patches

    def recording(namespace: str, name: str) -> list[dict[str, Any]]:
        patches = take(namespace, name)
        sent.extend(patches)
        return patches

    harness.kube.take_status_patches = recording  # type: ignore[method-assign]
    await loop.tick(body)
    cond = condition(body, "MetricsAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "PrometheusUnauthorized")
    patches = json.dumps(sent)
    assert "PrometheusUnauthorized" in patches
    assert TOKEN not in patches and TOKEN not in json.dumps(body["status"])
    assert "PrometheusUnauthorized" in harness.emitter.reasons
    assert TOKEN not in json.dumps(harness.emitter.events)
    assert TOKEN not in caplog.text
