"""A real, local Kubernetes control plane for kvpilot's e2e tests and demo.

Components (built from upstream Kubernetes Go modules by ``e2e/build.sh``):
embedded etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and
KWOK, which plays kubelet for simulated GPU nodes (``e2e/nodes.py``). Every
component is a separate process on 127.0.0.1 with free ports; PIDs are
recorded in ``<dir>/pids.json`` and stopped by PID only.

Python API::

    from e2e.cluster import LocalCluster
    with LocalCluster() as c:            # or c = LocalCluster(dir); c.start(); ...; c.stop()
        c.kubectl("get", "nodes")
        os.environ.update(c.env())       # KUBECONFIG, PATH with kubectl/helm

CLI::

    python -m e2e.cluster up   [--dir DIR]   # starts, prints `export ...` lines, leaves it running
    python -m e2e.cluster env  [--dir DIR]   # prints `export KUBECONFIG=...` for a running cluster
    python -m e2e.cluster down [--dir DIR]   # stops by recorded PIDs (logs are kept)
    python -m e2e.cluster build              # builds/restores binaries, prints their directory

Only the standard library, PyYAML and subprocess are used.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e import kwok_stages as _kwok_stages
from e2e import nodes as _nodes

E2E_DIR = Path(__file__).resolve().parent
K8SBIN_DIR = E2E_DIR / "k8sbin"
BUILD_SH = E2E_DIR / "build.sh"
DEFAULT_DIR = Path(os.environ.get("KVPILOT_CLUSTER_DIR", "/tmp/kvpilot-e2e-cluster"))
KWOK_LOGS_CRD = Path(__file__).resolve().parent / "testdata" / "kwok-logs-crd.yaml"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
FRONT_PROXY_CLIENT = "front-proxy-client"
"""CN of the API server's client certificate to aggregated API servers (``--requestheader-allowed-names``)."""
HPA_SYNC_PERIOD = "5s"
"""The controller manager's HPA resync (default 15 s); only HorizontalPodAutoscalers see it (test_keda)."""
POD_CIDR = "10.244.0.0/16"


class ClusterError(RuntimeError):
    pass


# --------------------------------------------------------------------------- binaries


