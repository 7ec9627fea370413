"""A LeaderWorkerSet group's crash outlives its pods (kvpilot/operator/pods/group_crashes.py).

LWS's ``RecreateGroupOnPodRestart`` deletes a group the moment one of its containers restarts, so the
tick reads only the new group's pods, all at ``restartCount`` 0. The pod index files the crash as the
watch delivers it, and the tick's read gives the gone pod back: its restart counts against its settings
(the remedy's evidence) and the pod counts for nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator.pods import group_crashes, pod_cache, pod_reading, pod_summary, workloads
from kvpilot.operator.pods import leader_worker_set as lws
from kvpilot.tuner.loop import RestartKind
from kvpilot.tuner.types import EngineSettings

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 512.00 MiB is free."
)
ARGS = ["--max-model-len", "8192", "--max-num-seqs", "120", "--gpu-memory-utilization", "0.94"]
CURRENT = EngineSettings(max_model_len=8192, max_num_seqs=120, gpu_memory_utilization=0.94)


def group_pod(name: str, uid: str, index: str, *, restarts: int = 0) -> dict[str, Any]:
    """A pod of the group ``dsv3`` (``index`` 0: the leader), as the watch delivers it."""
    labels = {**workloads.build_labels("dsv3"), lws.NAME_LABEL: "dsv3", lws.WORKER_INDEX_LABEL: index}
    owner = "dsv3" if index == "0" else "dsv3-0"
    status: dict[str, Any] = {"name": "vllm", "ready": not restarts, "restartCount": restarts, "state": {}}
    if restarts:
        status["lastState"] = {
            "terminated": {"exitCode": 1, "message": OOM, "finishedAt": "2026-12-06T07:00:00Z"}
        }
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": labels,
            "ownerReferences": [{"kind": "StatefulSet", "name": owner, "controller": True}],
        },
        "spec": {"containers": [{"name": "vllm", "args": ARGS}]},
        "status": {"phase": "Running", "containerStatuses": [status]},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_a_group_pods_restart_is_filed_and_given_back_once_the_pod_is_gone() -> None:
    clock = Clock()
    crashes = group_crashes.GroupCrashes(clock=clock)
    key = ("ns", "dsv3")
    healthy, crashed = (
        group_pod("dsv3-0", "u-leader", "0"),
        group_pod("dsv3-0-1", "u-worker", "1", restarts=1),
    )
    deployment_pod = {
        **crashed,
        "metadata": {**crashed["metadata"], "labels": workloads.build_labels("dsv3")},
    }
    for body in (healthy, deployment_pod):
        crashes.record(key, body)
    assert crashes.recall(key, []) == []  # no restart, or not a group's: nothing filed
    crashes.record(key, crashed)
    assert crashes.recall(key, [crashed]) == []  # still live: the tick reads it itself
    (gone,) = crashes.recall(key, [group_pod("dsv3-0-1", "u-new-worker", "1")])  # the new group's pod
    assert group_crashes.is_gone(gone) and gone["metadata"]["uid"] == "u-worker"
    assert not group_crashes.is_gone(crashed)  # the filed body is a copy, marked on its way out
    assert crashes.recall(("ns", "other"), []) == []
    clock.now += group_crashes.KEEP_SECONDS + 1
    assert crashes.recall(key, []) == []  # an hour on, forgotten


def test_a_service_keeps_its_newest_crashes() -> None:
    clock = Clock()
    crashes = group_crashes.GroupCrashes(clock=clock, per_service=2)
    for i in range(4):
        clock.now += 1
        crashes.record(("ns", "dsv3"), group_pod(f"dsv3-0-{i}", f"u{i}", "1", restarts=1))
    assert sorted(p["metadata"]["uid"] for p in crashes.recall(("ns", "dsv3"), [])) == ["u2", "u3"]


class NoLogs:
    """The termination messages explain every restart here: no previous log is read."""

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raise AssertionError("not a pod source")

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        raise AssertionError(f"read the log of {pod}")


def test_the_tick_counts_a_gone_workers_oom_against_its_settings_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashes = group_crashes.GroupCrashes()
    monkeypatch.setattr(group_crashes, "CRASHES", crashes)  # the operator's one memory, fresh
    crashed = group_pod("dsv3-0-1", "u-worker", "1", restarts=1)
    pod_cache.index_pod("ns", crashed["metadata"]["labels"], crashed)  # kubelet's report, as watched
    # ... and LWS deletes the group at once and makes a new one: the index holds only the new pods
    index = {
        ("ns", "dsv3"): [group_pod("dsv3-0", "u-leader-2", "0"), group_pod("dsv3-0-1", "u-worker-2", "1")]
    }
    reader = pod_cache.IndexedPods(index, NoLogs())
    views = pod_reading.read_pod_views(reader, "ns", workloads.build_label_selector("dsv3"), "dsv3")
    assert [v.name for v in views if v.gone] == ["dsv3-0-1"]
    summary = pod_summary.compute_pod_summary(views, CURRENT, replicas=1)
    (restart,) = summary.restarts
    assert restart.cause.kind == RestartKind.CUDA_OOM and restart.pod == "dsv3-0-1"
    assert summary.ready and summary.current_pods == 2  # the new group serves; the gone pod is no pod
    serving = pod_summary.compute_serving(views, CURRENT)
    assert serving.available and serving.ready_replicas == 1
    # settings changed since (the remedy rolled out): the old crash is no evidence against the new ones
    assert (
        pod_summary.compute_pod_summary(views, CURRENT.replace(gpu_memory_utilization=0.9), 1).restarts == ()
    )
