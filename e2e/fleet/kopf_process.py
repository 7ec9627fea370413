"""The kvpilot operator as a host process (``kopf run -m kvpilot.operator.main``) for e2e tests and the demo.

Started with the cluster's ``KUBECONFIG``, the Prometheus URL and short closed-loop timings in
its environment; its liveness endpoint (``--liveness``, 127.0.0.1 only) is the readiness wait.
``stop()`` sends SIGTERM, ``kill()`` SIGKILL (the "operator killed mid-rollout" scenario), both
to the recorded PID only. The log (``<dir>/operator-<n>.log``) is kept; one file per start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from e2e.prometheus import free_port


class OperatorError(RuntimeError):
    pass


class OperatorProcess:
    """``python -m kopf run --standalone -m kvpilot.operator.main``.

    :param kubeconfig: the cluster's kubeconfig.
    :param dir: where logs go.
    :param env: extra environment (Prometheus URL, closed-loop timings).
    :param namespaces: watch only these (default ``--all-namespaces``).
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        dir: str | os.PathLike[str],
        *,
        env: dict[str, str] | None = None,
        namespaces: list[str] | None = None,
    ) -> None:
        self.kubeconfig = str(kubeconfig)
        self.dir = Path(dir)
        self.env = dict(env or {})
        self.namespaces = namespaces
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_file: Path | None = None
        self.liveness_port = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> OperatorProcess:
        if self.running():
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.log_file = self.dir / f"operator-{self.starts}.log"
        self.liveness_port = free_port()
        scope = ["--all-namespaces"] if not self.namespaces else [f"--namespace={n}" for n in self.namespaces]
        args = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            *scope,
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            "-m",
            "kvpilot.operator.main",
        ]
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "KVPILOT_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        with open(self.log_file, "ab") as log:
            log.write(f"===== {time.strftime('%F %T')} {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._wait_live(timeout)
        return self

    def _wait_live(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise OperatorError(
                    f"the operator exited with code {self.proc.returncode}; log tail "
                    f"({self.log_file}):\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.3)
        self.kill()
        raise OperatorError(f"the operator was not live after {timeout}s; log tail:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (kopf finishes in-flight handlers), SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: no clean-up, no chance to finish anything (the crash scenario)."""
        self._signal(signal.SIGKILL, 10)

    def _signal(self, sig: int, timeout: float) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def log_tail(self, n: int = 4000) -> str:
        if self.log_file is None:
            return ""
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("operator-*.log")))
