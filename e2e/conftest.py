"""pytest fixtures for the e2e suite (a real local control plane, see e2e/cluster.py).

* ``cluster`` (session): a started :class:`e2e.cluster.LocalCluster`; ``KUBECONFIG``
  and ``PATH`` (kubectl, helm first) are set in ``os.environ`` for the session.
  With ``KVPILOT_E2E_KUBECONFIG`` set, an already running cluster is reused
  instead (started with ``python -m e2e.cluster up``; its directory is the
  kubeconfig's parent).
* ``namespace`` (function): a fresh namespace, deleted after the test.
* ``kubectl`` / ``helm`` (session): paths of the binaries.

The builds only one module needs (KEDA, the LeaderWorkerSet controller) start in the background once the
session knows its tests (:mod:`e2e.prebuild`); that module's fixture waits for its build.

A missing binary, a failed build or a cluster that does not come up is an
ERROR, never a skip. Every test under e2e/ is marked ``e2e``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import prebuild
from e2e.cluster import LocalCluster

E2E_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs the real local control plane built under e2e/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def _is_xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """Under xdist (the controller): start the builds the collected tests need (:mod:`e2e.prebuild`)."""
    prebuild.start_for(ids)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist: start the builds the selected tests need (:mod:`e2e.prebuild`)."""
    if not _is_xdist_worker():
        prebuild.start_for(item.nodeid for item in session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    prebuild.wait_all()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    reuse = os.environ.get("KVPILOT_E2E_KUBECONFIG")
    saved = {k: os.environ.get(k) for k in ("KUBECONFIG", "PATH", "KVPILOT_BIN_DIR")}
    if reuse:
        c = LocalCluster.attach(Path(reuse).resolve().parent)
        own = False
    else:
        keep = os.environ.get("KVPILOT_E2E_DIR")  # keep logs somewhere known (CI post-mortems)
        c = LocalCluster(keep or tmp_path_factory.mktemp("cluster"), build=True, die_with_parent=True)
        c.start()
        own = True
    os.environ.update(c.env())
    try:
        yield c
    finally:
        if own:
            c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def kubectl(cluster: LocalCluster) -> Path:
    return cluster.kubectl_bin


@pytest.fixture(scope="session")
def helm(cluster: LocalCluster) -> Path:
    return cluster.helm_bin


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.lower().replace("_", "-")
    slug = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    with cluster.temporary_namespace(name):
        yield name
