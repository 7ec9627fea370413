"""The whole closed-loop stack for e2e tests and the demo: cluster, CRD, Prometheus, fleet, operator.

:class:`Stack` owns what it starts and stops it in reverse order (each by PID). Helpers read
InferenceServices, their Deployments and events through ``kubectl`` (the real API server).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from e2e.fleet.fleet import Fleet
from e2e.fleet.kopf_process import OperatorProcess
from e2e.fleet.testing import wait_until
from e2e.fleet.truth import EngineArgs, GroundTruth, Scenario, Workload
from e2e.prometheus import PrometheusServer, WebSecurity
from e2e.waits import wait_established

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "inferenceservices.kvpilot.io.yaml"
ISVC = "inferenceservices.kvpilot.io"

#: Environment the operator reads for the closed loop (see docs/closed-loop.md): the Prometheus URL and
#: timings short enough for an e2e run. Unknown names are ignored by the operator.
PROMETHEUS_URL_ENV = "KVPILOT_PROMETHEUS_URL"


PROBATION_S = 20.0
"""Probation of Ready settings in e2e runs: longer than the fleet's ``oom_after_s`` plus a few ticks, so
a run-time OOM of new settings is caught on probation (and rolled back)."""


STEP_S = 10.0
"""Metrics step in e2e runs (Prometheus scrapes every second): 5 samples since a change = 50 s, not 150 s,
and still longer than a rollout plus its probation, so a scenario's next change never races its checks."""
MIN_CHANGE_INTERVAL_S = 10.0
"""Minimum between two changes in e2e runs: a crash remedy acts seconds after the plan, not a minute."""


def closed_loop_env(
    prometheus_url: str,
    *,
    interval_s: float = 2.0,
    probation_s: float = PROBATION_S,
    step_s: float = STEP_S,
    min_change_interval_s: float = MIN_CHANGE_INTERVAL_S,
) -> dict[str, str]:
    """The operator's environment for a fast closed loop against ``prometheus_url`` (docs/closed-loop.md)."""
    return {
        PROMETHEUS_URL_ENV: prometheus_url,
        "KVPILOT_CLOSED_LOOP_INTERVAL": f"{interval_s:g}",
        "KVPILOT_PROBATION_SECONDS": f"{probation_s:g}",
        "KVPILOT_METRICS_STEP_SECONDS": f"{step_s:g}",
        "KVPILOT_MIN_CHANGE_INTERVAL": f"{min_change_interval_s:g}",
    }


def prometheus_auth_env(web: WebSecurity, secrets_dir: Path) -> dict[str, str]:
    """The operator's environment for a Prometheus behind TLS and basic auth: the credentials as files (as
    the chart mounts the basic-auth Secret) and the CA bundle (docs/closed-loop.md, "Prometheus access")."""
    secrets_dir.mkdir(parents=True, exist_ok=True)
    (secrets_dir / "username").write_text(web.username)
    (secrets_dir / "password").write_text(web.password)
    (secrets_dir / "password").chmod(0o600)
    return {
        "KVPILOT_PROMETHEUS_USERNAME_FILE": str(secrets_dir / "username"),
        "KVPILOT_PROMETHEUS_PASSWORD_FILE": str(secrets_dir / "password"),
        "KVPILOT_PROMETHEUS_CA_FILE": str(web.ca_file),
    }


def install_crd(kubectl: Callable[..., Any]) -> None:
    if not CRD.exists():
        raise FileNotFoundError(f"{CRD} is missing: the operator's CRD has not landed")
    kubectl("apply", "--server-side", "--field-manager=kvpilot-e2e", "--force-conflicts", "-f", str(CRD))
    wait_established(kubectl, f"crd/{ISVC}")


def get_isvc(kubectl: Callable[..., Any], ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl("get", ISVC, name, "-n", ns, "-o", "json").stdout))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status", {}).get("conditions") or []) if c.get("type") == type_), {})


