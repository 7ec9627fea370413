"""How the operator scales: N InferenceServices on the real local control plane.

For each N (default 100 and 1000) this script:

- applies N InferenceServices, spread over namespaces and GPU pools (L4, H100, A100, found by
  nodeSelector from the KWOK nodes' GFD labels) and a few models and context bounds;
- measures the time from the first create until every object has ``Planned=True`` and its
  Deployment exists;
- measures the operator's peak RSS (VmHWM of the kopf process);
- measures the operator's Kubernetes API requests per object, counted inside the operator process
  by ``bench/_counting_operator.py`` (the operator of this checkout: ``PYTHONPATH``);
- reads the API server's own mean latency per kind of write over the run (its ``/metrics``) and the CPU
  time of each control-plane process (etcd, the API server, the controllers, KWOK), which say where the time
  goes (docs/operator.md, "Scale"), and the load average at the start and the end (the machine is shared);
- times one closed-loop tick over the same N services (the operator's own Prometheus fetch against an
  in-process fleet answering every query, :mod:`bench.prometheus_load`): PromQL queries per tick (constant
  in N) and the tick's operator CPU and wall time.

Goal (issues 4 and 14): 1000 in under 60 s with under 250 MB RSS and at most 4 requests per object. The
script prints what it measures either way.

Usage::

    .venv/bin/python bench/operator_scale.py                  # starts its own cluster (e2e/cluster.py)
    .venv/bin/python bench/operator_scale.py --n 100 --kubeconfig /tmp/kvpilot-e2e-cluster/kubeconfig

Deployments are created with ``replicas: 0`` by default, so that 1000 unschedulable pods do not load
the scheduler and KWOK. Use ``--replicas 1`` to include pod churn. The operator runs with
``--standalone`` on the host. The closed loop's timers are registered but hold (no Prometheus).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.prometheus_load import one_tick  # noqa: E402
from e2e.cluster import LocalCluster  # noqa: E402
from e2e.waits import wait_established  # noqa: E402

GROUP, VERSION, PLURAL = "kvpilot.io", "v1alpha1", "inferenceservices"
NS_PREFIX = "kvbench-"

# (pool label value, GPU count, model id, maxContextLength options)
PROFILES = (
    ("l4", 1, "meta-llama/Llama-3.1-8B-Instruct", (8192, 16384)),
    ("l4", 1, "Qwen/Qwen2.5-1.5B-Instruct", (16384, 32768)),
    ("h100", 4, "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", (32768, 65536)),
    ("h100", 1, "Qwen/Qwen2.5-7B-Instruct", (32768,)),
    ("a100", 2, "Qwen/Qwen3-32B", (16384, 40960)),
    ("a100", 1, "mistralai/Mistral-7B-Instruct-v0.3", (32768,)),
)


def build_isvc(
    i: int, namespaces: int, replicas: int, prefix: str = NS_PREFIX, headless: bool = False
) -> dict[str, Any]:
    pool, count, model, lengths = PROFILES[i % len(PROFILES)]
    service = {"service": {"headless": True}} if headless else {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": f"isvc-{i:05d}", "namespace": f"{prefix}{i % namespaces:02d}"},
        "spec": {
            "model": {"id": model},
            "gpu": {"count": count},
            "nodeSelector": {"kvpilot.dev/e2e-pool": pool},
            "replicas": replicas,
            "serving": {"maxContextLength": lengths[(i // len(PROFILES)) % len(lengths)]},
            **service,
        },
    }


LOOP_STATUS_WRITES = "client PATCH inferenceservices/status"
"""The closed loop's one status PATCH per tick that changes something
(``kvpilot/operator/status/status_write.py``,
through the ``kubernetes`` client); the reconciler's go through kopf (``kopf PATCH ...``)."""


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


_METRIC = re.compile(r"^([a-z_]+)_(sum|count)\{([^}]*)\} ([0-9.e+-]+)$")
_WRITES = ("POST", "PATCH", "APPLY", "PUT")
_WRITTEN = (
    PLURAL,
    "deployments",
    "services",
    "events",
    "ipaddresses",
    "endpointslices",
    "replicasets",
    "pods",
    "configmaps",
)
"""What kvpilot writes, and what the API server and the controllers write because of it: a Service's ClusterIP
is an ``IPAddress`` object the API server creates through its own loopback client (Kubernetes >= 1.33's
allocator), the endpoint-slice controller writes a slice per Service, the Deployment controller a ReplicaSet
and its pods."""
_LOOPBACK = ("rest_client_rate_limiter_duration_seconds", "rest_client_request_duration_seconds")
"""The API server's own client-go metrics: its loopback client (the ClusterIP allocator's IPAddress creates,
admission plugins' calls) waits on a client-side rate limiter of 50 QPS (burst 100) before each request
(``k8s.io/apiserver``, ``NewLoopbackClientConfig``)."""


