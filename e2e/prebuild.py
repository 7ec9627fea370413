"""Start the cold builds only some e2e modules need while the suite runs, not before it.

KEDA (``e2e/build-keda.sh``, about 8 minutes cold on 2 cores) and the LeaderWorkerSet controller
(``e2e/build-lws.sh``, about 2) serve one module each. ``make test`` does not build them up front: once the
session knows which tests it runs, :func:`start_for` starts the build of each one a selected module needs,
in the background and at a lower CPU priority (``nice``), so it takes the cores while the cluster tests
wait on the API server. The module's own fixture (:class:`e2e.keda_local.KedaServer`,
:class:`e2e.lws_local.LwsController`) runs the same script: the script's lock makes it wait for the
background build, and a build that failed fails there, loudly, with its output; when the cache already
holds the build, the scripts return at once.

The conftest calls :func:`start_for` from the xdist controller (or the one process without xdist) and
:func:`wait_all` at the end of the session, so no build outlives pytest.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from e2e.cluster import cache_root
from e2e.keda_local import BUILD_SH as KEDA_BUILD_SH
from e2e.lws_local import BUILD_SH as LWS_BUILD_SH

BUILDS: dict[str, Path] = {
    "e2e/test_keda.py": KEDA_BUILD_SH,
    "e2e/test_leader_worker_set.py": LWS_BUILD_SH,
}
"""The module that needs a build, and the script that makes it."""
NICENESS = 10
"""Below the tests and the cluster they drive: the build fills the cores they leave idle."""

_started: dict[Path, subprocess.Popen[bytes]] = {}


def compute_builds(node_ids: Iterable[str]) -> list[Path]:
    """The build scripts the selected tests (pytest node ids, relative to the repository) need."""
    modules = {node_id.split("::", 1)[0] for node_id in node_ids}
    return [script for module, script in BUILDS.items() if module in modules]


def start_for(node_ids: Iterable[str]) -> list[Path]:
    """Start, once per session, each build the selected tests need; returns the scripts started."""
    started = []
    for script in compute_builds(node_ids):
        if script in _started:
            continue
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"prebuild-{script.stem}-{os.getpid()}.log", "wb") as log:
            _started[script] = subprocess.Popen(
                ["nice", "-n", str(NICENESS), "bash", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        started.append(script)
    return started


def wait_all() -> None:
    """Wait for the background builds (their tests have waited on them already, or were not reached)."""
    while _started:
        _, proc = _started.popitem()
        proc.wait()