def deployment_args(kubectl: Callable[..., Any], ns: str, name: str) -> EngineArgs:
    d = json.loads(kubectl("get", "deployment", name, "-n", ns, "-o", "json").stdout)
    c = d["spec"]["template"]["spec"]["containers"][0]
    return EngineArgs.parse([*(c.get("command") or []), *(c.get("args") or [])])


def isvc_events(kubectl: Callable[..., Any], ns: str, name: str | None = None) -> list[dict[str, Any]]:
    sel = "involvedObject.kind=InferenceService" + (f",involvedObject.name={name}" if name else "")
    items = json.loads(kubectl("get", "events", "-n", ns, "--field-selector", sel, "-o", "json").stdout)[
        "items"
    ]
    return sorted(
        items, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "", e["metadata"]["name"])
    )


def settings_of(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    short = {
        "maxModelLen": "len",
        "maxNumSeqs": "seqs",
        "gpuMemoryUtilization": "gmu",
        "kvCacheDtype": "kv",
        "tensorParallelSize": "tp",
        "maxNumBatchedTokens": "batched",
    }
    return " ".join(f"{short.get(k, k)}={v}" for k, v in d.items() if k in short)


class EventTail:
    """Follows the InferenceService events of some namespaces and calls ``sink`` once per new event."""

    def __init__(
        self,
        kubectl: Callable[..., Any],
        namespaces: list[str],
        sink: Callable[[dict[str, Any]], None],
        interval: float = 1.0,
    ) -> None:
        self.kubectl, self.namespaces, self.sink, self.interval = kubectl, namespaces, sink, interval
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="event-tail", daemon=True)

    def start(self) -> EventTail:
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        with contextlib.suppress(Exception):
            self.poll()

    def poll(self) -> None:
        for ns in list(self.namespaces):
            for ev in isvc_events(self.kubectl, ns):
                key, count = ev["metadata"]["uid"], int(ev.get("count") or 1)
                if self._seen.get(key, 0) < count:
                    self._seen[key] = count
                    self.sink(ev)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.poll()


class Stack:
    """Prometheus + fleet + operator on a running cluster (``LocalCluster``), started and stopped together."""

    def __init__(
        self,
        cluster: Any,
        dir: str | os.PathLike[str],
        *,
        namespaces: list[str] | None = None,
        default_scenario: Scenario | None = None,
        scenarios: dict[tuple[str, str], Scenario] | None = None,
        operator_env: dict[str, str] | None = None,
        operator_namespaces: list[str] | None = None,
        scrape_interval: str = "1s",
        prometheus_web: WebSecurity | None = None,
        operator_metrics_port: int | None = None,
        operator_extra_env: dict[str, str] | None = None,
    ) -> None:
        """``operator_extra_env``: set on top of the operator's environment (default or ``operator_env``).
        ``prometheus_web``: serve Prometheus behind TLS and basic auth, and give the operator the CA
        bundle and the credentials (:func:`prometheus_auth_env`) on top of the default environment.
        ``operator_metrics_port``: the operator serves its own metrics there and Prometheus scrapes them
        (job ``kvpilot``); without it the operator serves none."""
        self.cluster = cluster
        self.dir = Path(dir)
        self.operator_metrics_port = operator_metrics_port
        operator_job = {"kvpilot": [f"127.0.0.1:{operator_metrics_port}"]} if operator_metrics_port else None
        self.prom = PrometheusServer(
            self.dir / "prometheus",
            scrape_interval=scrape_interval,
            web=prometheus_web,
            scrape_targets=operator_job,
        )
        self._namespaces = namespaces
        self._default_scenario = default_scenario
        self._scenarios = dict(scenarios or {})
        self._operator_env = operator_env
        self._operator_extra_env = dict(operator_extra_env or {})
        self._operator_namespaces = operator_namespaces if operator_namespaces is not None else namespaces
        self.fleet: Fleet | None = None
        self.operator: OperatorProcess | None = None

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def start(self, *, operator: bool = True) -> Stack:
        t0 = time.monotonic()
        try:
            install_crd(self.kubectl)
            self.prom.start()
            self.fleet = Fleet(
                self.cluster.kubeconfig,
                self.prom.targets_file,
                namespaces=self._namespaces,
                default_scenario=self._default_scenario,
                kubectl=self.cluster.kubectl_bin,
                log_root=self.dir / "pod-logs",
            )
            for (ns, inst), sc in self._scenarios.items():
                self.fleet.set_scenario(ns, inst, sc)
            self.fleet.start()
            env = self._operator_env if self._operator_env is not None else closed_loop_env(self.prom.url)
            if self.prom.web is not None and self._operator_env is None:
                env |= prometheus_auth_env(self.prom.web, self.dir / "prometheus-credentials")
            if self.operator_metrics_port:
                env = {**env, "KVPILOT_METRICS_PORT": str(self.operator_metrics_port)}
            env = {**env, **self._operator_extra_env}
            self.operator = OperatorProcess(
                self.cluster.kubeconfig, self.dir / "operator", env=env, namespaces=self._operator_namespaces
            )
            if operator:
                self.operator.start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.fleet is not None:
            self.fleet.stop()
        self.prom.stop()

    def stop_and_clean(self, namespaces: list[str]) -> None:
        """Delete the InferenceServices while the operator still runs (it removes its finalizers), stop
        everything, then delete the namespaces (without waiting)."""
        for ns in namespaces:
            self.kubectl("delete", ISVC, "--all", "-n", ns, "--wait=false", check=False)
        for ns in namespaces:
            self.kubectl("wait", "--for=delete", ISVC, "--all", "-n", ns, "--timeout=30s", check=False)
        self.stop()
        for ns in namespaces:
            self.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ InferenceServices
    def isvc(self, ns: str, name: str) -> dict[str, Any]:
        return get_isvc(self.kubectl, ns, name)

    def wait_isvc(
        self, ns: str, name: str, cond: Callable[[dict[str, Any]], Any], *, timeout: float, what: str
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> Any:
            nonlocal last
            last = self.isvc(ns, name)
            return cond(last)

        try:
            wait_until(check, timeout=timeout, what=what)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\nstatus: {json.dumps(last.get('status'), indent=1)[:4000]}\n"
                f"operator log tail:\n{self.operator.log_tail() if self.operator else ''}"
            ) from None
        return last


