"""The closed loop against Prometheus as teams run it: behind TLS and basic auth (``--web.config.file``).

The real Prometheus serves its API over HTTPS with a certificate from a private CA and asks for basic
auth; the operator (on the host, as in the other closed-loop tests) gets the CA bundle and the
credentials as files, as the chart mounts them (``prometheus.tls.ca``, ``prometheus.auth.basic``). It reads
the fleet's vLLM metrics (``MetricsAvailable=True``). Restarted with a CA that did not sign the server's
certificate, it says so (``MetricsAvailable=False``, reason ``PrometheusTLSError``, a Warning event of that
reason), holds, and keeps reconciling: the operator stays up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.stack import Stack, condition, isvc_events
from e2e.fleet.testing import catalogue_isvc
from e2e.prometheus import make_ca, make_web_security

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TRUTH = GroundTruth(
    gpu_memory_gib=79.11, non_kv_gib=20.0, kv_bytes_per_token=131072, startup_s=1.0, backoff_s=2.0
)
LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)


def _isvc(name: str, ns: str) -> dict[str, Any]:
    serving = {"maxContextLength": 8192, "concurrency": 16}
    return catalogue_isvc(name, ns, MODEL, H100, serving, {"mode": "Auto"})


@pytest.fixture(scope="module")
def secure_stack(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str]]:
    ns = f"e2e-promauth-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    run_dir = Path(tmp_path_factory.mktemp("promauth"))
    stack = Stack(
        cluster,
        run_dir,
        namespaces=[ns],
        operator_namespaces=[ns],
        scenarios={
            (ns, n): Scenario(name=n, truth=TRUTH, workload=LIGHT, seed=i)
            for i, n in enumerate(("secure", "later"))
        },
        prometheus_web=make_web_security(run_dir / "prometheus-web"),
    )
    stack.start()
    try:
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        yield stack, ns
        assert stack.fleet is not None and not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([ns])
        print(f"promauth run directory (operator and Prometheus logs): {run_dir}")


def _events(stack: Stack, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in isvc_events(stack.kubectl, ns, name) if e.get("reason") == reason]


def _metrics(o: dict[str, Any]) -> dict[str, Any]:
    return condition(o, "MetricsAvailable")


def test_the_closed_loop_reads_a_tls_and_basic_auth_prometheus(secure_stack: tuple[Stack, str]) -> None:
    stack, ns = secure_stack
    assert stack.prom.url.startswith("https://") and stack.prom.web is not None
    assert stack.operator is not None and "KVPILOT_PROMETHEUS_CA_FILE" in stack.operator.env
    # the server really asks for credentials: the unauthenticated API answers 401
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(stack.prom.web.ca_file))
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{stack.prom.url}/api/v1/query?query=up", timeout=10, context=ctx)
    assert denied.value.code == 401
    stack.cluster.apply([_isvc("secure", ns)])
    obj = stack.wait_isvc(
        ns,
        "secure",
        lambda o: _metrics(o).get("status") == "True",
        timeout=240,
        what="MetricsAvailable=True through TLS and basic auth",
    )
    assert _metrics(obj)["reason"] != "PrometheusTLSError"


def test_a_wrong_ca_is_a_condition_and_an_event_and_the_operator_stays_up(
    secure_stack: tuple[Stack, str], tmp_path: Path
) -> None:
    stack, ns = secure_stack
    op = stack.operator
    assert op is not None
    stack.wait_isvc(ns, "secure", lambda o: _metrics(o).get("status") == "True", timeout=240, what="metrics")
    op.stop()
    op.env["KVPILOT_PROMETHEUS_CA_FILE"] = str(make_ca(tmp_path / "wrong", "not-the-prometheus-ca"))
    op.start()
    obj = stack.wait_isvc(
        ns,
        "secure",
        lambda o: _metrics(o).get("reason") == "PrometheusTLSError",
        timeout=120,
        what="MetricsAvailable=False, PrometheusTLSError",
    )
    cond = _metrics(obj)
    assert cond["status"] == "False"
    assert stack.prom.url in cond["message"] and "certificate verify failed" in cond["message"], cond
    deadline = time.monotonic() + 60
    while not (tls := _events(stack, ns, "secure", "PrometheusTLSError")):
        assert time.monotonic() < deadline, "no PrometheusTLSError event"
        time.sleep(2)
    event = tls[0]
    assert event["type"] == "Warning" and "certificate" in event["message"]
    # the operator stays up: it keeps reconciling (a new service is planned) and its loop holds
    stack.cluster.apply([_isvc("later", ns)])
    later = stack.wait_isvc(
        ns, "later", lambda o: (o.get("status") or {}).get("applied"), timeout=120, what="planned and applied"
    )
    assert later["status"]["applied"]["maxNumSeqs"] >= 1
    time.sleep(6)  # a few 2 s ticks against the wrong CA
    assert op.running() and op.starts == 2, op.log_tail()
    still = stack.isvc(ns, "secure")
    assert _metrics(still).get("reason") == "PrometheusTLSError"
    assert not [h for h in still["status"].get("history") or () if h.get("action") == "Retuned"]
