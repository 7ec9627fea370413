"""The closed loop reads its pods from kopf's pod index (kvpilot.operator.pods.pod_cache), not a LIST a
tick."""

from __future__ import annotations

import inspect
from typing import Any

import kopf
import pytest

from kvpilot.operator.inferenceservice import closed_loop
from kvpilot.operator.loop import loop_deps
from kvpilot.operator.pods import pod_cache, workloads


def pod(name: str, instance: str, **extra_labels: str) -> dict[str, Any]:
    labels = {**workloads.build_selector(instance), "pod-template-hash": "abc", **extra_labels}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "managedFields": [{"manager": "x"}]},
        "status": {"phase": "Running"},
    }


def test_a_pod_is_filed_under_its_service_without_managed_fields() -> None:
    p = pod("a-1", "a")
    ((key, value),) = pod_cache.index_pod("ns", p["metadata"]["labels"], p).items()
    assert key == ("ns", "a")
    assert "managedFields" not in value["metadata"] and value["metadata"]["name"] == "a-1"
    assert value["status"] == {"phase": "Running"}
    assert "managedFields" in p["metadata"]  # the watched body is left alone


def test_pods_without_the_selector_labels_are_not_indexed() -> None:
    foreign = pod("x", "a")
    foreign["metadata"]["labels"]["app.kubernetes.io/name"] = "something-else"
    assert pod_cache.index_pod("ns", foreign["metadata"]["labels"], foreign) == {}
    assert pod_cache.index_pod("ns", {}, {"metadata": {}}) == {}


def test_parse_selector() -> None:
    assert pod_cache.parse_selector("a=1, b==2,") == {"a": "1", "b": "2"}
    for bad in ("a", "a!=1"):
        with pytest.raises(ValueError, match="equality selector"):
            pod_cache.parse_selector(bad)


class Logs:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int]] = []

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raise AssertionError("a tick must not LIST pods when the index is there")

    def read_previous_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str | None:
        self.calls.append((namespace, pod, container, tail_lines))
        return "CUDA out of memory"


def selector(instance: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(workloads.build_selector(instance).items()))


def test_indexed_pods_answer_the_closed_loops_selector() -> None:
    index = {
        ("ns", "a"): [pod("a-1", "a"), pod("a-2", "a")],
        ("other", "a"): [pod("o-1", "a")],
        ("ns", "b"): [pod("b-1", "b")],
    }
    logs = Logs()
    reader = pod_cache.IndexedPods(index, logs)
    assert [p["metadata"]["name"] for p in reader.list_pods("ns", selector("a"))] == ["a-1", "a-2"]
    assert [p["metadata"]["name"] for p in reader.list_pods("other", selector("a"))] == ["o-1"]
    assert reader.list_pods("ns", selector("gone")) == []
    narrower = selector("a") + ",pod-template-hash=zzz"
    assert reader.list_pods("ns", narrower) == []
    with pytest.raises(ValueError, match=workloads.INSTANCE_LABEL):
        reader.list_pods("ns", "app.kubernetes.io/name=vllm")
    assert reader.read_previous_log("ns", "a-1", "vllm", 50) == "CUDA out of memory"
    assert logs.calls == [("ns", "a-1", "vllm", 50)]


def test_the_pod_index_is_registered_for_pods_and_named_as_the_tick_expects() -> None:
    from kvpilot.operator import main  # noqa: F401  (every registration is there)

    registry = kopf.get_default_registry()
    (handler,) = [h for h in registry._indexing.get_all_handlers() if h.fn is pod_cache.vllm_pods]
    assert (handler.selector.group, handler.selector.version, handler.selector.any_name) == ("", "v1", "pods")
    assert handler.labels == {workloads.INSTANCE_LABEL: kopf.PRESENT}
    # kopf passes an index as the keyword argument named after its function
    assert pod_cache.vllm_pods.__name__ in inspect.signature(closed_loop.closed_loop_tick).parameters


async def test_the_tick_reads_pods_from_the_index(monkeypatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_run_once(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(closed_loop, "run_once", fake_run_once)
    monkeypatch.setattr(loop_deps, "_deps", loop_deps.LoopDeps(kube=None, pods=Logs(), prom_url=""))
    index = {("ns", "a"): [pod("a-1", "a")]}
    await closed_loop.closed_loop_tick(
        body={},
        spec={},
        meta={},
        status={},
        patch=None,
        logger=None,
        vllm_pods=index,  # type: ignore[arg-type]
    )
    reader = seen["deps"].pods
    assert isinstance(reader, pod_cache.IndexedPods)
    assert [p["metadata"]["name"] for p in reader.list_pods("ns", selector("a"))] == ["a-1"]