class EngineCase(Protocol):
    """One InferenceService of a loop module's scenarios: its namespace (set here), truth and load."""

    ns: str
    truth: GroundTruth
    workload: Workload


@contextlib.contextmanager
def run_engine_cases(
    cluster: Any,
    run_dir: Path,
    prefix: str,
    cases: Mapping[str, EngineCase],
    manifest: Callable[[str, str, Any], dict[str, Any]],
    *,
    probation_s: float | None,
    what: str,
) -> Iterator[Stack]:
    """A loop module's cases, each an InferenceService named after its key in a namespace of its own
    (``{prefix}-{name}-…``, set on the case), on one :class:`Stack` whose fleet plays each case's truth and
    load and whose operator runs with a ``probation_s`` probation (``None``: the operator's own); the fleet
    must have met no error by the end, and the namespaces are cleaned up whatever happens. ``what`` names
    the run directory's print."""
    for name, case in cases.items():
        case.ns = f"{prefix}-{name}-{uuid.uuid4().hex[:5]}"
        cluster.kubectl("create", "namespace", case.ns)
    probation_env = {} if probation_s is None else {"KVPILOT_PROBATION_SECONDS": f"{probation_s:g}"}
    stack = Stack(
        cluster,
        run_dir,
        namespaces=[c.ns for c in cases.values()],
        operator_namespaces=[f"{prefix}-*"],
        operator_extra_env=probation_env,
        scenarios={
            (c.ns, name): Scenario(name=name, truth=c.truth, workload=c.workload, seed=i)
            for i, (name, c) in enumerate(cases.items())
        },
    )
    stack.start()
    try:
        for c in cases.values():
            cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", c.ns, "--timeout=60s")
        cluster.apply([manifest(name, c.ns, c) for name, c in cases.items()])
        yield stack
        assert stack.fleet is not None
        assert not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([c.ns for c in cases.values()])
        print(f"{what} run directory (operator and Prometheus logs): {run_dir}")