def apiserver_write_latency(cluster: LocalCluster) -> dict[str, tuple[float, int]]:
    """The API server's own request-duration totals, by ``VERB resource[/subresource]`` for writes and by
    ``loopback <metric> VERB`` for its own client's requests: (seconds, count), from its ``/metrics``. Two
    readings' difference is the run's mean latency."""
    text = cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if not match:
            continue
        name, labels = match.group(1), dict(re.findall(r'(\w+)="([^"]*)"', match.group(3)))
        if name == "apiserver_request_duration_seconds":
            if labels.get("verb") not in _WRITES or labels.get("resource") not in _WRITTEN:
                continue
            sub = labels.get("subresource")
            key = f"{labels['verb']} {labels['resource']}" + (f"/{sub}" if sub else "")
        elif name in _LOOPBACK and labels.get("verb") in (*_WRITES, "GET"):
            what = name.removeprefix("rest_client_").removesuffix("_duration_seconds")
            key = f"loopback {what} {labels['verb']}"
        else:
            continue
        slot = out.setdefault(key, [0.0, 0.0])
        slot[0 if match.group(2) == "sum" else 1] += float(match.group(4))
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def latency_delta(
    before: dict[str, tuple[float, int]], after: dict[str, tuple[float, int]]
) -> dict[str, dict[str, float]]:
    """Mean latency (ms) and count of each kind of write between two readings."""
    out = {}
    for key, (total, count) in after.items():
        t0, c0 = before.get(key, (0.0, 0))
        if count - c0 > 0:
            out[key] = {"count": count - c0, "mean_ms": round(1000 * (total - t0) / (count - c0), 1)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["count"]))


def is_planned(obj: dict[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Planned" and c.get("status") == "True":
            return True
    return False


class Progress:
    """Watches (not polls) InferenceServices and Deployments, so that measuring adds no LIST load."""

    def __init__(self, cluster: LocalCluster, prefix: str) -> None:
        import threading

        self.prefix, self.lock = prefix, threading.Lock()
        self.planned: set[tuple[str, str]] = set()
        self.deployed: set[tuple[str, str]] = set()
        self.threads = [
            threading.Thread(target=self._watch, args=(cluster, kind), daemon=True)
            for kind in ("isvc", "deploy")
        ]
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # both watches established before the first create

    def _watch(self, cluster: LocalCluster, kind: str) -> None:
        from kubernetes import client, config, watch

        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        if kind == "isvc":
            fn: Any = client.CustomObjectsApi(api_client).list_cluster_custom_object
            args: tuple[Any, ...] = (GROUP, VERSION, PLURAL)
            kwargs: dict[str, Any] = {}
        else:
            fn, args = client.AppsV1Api(api_client).list_deployment_for_all_namespaces, ()
            kwargs = {"label_selector": "app.kubernetes.io/managed-by=kvpilot"}
        while True:
            try:
                for event in watch.Watch().stream(fn, *args, timeout_seconds=3600, **kwargs):
                    obj = event["object"]
                    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata.to_dict()
                    key = (meta["namespace"], meta["name"])
                    if not key[0].startswith(self.prefix):
                        continue
                    with self.lock:
                        if kind == "deploy":
                            self.deployed.add(key)
                        elif is_planned(obj):
                            self.planned.add(key)
            except Exception:  # noqa: BLE001 -- a dropped watch is re-established
                time.sleep(0.5)

    def wait(self, n: int, deadline: float) -> tuple[int, int]:
        while True:
            with self.lock:
                planned, deployed = len(self.planned), len(self.planned & self.deployed)
            if deployed >= n or time.monotonic() > deadline:
                return planned, deployed
            time.sleep(0.2)


def run_once(
    cluster: LocalCluster, n: int, namespaces: int, replicas: int, timeout: float, headless: bool = False
) -> dict[str, Any]:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api_client.configuration.connection_pool_maxsize = 32
    custom = client.CustomObjectsApi(api_client)

    prefix = f"{NS_PREFIX}{n}-{os.getpid() % 1000}-"
    for k in range(namespaces):
        cluster.kubectl("create", "namespace", f"{prefix}{k:02d}", check=False)
    workdir = Path(tempfile.mkdtemp(prefix="kvpilot-opscale-"))
    counts_file, log_file = workdir / "counts.json", workdir / "operator.log"
    # PYTHONPATH: the operator of this checkout, not whichever kvpilot the virtual environment has installed
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {
        **os.environ,
        **cluster.env(),
        "KVPILOT_METRICS_PORT": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
    }
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "_counting_operator.py"),
        str(counts_file),
        "run",
        "--standalone",
        "-m",
        "kvpilot.operator.main",
        "--namespace",
        f"{prefix}*",
        *(["--verbose"] if os.environ.get("KVPILOT_BENCH_VERBOSE") else []),
    ]
    with log_file.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "Initial authentication has finished" not in log_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"operator did not start:\n{log_file.read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(1.0)
        idle_rss = peak_rss_mb(proc.pid)
        before = json.loads(counts_file.read_text()) if counts_file.exists() else {}
        cpu0 = cpu_seconds(proc.pid)
        latency0 = apiserver_write_latency(cluster)

        bodies = [build_isvc(i, namespaces, replicas, prefix, headless) for i in range(n)]
        progress = Progress(cluster, prefix)
        load0 = os.getloadavg()[0]
        plane = {**cluster._read_pids(), **cluster.pids}  # etcd, kube-apiserver, the controllers, KWOK
        plane_cpu0 = {name: cpu_seconds(pid) for name, pid in plane.items()}
        t0 = time.monotonic()

        def create(body: dict[str, Any]) -> None:
            ns = body["metadata"]["namespace"]
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(create, bodies))
        created_s = time.monotonic() - t0

        planned, deployed = progress.wait(n, t0 + timeout)
        elapsed = time.monotonic() - t0
        load1 = os.getloadavg()[0]
        plane_cpu = {name: round(cpu_seconds(pid) - plane_cpu0[name], 1) for name, pid in plane.items()}
        cpu = cpu_seconds(proc.pid) - cpu0
        latency = latency_delta(latency0, apiserver_write_latency(cluster))
        time.sleep(2.5)  # let the counters flush
        after = json.loads(counts_file.read_text())
        rss = peak_rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for k in range(namespaces):
            cluster.kubectl("delete", "namespace", f"{prefix}{k:02d}", "--wait=false", check=False)
        api_client.close()

    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    total = sum(delta.values())
    loop_writes = delta.get(LOOP_STATUS_WRITES, 0)
    return {
        "n": n,
        "namespaces": namespaces,
        "replicas": replicas,
        "headless": headless,
        "create_s": round(created_s, 2),
        "all_planned_and_deployed_s": round(elapsed, 2),
        "planned": planned,
        "deployed": deployed,
        "complete": deployed >= n,
        "operator_cpu_s": round(cpu, 2),
        "operator_peak_rss_mb": round(rss, 1),
        "operator_idle_rss_mb": round(idle_rss, 1),
        "api_requests": total,
        "api_requests_per_object": round(total / n, 2),
        "loop_status_writes_per_object": round(loop_writes / n, 2),
        "load_average": [round(load0, 1), round(load1, 1)],
        "control_plane_cpu_s": dict(sorted(plane_cpu.items(), key=lambda kv: -kv[1])),
        "requests_by_kind": dict(sorted(delta.items(), key=lambda kv: -kv[1])),
        "apiserver_writes": latency,  # everyone's writes, the bench's own creates included
        "operator_log": str(log_file),
    }


