"""One simulated engine container: its state, its ``/metrics`` server, the pod status kubelet reports.

:class:`PodEngine` is the per-pod state the :class:`e2e.fleet.fleet.Fleet` steps;
:class:`MetricsServer` serves its exposition on its own 127.0.0.1 port;
:func:`build_running_patch` is the ``pods/status`` merge patch of a container that (re)started,
Ready or not yet (crashes go through :func:`e2e.pods.simulate_container_crash`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import http.server
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e.fleet.engine import SimEngine
from e2e.fleet.exposition import VllmMetrics
from e2e.fleet.truth import EngineArgs, Scenario

if TYPE_CHECKING:
    from e2e.fleet.players import Metrics, Player
    from e2e.vllm_cpu.engine_process import EngineProcess

INSTANCE_LABEL = "app.kubernetes.io/instance"
_LABEL_CHARS = re.compile("[^a-zA-Z0-9_]")
"""What Prometheus' Kubernetes discovery turns into ``_`` in a pod label's meta-label name
(``SanitizeLabelName``). Written here, not taken from ``kvpilot.observability.series.pod_label_meta``: the
fleet plays Prometheus' side and imports nothing of the code it judges (test_fleet)."""
ENGINE_LABEL = "e2e.kvpilot.io/engine"
"""A pod labelled ``e2e.kvpilot.io/engine: real`` runs the real vLLM engine (:mod:`e2e.vllm_cpu`), not the
simulator (also :meth:`e2e.fleet.fleet.Fleet.use_real_engine`)."""
STARTING, SERVING, CRASHED, STOPPED = "Starting", "Serving", "CrashLoopBackOff", "Stopped"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def now_rfc3339(offset_s: float = 0.0) -> str:
    t = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------- HTTP


class MetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, render: Callable[[], bytes]) -> None:
        self.render = render
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body = self.server.render()
            ctype = "text/plain; version=0.0.4; charset=utf-8"
        elif path in ("/health", "/ping"):
            body, ctype = b"", "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


# ---------------------------------------------------------------------------- one pod


@dataclasses.dataclass
class FleetEvent:
    time: float
    namespace: str
    pod: str
    kind: str  # Started, Serving, StartupFailed, CudaOOM, Restarted, Injected, Gone
    detail: str = ""


class PodEngine:
    """The simulated container of one pod: vLLM's, or another engine's when ``player`` plays it (SGLang's,
    TGI's: :mod:`e2e.fleet.players`; ``args`` is then the engine model's view of its flags)."""

    def __init__(
        self,
        pod: dict[str, Any],
        args: EngineArgs,
        scenario: Scenario,
        port: int,
        player: Player | None = None,
    ) -> None:
        md, spec = pod["metadata"], pod["spec"]
        self.namespace: str = md["namespace"]
        self.name: str = md["name"]
        self.uid: str = md.get("uid", "")
        self.labels: dict[str, str] = dict(md.get("labels") or {})
        self.instance = self.labels.get(INSTANCE_LABEL, "")
        self.node: str = spec.get("nodeName") or ""
        container = spec["containers"][0]
        self.container: str = container["name"]
        self.image: str = container.get("image", "")
        self.args = args
        self.player = player
        self.log_lines: list[str] = []
        """A played container's log so far (start-up summary, then SGLang's retraction warnings or TGI's
        429s): a crash's log ends it."""
        self.scenario = scenario
        self.port = port
        self.state = STARTING
        self.since = time.monotonic()
        self.restart_count = 0
        self.restart_at = 0.0
        self.sim: SimEngine | None = None
        self.metrics: VllmMetrics | Metrics | None = None
        self.server: MetricsServer | None = None
        self.pending_fault: str | None = None
        self.crashes: list[tuple[float, str, str]] = []
        self.last_message = ""
        self.started_count = 0
        self.cache_key = read_weight_cache(pod)
        self.cache_hit = False
        self.compile_cache_key = read_compile_cache(pod)
        self.compile_hit = False
        self.startup_wall_s = scenario.truth.startup_s
        self.real_engine = self.labels.get(ENGINE_LABEL) == "real"
        self.process: EngineProcess | None = None
        self.log_root: Path | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def log_file(self, restart: int | None = None) -> Path | None:
        """The real engine's log of container start ``restart`` (default: the current one), at kubelet's
        path under the fleet's log root; ``None`` for a simulated pod. The previous container's log is
        ``log_file(restart_count - 1)``; its last lines are also the crash's termination message."""
        from e2e.vllm_cpu.engine_process import container_log_path

        if not self.real_engine or self.log_root is None:
            return None
        n = self.restart_count if restart is None else restart
        return container_log_path(self.log_root, self.namespace, self.name, self.uid, self.container, n)

    def render(self) -> bytes:
        m = self.metrics
        return m.render() if m is not None else b""

    def _label_meta(self) -> dict[str, str]:
        return {f"__meta_kubernetes_pod_label_{_LABEL_CHARS.sub('_', k)}": v for k, v in self.labels.items()}

    def target_group(self) -> dict[str, Any]:
        """This pod's Prometheus file_sd entry, with the meta labels Kubernetes SD would give it."""
        return {
            "targets": [f"127.0.0.1:{self.port}"],
            "labels": {
                "__meta_kubernetes_namespace": self.namespace,
                "__meta_kubernetes_pod_name": self.name,
                "__meta_kubernetes_pod_container_name": self.container,
                "__meta_kubernetes_pod_node_name": self.node,
                "__meta_kubernetes_pod_uid": self.uid,
                **self._label_meta(),  # every pod label, named as Kubernetes discovery names them
            },
        }

    def snapshot(self) -> dict[str, Any]:
        sim = self.sim
        return {
            "namespace": self.namespace,
            "pod": self.name,
            "instance": self.instance,
            "state": self.state,
            "port": self.port,
            "restart_count": self.restart_count,
            "args": dataclasses.asdict(self.args),
            "scenario": self.scenario.name,
            "kv_usage": sim.kv_usage if sim else None,
            "running": sim.num_running if sim else None,
            "waiting": sim.num_waiting if sim else None,
            "preemptions": sim.total_preemptions if sim else None,
            "finished": sim.total_finished if sim else None,
            "num_gpu_blocks": sim.num_blocks if sim else None,
            "crashes": [k for _, k, _ in self.crashes],
            "engine": "real" if self.real_engine else "simulated",
            "kind": self.player.kind if self.player is not None else "vLLM",
            "pid": self.process.pid if self.process is not None else None,
        }


