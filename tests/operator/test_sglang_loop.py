"""The SGLang loop's reading of its pods (:mod:`kvpilot.operator.inferenceservice.sglang_loop`): the settings
most live pods run are the current ones, and only their restarts are evidence against them."""

from __future__ import annotations

from closed_loop_fakes import pod

from kvpilot.operator.inferenceservice import sglang_loop
from kvpilot.operator.pods import sglang_pods
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import ObservationWindow

OLD = ["--model-path", "m", "--mem-fraction-static", "0.84"]
NEW = ["--model-path", "m", "--mem-fraction-static", "0.8"]
OOM = "torch.OutOfMemoryError: CUDA out of memory."


def test_the_current_settings_are_the_live_majoritys_and_only_their_restarts_count() -> None:
    pods = [
        sglang_pods.build_sglang_pod(pod("llm-5d8f7c-00000", NEW)),
        sglang_pods.build_sglang_pod(pod("llm-5d8f7c-00001", NEW, restarts=1, message=OOM, finished=50.0)),
        sglang_pods.build_sglang_pod(pod("llm-6a1b2c-00000", OLD, restarts=3, message=OOM, finished=40.0)),
    ]
    window = ObservationWindow.unavailable("none", 100.0)
    state, evidence = sglang_loop.build_state_and_evidence(pods, window, {})
    assert state.current == sglang.SglangSettings(mem_fraction_static=0.8)
    assert [r.pod for r in evidence.restarts] == ["llm-5d8f7c-00001"]
    assert evidence.restarts[0].failure is not None and evidence.restarts[0].failure.kind == "runtime_oom"
    failed = {"failedEngineArgs": [{"args": ["--mem-fraction-static", "0.84"], "failure": "runtime_oom"}]}
    state, _ = sglang_loop.build_state_and_evidence(pods, window, failed)
    assert [run.settings.mem_fraction_static for run in state.failed] == [0.84]


def test_no_pod_means_sglangs_defaults_and_no_evidence() -> None:
    state, evidence = sglang_loop.build_state_and_evidence([], ObservationWindow.unavailable("x", 1.0), {})
    assert state.current == sglang.SglangSettings() and evidence.restarts == ()


def test_flags_that_do_not_parse_are_no_settings() -> None:
    view = sglang_pods.build_sglang_pod(pod("llm-5d8f7c-00000", ["--context-length", "long"]))
    assert view.settings is None and view.restart is None
