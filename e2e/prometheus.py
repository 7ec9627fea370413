"""The real Prometheus server (Debian's ``prometheus`` package) for the e2e suite and the demo.

Owned by the closed-loop e2e harness (with ``e2e/fleet/``). Not the Debian
service: our own process, on a free 127.0.0.1 port, with its own TSDB in a
temporary directory, ``--web.enable-lifecycle``, a short scrape interval, and
one ``file_sd_configs`` job (``vllm``) whose targets file the vLLM fleet
simulator (``e2e.fleet``) writes. The fleet writes the Kubernetes service
discovery meta labels (``__meta_kubernetes_namespace``,
``__meta_kubernetes_pod_name``, ...) into that file; the relabelling below turns
them into ``namespace`` and ``pod`` target labels as a kube-prometheus
PodMonitor does, so the operator's queries, aggregated ``by (namespace, pod)``, find
each pod's series (docs/closed-loop.md).

Python API::

    from e2e.prometheus import PrometheusServer
    with PrometheusServer() as prom:          # or PrometheusServer(workdir); start() ... stop()
        prom.url                              # http://127.0.0.1:<port>
        prom.targets_file                     # the fleet writes this file_sd JSON
        prom.query("vllm:num_requests_running")

Extra static jobs: ``PrometheusServer(workdir, scrape_targets={"job": ["127.0.0.1:8000"]})``.

Prometheus as teams run it, behind TLS and basic auth (its ``--web.config.file``)::

    web = make_web_security(workdir / "web")  # a CA, a serving cert for 127.0.0.1, a basic-auth user
    with PrometheusServer(workdir, web=web) as prom:
        prom.url                              # https://127.0.0.1:<port>; prom.query() authenticates

``stop()`` sends SIGTERM to the recorded PID only (SIGKILL after a grace
period); the log (``<dir>/prometheus.log``) and TSDB are kept, and ``start()``
after ``stop()`` restarts on the same port with the same TSDB (the
"Prometheus down" scenario). A missing binary raises :class:`PrometheusError`:
never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from kvpilot.observability import series

DEFAULT_BIN = "/usr/bin/prometheus"
JOB = "vllm"

#: kube-prometheus style relabelling from the Kubernetes SD meta labels the fleet writes.
RELABEL_CONFIGS: list[dict[str, Any]] = [
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "target_label": "service"},
    # the chart's PodMonitor's: each series names its InferenceService
    {"source_labels": series.RELABELING["sourceLabels"], "target_label": series.RELABELING["targetLabel"]},
    {
        "source_labels": ["__meta_kubernetes_namespace", "__meta_kubernetes_pod_name"],
        "separator": "/",
        "target_label": "instance",
    },
]


class PrometheusError(RuntimeError):
    pass


BASIC_AUTH_USER = "kvpilot"
BASIC_AUTH_PASSWORD = "kvpilot-e2e-secret"
BASIC_AUTH_BCRYPT = "$2b$04$qTF5Ob9TbtmNQYVi6HwQ6OYa7HNbhcd7QxU.QGEMaJEUr8l/WK2Ly"
"""bcrypt (cost 4) of :data:`BASIC_AUTH_PASSWORD`, as ``web.config.file``'s ``basic_auth_users`` wants it.
Made once with Python 3.11's ``crypt`` (libxcrypt): ``crypt.crypt(password, crypt.mksalt(
crypt.METHOD_BLOWFISH, rounds=16))``; no bcrypt tool or module is installed here, and ``crypt`` leaves
Python in 3.13, so the hash is kept rather than made per run."""


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PrometheusError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA (EC P-256, openssl) as ``<name>.crt`` / ``<name>.key`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "30",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=directory,
    )
    return directory / f"{name}.crt"


@dataclass(frozen=True, slots=True)
class WebSecurity:
    """TLS and basic auth of Prometheus' own HTTP API (``--web.config.file``)."""

    ca_file: Path
    """The CA that signed the serving certificate (what a client must trust)."""
    cert_file: Path
    key_file: Path
    username: str = BASIC_AUTH_USER
    password: str = BASIC_AUTH_PASSWORD
    password_bcrypt: str = BASIC_AUTH_BCRYPT

    def web_config(self) -> dict[str, Any]:
        return {
            "tls_server_config": {"cert_file": str(self.cert_file), "key_file": str(self.key_file)},
            "basic_auth_users": {self.username: self.password_bcrypt},
        }

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def authorization(self) -> str:
        import base64

        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def make_web_security(directory: Path) -> WebSecurity:
    """A CA and a serving certificate it signed for 127.0.0.1 and localhost, plus the basic-auth user."""
    ca = make_ca(directory, "prometheus-ca")
    (directory / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=prometheus",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        ca.name,
        "-CAkey",
        "prometheus-ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
        cwd=directory,
    )
    (directory / "server.key").chmod(0o600)
    return WebSecurity(ca_file=ca, cert_file=directory / "server.crt", key_file=directory / "server.key")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary(binary: str | os.PathLike[str] | None = None) -> Path:
    """Debian's binary (``KVPILOT_PROMETHEUS_BIN`` overrides); raises, never skips, when missing."""
    exe = Path(binary or os.environ.get("KVPILOT_PROMETHEUS_BIN") or DEFAULT_BIN)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise PrometheusError(
            f"{exe} not found: install Debian's prometheus package "
            "(`apt-get install -y prometheus`; `make e2e-tools` does it) or set KVPILOT_PROMETHEUS_BIN"
        )
    return exe


