"""One tenant's burst against another tenant's CUDA-OOM retune, on the real control plane (issue 31).

Tenant B runs one InferenceService (``victim``, mode Auto) whose pod the fleet plays. Tenant A then creates a
burst of small InferenceServices (``replicas: 0``: reconciles and closed-loop ticks, no pods) while B's pod
dies of CUDA OOM. What counts is B's time to patch: from the crash (the fleet's clock) until the operator has
patched B's Deployment with new engine arguments.

:func:`measure` runs it once with an operator whose fairness gate (:mod:`kvpilot.operator.fairness`) is set
from ``extra_env``: the defaults (16 at once, 4 per namespace), or limits so high that it admits everything
(the operator without the gate). It also times one retune with no burst, as the quiet baseline.
``bench/tenant_burst.py`` runs both and checks the gated one against a bound; a run takes 4-6 minutes on the
shared 2-core machine (most of it planning the burst and deleting it), too long for the e2e suite.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from e2e.cluster import LocalCluster
from e2e.fleet import Scenario, Workload
from e2e.fleet.pod import SERVING
from e2e.fleet.stack import PROBATION_S, Stack, condition
from e2e.fleet.testing import H100_8B, catalogue_isvc, wait_until
from kvpilot.operator import fairness

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = {"mode": "Auto", "cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
UNGATED = {fairness.TOTAL_ENV: "100000", fairness.PER_NAMESPACE_ENV: "100000"}
"""An operator whose gate admits every unit at once: kopf's own scheduling, as before the gate."""
BURST_CHUNK = 50
"""InferenceServices per ``kubectl apply`` of the burst (several applies, as a tenant's script would)."""


@dataclass(frozen=True)
class BurstResult:
    label: str
    burst: int
    quiet_patch_s: float
    """B's time to patch with no burst."""
    burst_patch_s: float
    """B's time to patch while A's burst is reconciled."""
    quiet_seen_s: float
    """From the crash until the API server shows the pod's restart (the fleet's patch), with no burst."""
    burst_seen_s: float
    """The same under the burst: the part of the time to patch that is not the operator's."""
    burst_planned_s: float
    """From the burst's first apply until every one of A's InferenceServices has ``status.applied``."""

    def line(self) -> str:
        return (
            f"{self.label:8s} burst={self.burst} B time-to-patch: quiet {self.quiet_patch_s:5.1f} s, "
            f"under the burst {self.burst_patch_s:5.1f} s (restart in the API after "
            f"{self.quiet_seen_s:.1f} s / {self.burst_seen_s:.1f} s); A's burst planned in "
            f"{self.burst_planned_s:5.1f} s"
        )


def burst_manifests(namespace: str, n: int) -> list[dict[str, Any]]:
    """Tenant A's burst: ``n`` services without pods, with contexts that defeat the plan caches."""
    objs = []
    for i in range(n):
        obj = catalogue_isvc(
            f"burst-{i:04d}", namespace, MODEL, H100, {"maxContextLength": 4096 + 64 * i}, dict(FAST)
        )
        obj["spec"]["replicas"] = 0
        objs.append(obj)
    return objs


class _Deployments:
    """Reads Deployments and pods through the API server with the Python client (a poll costs no process)."""

    def __init__(self, kubeconfig: Path) -> None:
        api = kubernetes.config.new_client_from_config(str(kubeconfig))
        self.apps, self.core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)

    def restarts(self, namespace: str, pod: str) -> int:
        resp = self.core.read_namespaced_pod_status(pod, namespace, _preload_content=False)
        statuses = json.loads(resp.data)["status"].get("containerStatuses") or ()
        return sum(int(c.get("restartCount") or 0) for c in statuses)

    def args(self, namespace: str, name: str) -> list[str] | None:
        try:
            resp = self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        containers = json.loads(resp.data)["spec"]["template"]["spec"]["containers"]
        return [str(a) for a in containers[0].get("args") or ()]


