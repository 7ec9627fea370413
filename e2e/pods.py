"""Make KWOK pods look like a crashing vLLM container, the way kubelet reports it.

KWOK plays kubelet for the simulated nodes: its ``pod-ready`` stage turns a
scheduled *Pending* pod into *Running*/Ready. None of KWOK's default stages
(``pod-ready``: phase Pending; ``pod-complete``: Running pods owned by a Job;
``pod-delete``: deletionTimestamp set) selects a Running pod of a Deployment,
so once KWOK has made the pod Running, a status written here through the
``pods/status`` subresource stays as written until the pod is deleted. The
helper therefore waits for KWOK to finish first, then patches.

What a real kubelet reports for a container that exits non-zero under
``restartPolicy: Always`` and is being backed off (see kubelet's
``kuberuntime_container.go`` / ``pod_workers``)::

    phase: Running
    conditions: Ready=False / ContainersReady=False (reason ContainersNotReady)
    containerStatuses[i]:
      ready: false, started: false, restartCount: N
      state.waiting: {reason: CrashLoopBackOff,
                      message: "back-off 40s restarting failed container=vllm pod=p_ns(uid)"}
      lastState.terminated: {exitCode, reason: Error|OOMKilled, message: <termination message>,
                             startedAt, finishedAt, containerID}

The termination message is the container's ``/dev/termination-log`` or, with
``terminationMessagePolicy: FallbackToLogsOnError``, the tail of its log.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

#: A start-up CUDA OOM as vLLM V1 prints it (torch >= 2.1 message format, in-container wording).
CUDA_OOM_MESSAGE = "\n".join(
    [
        "ERROR [core.py:708] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',  # noqa: E501
        "    engine_core = EngineCoreProc(*args, **kwargs)",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2391, '
        "in _dummy_sampler_run",
        "    raise e",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "  # noqa: E501
        "79.11 GiB of which 140.75 MiB is free. Including non-PyTorch memory, this process has 78.96 GiB memory in "  # noqa: E501
        "use. Of the allocated memory 68.83 GiB is allocated by PyTorch, with 660.00 MiB allocated in private pools "  # noqa: E501
        "(e.g., CUDA Graphs), and 331.08 MiB is reserved by PyTorch but unallocated. If reserved but unallocated "  # noqa: E501
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "  # noqa: E501
        "See documentation for Memory Management "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",
        "",
    ]
)


TERMINATION_MESSAGE_LINES = 80
TERMINATION_MESSAGE_BYTES = 2048
"""kubelet's ``FallbackToLogsOnError`` message: the log's last 80 lines, of which the last 2 KiB
(``kuberuntime_container.go``: ``MaxContainerTerminationMessageLogLines``, ``...LogLength``)."""


def termination_message(log: str) -> str:
    """The termination message kubelet writes for a container that exits with ``log`` on its output and
    ``terminationMessagePolicy: FallbackToLogsOnError``: the last 80 lines, then their last 2048 bytes."""
    tail = "".join(log.splitlines(keepends=True)[-TERMINATION_MESSAGE_LINES:]).encode()
    return tail[-TERMINATION_MESSAGE_BYTES:].decode("utf-8", "replace")


class PodSimulationError(RuntimeError):
    pass


def cri_log(text: str, at: str = "2026-12-05T18:31:04.000000000Z") -> str:
    """``text`` in the CRI log format kubelet (and KWOK) read: ``<RFC 3339 time> stdout F <line>``."""
    return "".join(f"{at} stdout F {line}\n" for line in text.splitlines())


def serve_previous_log(
    kubeconfig: str | Path | None,
    namespace: str,
    pod: str,
    container: str,
    log: str,
    directory: Path,
    *,
    kubectl: str | Path | None = None,
) -> Path:
    """Make ``log`` the previous log of ``container``, as kubelet keeps the log of the container that exited:
    the API server's ``pods/log?previous=true`` reaches KWOK's server (the nodes' kubelet endpoint,
    :mod:`e2e.cluster`), which serves the ``previousLogsFile`` of the pod's ``Logs`` object. Returns that
    file."""
    directory.mkdir(parents=True, exist_ok=True)
    previous = directory / f"{namespace}_{pod}_{container}.previous.log"
    current = directory / f"{namespace}_{pod}_{container}.log"
    previous.write_text(cri_log(log))
    current.touch()
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {
            "logs": [{"containers": [container], "logsFile": str(current), "previousLogsFile": str(previous)}]
        },
    }
    _kubectl(kubectl, kubeconfig, "apply", "-f", "-", input=json.dumps(logs))
    return previous


def _now(offset_s: float = 0.0) -> str:
    t = _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _kubectl(
    kubectl: str | Path | None,
    kubeconfig: str | Path | None,
    *args: str,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    if kubectl is None:
        from e2e.cluster import kubectl_path

        kubectl = kubectl_path()
    cmd = [str(kubectl)]
    if kubeconfig:
        cmd.append(f"--kubeconfig={kubeconfig}")
    proc = subprocess.run([*cmd, *args], input=input, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise PodSimulationError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def get_pod(
    kubeconfig: str | Path | None, namespace: str, pod: str, *, kubectl: str | Path | None = None
) -> dict[str, Any]:
    return json.loads(_kubectl(kubectl, kubeconfig, "get", "pod", pod, "-n", namespace, "-o", "json").stdout)


def _is_ready(p: dict[str, Any]) -> bool:
    st = p.get("status", {})
    return st.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions", [])
    )


def _started(p: dict[str, Any]) -> bool:
    st = p.get("status", {})
    return st.get("phase") == "Running" and bool(st.get("containerStatuses"))


def wait_pod_running(
    kubeconfig: str | Path | None,
    namespace: str,
    pod: str,
    *,
    timeout: float = 60,
    ready: bool = True,
    kubectl: str | Path | None = None,
) -> dict[str, Any]:
    """Wait until KWOK has made the pod Running (and Ready, with ``ready=True``); return it."""
    cond = _is_ready if ready else _started
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = get_pod(kubeconfig, namespace, pod, kubectl=kubectl)
        if cond(last):
            return last
        time.sleep(0.3)
    raise PodSimulationError(f"pod {namespace}/{pod} not Running after {timeout}s: {last.get('status')}")


def _container_id(uid: str, name: str, restart: int) -> str:
    return "containerd://" + hashlib.sha256(f"{uid}/{name}/{restart}".encode()).hexdigest()


def simulate_container_crash(
    kubeconfig: str | Path | None,
    namespace: str,
    pod: str,
    *,
    exit_code: int = 1,
    message: str = CUDA_OOM_MESSAGE,
    restart_count: int = 1,
    container: str | None = None,
    reason: str | None = None,
    crash_loop: bool = True,
    kubectl: str | Path | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    """Report ``container`` (default: the first) of a KWOK pod as crashed, as kubelet would.

    :param exit_code: the container's exit code (vLLM start-up failures exit 1; cgroup OOM kill is 137).
    :param message: the termination message (default: a vLLM CUDA OOM traceback, ``CUDA_OOM_MESSAGE``).
    :param restart_count: ``restartCount`` to report (kubelet increments it on each restart).
    :param reason: terminated reason; default ``OOMKilled`` for exit code 137, else ``Error``.
    :param crash_loop: True: ``state.waiting`` CrashLoopBackOff with the crash in ``lastState.terminated``
        (the steady state of a crash-looping pod). False: the crash is the current ``state.terminated``
        (the moment right after the exit, before back-off).
    :returns: the pod as the API server answered the patch.
    """
    # KWOK's pod-ready stage only acts on Pending pods: once it has made the pod Running
    # (or an earlier crash was simulated), nothing in KWOK rewrites the status below.
    p = wait_pod_running(kubeconfig, namespace, pod, timeout=timeout, ready=False, kubectl=kubectl)
    spec_containers = [c["name"] for c in p["spec"]["containers"]]
    target = container or spec_containers[0]
    if target not in spec_containers:
        raise PodSimulationError(f"pod {namespace}/{pod} has no container {target!r} (has {spec_containers})")
    reason = reason or ("OOMKilled" if exit_code == 137 else "Error")
    uid = p["metadata"].get("uid", "")
    old = {s["name"]: s for s in p.get("status", {}).get("containerStatuses", [])}
    statuses = []
    for c in p["spec"]["containers"]:
        s = dict(
            old.get(
                c["name"],
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                },
            )
        )
        if c["name"] == target:
            # the container ran within the pod's life: kubelet's times never predate the pod's start (the
            # closed loop counts a crash only from the last change on, in whole seconds: a crash dated a
            # second before a pod made after that change was lost when it came within a second of it)
            terminated = {
                "exitCode": exit_code,
                "reason": reason,
                "message": message,
                "startedAt": max(_now(-30), str((p.get("status") or {}).get("startTime") or "")),
                "finishedAt": _now(),
                "containerID": _container_id(uid, c["name"], restart_count - 1),
            }
            backoff = min(10 * 2 ** max(restart_count - 1, 0), 300)
            s.update(
                ready=False,
                started=False,
                restartCount=restart_count,
                image=c.get("image", ""),
                imageID=s.get("imageID", ""),
            )
            if crash_loop:
                s["state"] = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {backoff}s restarting failed container={c['name']} "
                        f"pod={pod}_{namespace}({uid})",
                    }
                }
                s["lastState"] = {"terminated": terminated}
                s.pop("containerID", None)
            else:
                s["state"] = {"terminated": terminated}
                s["containerID"] = terminated["containerID"]
        statuses.append(s)
    not_ready = [s["name"] for s in statuses if not s.get("ready")]
    conditions = []
    for cond in p["status"].get("conditions", []):
        cond = dict(cond)
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(
                status="False",
                reason="ContainersNotReady",
                lastTransitionTime=_now(),
                message=f"containers with unready status: [{' '.join(not_ready)}]",
            )
        conditions.append(cond)
    patch = {"status": {"phase": "Running", "conditions": conditions, "containerStatuses": statuses}}
    # merge patch: lists are replaced wholesale, exactly what kubelet's status manager sends in effect.
    # The pod is the patch's own answer: a controller may delete it at once (LeaderWorkerSet recreates
    # a whole group on a restart), so a second read could find it gone.
    out = _kubectl(
        kubectl,
        kubeconfig,
        "patch",
        "pod",
        pod,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
        "-o",
        "json",
    )
    return dict(json.loads(out.stdout))


def container_status(p: dict[str, Any], container: str | None = None) -> dict[str, Any]:
    sts = p.get("status", {}).get("containerStatuses", [])
    for s in sts:
        if container is None or s["name"] == container:
            return s
    raise KeyError(container)
