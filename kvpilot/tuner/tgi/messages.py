"""What TGI prints when it will not start or refuses a request: the texts, and their parser.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). At ``v3.3.7``:
``server/text_generation_server/models/flash_causal_lm.py`` lines 1551-1552 (the warm-up prefill does not
fit), ``backends/v3/src/lib.rs`` line 181 (the inferred batch cannot hold one request:
``V3Error::NotEnoughMemory``, whose Display text is :func:`max_total_tokens_error`; the router's ``main``
returns it, so the log shows Rust's Debug form of it, ``Error: Backend(NotEnoughMemory(N))``, which
:func:`classify_log` reads too),
``router/src/infer/mod.rs`` line 412 (429 beyond ``--max-concurrent-requests``). A shard that runs out of
memory while serving dies with PyTorch's ``torch.OutOfMemoryError`` ("CUDA out of memory"): TGI catches it
only in the warm-up (``flash_causal_lm.py`` line 1549, re-raised as the prefill text above), so at run time
its traceback is what the launcher relays from the shard's standard error when it exits.
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


def prefill_tokens_error(num_tokens: int) -> str:
    return (
        f"Not enough memory to handle {num_tokens} prefill tokens. "
        "You need to decrease `--max-batch-prefill-tokens`"
    )


def max_total_tokens_error(max_total_tokens: int) -> str:
    return f"Not enough memory to handle `max_total_tokens={max_total_tokens}`"


_PREFILL = re.compile(r"Not enough memory to handle (\d+) prefill tokens")
_TOTAL = re.compile(r"Not enough memory to handle `max_total_tokens=(\d+)`")
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
        return TgiFailure("cuda_oom", None, _line_at(log, at))
    if (at := log.find(OVERLOADED)) >= 0:
        return TgiFailure("overloaded", None, _line_at(log, at))
    return None
