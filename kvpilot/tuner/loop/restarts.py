"""Why did the vLLM container stop? Classify a termination from its message, reason and exit code.

Pure text matching against the exact strings vLLM (0.9 - 0.33) and PyTorch print; see
``vllm_reference.md`` section 1.6 (start-up errors) and section 6 (OOM signatures). The
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

_INT = r"(\d+)"
_NUM = r"([0-9]+(?:\.[0-9]+)?)"

# V1, 0.9 - 0.33 (``models's`` before ~0.25, ``model's`` after): one request does not fit.
_V1_KV_MARK = re.compile(r"KV cache is needed, which is larger than the available KV cache memory")
_V1_MAX_SEQ = re.compile(r"max seq len \(" + _INT + r"\)")
_V1_NEEDED = re.compile(r"\(" + _NUM + r" GiB KV cache is needed")
_V1_AVAILABLE = re.compile(r"available KV cache memory \(" + _NUM + r" GiB\)")
_V1_ESTIMATE = re.compile(r"estimated maximum model length is " + _INT)
# V0 engine (<= 0.10): "The model's max seq len (L) is larger than the maximum number of
# tokens that can be stored in KV cache (N)."
_V0_KV = re.compile(
    r"max seq len \("
    + _INT
    + r"\) is larger than the maximum number of tokens that can be stored in KV cache \("
    + _INT
    + r"\)"
)
_NO_BLOCKS = re.compile(r"No available memory for the cache blocks")
# "Free memory on device (F/T GiB) on startup is less than desired GPU memory utilization"
# (0.20+ inserts the device name: "on device cuda:0 (F/T GiB)").
_FREE_MEMORY = re.compile(
    r"Free memory on device(?: \S+)? \(" + _NUM + r"/" + _NUM + r" GiB\) on startup is less than"
)
_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
    r"Cuda failure '?out of memory'?|OutOfMemoryError",
    re.IGNORECASE,
)
_TRIED = re.compile(r"Tried to allocate " + _NUM + r" ([GM]iB)")


def classify_termination(message: str | None, reason: str | None, exit_code: int | None) -> RestartCause:
    """Classify one container termination. Never raises; unknown texts are ``Other``."""
    text = message or ""
    if reason == "OOMKilled":
        return RestartCause(RestartKind.HOST_OOM_KILLED, detail=f"OOMKilled (exit code {exit_code})")
    for classify in (_kv_too_small, _no_cache_blocks, _insufficient_free_memory, _cuda_oom):
        cause = classify(text)
        if cause is not None:
            return cause
    detail = _last_line(text) or f"{reason or 'terminated'} (exit code {exit_code})"
    return RestartCause(RestartKind.OTHER, detail=detail)


def _kv_too_small(text: str) -> RestartCause | None:
    if _V1_KV_MARK.search(text):
        line = _line_containing(text, "KV cache is needed")
        return RestartCause(
            RestartKind.KV_CACHE_TOO_SMALL,
            detail=line,
            max_model_len=_int(_V1_MAX_SEQ, line),
            estimated_max_model_len=_int(_V1_ESTIMATE, text),
            needed_kv_gib=_float(_V1_NEEDED, line),
            available_kv_gib=_float(_V1_AVAILABLE, line),
        )
    match = _V0_KV.search(text)
    if match:
        return RestartCause(
            RestartKind.KV_CACHE_TOO_SMALL,
            detail=_line_containing(text, "stored in KV cache"),
            max_model_len=int(match.group(1)),
            estimated_max_model_len=int(match.group(2)),
        )
    return None


def _no_cache_blocks(text: str) -> RestartCause | None:
    if _NO_BLOCKS.search(text):
        return RestartCause(RestartKind.NO_CACHE_BLOCKS, detail=_line_containing(text, "No available memory"))
    return None


def _insufficient_free_memory(text: str) -> RestartCause | None:
    match = _FREE_MEMORY.search(text)
    if match:
        return RestartCause(
            RestartKind.INSUFFICIENT_FREE_MEMORY,
            detail=_line_containing(text, "Free memory on device"),
            free_gib=float(match.group(1)),
            total_gib=float(match.group(2)),
        )
    return None


def _cuda_oom(text: str) -> RestartCause | None:
    match = _CUDA_OOM.search(text)
    if not match:
        return None
    line = _line_containing(text, match.group(0))
    tried = _TRIED.search(text)
    if tried:
        line = f"CUDA out of memory (tried to allocate {tried.group(1)} {tried.group(2)})"
    return RestartCause(RestartKind.CUDA_OOM, detail=line)


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
