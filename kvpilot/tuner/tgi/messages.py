"""What TGI prints when it will not start or refuses a request: the texts, and their parser.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). At ``v3.3.7``:
``server/text_generation_server/models/flash_causal_lm.py`` lines 1551-1552 (the warm-up prefill does not
fit), ``backends/v3/src/lib.rs`` line 181 (the inferred batch cannot hold one request:
``V3Error::NotEnoughMemory``, whose Display text is :func:`max_total_tokens_error`; the router's ``main``
returns it, so the log shows Rust's Debug form of it, ``Error: Backend(NotEnoughMemory(N))``, which
:func:`classify_log` reads too),
``router/src/infer/mod.rs`` line 412 (429 beyond ``--max-concurrent-requests``). A shard that runs out of
memory while serving dies with PyTorch's ``torch.OutOfMemoryError`` ("CUDA out of memory"): the warm-up
re-raises it as the prefill text above (``flash_causal_lm.py`` line 1549); at run time the shard's
interceptor logs "Method Decode encountered an error." with the traceback, shuts the shard down and answers
the router with the error's text (``server/text_generation_server/interceptor.py`` lines 25-41), which the
router logs as ``Server error: ...`` (``backends/v3/src/client/mod.rs`` lines 42-46) inside the spans of the
batch that failed: ``batch{batch_size=N}:decode:decode{size=N}:...`` (``backends/v3/src/backend.rs`` lines
272-286, ``client/sharded_client.rs`` line 175): :func:`classify_log` reads N, the requests of the batch
that ran out of memory (verbatim in ``tests/data/tgi/router_errors_v3.3.7.rs.txt``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["prefill_too_large", "total_tokens_too_large", "cuda_oom", "overloaded"]

OVERLOADED = "Model is overloaded"
CUDA_OOM = "CUDA out of memory"
"""PyTorch's ``torch.OutOfMemoryError`` text, from a shard out of memory while serving."""


@dataclass(frozen=True)
class TgiFailure:
    kind: FailureKind
    tokens: int | None
    """The token count the text names (``None`` for ``cuda_oom`` and ``overloaded``)."""
    line: str
    batch_size: int | None = None
    """``cuda_oom``: the requests of the batch that ran out of memory, from the router's span on its error
    line (``None``: the log has no such line)."""


def prefill_tokens_error(num_tokens: int) -> str:
    return (
        f"Not enough memory to handle {num_tokens} prefill tokens. "
        "You need to decrease `--max-batch-prefill-tokens`"
    )


def batch_oom_error_line(batch_size: int, error: str) -> str:
    """The router's error line, without its timestamp and level, for a decode batch of ``batch_size``
    requests whose shard answered ``error`` (the spans of ``backend.rs`` lines 272-286 and the two clients'
    ``decode``; the target and place of ``client/mod.rs`` line 45)."""
    size = f"{{size={batch_size}}}"
    return (
        f"batch{{batch_size={batch_size}}}:decode:decode{size}:decode{size}: "
        f"text_generation_router_v3::client: backends/v3/src/client/mod.rs:45: Server error: {error}"
    )


def max_total_tokens_error(max_total_tokens: int) -> str:
    return f"Not enough memory to handle `max_total_tokens={max_total_tokens}`"


_PREFILL = re.compile(r"Not enough memory to handle (\d+) prefill tokens")
_TOTAL = re.compile(r"Not enough memory to handle `max_total_tokens=(\d+)`")
_BATCH_OOM = re.compile(r"\bbatch\{batch_size=(\d+)\}[^\n]*Server error: [^\n]*" + re.escape(CUDA_OOM))
"""The router's error line for a batch whose forward ran out of memory, in the batch's span."""
_TOTAL_DEBUG = re.compile(r"\bNotEnoughMemory\((\d+)\)")
"""``V3Error::NotEnoughMemory(max_total_tokens)`` as ``main`` returning it prints it (``{:?}``)."""


def _line_at(log: str, start: int) -> str:
    begin = log.rfind("\n", 0, start) + 1
    end = log.find("\n", start)
    return log[begin : end if end >= 0 else len(log)].strip()


def classify_log(log: str) -> TgiFailure | None:
    """The failure a launcher or router log shows, the start-up texts first (the warm-up's prefill text
    carries the OOM it caught); ``None`` when it shows none."""
    if found := _PREFILL.search(log):
        return TgiFailure("prefill_too_large", int(found.group(1)), _line_at(log, found.start()))
    if found := _TOTAL.search(log) or _TOTAL_DEBUG.search(log):
        return TgiFailure("total_tokens_too_large", int(found.group(1)), _line_at(log, found.start()))
    if (at := log.find(CUDA_OOM)) >= 0:
        sizes = [int(m.group(1)) for m in _BATCH_OOM.finditer(log)]
        return TgiFailure("cuda_oom", None, _line_at(log, at), max(sizes) if sizes else None)
    if (at := log.find(OVERLOADED)) >= 0:
        return TgiFailure("overloaded", None, _line_at(log, at))
    return None
