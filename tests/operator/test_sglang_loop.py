"""The SGLang loop's reading of its pods (:mod:`kvpilot.operator.inferenceservice.sglang_loop`): the settings
most live pods run are the current ones, and only their restarts are evidence against them; and of its
series, where the prompt lengths reach the latency rule."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from closed_loop_fakes import pod

from kvpilot.operator.clients import prometheus
from kvpilot.operator.inferenceservice import sglang_loop
from kvpilot.operator.pods import sglang_pods
from kvpilot.tuner import gpus, sglang
from kvpilot.tuner.engines import SglangEngine
from kvpilot.tuner.loop import (
    Action,
    ObservationWindow,
    SglangContext,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
    compute_sglang_decision,
    engine_latency,
    gpu_memory,
)
from kvpilot.tuner.model import build_model_spec, lookup_model_config

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


def test_an_oom_whose_message_lost_the_batch_lines_reads_the_previous_log_for_them() -> None:
    """kubelet keeps a termination message's last 2 KiB: SGLang's traceback pushes the batch lines before
    it out, so the previous log is read, and the running requests it shows reach the failed run."""
    message = pod("llm-5d8f7c-00001", NEW, restarts=1, message=OOM, finished=50.0)
    first = sglang_pods.build_sglang_pod(message)
    assert first.needs_log and first.restart is not None and first.restart.failure is not None
    assert first.restart.failure.kind == "runtime_oom" and first.restart.failure.running is None
    log = "\n".join(["[TP0] " + sglang.decode_batch_line(n, 900 * n, 0.4) for n in (60, 97)] + [OOM])
    read = sglang_pods.build_sglang_pod(message, log)
    assert not read.needs_log and read.restart is not None and read.restart.failure is not None
    assert read.restart.failure.running == 97
    retraction = pod("llm-5d8f7c-00002", NEW, restarts=1, message=sglang.kv_pool_full_warning(3, 10))
    assert not sglang_pods.build_sglang_pod(retraction).needs_log  # nothing more to read for it


def test_no_pod_means_sglangs_defaults_and_no_evidence() -> None:
    state, evidence = sglang_loop.build_state_and_evidence([], ObservationWindow.unavailable("x", 1.0), {})
    assert state.current == sglang.SglangSettings() and evidence.restarts == ()


def test_flags_that_do_not_parse_are_no_settings() -> None:
    view = sglang_pods.build_sglang_pod(pod("llm-5d8f7c-00000", ["--context-length", "long"]))
    assert view.settings is None and view.restart is None


NOW = 100_000.0
POD = ("ns1", "llm-5d8f7c-00000")


def _answers(prompt_mean: float, finished: float = 4.0, free_gib: float | None = None) -> ObservationWindow:
    """SGLang's series as Prometheus answers the tick's queries (one pod, 10 steps of 30 s: the token usage
    0.6, 120 running, no queue, the ITL p95 80 ms, ``finished`` requests a second of ``prompt_mean`` tokens;
    with ``free_gib``, dcgm-exporter's framebuffer of an 80 GiB GPU), read into the service's window by the
    operator's client."""
    series = SglangEngine().metrics
    queries = prometheus.build_queries(300, series=series)
    labels = {"namespace": POD[0], "pod": POD[1]}
    level = {series.kv_usage: 0.6, series.running: 120.0, series.queued: 0.0, f"{series.itl}_bucket": 0.08}
    if free_gib is not None:  # the query's answer, already in GiB (``/ 1024`` is Prometheus')
        level |= {prometheus.FB_FREE: free_gib, prometheus.FB_USED: 80.0 - free_gib}
    ranged: dict[str, list[dict[str, Any]]] = {}
    for key, query in queries.ranged.items():
        value = next((v for name, v in level.items() if f"({name})" in query or f"({name}[" in query), None)
        points = [[NOW - 30 * (9 - i), str(value)] for i in range(10)]
        ranged[key] = [{"metric": labels, "values": points}] if value is not None else []
    instant: dict[str, list[dict[str, Any]]] = {}
    for key, query in queries.instant.items():
        answers = {
            "timestamp(": NOW,
            f"{series.prompt_tokens}_sum[": finished * prompt_mean,
            f"{series.prompt_tokens}_count[": finished,
        }
        found = [v for fragment, v in answers.items() if fragment in query]
        instant[key] = [{"metric": labels, "value": [NOW, str(found[0])]}] if found else []
    snapshot = prometheus.build_fleet_snapshot(ranged, instant, NOW, kv_series=series.kv_usage or "")
    return prometheus.build_service_window(snapshot, POD[0], [POD[1]], 300, 30)


@pytest.mark.parametrize("prompt", [4000.0, 1000.0])
def test_a_missed_itl_objective_in_sglangs_series_cuts_the_running_requests_for_any_prompt(
    prompt: float,
) -> None:
    """SGLang's series as the operator reads them (the prompt lengths too): a missed ITL objective cuts
    ``--max-running-requests`` to 120 x 0.06 / 0.08 and leaves the 8192-token chunk, with 4000-token prompts
    as with 1000-token ones. SGLang runs a prefill batch alone (``Scheduler.get_next_batch_to_run``), so a
    smaller chunk does not shorten what the decodes wait for (vLLM's rule halves it for long prompts)."""
    chunk, running = 8192, 90
    window = _answers(prompt)
    assert window.available and len(window.samples) == 10
    assert window.prompt_tokens is not None and window.prompt_tokens.mean == prompt
    current = sglang.SglangSettings(context_length=8192, max_running_requests=128, chunked_prefill_size=8192)
    memory = SglangMemory(
        gpus.lookup_gpu("H100-SXM"), build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    )
    decision = compute_sglang_decision(
        SglangLoopState(current),
        SglangEvidence(window, ready=True),
        SglangContext(memory, itl_p95_seconds=0.06),
        NOW,
    )
    assert (decision.action, decision.trigger) == (Action.RETUNE, engine_latency.LATENCY_SLO)
    assert decision.settings.chunked_prefill_size == chunk
    assert decision.settings.max_running_requests == running


def test_dcgm_exporters_framebuffer_reaches_sglangs_rules_as_the_operator_reads_it() -> None:
    """The tick's dcgm-exporter series for an SGLang pod land in its window and its evidence
    (:func:`sglang_loop.build_state_and_evidence`), and 0.5 GiB free of 80 while serving lowers
    ``--mem-fraction-static`` ahead of a CUDA OOM (``GpuMemoryPressure``), not marked failed (issue 29)."""
    window = _answers(1000.0, free_gib=0.5)
    assert [(s.gpu_memory_free_gib, s.gpu_memory_used_gib) for s in window.samples] == [(0.5, 79.5)] * 10
    views = [sglang_pods.build_sglang_pod(pod(POD[1], OLD))]
    state, evidence = sglang_loop.build_state_and_evidence(views, window, {})
    assert evidence.window.samples[-1].gpu_memory_free_gib == 0.5
    memory = SglangMemory(
        gpus.lookup_gpu("H100-SXM"), build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    )
    decision = compute_sglang_decision(
        state, dataclasses.replace(evidence, ready=True), SglangContext(memory), NOW
    )
    assert (decision.action, decision.trigger) == (Action.RETUNE, gpu_memory.GPU_MEMORY_PRESSURE)
    assert (decision.settings.mem_fraction_static or 0.84) < 0.84 and decision.failed is None
    assert "(dcgm-exporter): below 1.60 GiB now, ahead of a CUDA OOM" in decision.reason
