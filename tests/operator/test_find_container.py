"""Which container of a pod is the engine's (:func:`kvpilot.operator.pods.pod_view.find_container`), for
vLLM's closed loop and SGLang's alike: the one the engine seam names, else the first."""

from __future__ import annotations

from typing import Any

from kvpilot.operator.pods import pod_view, sglang_pods
from kvpilot.tuner.engines import SglangEngine, VllmEngine


def _pod(*names: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "llm-5d8f7c-00000"},
        "spec": {"containers": [{"name": n, "args": [f"--from-{n}"]} for n in names]},
        "status": {"containerStatuses": [{"name": n, "restartCount": i} for i, n in enumerate(names)]},
    }


def test_the_engines_container_is_found_by_the_seams_name_wherever_it_sits() -> None:
    for engine in (VllmEngine(), SglangEngine()):
        name = engine.serving.container_name
        pod = _pod("sidecar", name)
        assert pod_view.find_container(pod, "containers", name)["args"] == [f"--from-{name}"]
        assert pod_view.find_container(pod, "containerStatuses", name)["restartCount"] == 1


def test_without_the_named_container_the_first_one_is_read_and_without_any_nothing() -> None:
    assert pod_view.find_container(_pod("a", "b"), "containers", "vllm")["name"] == "a"
    assert pod_view.find_container(_pod("a", "b"), "containerStatuses", "sglang")["name"] == "a"
    assert pod_view.find_container({}, "containers", "vllm") == {}
    assert pod_view.find_container({"spec": None, "status": {}}, "containerStatuses", "vllm") == {}


def test_both_loops_read_the_engines_container_behind_a_sidecar() -> None:
    vllm_pod = _pod("sidecar", "vllm")
    vllm_pod["spec"]["containers"][1]["args"] = ["--max-num-seqs", "64"]
    view = pod_view.build_pod_view(vllm_pod)
    assert view.settings is not None and view.settings.max_num_seqs == 64
    sglang_pod = _pod("sidecar", "sglang")
    sglang_pod["spec"]["containers"][1]["args"] = ["--mem-fraction-static", "0.8"]
    sglang_view = sglang_pods.build_sglang_pod(sglang_pod)
    assert sglang_view.settings is not None and sglang_view.settings.mem_fraction_static == 0.8
    assert sglang_view.restart_count == 1
