"""Fakes for the closed-loop tests: pods made from the applied Deployment, canned metrics, a clock."""

from __future__ import annotations

import copy
import datetime
import logging
from typing import Any

import kopf
from operator_fakes import Harness, apply_merge, apply_patch

from kvpilot.operator.inferenceservice import closed_loop
from kvpilot.operator.loop import loop_deps
from kvpilot.tuner.loop.observations import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.loop.policy import Decision

T0 = datetime.datetime(2026, 11, 30, 11, 0, tzinfo=datetime.UTC).timestamp()
"""An hour after the fake reconciler's Planned entry (10:00): no cooldown left."""


def rfc3339(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakePods:
    """:class:`kvpilot.operator.pods.pod_reading.PodReader` over a list of pod dicts."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[str, str] = {}
        self.log_reads = 0

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str | None:
        self.log_reads += 1
        return self.logs.get(pod)


def pod(
    name: str,
    args: list[str],
    *,
    ready: bool = True,
    restarts: int = 0,
    message: str | None = None,
    reason: str = "Error",
    exit_code: int = 1,
    finished: float | None = None,
    crash_loop: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "vllm", "ready": ready, "restartCount": restarts, "state": {}}
    if restarts:
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason}
        if message is not None:
            terminated["message"] = message
        if finished is not None:
            terminated["finishedAt"] = rfc3339(finished)
        status["lastState"] = {"terminated": terminated}
    if crash_loop:
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    deployment, template_hash = name.rsplit("-", 2)[0], name.rsplit("-", 2)[1]
    return {
        "metadata": {
            "name": name,
            "labels": {"pod-template-hash": template_hash},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"{deployment}-{template_hash}", "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "vllm", "args": list(args)}]},
        "status": {"containerStatuses": [status]},
    }


def window(
    now: float,
    kv: float = 0.7,
    preempt: float = 0.0,
    running: float = 40.0,
    waiting: float = 0.0,
    prompt: float = 1500.0,
    output: float = 500.0,
    capacity: int | None = None,
    gmu: float | None = None,
) -> ObservationWindow:
    samples = tuple(
        MetricsSample(
            now - 270 + 30 * i, kv_usage=kv, preemption_rate=preempt, running=running, waiting=waiting
        )
        for i in range(10)
    )
    return ObservationWindow(
        now - 300,
        now,
        samples,
        LengthSummary(prompt),
        LengthSummary(output),
        kv_capacity_tokens=capacity,
        reported_gpu_memory_utilization=gmu,
        reported_kv_cache_dtype="auto" if capacity else None,
        pods=1,
    )


class LoopHarness:
    """Runs :func:`closed_loop.run_once` on a body the fake reconciler created, like kopf's timer would."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness
        self.now = T0
        self.pods = FakePods()
        self.window: ObservationWindow | None = None
        self.fetches = 0
        self.deps = self.new_deps()

    def new_deps(self) -> loop_deps.LoopDeps:
        """A fresh set of dependencies: what a restarted operator would build."""
        return loop_deps.LoopDeps(
            kube=self.h.kube,
            pods=self.pods,
            prom_url="http://prometheus.test:9090",
            clock=lambda: self.now,
            emit=self.h.emitter,
            fetch_window=self._fetch,
            hub=self.h._hub,
            record_metrics=False,
            owners=self.h.deps.owners,  # one memory of kvpilot's objects, as the operator's start-up makes
        )

    async def _fetch(self, url: str, namespace: str, name: str, now: float, **_: Any) -> ObservationWindow:
        self.fetches += 1
        if self.window is None:
            return ObservationWindow.unavailable("Prometheus query failed: connection refused", now)
        return self.window

    def deployment_args(self) -> list[str]:
        return list(self.h.kube.last("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])

    def healthy_pods(self, n: int = 1, **kw: Any) -> None:
        args = self.deployment_args()
        self.pods.pods = [pod(f"llm-5d8f7c-{i:05d}", args, **kw) for i in range(n)]

    async def tick(self, body: dict[str, Any], advance: float = 30.0) -> Decision | None:
        self.now += advance
        patch = kopf.Patch()
        decision = await closed_loop.run_once(
            body=body,
            spec=body["spec"],
            meta=body["metadata"],
            status=body.get("status") or {},
            patch=patch,
            logger=logging.getLogger("test"),
            deps=self.deps,
        )
        body["status"] = self.land(body, patch)
        return decision

    def land(self, body: dict[str, Any], patch: kopf.Patch) -> dict[str, Any]:
        """The status after the tick's writes: its own conditional PATCHes (``kube``), then kopf's ``patch``
        (used only without a client)."""
        status = dict(body.get("status") or {})
        meta = body["metadata"]
        for sent in self.h.kube.take_status_patches(meta.get("namespace") or "default", meta["name"]):
            status = apply_merge(status, sent)
        return apply_patch(status, patch)
