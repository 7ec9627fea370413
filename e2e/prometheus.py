"""A throw-away Prometheus server (Debian's ``prometheus`` package) for e2e tests and the demo.

    from e2e.prometheus import PrometheusServer
    with PrometheusServer(workdir, scrape_targets={"vllm": ["127.0.0.1:8000"]}) as prom:
        prom.url                    # http://127.0.0.1:<port>
        prom.query("up")            # instant query -> result list

Started by PID, stopped by PID; logs in ``<workdir>/prometheus.log``.
``make e2e-tools`` installs the package (apt).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import ClusterError, free_port


class PrometheusServer:
    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        scrape_targets: dict[str, list[str]] | None = None,
        scrape_interval: str = "1s",
        config: dict[str, Any] | None = None,
        binary: str | None = None,
    ) -> None:
        self.dir = Path(workdir)
        self.port = 0
        self.binary = binary or shutil.which("prometheus") or "/usr/bin/prometheus"
        self.config = config or {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in (scrape_targets or {}).items()
            ],
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30) -> PrometheusServer:
        if not Path(self.binary).exists():
            raise ClusterError(f"prometheus not found at {self.binary}; run `make e2e-tools`")
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.port = free_port()
        with open(self.dir / "prometheus.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={self.dir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=1d",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                start_new_session=True,
            )
        (self.dir / "prometheus.pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.dir / "prometheus.log").read_text(errors="replace")[-2000:]
                raise ClusterError(f"prometheus exited with {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return self
            time.sleep(0.3)
        self.stop()
        raise ClusterError(f"prometheus not ready after {timeout}s (log: {self.dir / 'prometheus.log'})")

    def reload(self, config: dict[str, Any]) -> None:
        self.config = config
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise ClusterError(f"prometheus query {promql!r} failed: {body}")
        return body["data"]["result"]

    def stop(self, timeout: float = 10) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None
