"""The real LeaderWorkerSet controller (``sigs.k8s.io/lws``, ``cmd/main.go``) as a host process on the e2e
control plane, for e2e/test_leader_worker_set.py.

Built by ``e2e/build-lws.sh`` (the version and commit in ``e2e/lws/versions.env``) into
``$KVPILOT_CACHE/bin/lws-<key>/``: ``lws-manager``, ``crds/`` (the module's config/crd/bases) and
``webhooks.yaml`` (its config/webhook/manifests.yaml). A missing build raises :class:`LwsError`: never a skip.

How it is wired, as LWS's own kustomize manifests do in a cluster but on 127.0.0.1:

* the CRDs (LeaderWorkerSet, and DisaggregatedSet's two, which the same manager watches) are applied;
* the manager runs from a ``Configuration`` file with its internal cert rotation off, leader election off
  and its webhook server on a free port with a certificate for IP 127.0.0.1
  (:func:`e2e.targets.make_webhook_pki`);
* its webhooks are registered by URL with that CA. They are not optional: the pod webhook is what gives a
  group's pods their ``worker-index`` / ``group-index`` labels and the ``LWS_LEADER_ADDRESS`` /
  ``LWS_WORKER_INDEX`` variables, and the LWS webhook sets the defaults. As in config/webhook's patches, the
  pod webhooks only see pods labelled ``leaderworkerset.sigs.k8s.io/name``, so the suite's other pods never
  call them.

``stop()`` deletes the webhook configurations first (the group's pods could not be created or deleted through
a webhook that is gone), then stops the process by PID; ``uninstall()`` removes the CRDs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import (
    LocalCluster,
    _die_with_parent,
    cache_root,
    compute_build_key,
    free_port,
    locate_binaries,
)
from e2e.targets import make_webhook_pki
from e2e.waits import wait_established

E2E_DIR = Path(__file__).resolve().parent
VERSIONS_ENV = E2E_DIR / "lws" / "versions.env"
BUILD_SH = E2E_DIR / "build-lws.sh"
BINARY = "lws-manager"
CRDS = (
    "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
    "disaggregatedset.x-k8s.io_disaggregatedsetrolescalers.yaml",
)
WEBHOOKS = "webhooks.yaml"
GROUP_LABEL = "leaderworkerset.sigs.k8s.io/name"
PREFIX = "kvpilot-e2e-lws-"


class LwsError(RuntimeError):
    pass


def cache_key() -> str:
    """Same key as e2e/build-lws.sh: sha256(e2e/lws/versions.env, go version)."""
    return compute_build_key([VERSIONS_ENV], "LWS", LwsError)


def bin_dir(build: bool = False) -> Path:
    """Directory holding ``lws-manager``, ``crds/`` and ``webhooks.yaml``. ``KVPILOT_LWS_BIN_DIR`` overrides;
    ``build=True`` runs e2e/build-lws.sh (instant when cached). Raises LwsError when missing."""
    names = (BINARY, WEBHOOKS, *(f"crds/{c}" for c in CRDS))
    cached = lambda: cache_root() / "bin" / f"lws-{cache_key()}"  # noqa: E731
    return locate_binaries("KVPILOT_LWS_BIN_DIR", BUILD_SH, cached, names, build=build, error=LwsError)


def crd_name(file: str) -> str:
    group, plural = file.removesuffix(".yaml").split("_", 1)
    return f"{plural}.{group}"


def manager_configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """LWS's ``Configuration`` (api/config/v1alpha1) for a host process: no cert rotation (the certificate is
    ours), no leader election (one replica), no metrics server, the webhook server on 127.0.0.1."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


def webhook_configurations(manifests: str, port: int, ca: bytes) -> list[dict[str, Any]]:
    """LWS's own webhook configurations, each webhook pointed at ``https://127.0.0.1:port`` by URL instead
    of its Service, and the pod webhooks limited to a group's pods as config/webhook/*-patch.yaml do."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc["metadata"] = {"name": PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            if any("pods" in r["resources"] for r in hook["rules"]):
                hook["objectSelector"] = {"matchExpressions": [{"key": GROUP_LABEL, "operator": "Exists"}]}
        out.append(doc)
    return out


class LwsController:
    """LWS's controller manager on ``cluster``; its log in ``dir``."""

    def __init__(self, cluster: LocalCluster, dir: str | os.PathLike[str], *, build: bool = True) -> None:
        self.cluster = cluster
        self.dir = Path(dir)
        self.bin = bin_dir(build=build)  # fail before anything starts
        self.certs = self.dir / "certs"
        self.proc: subprocess.Popen[bytes] | None = None
        self.hooks: list[dict[str, Any]] = []

    def __enter__(self) -> LwsController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def install_crds(self) -> None:
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--field-manager=kvpilot-e2e",
            "--force-conflicts",
            *(a for c in CRDS for a in ("-f", str(self.bin / "crds" / c))),
        )
        for c in CRDS:  # kubectl wait fails at once on a CRD this new: poll
            wait_established(self.cluster.kubectl, f"crd/{crd_name(c)}")

    def uninstall(self) -> None:
        self.cluster.kubectl("delete", "crd", *(crd_name(c) for c in CRDS), "--ignore-not-found", check=False)

    def start(self, timeout: float = 120.0) -> LwsController:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca = make_webhook_pki(self.certs)
        self.install_crds()
        webhook_port, health_port = free_port(), free_port()
        config = self.dir / "lws-config.yaml"
        config.write_text(json.dumps(manager_configuration(webhook_port, health_port, self.certs)))
        try:
            self._spawn(["--config", str(config), "--zap-log-level=info"])
            self._wait(lambda: _http_ok(f"http://127.0.0.1:{health_port}/readyz"), timeout, "LWS /readyz")
            self.hooks = webhook_configurations((self.bin / WEBHOOKS).read_text(), webhook_port, ca)
            self.cluster.apply(self.hooks)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, args: list[str]) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig), "ENABLE_WEBHOOKS": "true"}
        with open(self.dir / "lws.log", "ab") as log:
            log.write(f"\n===== {time.strftime('%F %T')} {BINARY} {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(self.bin / BINARY), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, n: int = 3000) -> str:
        f = self.dir / "lws.log"
        return f.read_text(errors="replace")[-n:] if f.exists() else ""

    def _wait(self, cond: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise LwsError(f"{BINARY} exited with code {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                if cond():
                    return
            if time.monotonic() > deadline:
                raise LwsError(f"timed out waiting for {what}; log in {self.dir}\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        for hook in self.hooks:
            kind = hook["kind"].lower()
            self.cluster.kubectl("delete", kind, hook["metadata"]["name"], "--ignore-not-found", check=False)
        self.hooks = []
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bool(r.status == 200)
