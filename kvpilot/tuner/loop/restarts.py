"""Why did the vLLM container stop? Classify a termination from its message, reason and exit code.

Pure text matching against the exact strings vLLM (0.9 - 0.33) and PyTorch print; the
patterns are vLLM facts and live beside the texts they match, in :mod:`kvpilot.tuner.vllm.messages`. The
operator feeds it ``lastState.terminated.{message, reason, exitCode}`` of a container (the
message is the tail of the log when the pod uses ``terminationMessagePolicy:
FallbackToLogsOnError``) and, when that says nothing, the tail of the previous log.

Precedence, most specific first: ``OOMKilled`` from the kubelet (the kernel killed the
process; whatever it printed before is beside the point), then the start-up KV texts
(they name the figures the policy needs), then "free memory on device" (the CPU backend's
"Available memory on node" too), then CUDA OOM, then arguments vLLM refused before starting
(``InvalidEngineArgs``: argparse, a config's validation, ``max_model_len`` beyond the model, and a
``--load-format runai_streamer`` on an image without ``runai-model-streamer``), then a
group's peer that stopped answering (``DistributedTimeout``: NCCL's watchdog, vLLM's RPC or barrier timing
out, a worker process that died; a worker's timeout is not a KV failure).

A real start-up failure ends with the API server's own traceback and ``Engine core
initialization failed. See root cause above``; the root cause sits ~60 lines up, outside the
80 lines / 2 KiB of a termination message. That line alone is ``Other``, and its detail says
the cause is further up (the operator then reads the previous log). Anything else that is
``Other`` names its root-cause line (the last ``...Error:`` line), not the log's last line.
"""

from __future__ import annotations

import re

from kvpilot.tuner import vllm
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
        _missing_streamer,
        _invalid_engine_args,
        _distributed_timeout,
    ):
        cause = classify(text)
        if cause is not None:
            return cause
    detail = _root_cause(text) or f"{reason or 'terminated'} (exit code {exit_code})"
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
    if messages.CPU_KV_ALLOCATION.search(text):
        detail = _line_containing(text, "on kv cache allocation")
        return RestartCause(RestartKind.NO_CACHE_BLOCKS, detail=detail)
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
    match = messages.FREE_MEMORY.search(text) or messages.CPU_FREE_MEMORY.search(text)
    if match:
        return RestartCause(
            RestartKind.INSUFFICIENT_FREE_MEMORY,
            detail=_line_containing(text, match.group(0)[:20]),
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


def _missing_streamer(text: str) -> RestartCause | None:
    """The streaming loader asked of an image without its package: the command, not the memory."""
    detail = vllm.describe_missing_streamer(text)
    return None if detail is None else RestartCause(RestartKind.INVALID_ENGINE_ARGS, detail=detail)


def _invalid_engine_args(text: str) -> RestartCause | None:
    """Arguments vLLM refused before its engine started; the detail names the argument and vLLM's words."""
    long_len = messages.LONG_MAX_LEN.search(text)
    if long_len:
        detail = (
            f"max_model_len {long_len.group(1)} is beyond the model's {long_len.group(2)} "
            f"({long_len.group(3)}): {_line_containing(text, long_len.group(0))}"
        )
        return RestartCause(RestartKind.INVALID_ENGINE_ARGS, detail=detail[:300])
    arg = _last_match(messages.ARG_ERROR, text)
    if arg is not None:
        return RestartCause(RestartKind.INVALID_ENGINE_ARGS, detail=f"{arg.group(1)}: {arg.group(2)}"[:300])
    validation = _last_match(messages.CONFIG_VALIDATION, text)
    if validation is not None:
        return RestartCause(RestartKind.INVALID_ENGINE_ARGS, detail=_validation_detail(text, validation))
    return None


def _distributed_timeout(text: str) -> RestartCause | None:
    """A peer of the group failed (last, so a rank's own memory error found above wins over its timeout)."""
    match = _last_match(messages.DISTRIBUTED_TIMEOUT, text)
    if match is None:
        return None
    return RestartCause(RestartKind.DISTRIBUTED_TIMEOUT, detail=_line_containing(text, match.group(0)))


def _validation_detail(text: str, match: re.Match[str]) -> str:
    """pydantic's "N validation errors for XConfig" and the field / message pairs after it, on one line."""
    after = [line.strip() for line in text[match.end() :].splitlines()[1:]]
    pairs = []
    for field, said in zip(after, after[1:], strict=False):
        if field and " " not in field and said and not said.startswith("For further information"):
            pairs.append(f"{field}: {said.split(' [type=')[0]}")
    return f"{match.group(2)} refused: {'; '.join(pairs) or match.group(0)}"[:300]


def _root_cause(text: str) -> str:
    """The line that says why, for an ``Other``: the last ``...Error: ...`` line that is not the API
    server's "Engine core initialization failed" (which only points up the log); with nothing but that
    line, a detail saying the cause is further up; else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [x for x in lines if _ERROR_LINE.match(x) and not messages.ENGINE_INIT_FAILED.search(x)]
    if errors:
        return messages.LOG_PREFIX.sub("", errors[-1])[:300]
    if messages.ENGINE_INIT_FAILED.search(text):
        return (
            "vLLM's engine core failed to start (\"Engine core initialization failed. See root cause "
            'above"); its root cause is further up the log than this text holds'
        )
    return _last_line(text)


_ERROR_LINE = re.compile(r"^(?:\([\w-]+ pid=\d+\) ERROR .*\] )?[\w.]*(?:Error|Exception): \S")


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _gib(value: str, unit: str) -> float:
    return float(value) / (1024.0 if unit == "MiB" else 1.0)


def _line_containing(text: str, needle: str, limit: int = 300) -> str:
    """The first line with ``needle``, without vLLM's logger prefix."""
    for line in text.splitlines():
        if needle in line:
            return messages.LOG_PREFIX.sub("", line.strip())[:limit]
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