def cache_root() -> Path:
    return Path(os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot")


def versions() -> dict[str, str]:
    out = {}
    for line in (K8SBIN_DIR / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def compute_build_key(sources: Sequence[Path], what: str, error: type[Exception]) -> str:
    """The cache key the build scripts compute: sha256 of ``sources``' bytes, then ``go version``'s, cut to
    16 hex digits. Raises ``error`` when Go cannot be asked (``what``: whose key, for the message)."""
    try:
        gover = subprocess.run(
            ["go", "env", "GOVERSION"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise error(f"cannot run `go env GOVERSION` to compute the {what} cache key: {e}") from e
    h = hashlib.sha256()
    for source in sources:
        h.update(source.read_bytes())
    h.update((gover + "\n").encode())
    return h.hexdigest()[:16]


def cache_key() -> str:
    """Same key as build.sh: sha256(go.mod, go.sum, main.go, versions.env, go version)."""
    sources = [K8SBIN_DIR / name for name in ("go.mod", "go.sum", "main.go", "versions.env")]
    return compute_build_key(sources, "binary", ClusterError)


def bin_dir(build: bool = False) -> Path:
    """Directory holding k8s (multicall), its component symlinks, kwok, helm.

    ``KVPILOT_BIN_DIR`` overrides. With ``build=True`` runs ``e2e/build.sh``
    (instant when cached; a cold build takes tens of minutes). Raises
    ClusterError when the binaries are missing: never skip silently.
    """
    names = ("k8s", *COMPONENTS, "kubectl", "helm", "kwok-default-stages.yaml")
    return locate_binaries(
        "KVPILOT_BIN_DIR",
        BUILD_SH,
        lambda: cache_root() / "bin" / cache_key(),
        names,
        build=build,
        error=ClusterError,
    )


def locate_binaries(
    env_var: str,
    build_sh: Path,
    cached: Callable[[], Path],
    names: Sequence[str],
    *,
    build: bool,
    error: type[Exception],
) -> Path:
    """The directory of a cached build: ``$env_var`` if set, else what ``build_sh`` prints last when
    ``build`` (it is instant when cached), else ``cached()``. Raises ``error`` naming what is missing in it:
    never skip silently."""
    env_dir = os.environ.get(env_var)
    if env_dir:
        d = Path(env_dir)
    elif build:
        proc = subprocess.run(["bash", str(build_sh)], stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise error(f"e2e/{build_sh.name} failed with exit code {proc.returncode} (see its stderr above)")
        d = Path(proc.stdout.strip().splitlines()[-1])
    else:
        d = cached()
    missing = [n for n in names if not (d / n).exists()]
    if missing:
        raise error(
            f"binaries missing in {d}: {', '.join(missing)}. Run `make e2e-tools` (or `e2e/{build_sh.name}`)."
        )
    return d


def kubectl_path() -> Path:
    return bin_dir() / "kubectl"


def helm_path() -> Path:
    return bin_dir() / "helm"


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists"; treat it as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def make_pki(pki: Path) -> None:
    """CA, apiserver serving cert (SAN 127.0.0.1, localhost, kubernetes.default...), admin client
    cert (O=system:masters) and the service-account signing key pair, all with openssl."""
    pki.mkdir(parents=True, exist_ok=True)
    days = "3650"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        days,
        "-subj",
        "/CN=kvpilot-e2e-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=pki,
    )
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
    )
    (pki / "client.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    )
    for name, subj, ext in (
        ("apiserver", "/CN=kube-apiserver", "apiserver.ext"),
        ("admin", "/O=system:masters/CN=kubernetes-admin", "client.ext"),
    ):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            subj,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=pki,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            days,
            "-extfile",
            ext,
            "-out",
            f"{name}.crt",
            cwd=pki,
        )
    # API aggregation (an aggregated API server such as KEDA's metrics adapter, e2e/keda_local.py): the
    # API server authenticates to it with this client certificate, signed by its own front-proxy CA.
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        days,
        "-subj",
        "/CN=kvpilot-e2e-front-proxy-ca",
        "-keyout",
        "front-proxy-ca.key",
        "-out",
        "front-proxy-ca.crt",
        cwd=pki,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={FRONT_PROXY_CLIENT}",
        "-keyout",
        "front-proxy-client.key",
        "-out",
        "front-proxy-client.csr",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "front-proxy-client.csr",
        "-CA",
        "front-proxy-ca.crt",
        "-CAkey",
        "front-proxy-ca.key",
        "-CAcreateserial",
        "-days",
        days,
        "-extfile",
        "client.ext",
        "-out",
        "front-proxy-client.crt",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.iterdir():
        if p.suffix == ".key":
            p.chmod(0o600)


def write_kubeconfig(path: Path, server: str, pki: Path, name: str = "kvpilot-e2e") -> None:
    b64 = lambda p: base64.b64encode((pki / p).read_bytes()).decode()  # noqa: E731
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin", "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)


# --------------------------------------------------------------------------- cluster


class LocalCluster:
    """A local control plane with KWOK GPU nodes.

    :param dir: working directory (PKI, kubeconfig, etcd data, logs/, pids.json).
        Defaults to a fresh temp dir. Logs are kept after stop() for post-mortems.
    :param pools: GPU node pools (``e2e.nodes.DEFAULT_POOLS``).
    :param build: run ``e2e/build.sh`` first (instant when cached).
    :param bin: binary directory (default: ``bin_dir()``).
    :param die_with_parent: components get SIGTERM when this Python process dies, even by SIGKILL
        (Linux PR_SET_PDEATHSIG). The pytest fixture uses it; the ``up`` CLI does not.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        pools: Iterable[_nodes.NodePool] = _nodes.DEFAULT_POOLS,
        build: bool = False,
        bin: str | os.PathLike[str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="kvpilot-e2e-"))
        self.die_with_parent = die_with_parent
        self.pools = tuple(pools)
        self._build = build
        self._bin = Path(bin) if bin else None
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.kubeconfig = self.dir / "kubeconfig"
        self.pids_file = self.dir / "pids.json"
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started_in: float | None = None

    # -- paths
    @property
    def bin(self) -> Path:
        if self._bin is None:
            self._bin = bin_dir(build=self._build)
        return self._bin

    @property
    def kubectl_bin(self) -> Path:
        return self.bin / "kubectl"

    @property
    def helm_bin(self) -> Path:
        return self.bin / "helm"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def env(self) -> dict[str, str]:
        """Environment for child processes: KUBECONFIG and PATH with kubectl/helm first."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "KVPILOT_BIN_DIR": str(self.bin),
        }

    # -- lifecycle
    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> LocalCluster:
        t0 = time.monotonic()
        if self.pids_file.exists() and any(_pid_alive(p) for p in self._read_pids().values()):
            raise ClusterError(
                f"a cluster seems to be running in {self.dir}; stop it first (`down --dir {self.dir}`)"
            )
        _ = self.bin  # fail early when binaries are missing
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        if not all((self.pki / f).exists() for f in ("admin.crt", "front-proxy-client.crt")):
            make_pki(self.pki)
        for attempt in (1, 2):
            # free ports are picked, then bound by the components: another process may grab one
            # in between. That shows as "address already in use"; retry once with new ports.
            for k in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok"):
                self.ports[k] = free_port()
            write_kubeconfig(self.kubeconfig, self.server, self.pki)
            try:
                self._start_all(timeout - (time.monotonic() - t0))
                self.started_in = time.monotonic() - t0
                break
            except ClusterError as e:
                self.stop()
                if attempt == 2 or "address already in use" not in str(e):
                    raise
                shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        (self.dir / "cluster.json").write_text(
            json.dumps(
                {
                    "kubeconfig": str(self.kubeconfig),
                    "server": self.server,
                    "bin": str(self.bin),
                    "ports": self.ports,
                    "pids": self.pids,
                    "started_in_s": round(self.started_in, 1),
                },
                indent=2,
            )
        )
        return self

    def _start_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        p, pki, kc = self.ports, self.pki, str(self.kubeconfig)
        self._spawn(
            "etcd",
            [
                "--data-dir",
                str(self.dir / "etcd"),
                "--client-url",
                f"http://127.0.0.1:{p['etcd']}",
                "--peer-url",
                f"http://127.0.0.1:{p['etcd_peer']}",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['apiserver']}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--storage-media-type=application/vnd.kubernetes.protobuf",
                "--watch-cache=true",
                # API aggregation (external.metrics.k8s.io from KEDA's adapter, e2e/keda_local.py); costs
                # nothing while no APIService names a service
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # pods/log goes to the node's InternalIP:kubeletEndpoint, which is KWOK's server (below)
                "--kubelet-preferred-address-types=InternalIP",
                "--v=1",
            ],
        )
        self._wait_http("kube-apiserver", f"{self.server}/readyz", deadline)
        self.kubectl("apply", "-f", str(KWOK_LOGS_CRD))
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kcm']}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--controllers=*",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['scheduler']}",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={kc}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={_nodes.KWOK_ANNOTATION}={_nodes.KWOK_ANNOTATION_VALUE}",
                f"--cidr={POD_CIDR}",
                # nodes at 127.0.0.1 with KWOK's server as their kubelet endpoint: the API server's pods/log
                # (kubectl logs --previous, the operator's previous-log read) reaches KWOK, which serves the
                # files a Logs object names (e2e/pods.py serve_previous_log)
                "--node-ip=127.0.0.1",
                f"--node-port={p['kwok']}",
                "--enable-crds=Logs",
                "--node-lease-duration-seconds=40",
                f"--config={self._kwok_stages()}",
                f"--server-address=127.0.0.1:{p['kwok']}",
            ],
        )
        self._wait_http("kube-controller-manager", f"https://127.0.0.1:{p['kcm']}/healthz", deadline)
        self._wait_http("kube-scheduler", f"https://127.0.0.1:{p['scheduler']}/healthz", deadline)
        self.add_nodes(_nodes.node_manifests(self.pools))
        self._wait(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
            ),
            deadline,
            "serviceaccount default/default (serviceaccount controller)",
        )

    def _kwok_stages(self) -> Path:
        """KWOK's default stages with pods labelled ``e2e.kvpilot.io/kubelet: probes`` started not Ready
        (:mod:`e2e.kwok_stages`), written into the run directory."""
        path = self.dir / "kwok-stages.yaml"
        path.write_text(_kwok_stages.build_stages((self.bin / "kwok-default-stages.yaml").read_text()))
        return path

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        exe = self.bin / name
        with open(self.logs / f"{name}.log", "ab") as log:
            log.write(f"\n===== {time.strftime('%F %T')} {exe} {' '.join(args)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [str(exe), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self._procs[name] = proc
        self.pids[name] = proc.pid
        self.pids_file.write_text(json.dumps(self.pids, indent=2))

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            rc = proc.poll()
            if rc is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ClusterError(
                    f"{name} exited with code {rc}; log tail ({self.logs / (name + '.log')}):\n{tail}"
                )

    def _wait(self, cond: Any, deadline: float, what: str) -> None:
        last_exc: Exception | None = None
        while True:
            self._check_alive()
            try:
                if cond():
                    return
            except Exception as e:  # retried until the deadline
                last_exc = e
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out waiting for {what} (logs in {self.logs}); last error: {last_exc}"
                )
            time.sleep(0.5)

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait_http(self, what: str, url: str, deadline: float) -> None:
        ctx = self._ssl_context()
        if "127.0.0.1:" + str(self.ports["apiserver"]) not in url:
            ctx.check_hostname = False  # kcm/scheduler serve self-signed certs
            ctx.verify_mode = ssl.CERT_NONE

        def ok() -> bool:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
                return r.status == 200

        self._wait(ok, deadline, f"{what} {url}")

    def get_json(self, path: str) -> Any:
        """GET a raw API path (e.g. ``/version``) as the admin user."""
        with urllib.request.urlopen(self.server + path, context=self._ssl_context(), timeout=10) as r:
            return json.load(r)

    def _nodes_ready(self, names: list[str]) -> bool:
        items = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        ready = {
            n["metadata"]["name"]
            for n in items
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        }
        return set(names) <= ready

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every recorded component by PID (SIGTERM, then SIGKILL). Logs are kept."""
        pids = dict(self._read_pids())
        pids.update(self.pids)
        order = ["kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        for name in sorted(pids, key=lambda n: order.index(n) if n in order else -1):
            pid = pids[name]
            proc = self._procs.get(name)
            if proc is None and not _looks_like_ours(pid, name):
                continue
            _terminate(pid, proc, timeout)
        self._procs.clear()
        self.pids.clear()
        with contextlib.suppress(FileNotFoundError):
            self.pids_file.unlink()

    def _read_pids(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.pids_file.read_text()).items()}
        except (FileNotFoundError, ValueError):
            return {}

    @classmethod
    def attach(cls, dir: str | os.PathLike[str]) -> LocalCluster:
        """A handle on a cluster started earlier (e.g. by the CLI) in ``dir``."""
        c = cls(dir)
        info = json.loads((c.dir / "cluster.json").read_text())
        c.ports = info["ports"]
        c._bin = Path(info["bin"])
        c.pids = {k: int(v) for k, v in info["pids"].items()}
        return c

    # -- convenience
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def create_namespace(self, name: str) -> None:
        """Create a namespace and wait for its ``default`` ServiceAccount (created by
        kube-controller-manager), without which pods are not admitted."""
        self.kubectl("create", "namespace", name)
        self.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")

    @contextlib.contextmanager
    def temporary_namespace(self, name: str) -> Iterator[str]:
        """:meth:`create_namespace`, then delete it on exit (without waiting for its contents to go)."""
        self.create_namespace(name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)

    def apply(self, objs: list[dict[str, Any]] | dict[str, Any]) -> None:
        """``kubectl apply`` a list of manifests (server-side apply, field manager kvpilot-e2e)."""
        docs = objs if isinstance(objs, list) else [objs]
        self.kubectl(
            "apply", "--server-side", "--field-manager=kvpilot-e2e", "-f", "-", input=yaml.safe_dump_all(docs)
        )

    @contextlib.contextmanager
    def tainted_nodes(self, pool: _nodes.NodePool, label: str, value: str, taint: str) -> Iterator[list[str]]:
        """A node pool of one test's own: ``pool``'s KWOK nodes labelled ``label=value`` and tainted
        ``taint=true:NoSchedule``, so only the pods that select and tolerate them land there; deleted after
        (without waiting). Yields the nodes' names."""
        manifests = []
        for i in range(pool.count):
            m = _nodes.node_manifest(pool, i)
            m["metadata"]["labels"][label] = value
            m["spec"]["taints"] = [{"key": taint, "value": "true", "effect": "NoSchedule"}]
            manifests.append(m)
        self.add_nodes(manifests)
        names = [m["metadata"]["name"] for m in manifests]
        try:
            yield names
        finally:
            for name in names:
                self.kubectl("delete", "node", name, "--wait=false", check=False)

    def add_nodes(self, manifests: list[dict[str, Any]]) -> None:
        """Register Nodes *with* their status, as a kubelet does (create keeps Node.status),
        then make sure capacity/allocatable (nvidia.com/gpu) stuck after KWOK initialised them."""
        self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(manifests))
        names = [m["metadata"]["name"] for m in manifests]
        self._wait(lambda: self._nodes_ready(names), time.monotonic() + 120, "all KWOK nodes Ready")
        items = {
            n["metadata"]["name"]: n
            for n in json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        }
        for m in manifests:
            want = m["status"]["allocatable"]
            have = items[m["metadata"]["name"]]["status"].get("allocatable", {})
            if any(have.get(k) != v for k, v in want.items()):
                self.kubectl(
                    "patch",
                    "node",
                    m["metadata"]["name"],
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    json.dumps({"status": {"capacity": m["status"]["capacity"], "allocatable": want}}),
                )


