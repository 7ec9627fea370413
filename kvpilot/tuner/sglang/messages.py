"""What SGLang prints when it will not start or runs short of memory: the texts, and their parsers.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). Format and parse sit side by side
(``tests/tuner/test_sglang_facts.py`` round-trips each text through :func:`classify_log`). The meaning of
``--mem-fraction-static`` is inverted between start-up and run time: the fraction is (weights + KV pool) /
GPU memory, so a start that leaves no KV pool asks to *raise* it, while an out-of-memory once serving (or
while capturing CUDA graphs, which live outside it) asks to *lower* it. Texts of SGLang 0.5.23:
``model_executor/pool_configurator.py`` lines 96-98, ``mem_cache/kv_cache_configurator.py`` lines
3050-3058, ``model_executor/runner/decode_cuda_graph_runner.py`` line 603 with
``runner_backend_utils/__init__.py`` lines 14-21, ``managers/scheduler.py`` lines 4525-4530; and
PyTorch's CUDA allocator. The scheduler's batch lines (``managers/scheduler_components/metrics_reporter.py``
lines 753-762 and 963: every prefill batch, and every ``--decode-log-interval`` (40) decode steps) say how
many requests ran before an out-of-memory while serving: :func:`running_before_oom`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["no_kv_pool", "weights_exceed_static", "graph_capture_oom", "kv_pool_full", "cuda_oom"]

RAISE: Literal[1] = 1
LOWER: Literal[-1] = -1


@dataclass(frozen=True)
class SglangFailure:
    """One failure found in a log: what it is, which way ``--mem-fraction-static`` must move, and the
    numbers the text carries."""

    kind: FailureKind
    fraction_direction: int
    """+1: raise ``--mem-fraction-static``; -1: lower it; 0: the fraction is not the remedy."""
    at_start: bool
    mem_fraction_static: float | None = None
    """The fraction the engine ran with, where the text says."""
    minimum_fraction: float | None = None
    """The smallest fraction SGLang suggests (``weights_exceed_static`` only)."""
    retracted_requests: int | None = None
    running_requests: int | None = None
    """A CUDA OOM while serving: the most requests the scheduler's batch lines before it say ran
    (:func:`running_before_oom`; ``None``: no such line)."""
    line: str = ""
    """The log line that carries it (the first such line)."""


def no_kv_pool_error(mem_fraction_static: float | None) -> str:
    """``MemoryPoolConfig.__post_init__``: the profiled pool holds no token."""
    text = "Not enough memory. Please try to increase --mem-fraction-static."
    if mem_fraction_static is not None:
        text += f" Current value: mem_fraction_static={mem_fraction_static}"
    return text


def weights_exceed_static_error(mem_fraction_static: float, minimum: float) -> str:
    """``_profile_available_bytes``: the loaded weights alone exceed the static budget."""
    suggested = math.ceil(minimum * 1000) / 1000
    return (
        f"Loaded weights leave no GPU memory for the KV cache under "
        f"--mem-fraction-static={mem_fraction_static}. "
        f"Raise --mem-fraction-static above {suggested:.3f} "
        f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
        f"decoding, draft weights are now counted."
    )


def kv_pool_full_warning(retracted: int, new_tokens_gained: int) -> str:
    """The scheduler's warning when decode retracts requests (SGLang's preemption)."""
    return (
        "KV cache pool is full. Retract requests. "
        f"#retracted_reqs: {retracted}, #new_tokens_gained: {new_tokens_gained}"
    )


def decode_batch_line(running: int, used_tokens: int, token_usage: float) -> str:
    """The scheduler's decode-batch line (``metrics_reporter.py`` line 963, with
    ``pool_stats_observer.py``'s usage part for a plain pool; the throughput fields that follow it are
    left out: the parser reads only ``#running-req``)."""
    return f"Decode batch, #running-req: {running}, #token: {used_tokens}, token usage: {token_usage:.2f}, "


GRAPH_CAPTURE_FAILED = "Capture cuda graph failed: "
CUDA_OOM = "CUDA out of memory"
"""PyTorch's ``torch.OutOfMemoryError`` text."""

_NO_KV_POOL = re.compile(
    r"Not enough memory\. Please try to increase --mem-fraction-static\."
    r"(?: Current value: mem_fraction_static=(?P<fraction>[0-9.]+))?"
)
_WEIGHTS = re.compile(
    r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(?P<fraction>[0-9.]+)\."
    r".*?minimum viable = 1 - available/pre = (?P<minimum>-?[0-9.]+)\)"
)
_RUNNING = re.compile(r"(?:Prefill|Decode) batch(?: \[\d+\])?[.,] [^\n]*?#running-req: (?P<n>\d+)")
_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<n>\d+)")


def _fraction(match: re.Match[str]) -> float | None:
    text = match.group("fraction")
    return float(text.rstrip(".")) if text else None


def _line_at(log: str, start: int) -> str:
    begin = log.rfind("\n", 0, start) + 1
    end = log.find("\n", start)
    return log[begin : end if end >= 0 else len(log)].strip()


def classify_log(log: str) -> SglangFailure | None:
    """The failure a container log shows, start-up failures first; ``None`` when it shows none."""
    if found := _WEIGHTS.search(log):
        minimum = float(found.group("minimum"))
        return SglangFailure(
            "weights_exceed_static", RAISE, True, _fraction(found), minimum, line=_line_at(log, found.start())
        )
    if found := _NO_KV_POOL.search(log):
        return SglangFailure("no_kv_pool", RAISE, True, _fraction(found), line=_line_at(log, found.start()))
    if (at := log.find(GRAPH_CAPTURE_FAILED)) >= 0:
        return SglangFailure("graph_capture_oom", LOWER, True, line=_line_at(log, at))
    if (at := log.find(CUDA_OOM)) >= 0:
        running = running_before_oom(log[:at])
        return SglangFailure("cuda_oom", LOWER, False, running_requests=running, line=_line_at(log, at))
    retractions = list(_RETRACT.finditer(log))
    if retractions:
        total = sum(int(m.group("n")) for m in retractions)
        return SglangFailure(
            "kv_pool_full", 0, False, retracted_requests=total, line=_line_at(log, retractions[0].start())
        )
    return None


def running_before_oom(log: str) -> int | None:
    """The most requests the scheduler's batch lines in ``log`` say ran (``#running-req``: a decode batch's
    size, or the running batch a prefill joins), ``None`` when it has none. Lines are logged every prefill and
    every 40th decode step, so the batch that ran out of memory held at least this many: a raise that stays
    below it stays below the failure."""
    counts = [int(m.group("n")) for m in _RUNNING.finditer(log)]
    return max(counts) if counts else None
