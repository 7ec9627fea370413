"""KEDA (operator and metrics adapter) as host processes on the e2e control plane, for e2e/test_keda.py.

Built from the Go module proxy by ``e2e/build-keda.sh`` (``github.com/kedacore/keda/v2``, the version
in ``e2e/keda/versions.env``) into ``$KVPILOT_CACHE/bin/keda-<key>/``: ``keda`` (cmd/operator),
``keda-adapter`` (cmd/adapter) and ``crds/`` (the module's config/crd/bases). A missing build raises
:class:`KedaError`: never a skip.

How it is wired, as KEDA's own manifests do in a cluster but with everything on 127.0.0.1:

* the CRDs (ScaledObject, TriggerAuthentication, ...) and the ``keda`` namespace are applied;
* one certificate, signed by the cluster's CA, for the operator's gRPC metrics service and the
  adapter (mutual TLS between the two, as KEDA's cert rotation would make, which is off here) and for
  the adapter's serving endpoint (``keda-metrics-apiserver.keda.svc``);
* the adapter is an aggregated API server: the APIService ``v1beta1.external.metrics.k8s.io`` names
  the Service ``keda/keda-metrics-apiserver``, of type ExternalName ``127.0.0.1`` (the aggregator
  dials an ExternalName service's name at the APIService's port; Endpoints may not hold a loopback
  address). The kube-apiserver authenticates with its front-proxy client certificate
  (``e2e.cluster.make_pki``) and the adapter checks it against ``extension-apiserver-authentication``;
* the operator and adapter use the admin kubeconfig (KEDA's least-privilege RBAC is its chart's).

``stop()`` deletes the APIService first (an unavailable aggregated API breaks discovery, and with
it namespace deletion, for the rest of the session), then stops both processes by PID.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from e2e.cluster import (
    ClusterError,
    LocalCluster,
    _die_with_parent,
    cache_root,
    compute_build_key,
    free_port,
    locate_binaries,
)
from e2e.waits import wait_established

E2E_DIR = Path(__file__).resolve().parent
VERSIONS_ENV = E2E_DIR / "keda" / "versions.env"
BUILD_SH = E2E_DIR / "build-keda.sh"
NAMESPACE = "keda"
SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
BINARIES = ("keda", "keda-adapter")
CRDS = (
    "keda.sh_scaledobjects.yaml",
    "keda.sh_scaledjobs.yaml",
    "keda.sh_triggerauthentications.yaml",
    "keda.sh_clustertriggerauthentications.yaml",
    # KEDA's operator watches CloudEventSources too: without these it exits when its caches do not sync
    "eventing.keda.sh_cloudeventsources.yaml",
    "eventing.keda.sh_clustercloudeventsources.yaml",
)


class KedaError(RuntimeError):
    pass


def cache_key() -> str:
    """Same key as e2e/build-keda.sh: sha256(e2e/keda/versions.env, go version)."""
    return compute_build_key([VERSIONS_ENV], "KEDA", KedaError)


def bin_dir(build: bool = False) -> Path:
    """Directory holding ``keda``, ``keda-adapter`` and ``crds/``. ``KVPILOT_KEDA_BIN_DIR`` overrides;
    ``build=True`` runs e2e/build-keda.sh (instant when cached). Raises KedaError when missing."""
    names = (*BINARIES, *(f"crds/{c}" for c in CRDS))
    cached = lambda: cache_root() / "bin" / f"keda-{cache_key()}"  # noqa: E731
    return locate_binaries("KVPILOT_KEDA_BIN_DIR", BUILD_SH, cached, names, build=build, error=KedaError)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KedaError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def make_certs(certs: Path, pki: Path) -> None:
    """``ca.crt``, ``tls.crt``, ``tls.key`` in KEDA's cert-dir layout, signed by the cluster CA in ``pki``."""
    certs.mkdir(parents=True, exist_ok=True)
    (certs / "ext.cnf").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{SERVICE}.{NAMESPACE}.svc,DNS:keda-operator.{NAMESPACE}.svc\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=keda",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        cwd=certs,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-CAserial",
        "ca.srl",
        "-days",
        "365",
        "-extfile",
        "ext.cnf",
        "-out",
        "tls.crt",
        cwd=certs,
    )
    (certs / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (certs / "tls.key").chmod(0o600)


class KedaServer:
    """KEDA's operator and metrics adapter on ``cluster``; logs in ``dir``."""

    def __init__(self, cluster: LocalCluster, dir: str | os.PathLike[str], *, build: bool = True) -> None:
        self.cluster = cluster
        self.dir = Path(dir)
        self.bin = bin_dir(build=build)  # fail before anything starts
        self.certs = self.dir / "certs"
        self.ports: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def __enter__(self) -> KedaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> KedaServer:
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        make_certs(self.certs, self.cluster.pki)
        self.kubectl(
            "apply",
            "--server-side",
            "--field-manager=kvpilot-e2e",
            "--force-conflicts",
            *(a for c in CRDS for a in ("-f", str(self.bin / "crds" / c))),
        )
        for c in CRDS:  # kubectl wait fails at once on a CRD this new: poll
            name = f"{c.removesuffix('.yaml').split('_', 1)[1]}.{c.split('_')[0]}"
            wait_established(self.kubectl, f"crd/{name}")
        self.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for k in ("grpc", "op_metrics", "op_health", "adapter", "adapter_metrics"):
            self.ports[k] = free_port()
        try:
            self._start(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        p, kc, certs = self.ports, str(self.cluster.kubeconfig), self.certs
        env = {
            **os.environ,
            "KUBECONFIG": kc,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "POD_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": "",
        }
        self._spawn(
            "keda",
            [
                "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{p['op_metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{p['op_health']}",
                f"--metrics-service-bind-address=127.0.0.1:{p['grpc']}",
                f"--cert-dir={certs}",
                "--enable-cert-rotation=false",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                f"--ca-dir={certs}",
                "--zap-log-level=info",
            ],
            env,
        )
        self._wait(
            lambda: _http_ok(f"http://127.0.0.1:{p['op_health']}/readyz"), deadline, "KEDA operator /readyz"
        )
        self._spawn(
            "keda-adapter",
            [
                "--bind-address=127.0.0.1",
                f"--secure-port={p['adapter']}",
                f"--cert-dir={certs}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--lister-kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--metrics-service-address=127.0.0.1:{p['grpc']}",
                f"--port={p['adapter_metrics']}",
                "--zap-log-level=info",
            ],
            env,
        )
        ca = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ca.load_cert_chain(str(self.cluster.pki / "admin.crt"), str(self.cluster.pki / "admin.key"))
        self._wait(
            lambda: _http_ok(f"https://127.0.0.1:{p['adapter']}/readyz", ca), deadline, "KEDA adapter /readyz"
        )
        self.cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                    "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
                },
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": APISERVICE},
                    "spec": {
                        "group": "external.metrics.k8s.io",
                        "version": "v1beta1",
                        "groupPriorityMinimum": 100,
                        "versionPriority": 100,
                        "service": {"name": SERVICE, "namespace": NAMESPACE, "port": p["adapter"]},
                        "caBundle": base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
                    },
                },
            ]
        )
        self._wait(self._apiservice_available, deadline, f"APIService {APISERVICE} Available")

    def _apiservice_available(self) -> bool:
        out = self.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout).get("status", {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        with open(self.dir / f"{name}.log", "ab") as log:
            log.write(f"\n===== {time.strftime('%F %T')} {name} {' '.join(args)}\n".encode())
            log.flush()
            self.procs[name] = subprocess.Popen(
                [str(self.bin / name), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, name: str, n: int = 3000) -> str:
        f = self.dir / f"{name}.log"
        return f.read_text(errors="replace")[-n:] if f.exists() else ""

    def _wait(self, cond: Any, deadline: float, what: str) -> None:
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise KedaError(f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}")
            with contextlib.suppress(Exception):
                if cond():
                    return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.procs)
                raise KedaError(f"timed out waiting for {what}; logs in {self.dir}\n{tails}")
            time.sleep(0.5)

    def stop(self) -> None:
        with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
            self.kubectl(
                "delete", "apiservice", APISERVICE, "--ignore-not-found", "--wait=false", check=False
            )
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
        return bool(r.status == 200)