def _die_with_parent() -> None:
    """In the child before exec: ask the kernel for SIGTERM when the parent dies."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _looks_like_ours(pid: int, name: str) -> bool:
    cmd = _pid_cmdline(pid)
    return bool(cmd) and name in cmd.split(" ", 1)[0]


def _terminate(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not _pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.wait(5)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "down", "env", "build", "status"])
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help=f"cluster directory (default {DEFAULT_DIR})")
    ap.add_argument("--timeout", type=float, default=180.0)
    a = ap.parse_args(argv)
    if a.command == "build":
        print(bin_dir(build=True))
        return 0
    if a.command == "up":
        c = LocalCluster(a.dir, build=True)
        c.start(timeout=a.timeout)
        print(
            f"# cluster up in {c.started_in:.1f}s; logs in {c.logs}; "
            f"stop with: python -m e2e.cluster down --dir {c.dir}",
            file=sys.stderr,
        )
        for k, v in c.env().items():
            print(f"export {k}={v}")
        return 0
    if a.command == "down":
        LocalCluster(a.dir).stop()
        print(f"# stopped; logs kept in {Path(a.dir) / 'logs'}", file=sys.stderr)
        return 0
    c = LocalCluster.attach(a.dir)
    if a.command == "env":
        for k, v in c.env().items():
            print(f"export {k}={v}")
        return 0
    alive = {n: _pid_alive(p) for n, p in c.pids.items()}
    print(json.dumps({"server": c.server, "kubeconfig": str(c.kubeconfig), "alive": alive}, indent=2))
    return 0 if all(alive.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
