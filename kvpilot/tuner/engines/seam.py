"""The engine seam: what the planner, the loop and the operator ask of an inference engine.

Designed from what vLLM and SGLang really share -- a pod that serves one port with a health path and a
Prometheus exposition, a handful of knobs with the same meaning (context, concurrent sequences, tokens
per prefill step, the memory share, the KV dtype, tensor parallelism), the same few gauges under other
names (KV usage, running, queued, preemptions), and failure texts that say which way the memory share
must move. What they do not share stays with each engine: how memory is budgeted (vLLM's
``--gpu-memory-utilization`` caps everything the engine allocates; SGLang's ``--mem-fraction-static``
covers only weights + KV pool), so the seam has no memory model in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

EngineKind = Literal["vLLM", "SGLang", "TGI"]
KINDS: tuple[EngineKind, ...] = ("vLLM", "SGLang", "TGI")

FailureKind = Literal["start_memory_short", "start_oom", "runtime_oom", "kv_pressure"]


@dataclass(frozen=True)
class Serving:
    """How the engine's pod serves."""

    container_name: str
    command: tuple[str, ...]
    port: int
    health_path: str
    metrics_path: str
    metrics_args: tuple[str, ...]
    """Flags the engine needs to expose metrics at all (SGLang: ``--enable-metrics``; vLLM: none)."""


@dataclass(frozen=True)
class MetricSeries:
    """The series the loop reads, by shared meaning."""

    kv_usage: str | None
    """A gauge of KV capacity in use, 0-1 (``None``: the engine exports none)."""
    kv_capacity_tokens: str | None
    """A gauge of the KV pool's size in tokens (``None``: not a plain gauge, e.g. vLLM's info labels)."""
    running: str
    queued: str
    preemptions: str | None
    """A counter of requests evicted for KV room (vLLM: preemptions; SGLang: retractions; ``None``: the
    engine never evicts)."""
    ttft: str
    itl: str
    kv_used_tokens: str | None = None
    """A gauge of KV tokens in use, for an engine with no usage ratio: ``kv_used_tokens /
    kv_capacity_tokens`` is its KV usage (TGI's)."""
    prompt_tokens: str | None = None
    """A histogram of requests' prompt lengths in tokens, read as its ``_sum`` over its ``_count`` (the
    window's mean prompt; ``None``: the loop reads none for this engine)."""
    rejected: str | None = None
    """A counter (a selector, with its labels) of requests refused at the engine's admission limit, read as
    its ``rate()``, the refusals per second (TGI's 429 "Model is overloaded" beyond
    ``--max-concurrent-requests``; ``None``: vLLM and SGLang export none, they queue what they cannot run
    by default)."""


@dataclass(frozen=True)
class Knobs:
    """The flag with each shared meaning."""

    context: str
    sequences: str
    batched_tokens: str
    memory_share: str
    kv_cache_dtype: str
    tensor_parallel: str


@dataclass(frozen=True)
class EngineFailure:
    """A failure read from a container's log."""

    kind: FailureKind
    memory_share_direction: int
    """+1: give the engine a larger memory share (flag raised); -1: a smaller one; 0: not the remedy."""
    text: str
    """The engine's own words (the matching line)."""
    running: int | None = None
    """A run-time OOM: the running requests the engine's own log ties to it (SGLang: the most its batch lines
    showed before it; TGI: the batch that ran out, from the router's span); ``None``: the log does not say.
    The window's samples may miss a batch that fills in seconds after a restart."""
    more_in_log: bool = False
    """The container's whole log may say more than the text read (SGLang's batch lines before an OOM fall out
    of a termination message's last 2 KiB behind the traceback): the previous log is worth reading."""


class Engine(Protocol):
    """One inference engine at one release, as the tuner asks it."""

    @property
    def kind(self) -> EngineKind: ...

    @property
    def release(self) -> str: ...

    @property
    def serving(self) -> Serving: ...

    @property
    def metrics(self) -> MetricSeries: ...

    @property
    def knobs(self) -> Knobs: ...

    def classify_failure(self, log: str) -> EngineFailure | None:
        """The failure ``log`` shows, ``None`` when it shows none."""
        ...
