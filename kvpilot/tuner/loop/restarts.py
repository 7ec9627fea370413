"""Why did the vLLM container stop? Classify a termination from its message, reason and exit code.

Pure text matching against the exact strings vLLM (0.9 - 0.33) and PyTorch print; the
patterns are vLLM facts and live beside the texts they match, in :mod:`kvpilot.tuner.vllm.messages`. The
operator feeds it ``lastState.terminated.{message, reason, exitCode}`` of a container (the
message is the tail of the log when the pod uses ``terminationMessagePolicy:
FallbackToLogsOnError``) and, when that says nothing, the tail of the previous log.

Precedence, most specific first: ``OOMKilled`` from the kubelet (the kernel killed the
process; whatever it printed before is beside the point), then the start-up KV texts
(they name the figures the policy needs), then "free memory on device", then CUDA OOM.
A start-up KV failure is often followed by ``Engine core initialization failed``; that
line alone is ``Other``.
"""

from __future__ import annotations

import re

from kvpilot.tuner.loop.observations import RestartCause, RestartKind
from kvpilot.tuner.vllm import messages


def classify_termination(message: str | None, reason: str | None, exit_code: int | None) -> RestartCause:
    """Classify one container termination. Never raises; unknown texts are ``Other``."""
    text = message or ""
    if reason == "OOMKilled":
        return RestartCause(RestartKind.HOST_OOM_KILLED, detail=f"OOMKilled (exit code {exit_code})")
    for classify in (
        _kv_too_small,
        _no_cache_blocks,
        _mamba_cache_blocks,
        _insufficient_free_memory,
        _cuda_oom,
    ):
        cause = classify(text)
        if cause is not None:
            return cause
    detail = _last_line(text) or f"{reason or 'terminated'} (exit code {exit_code})"
    return RestartCause(RestartKind.OTHER, detail=detail)


def _kv_too_small(text: str) -> RestartCause | None:
    if messages.V1_KV_MARK.search(text):
        line = _line_containing(text, "KV cache is needed")
        return RestartCause(
            RestartKind.KV_CACHE_TOO_SMALL,
            detail=line,
            max_model_len=_int(messages.V1_MAX_SEQ, line),
            estimated_max_model_len=_int(messages.V1_ESTIMATE, text),
            needed_kv_gib=_float(messages.V1_NEEDED, line),
            available_kv_gib=_float(messages.V1_AVAILABLE, line),
        )
    match = messages.V0_KV.search(text)
    if match:
        return RestartCause(
            RestartKind.KV_CACHE_TOO_SMALL,
            detail=_line_containing(text, "stored in KV cache"),
            max_model_len=int(match.group(1)),
            estimated_max_model_len=int(match.group(2)),
        )
    return None


def _no_cache_blocks(text: str) -> RestartCause | None:
    if messages.NO_BLOCKS.search(text):
        return RestartCause(RestartKind.NO_CACHE_BLOCKS, detail=_line_containing(text, "No available memory"))
    return None


def _mamba_cache_blocks(text: str) -> RestartCause | None:
    match = messages.MAMBA_CACHE_BLOCKS.search(text)
    if not match:
        return None
    return RestartCause(
        RestartKind.MAMBA_CACHE_BLOCKS,
        detail=_line_containing(text, "exceeds available Mamba cache blocks"),
        cache_blocks=int(match.group(2)),
    )


def _insufficient_free_memory(text: str) -> RestartCause | None:
    match = messages.FREE_MEMORY.search(text)
    if match:
        return RestartCause(
            RestartKind.INSUFFICIENT_FREE_MEMORY,
            detail=_line_containing(text, "Free memory on device"),
            free_gib=float(match.group(1)),
            total_gib=float(match.group(2)),
        )
    return None


def _cuda_oom(text: str) -> RestartCause | None:
    match = messages.CUDA_OOM.search(text)
    if not match:
        return None
    line = _line_containing(text, match.group(0))
    tried = messages.TRIED.search(text)
    tried_gib = None
    if tried:
        line = f"CUDA out of memory (tried to allocate {tried.group(1)} {tried.group(2)})"
        tried_gib = _gib(tried.group(1), tried.group(2))
    capacity = messages.OOM_CAPACITY.search(text)
    total = free = None
    if capacity:
        total = _gib(capacity.group(1), capacity.group(2))
        free = _gib(capacity.group(3), capacity.group(4))
    return RestartCause(
        RestartKind.CUDA_OOM, detail=line, tried_gib=tried_gib, free_gib=free, total_gib=total
    )


def _gib(value: str, unit: str) -> float:
    return float(value) / (1024.0 if unit == "MiB" else 1.0)


def _line_containing(text: str, needle: str, limit: int = 300) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()[:limit]
    return needle


def _last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def _int(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1)) if match else None


def _float(pattern: re.Pattern[str], text: str) -> float | None:
    match = pattern.search(text)
    return float(match.group(1)) if match else None
