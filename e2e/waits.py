"""The e2e suite's one polling helper (shared by test_operator, test_control_plane and test_chart)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` every 0.5 s until it returns something truthy, and return that.

    An exception from ``cond`` propagates at once; on timeout, an AssertionError names ``what``
    and the last value.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def spawn_host_operator(
    cluster: Any,
    log: Path,
    namespaces: str,
    env: dict[str, str] | None = None,
    mode: tuple[str, ...] = ("--standalone",),
) -> subprocess.Popen[bytes]:
    """``kopf run`` of kvpilot's operator on the host against ``cluster``, watching the ``namespaces`` glob,
    with a Hub that refuses connections (Hub-sourced specs fail the same way with or without network);
    returns the process once it has authenticated. ``mode``: ``--standalone``, or kopf's peering flags
    (``--peering=NAME --priority=N``, e2e/test_ha.py). The caller stops it (:func:`stop_host_operator`)."""
    full = {
        **os.environ,
        **cluster.env(),
        "KVPILOT_METRICS_PORT": "0",
        "PYTHONUNBUFFERED": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HUB_CACHE": str(log.parent / "hf-cache"),
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "kopf",
        "run",
        *mode,
        "-m",
        "kvpilot.operator.main",
        "--namespace",
        namespaces,
        "--verbose",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=_ROOT, env=full, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: proc.poll() is not None or "Initial authentication has finished" in log.read_text(),
            60,
            "the operator to start",
        )
        assert proc.poll() is None, f"the operator exited:\n{log.read_text()[-3000:]}"
    except BaseException:
        stop_host_operator(proc, log)
        raise
    return proc


def stop_host_operator(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"operator log: {log}")


def wait_established(kubectl: Callable[..., Any], crd: str, timeout: float = 120.0) -> None:
    """Wait until ``crd`` (``crd/<name>``) is Established. A CRD just applied has no ``status.conditions``
    yet, and ``kubectl wait`` fails at once on that (``.status.conditions accessor error``) instead of
    waiting, more often the larger the CRD: so poll it."""
    args = ("wait", "--for=condition=Established", crd, "--timeout=10s")
    wait_for(lambda: kubectl(*args, check=False).returncode == 0, timeout, f"{crd} Established")


@contextlib.contextmanager
def host_operator(
    cluster: Any, log: Path, namespaces: str, env: dict[str, str] | None = None
) -> Iterator[Path]:
    """:func:`spawn_host_operator` in ``--standalone`` mode; yields its log file, and stops it afterwards."""
    proc = spawn_host_operator(cluster, log, namespaces, env)
    try:
        yield log
    finally:
        stop_host_operator(proc, log)