def probe_creates(cluster: LocalCluster, n: int, threads: int = 32) -> dict[str, dict[str, float]]:
    """The API server's own floor, without the operator: ``n`` creates of one kind from ``threads`` threads
    (the operator's I/O pool), for a ClusterIP Service (what kvpilot applies), a headless one
    (``clusterIP: None``: no IPAddress allocated) and a ConfigMap, in a scratch namespace; wall seconds,
    creates per second and the API server's mean latency for each (same conditions, one after the other)."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api_client.configuration.connection_pool_maxsize = threads
    core = client.CoreV1Api(api_client)
    ns = f"{NS_PREFIX}probe-{os.getpid() % 1000}"
    cluster.kubectl("create", "namespace", ns, check=False)
    port = {"port": 8000, "targetPort": "http", "name": "http"}
    kinds: dict[str, tuple[Any, Any]] = {
        "ClusterIP Service": (
            core.create_namespaced_service,
            lambda i: {
                "metadata": {"name": f"cip-{i:05d}"},
                "spec": {"selector": {"app": f"a{i}"}, "ports": [port]},
            },
        ),
        "headless Service": (
            core.create_namespaced_service,
            lambda i: {
                "metadata": {"name": f"hl-{i:05d}"},
                "spec": {"clusterIP": "None", "selector": {"app": f"a{i}"}, "ports": [port]},
            },
        ),
        "ConfigMap": (
            core.create_namespaced_config_map,
            lambda i: {"metadata": {"name": f"cm-{i:05d}"}, "data": {"k": "v"}},
        ),
    }
    out: dict[str, dict[str, float]] = {}
    try:
        for kind, (create, body) in kinds.items():
            latency0 = apiserver_write_latency(cluster)
            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda i: create(ns, body(i)), range(n)))  # noqa: B023 -- used at once
            wall = time.monotonic() - t0
            writes = latency_delta(latency0, apiserver_write_latency(cluster))
            shown = ("POST services", "POST configmaps", "POST ipaddresses", "loopback")
            out[kind] = {
                "wall_s": round(wall, 2),
                "per_s": round(n / wall, 1),
                **{k: w["mean_ms"] for k, w in writes.items() if k.startswith(shown)},
            }
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        api_client.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append", help="object counts (default: 100 and 1000)")
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--kubeconfig", help="reuse a running e2e cluster (python -m e2e.cluster up)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per run")
    ap.add_argument(
        "--headless",
        action="store_true",
        help="InferenceServices with spec.service.headless: true (no ClusterIP to allocate)",
    )
    ap.add_argument(
        "--probe",
        type=int,
        default=0,
        metavar="N",
        help="first time N raw creates of ClusterIP Services, headless Services and ConfigMaps "
        "(the API server's floor, no operator)",
    )
    a = ap.parse_args()
    counts = a.n or [100, 1000]

    if a.kubeconfig:
        cluster, own = LocalCluster.attach(Path(a.kubeconfig).resolve().parent), False
    else:
        cluster, own = LocalCluster(tempfile.mkdtemp(prefix="kvpilot-opscale-cluster-"), build=True), True
        cluster.start(timeout=600)
    try:
        for crd in ("inferenceservices", "tuningprofiles"):  # as the chart installs them
            cluster.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(ROOT / "crds" / f"{crd}.{GROUP}.yaml"),
            )
            wait_established(cluster.kubectl, f"crd/{crd}.{GROUP}")  # kubectl wait fails on a CRD this new
        if a.probe:
            probe = probe_creates(cluster, a.probe)
            if a.json:
                print(json.dumps({"probe": a.probe, **probe}))
            else:
                print(f"the API server alone, {a.probe} creates from 32 threads:")
                for kind, p in probe.items():
                    rest = ", ".join(f"{k} {v:.0f} ms" for k, v in p.items() if k not in ("wall_s", "per_s"))
                    print(f"    {kind}: {p['wall_s']:.1f} s ({p['per_s']:.0f}/s); mean latency: {rest}")
            sys.stdout.flush()
        for n in counts:
            result = run_once(cluster, n, a.namespaces, a.replicas, a.timeout, a.headless)
            # the closed loop's tick over the same N services: the operator's own fetch code, one
            # Prometheus answer per query from an in-process fleet (bench/prometheus_load.py)
            result["prometheus_tick"] = asyncio.run(one_tick(n, max(1, a.replicas)))
            if a.json:
                print(json.dumps(result))
            else:
                goal = (
                    ""
                    if n != 1000
                    else (
                        f"  [goal <60 s: {'met' if result['all_planned_and_deployed_s'] < 60 else 'missed'}, "
                        f"<250 MB: {'met' if result['operator_peak_rss_mb'] < 250 else 'missed'}]"
                    )
                )
                kind = " (headless)" if a.headless else ""
                print(
                    f"N={n:5d}{kind}: all Planned + Deployment in "
                    f"{result['all_planned_and_deployed_s']:.1f} s "
                    f"(creates took {result['create_s']:.1f} s; {result['deployed']}/{n} done), "
                    f"operator CPU {result['operator_cpu_s']:.1f} s, "
                    f"peak RSS {result['operator_peak_rss_mb']:.0f} MB "
                    f"(idle {result['operator_idle_rss_mb']:.0f} MB), "
                    f"{result['api_requests_per_object']:.2f} API requests/object (closed-loop status "
                    f"writes {result['loop_status_writes_per_object']:.2f} of them){goal}; load average "
                    f"{result['load_average'][0]} at the start, "
                    f"{result['load_average'][1]} at the end"
                )
                for kind, count in list(result["requests_by_kind"].items())[:12]:
                    print(f"    {count:7d}  {kind}")
                tick = result["prometheus_tick"]
                print(
                    f"    closed-loop tick over {n} services: {tick['queries_per_tick']} PromQL queries "
                    f"(per-service queries would be {tick['queries_per_tick_before']}), operator CPU "
                    f"{tick['tick_cpu_s']:.2f} s, wall {tick['tick_wall_s']:.2f} s"
                )
                plane_cpu = ", ".join(f"{k} {v:.1f} s" for k, v in result["control_plane_cpu_s"].items())
                print(f"    control-plane CPU in that time: {plane_cpu}")
                print("    the API server's writes in that time (all clients): mean latency")
                for kind, w in result["apiserver_writes"].items():
                    print(f"    {w['count']:7.0f}  {kind}: {w['mean_ms']:.0f} ms")
            sys.stdout.flush()
            time.sleep(5)  # let namespace deletion start before the next run
    finally:
        if own:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