def build_config(
    targets_file: Path, *, scrape_interval: str = "1s", scrape_targets: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """The config: one file_sd job for the fleet (relabelled to namespace/pod) plus optional static jobs."""
    jobs: list[dict[str, Any]] = [
        {
            "job_name": JOB,
            "metrics_path": "/metrics",
            "scheme": "http",
            "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            "relabel_configs": RELABEL_CONFIGS,
        }
    ]
    jobs += [
        {"job_name": job, "static_configs": [{"targets": t}]} for job, t in (scrape_targets or {}).items()
    ]
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "scrape_configs": jobs,
    }


def write_targets_file(path: Path, groups: list[dict[str, Any]]) -> None:
    """Atomically replace a file_sd targets file (Prometheus watches it with inotify)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups, indent=1, sort_keys=True))
    os.replace(tmp, path)


class PrometheusServer:
    """One Prometheus process on 127.0.0.1.

    :param workdir: working directory (config, targets file, TSDB, log). Default: a fresh temp dir.
    :param scrape_interval: global scrape (and evaluation) interval, e.g. ``"1s"``.
    :param scrape_targets: extra static jobs, ``{job: ["127.0.0.1:port", ...]}``.
    :param config: a complete config instead of the generated one.
    :param port: listen port on 127.0.0.1 (default: a free one, kept across restarts).
    :param lookback_delta: ``--query.lookback-delta`` (instant queries see samples this old at most).
    :param web: serve over TLS with basic auth (``--web.config.file``); :meth:`api` and the readiness
        checks then verify against ``web.ca_file`` and authenticate.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        scrape_interval: str = "1s",
        scrape_targets: dict[str, list[str]] | None = None,
        config: dict[str, Any] | None = None,
        binary: str | os.PathLike[str] | None = None,
        port: int | None = None,
        lookback_delta: str = "1m",
        web: WebSecurity | None = None,
    ) -> None:
        self.dir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kvpilot-prom-"))
        self.binary = binary
        self.scrape_interval = scrape_interval
        self.lookback_delta = lookback_delta
        self.port = port or free_port()
        self.config_file = self.dir / "prometheus.yml"
        self.targets_file = self.dir / "targets.json"
        self.tsdb = self.dir / "tsdb"
        self.log_file = self.dir / "prometheus.log"
        self.config = config or build_config(
            self.targets_file, scrape_interval=scrape_interval, scrape_targets=scrape_targets
        )
        self.web = web
        self.web_config_file = self.dir / "web.yml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"{'https' if self.web else 'http'}://127.0.0.1:{self.port}"

    def _open(self, req: str | urllib.request.Request, timeout: float) -> Any:
        """``urlopen`` with the server's CA and basic auth when it has them."""
        if self.web is None:
            return urllib.request.urlopen(req, timeout=timeout)
        r = req if isinstance(req, urllib.request.Request) else urllib.request.Request(req)
        r.add_header("Authorization", self.web.authorization())
        return urllib.request.urlopen(r, timeout=timeout, context=self.web.ssl_context())

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        if self.running():
            return self
        exe = prometheus_binary(self.binary)
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tsdb.mkdir(exist_ok=True)
        if not self.targets_file.exists():
            write_targets_file(self.targets_file, [])
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        args = [
            str(exe),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.tsdb}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            f"--query.lookback-delta={self.lookback_delta}",
        ]
        if self.web is not None:
            self.web_config_file.write_text(yaml.safe_dump(self.web.web_config(), sort_keys=False))
            args.append(f"--web.config.file={self.web_config_file}")
        with open(self.log_file, "ab") as log:
            log.write(f"\n===== {time.strftime('%F %T')} {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                start_new_session=True,
            )
        (self.dir / "prometheus.pid").write_text(str(self.proc.pid))
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with code {self.proc.returncode}; "
                    f"log tail ({self.log_file}):\n{self.log_tail()}"
                )
            try:
                with self._open(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError as e:  # URLError is an OSError
                last = e
            time.sleep(0.2)
        raise PrometheusError(
            f"prometheus not ready at {self.url} after {timeout}s ({last}); log tail:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the recorded PID (SIGKILL after ``timeout``); the log and TSDB are kept."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "prometheus.pid").unlink()

    def cleanup(self) -> None:
        """Remove the TSDB (the log and config stay)."""
        shutil.rmtree(self.tsdb, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ configuration
    def write_targets(self, groups: list[dict[str, Any]]) -> None:
        write_targets_file(self.targets_file, groups)

    def reload(self, config: dict[str, Any] | None = None) -> None:
        """Rewrite the config (when given) and POST /-/reload."""
        if config is not None:
            self.config = config
            self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        with self._open(req, timeout=10) as r:
            if r.status != 200:
                raise PrometheusError(f"reload failed: HTTP {r.status}")

    # ------------------------------------------------------------------ HTTP API
    def api(self, path: str, **params: Any) -> Any:
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}/api/v1/{path}" + (f"?{q}" if q else "")
        try:
            with self._open(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"GET {url}: HTTP {e.code}: {e.read()[:500]!r}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body}")
        return body["data"]

    def query(self, promql: str, time: float | None = None) -> list[dict[str, Any]]:
        """Instant query: ``[{"metric": {...}, "value": [t, "v"]}, ...]`` (a scalar becomes one row)."""
        data = self.api("query", query=promql, time=time)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_value(self, promql: str) -> float | None:
        """The single value of an instant query; None when empty, an error when several series match."""
        res = self.query(promql)
        if not res:
            return None
        if len(res) > 1:
            raise PrometheusError(f"{promql!r} returned {len(res)} series: {[r['metric'] for r in res]}")
        return float(res[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool],
        *,
        timeout: float = 30.0,
        interval: float = 0.5,
        what: str | None = None,
    ) -> list[dict[str, Any]]:
        """Poll an instant query until ``predicate(result)``; raise with the last result otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            res = self.query(promql)
            if predicate(res):
                return res
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"timed out after {timeout}s waiting for {what or promql!r}; last: {res}"
                )
            time.sleep(interval)


def main() -> int:  # manual use: python -m e2e.prometheus
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m e2e.prometheus", description="run a local Prometheus until Ctrl-C"
    )
    ap.add_argument("--dir")
    ap.add_argument("--scrape-interval", default="1s")
    a = ap.parse_args()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    with PrometheusServer(a.dir, scrape_interval=a.scrape_interval) as p:
        print(
            f"prometheus {p.url} (pid {p.pid}); targets file {p.targets_file}; log {p.log_file}", flush=True
        )
        with contextlib.suppress(KeyboardInterrupt):
            while p.running():
                time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def serve_exposition(render: Callable[[], bytes]) -> ThreadingHTTPServer:
    """A scrape target on ``127.0.0.1`` (a free port) answering every GET with ``render()`` in the text
    exposition format; ``shutdown()`` it when done."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