def container_env(container: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet resolves it for ``$(VAR)`` references: literal values, and
    ``fieldRef`` to one of the pod's labels (how an injected variable may name the pod's own index)."""
    out: dict[str, str] = {}
    for var in container.get("env") or ():
        if "value" in var:
            out[var["name"]] = str(var["value"])
            continue
        path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        found = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        if found and found.group(1) in labels:
            out[var["name"]] = labels[found.group(1)]
    return out


def read_weight_cache(pod: dict[str, Any]) -> str | None:
    """Where this pod's Hugging Face cache lives, as kubelet would mount it: the volume under the
    model container's ``HF_HOME`` (:func:`read_volume_key`)."""
    return read_volume_key(pod, "HF_HOME")


def read_compile_cache(pod: dict[str, Any]) -> str | None:
    """Where this pod's vLLM compile cache lives: the volume under the model container's
    ``VLLM_CACHE_ROOT`` (vLLM's own variable, read as vLLM reads it; kvpilot sets it on a
    writable weight-cache volume); ``None``: vLLM's default ``~/.cache/vllm``, gone with the container."""
    return read_volume_key(pod, "VLLM_CACHE_ROOT")


def read_volume_key(pod: dict[str, Any], env_name: str) -> str | None:
    """The volume holding the folder the model container's ``env_name`` names. A claim
    (``pvc:<namespace>/<claim>``) is shared by every pod that mounts it; a ``hostPath``
    (``host:<node>:<path>``) by the pods on that node; anything else (``emptyDir``, the container's own
    filesystem) is gone with the container: ``None``."""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    folder = next((e.get("value") for e in container.get("env") or [] if e.get("name") == env_name), None)
    if not folder:
        return None
    mounts = [m for m in container.get("volumeMounts") or [] if folder.startswith(m.get("mountPath", "\0"))]
    if not mounts:
        return None
    volume_name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    volume = next((v for v in spec.get("volumes") or [] if v.get("name") == volume_name), {})
    if "persistentVolumeClaim" in volume:
        namespace = (pod.get("metadata") or {}).get("namespace", "")
        return f"pvc:{namespace}/{volume['persistentVolumeClaim'].get('claimName', '')}"
    if "hostPath" in volume:
        return f"host:{spec.get('nodeName', '')}:{volume['hostPath'].get('path', '')}"
    return None


def build_running_patch(
    pod: dict[str, Any], container: str, image: str, restarts: int, *, ready: bool
) -> dict[str, Any]:
    """The ``pods/status`` merge patch of ``container`` running again: Ready, or still starting."""
    uid = pod["metadata"].get("uid", "")
    st = pod.get("status", {})
    old = next((s for s in st.get("containerStatuses") or [] if s["name"] == container), {})
    cid = "containerd://" + hashlib.sha256(f"{uid}/{container}/{restarts}".encode()).hexdigest()
    cs = {
        "name": container,
        "image": image,
        "imageID": old.get("imageID", ""),
        "containerID": cid,
        "ready": ready,
        "started": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": now_rfc3339()}},
    }
    if old.get("lastState"):
        cs["lastState"] = old["lastState"]
    conds = []
    for c in st.get("conditions") or []:
        c = dict(c)
        if c["type"] in ("Ready", "ContainersReady"):
            want = "True" if ready else "False"
            if c.get("status") != want:
                c.update(status=want, lastTransitionTime=now_rfc3339())
            if ready:
                c.pop("reason", None)
                c.pop("message", None)
            else:
                c.update(
                    reason="ContainersNotReady",
                    message=f"containers with unready status: [{container}]",
                )
        conds.append(c)
    return {"status": {"phase": "Running", "conditions": conds, "containerStatuses": [cs]}}
