"""Helpers for the Helm chart tests (and e2e/test_chart.py): find helm the way the e2e harness does, render.

helm comes from the e2e tool cache (``make e2e-tools`` builds it with the control plane; ``make test``
runs that first): :func:`e2e.cluster.helm_path`. ``$KVPILOT_HELM`` overrides it with a binary path.
A missing helm FAILS these tests; it never skips them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvpilot"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "kvp"
NAMESPACE = "kvpilot-system"

if str(ROOT) not in sys.path:  # e2e/ is a package at the repository root
    sys.path.insert(0, str(ROOT))

from e2e.cluster import versions  # noqa: E402

# Render and lint for the Kubernetes version the e2e control plane runs (a helm built without its version
# ldflags would otherwise assume v1.20 and refuse the chart's kubeVersion).
KUBE_VERSION = versions()["K8S_VERSION"]


def find_helm() -> Path:
    """The helm binary: ``$KVPILOT_HELM``, else the e2e tool cache. Fails the test when there is none."""
    override = os.environ.get("KVPILOT_HELM")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"$KVPILOT_HELM={override} is not an executable file")
        return path
    from e2e.cluster import ClusterError, helm_path

    try:
        return helm_path()
    except ClusterError as e:
        pytest.fail(f"helm not found: {e} (or point $KVPILOT_HELM at a helm binary)")


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if args and args[0] in ("lint", "template"):
        args = (args[0], "--kube-version", KUBE_VERSION, *args[1:])
    proc = subprocess.run(
        [str(helm), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "HELM_CACHE_HOME": "/tmp/kvpilot-helm/cache",
            "HELM_CONFIG_HOME": "/tmp/kvpilot-helm/config",
            "HELM_DATA_HOME": "/tmp/kvpilot-helm/data",
        },
    )
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def values_args(values_file: Path | None = None, sets: Sequence[str] = ()) -> list[str]:
    args = ["--values", str(values_file)] if values_file else []
    for s in sets:
        args += ["--set", s]
    return args


def render(helm: Path, values_file: Path | None = None, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``helm template`` the chart (templates and crds/) and return its objects."""
    out = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--include-crds",
        *values_args(values_file, sets),
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]
