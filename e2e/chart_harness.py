"""The chart on a module's own control plane: the one harness of the chart-install e2e modules.

``test_chart.py``, ``test_admission.py``, ``test_tenants.py`` and ``test_operator_enforcement.py`` each start
their own cluster (Helm must own the CRD from the first install, and each installs the chart differently), and
each needs the same things around it: Helm with private homes, kubectl as the admin or as a user, an
InferenceService created as a user, the chart's ServiceAccount as a kubeconfig and ``kubectl auth can-i``.
:func:`module_cluster` starts and stops the cluster; :class:`ChartHarness` is the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
NS = "kvpilot-system"
"""The namespace the modules install the chart in."""
SA = "kvpilot"
"""The chart's ServiceAccount (release ``kvpilot``)."""
SA_USER = f"system:serviceaccount:{NS}:{SA}"


@contextmanager
def module_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[tuple[LocalCluster, Path]]:
    """A started cluster under a fresh ``name`` directory, and that directory; stopped on exit."""
    home = tmp_path_factory.mktemp(name)
    cluster = LocalCluster(home / "cluster", build=True)
    cluster.start()
    try:
        yield cluster, home
    finally:
        cluster.stop()


class ChartHarness:
    """kubectl, Helm and identities on one cluster; ``namespace`` is where :meth:`create_as` creates."""

    def __init__(self, cluster: LocalCluster, home: Path, namespace: str = "default") -> None:
        self.cluster = cluster
        self.home = home
        self.namespace = namespace
        self.env = {
            **os.environ,
            **cluster.env(),
            "HELM_CACHE_HOME": str(home / "helm-cache"),
            "HELM_CONFIG_HOME": str(home / "helm-config"),
            "HELM_DATA_HOME": str(home / "helm-data"),
        }

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, input=input, check=check)

    def helm(self, *args: str) -> str:
        """``helm ARGS`` from the repository root; its stdout (``install`` prints the NOTES)."""
        return subprocess.run(
            [str(self.cluster.helm_bin), *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json`` as the admin; None when it fails (not found)."""
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def create_as(
        self,
        user: str,
        spec: dict[str, Any],
        name: str = "isvc",
        kind: str = "InferenceService",
        ns: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl create`` of a kvpilot object as ``user`` (impersonated); the result, refused or not."""
        manifest = {
            "apiVersion": "kvpilot.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        return self.kubectl(
            f"--as={user}",
            "-n",
            ns or self.namespace,
            "create",
            "-f",
            "-",
            input=json.dumps(manifest),
            check=False,
        )

    def can_i_as(self, user: str, *args: str) -> bool:
        """``kubectl auth can-i ARGS`` for an impersonated ``user``."""
        out = self.kubectl("auth", "can-i", f"--as={user}", *args, check=False).stdout.strip()
        assert out in ("yes", "no"), out
        return out == "yes"

    def sa_kubeconfig(self) -> Path:
        """A kubeconfig holding nothing but a fresh TokenRequest token of the chart's ServiceAccount."""
        token = self.kubectl("--namespace", NS, "create", "token", SA, "--duration=1h").stdout.strip()
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": SA, "user": {"token": token}}],
            "contexts": [{"name": SA, "context": {"cluster": admin["clusters"][0]["name"], "user": SA}}],
            "current-context": SA,
        }
        path = self.home / "sa-kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def can_i(self, kubeconfig: Path, *args: str) -> bool:
        """``kubectl auth can-i ARGS`` with ``kubeconfig``'s credentials (the ServiceAccount's token)."""
        proc = subprocess.run(
            [str(self.cluster.kubectl_bin), f"--kubeconfig={kubeconfig}", "auth", "can-i", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
        return proc.stdout.strip() == "yes"
