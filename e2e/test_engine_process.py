"""The real engine's launcher (``e2e/vllm_cpu/engine_process.py``) without starting vLLM: the flags a pod's
rendered args become, kubelet's termination message, the stop by process group, a missing venv."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from e2e.fleet.testing import H100_8B
from e2e.fleet.truth import EngineArgs
from e2e.vllm_cpu.engine_process import (
    EngineLaunch,
    EngineMissingError,
    EngineProcess,
    build_engine_launch,
    cpu_block_size,
    engine_python,
    read_tail,
)

RENDERED = [
    "vllm",
    "serve",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "64",
    "--gpu-memory-utilization",
    "0.93",
    "--tensor-parallel-size",
    "1",
    "--max-num-batched-tokens",
    "4096",
]


def _flags(launch: EngineLaunch) -> dict[str, str]:
    argv = list(launch.argv)
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)}


def test_a_rendered_pod_becomes_the_truths_kv_pool_in_cpu_blocks(tmp_path: Path) -> None:
    args = EngineArgs.parse(RENDERED)
    launch = build_engine_launch(args, H100_8B, port=18000, model_dir=tmp_path)
    flags = _flags(launch)
    assert flags["--max-model-len"] == "8192" and flags["--max-num-seqs"] == "64"
    assert flags["--gpu-memory-utilization"] == "0.93" and flags["--max-num-batched-tokens"] == "4096"
    assert flags["--served-model-name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert flags["--model"] == str(tmp_path) and flags["--port"] == "18000"
    assert "--tensor-parallel-size" not in flags and "--enforce-eager" in launch.argv
    # the truth's 16-token blocks as 32-token ones: the same tokens (to a block), exactly that many bytes
    assert flags["--block-size"] == "32" and launch.block_size == 32
    assert launch.num_blocks == H100_8B.kv_tokens(args) // 32 > 0
    assert int(flags["--num-gpu-blocks-override"]) == launch.num_blocks
    assert int(flags["--kv-cache-memory-bytes"]) == launch.num_blocks * 32 * 4096
    assert launch.env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    fp8_args = dataclasses.replace(args, kv_cache_dtype="fp8")
    fp8 = build_engine_launch(fp8_args, H100_8B, port=1, model_dir=tmp_path)
    assert _flags(fp8)["--kv-cache-dtype"] == "fp8"
    assert (
        fp8.num_blocks
        == H100_8B.kv_tokens(fp8_args) // 32
        in (2 * launch.num_blocks, 2 * launch.num_blocks + 1)
    )
    assert int(_flags(fp8)["--kv-cache-memory-bytes"]) == fp8.num_blocks * 32 * 2048
    assert [cpu_block_size(b) for b in (16, 32, 48, 128)] == [32, 32, 64, 128]


def test_a_missing_engine_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(EngineMissingError, match="make e2e-engine"):
        engine_python(tmp_path / "no-venv")


def test_termination_message_is_kubelets_log_fallback(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text("".join(f"line {i:03d} " + "x" * 10 + "\n" for i in range(200)))
    tail = read_tail(log, 80, 2048)
    assert tail.endswith("line 199 xxxxxxxxxx") and "line 120" in tail and "line 119" not in tail
    long = tmp_path / "1.log"
    long.write_text("".join(f"{i} " + "y" * 100 + "\n" for i in range(100)))
    assert len(read_tail(long, 80, 2048).encode()) == 2048
    assert read_tail(tmp_path / "missing.log", 80) == ""


def _fake_engine(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/bash\n{body}\n")
    script.chmod(0o755)
    return script


def test_exit_code_and_log_of_the_process(tmp_path: Path) -> None:
    python = _fake_engine(tmp_path, 'for i in $(seq 1 100); do echo "row $i"; done; echo boom >&2; exit 3')
    launch = EngineLaunch(("--port", "1"), {}, 1, 32, 2048)
    proc = EngineProcess(launch, tmp_path / "logs" / "0.log", python=python)
    deadline = time.monotonic() + 30
    while proc.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.exit_code() == 3
    message = proc.termination_message()
    assert message.splitlines()[-1] == "boom" and message.splitlines()[0] == "row 22"
    assert not proc.healthy(timeout=0.5)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    python = _fake_engine(tmp_path, f"sleep 300 & echo $! > {tmp_path}/child; wait")
    proc = EngineProcess(EngineLaunch(("--port", "1"), {}, 1, 32, 2048), tmp_path / "0.log", python=python)
    child_file = tmp_path / "child"
    deadline = time.monotonic() + 30
    while not child_file.exists() or not child_file.read_text().strip():
        assert time.monotonic() < deadline, "the fake engine never started its child"
        time.sleep(0.1)
    child = int(child_file.read_text())
    assert os.getpgid(child) == proc.pid  # the engine's children share its group
    proc.stop(grace_s=5)
    assert proc.exit_code() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
    return bool(state.strip()) and not state.strip().startswith("Z")