class _Victim:
    """Tenant B's service: crash its serving pod with CUDA OOM and time the operator's patch."""

    def __init__(self, stack: Stack, namespace: str, deployments: _Deployments) -> None:
        self.stack, self.ns, self.deployments = stack, namespace, deployments

    @property
    def fleet(self) -> Any:
        assert self.stack.fleet is not None
        return self.stack.fleet

    def wait_settled(self, timeout: float) -> None:
        """Ready, no rollout, one pod serving, and past its probation (a new crash is a fresh retune)."""

        def settled() -> bool:
            obj = self.stack.isvc(self.ns, "victim")
            status = obj.get("status") or {}
            serving = [p for p in self.fleet.pods(self.ns, "victim") if p["state"] == SERVING]
            return (
                condition(obj, "Ready").get("status") == "True"
                and not status.get("rollout")
                and condition(obj, "RolloutInProgress").get("status") != "True"
                and len(serving) == 1
            )

        wait_until(settled, timeout=timeout, what="B's service Ready with one pod serving")
        time.sleep(PROBATION_S + 2)

    def crash_and_time_patch(self, timeout: float) -> tuple[float, float]:
        """(seconds from the crash until the API server shows the pod's restart, until B is patched)."""
        before = self.deployments.args(self.ns, "victim")
        pod = next(p["pod"] for p in self.fleet.pods(self.ns, "victim") if p["state"] == SERVING)
        restarts = self.deployments.restarts(self.ns, pod)
        hit = self.fleet.inject(self.ns, "victim", pod=pod, fault="cuda_oom")
        assert hit, f"no serving pod of {self.ns}/victim to crash: {self.fleet.pods(self.ns)}"
        engine = self.fleet.engine(self.ns, hit[0])
        crashed_at = float(
            wait_until(
                lambda: engine.crashes and engine.crashes[-1][0],
                timeout=30,
                what="the CUDA OOM",
                interval=0.05,
            )
        )
        visible: float | None = None
        deadline = time.time() + timeout
        while time.time() < deadline:
            if visible is None and self.deployments.restarts(self.ns, pod) > restarts:
                visible = time.time() - crashed_at
            if self.deployments.args(self.ns, "victim") != before:
                return (visible if visible is not None else float("nan")), time.time() - crashed_at
            time.sleep(0.05)
        raise AssertionError(f"B's Deployment not patched {timeout:g} s after its CUDA OOM")


def _apply_burst(cluster: LocalCluster, objs: list[dict[str, Any]], errors: list[str]) -> None:
    for i in range(0, len(objs), BURST_CHUNK):
        proc = cluster.kubectl(
            "apply",
            "--server-side",
            "--field-manager=kvpilot-e2e",
            "-f",
            "-",
            input=yaml.safe_dump_all(objs[i : i + BURST_CHUNK]),
            check=False,
        )
        if proc.returncode != 0:
            errors.append(proc.stderr[-500:])


def _count_planned(cluster: LocalCluster, namespace: str) -> int:
    out = cluster.kubectl("get", "inferenceservices.kvpilot.io", "-n", namespace, "-o", "json").stdout
    return sum(1 for o in json.loads(out)["items"] if (o.get("status") or {}).get("applied"))


def measure(
    cluster: LocalCluster,
    run_dir: Path,
    *,
    label: str,
    extra_env: dict[str, str],
    burst: int,
    log: Callable[[str], None] = print,
) -> BurstResult:
    """One run (module docstring): a fresh operator, Prometheus and fleet, two fresh namespaces."""
    tag = uuid.uuid4().hex[:5]
    ns_a, ns_b = f"kvburst-a-{tag}", f"kvburst-b-{tag}"
    for ns in (ns_a, ns_b):
        cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns_b, "--timeout=60s")
    workload = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)
    stack = Stack(
        cluster,
        run_dir / label,
        namespaces=[ns_b],
        operator_namespaces=[ns_a, ns_b],
        scenarios={(ns_b, "victim"): Scenario(name="victim", truth=H100_8B, workload=workload)},
        operator_extra_env=extra_env,
    )
    stack.start()
    try:
        victim = _Victim(stack, ns_b, _Deployments(cluster.kubeconfig))
        serving = {"maxContextLength": 8192, "concurrency": 16}
        cluster.apply(catalogue_isvc("victim", ns_b, MODEL, H100, serving, dict(FAST)))
        victim.wait_settled(timeout=180)
        quiet_seen, quiet = victim.crash_and_time_patch(timeout=120)
        log(f"{label}: quiet retune patched in {quiet:.1f} s (restart seen after {quiet_seen:.1f} s)")
        victim.wait_settled(timeout=180)

        errors: list[str] = []
        t0 = time.monotonic()
        applier = threading.Thread(target=_apply_burst, args=(cluster, burst_manifests(ns_a, burst), errors))
        applier.start()
        wait_until(lambda: _count_planned(cluster, ns_a) >= 1, timeout=60, what="the burst under way")
        under_seen, under = victim.crash_and_time_patch(timeout=300)
        log(
            f"{label}: retune under the burst patched in {under:.1f} s "
            f"(restart seen after {under_seen:.1f} s)"
        )
        applier.join()
        assert not errors, errors
        wait_until(
            lambda: _count_planned(cluster, ns_a) == burst, timeout=600, what=f"all {burst} of A's planned"
        )
        planned = time.monotonic() - t0
        return BurstResult(label, burst, quiet, under, quiet_seen, under_seen, planned)
    finally:
        stack.stop_and_clean([ns_a, ns_b])
