"""``kvpilot diagnose``: what a vLLM log says happened, in the terms of the memory model, and what to change.

Pure: text in, data out (the CLI reads the file, stdin or a pod's previous log). :func:`read_log` takes
the figures vLLM printed (the patterns are vLLM facts: :mod:`kvpilot.tuner.vllm.log_lines`, and the
error texts :mod:`kvpilot.tuner.vllm.messages` through the crash classifier
:func:`kvpilot.tuner.loop.restarts.classify_termination`); :func:`compute_diagnosis` turns them into
findings; :func:`format_diagnosis` prints them.

Each start-up in the log (a log of several restarts holds several) is one :class:`Startup`: the four
terms the memory model splits a GPU into (weights, activation peak, KV cache, CUDA graphs) as far as the
log gives them; two starts are compared term by term ("which one grew"). The failures:

* a start-up KV shortfall (vLLM's ``ValueError``: one request of ``max_model_len`` does not fit; no
  memory for any block; less free memory than asked for; too few Mamba state blocks);
* a CUDA out-of-memory, at start-up or while serving (after the API server came up);
* a preemption storm: the periodic stats lines show the KV cache full with requests waiting for
  :data:`STORM_LINES` lines running (or V0's preemption warnings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.restarts import classify_termination
from kvpilot.tuner.vllm import log_lines as L

__all__ = [
    "Diagnosis",
    "Finding",
    "LogReading",
    "Startup",
    "StatsLine",
    "compute_diagnosis",
    "format_diagnosis",
    "read_log",
]

STORM_USAGE = 0.98
"""KV usage (0-1) from which a stats line counts as a full cache (vLLM's dashboards turn red at 0.98)."""
STORM_LINES = 3
"""Full-cache lines with requests waiting that make a storm, within :data:`STORM_WINDOW` consecutive
stats lines (30 s in 50 s at vLLM's 10 s interval: preempting frees blocks, so usage dips between)."""
STORM_WINDOW = 5


@dataclass(frozen=True, slots=True)
class Startup:
    """One start-up's memory, as logged (GiB; ``None``: not in the log)."""

    weights_gib: float | None = None
    load_seconds: float | None = None
    activation_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    device: str | None = None
    """``GPU``, ``CPU``, ``XPU``: the pool the KV cache-size line names."""
    concurrency: float | None = None
    concurrency_tokens: int | None = None
    graphs_gib: float | None = None
    graph_seconds: float | None = None
    compile_seconds: float | None = None
    init_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class StatsLine:
    running: int
    waiting: int
    kv_usage: float
    """0-1."""


@dataclass(frozen=True, slots=True)
class LogReading:
    """What one log holds."""

    startups: tuple[Startup, ...] = ()
    stats: tuple[StatsLine, ...] = ()
    failure: str | None = None
    """The classified failure kind (:class:`~kvpilot.tuner.loop.observations.RestartKind`), or ``None``."""
    failure_line: str = ""
    failure_while_serving: bool = False
    figures: dict[str, float] = field(default_factory=dict)
    """The failure's figures (``max_model_len``, ``needed_kv_gib``, ``available_kv_gib``, ...)."""
    preempted_lines: int = 0
    version: str | None = None
    model: str | None = None
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    title: str
    detail: str
    advice: str
    quote: str = ""
    """vLLM's own line, when the finding comes from one."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    reading: LogReading
    findings: tuple[Finding, ...]


# --- reading ------------------------------------------------------------------------------------


def read_log(text: str) -> LogReading:
    """Every figure ``text`` (a vLLM log) holds. Never raises: a log with none gives an empty reading."""
    lines = text.splitlines()
    cause = classify_termination(text, None, None)
    failure = None if cause.kind == RestartKind.OTHER else str(cause.kind)
    figures = {
        k: float(v)
        for k in (
            "max_model_len",
            "estimated_max_model_len",
            "needed_kv_gib",
            "available_kv_gib",
            "free_gib",
            "total_gib",
            "tried_gib",
            "cache_blocks",
        )
        if (v := getattr(cause, k)) is not None
    }
    serving_at = next((i for i, line in enumerate(lines) if L.SERVING.search(line)), None)
    failed_at = _failure_line_index(lines, cause.detail) if failure else None
    return LogReading(
        startups=tuple(_startups(lines)),
        stats=tuple(_stats(lines)),
        failure=failure,
        failure_line=cause.detail if failure else "",
        failure_while_serving=failed_at is not None and serving_at is not None and failed_at > serving_at,
        figures=figures,
        preempted_lines=sum(1 for line in lines if L.V0_PREEMPTED.search(line)),
        version=L.first_group(L.VERSION.search(text)),
        model=L.first_group(L.MODEL.search(text)),
        tensor_parallel_size=_int(L.TENSOR_PARALLEL, text),
        max_model_len=_int(L.MAX_SEQ_LEN, text),
        max_num_seqs=_int(L.MAX_NUM_SEQS, text),
    )


def _int(pattern: re.Pattern[str], text: str) -> int | None:
    value = L.first_group(pattern.search(text))
    return int(value) if value is not None else None


def _failure_line_index(lines: list[str], detail: str) -> int | None:
    needle = detail[:60]
    marker = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)
    for i, line in enumerate(lines):
        if needle and needle in line or marker.search(line) and "CUDA" in detail:
            return i
    return None


def _startups(lines: list[str]) -> list[Startup]:
    """One :class:`Startup` per engine start in the log (an engine-config line, or a second ``Model
    loading took`` without one), filled by the memory lines that follow; starts without any are left out."""
    out: list[dict[str, object]] = [{}]
    for line in lines:
        if L.ENGINE_START.search(line):
            out.append({})
        elif m := L.MODEL_LOADING.search(line):
            if "weights_gib" in out[-1]:
                out.append({})
            weights = float(m.group(1)) * (1.0 if m.group(2) == "GiB" else 1e9 / 2**30)
            out[-1].update(weights_gib=round(weights, 4), load_seconds=float(m.group(3)))
        else:
            _read_startup_line(line, out[-1])
    return [Startup(**s) for s in out if s]  # type: ignore[arg-type]


def _read_startup_line(line: str, s: dict[str, object]) -> None:
    if m := L.V0_PROFILE.search(line):
        weights, activation, kv = float(m.group(1)), float(m.group(3)), float(m.group(4))
        s.update(weights_gib=weights, activation_gib=activation, kv_cache_gib=kv)
    elif m := L.TORCH_PEAK.search(line):
        s["activation_gib"] = float(m.group(1))
    elif m := L.AVAILABLE_KV.search(line):
        s["kv_cache_gib"] = float(m.group(1))
    elif m := L.CPU_KV_SET.search(line):
        s["kv_cache_gib"] = float(m.group(2))
    elif m := L.GRAPH_CAPTURE.search(line):
        s.update(graph_seconds=float(m.group(1)), graphs_gib=float(m.group(2)))
    elif m := L.TORCH_COMPILE.search(line):
        s["compile_seconds"] = float(m.group(1))
    elif m := L.INIT_ENGINE.search(line):
        s["init_seconds"] = float(m.group(1))
    if m := L.KV_CACHE_SIZE.search(line):
        s.update(device=m.group(1), kv_cache_tokens=L.count(m.group(2)))
    if m := L.MAX_CONCURRENCY.search(line):
        s.update(concurrency_tokens=L.count(m.group(1)), concurrency=float(m.group(2)))


def _stats(lines: list[str]) -> list[StatsLine]:
    out = []
    for line in lines:
        if m := L.STATS.search(line):
            out.append(StatsLine(int(m.group(1)), int(m.group(2)), float(m.group(3)) / 100.0))
    return out


# --- findings -----------------------------------------------------------------------------------


def compute_diagnosis(reading: LogReading) -> Diagnosis:
    """The findings of ``reading``, most serious first."""
    findings = [f for f in (_failure(reading), _storm(reading), _growth(reading)) if f is not None]
    return Diagnosis(reading, tuple(findings))


def _failure(r: LogReading) -> Finding | None:
    f, line = r.figures, r.failure_line
    if r.failure == RestartKind.KV_CACHE_TOO_SMALL:
        estimate = int(f["estimated_max_model_len"]) if "estimated_max_model_len" in f else None
        needed = f"{f['needed_kv_gib']:.2f} GiB" if "needed_kv_gib" in f else "more"
        have = f"{f['available_kv_gib']:.2f} GiB" if "available_kv_gib" in f else "less"
        fit = f"; vLLM estimates {estimate} tokens fit" if estimate else ""
        return Finding(
            "Start-up KV shortfall",
            f"one request of max_model_len {int(f.get('max_model_len', 0)) or '?'} needs {needed} of KV; "
            f"{have} was left after weights, activations and graphs{fit}.",
            (f"--max-model-len {estimate}" if estimate else "a shorter --max-model-len")
            + ", or more KV memory: a higher --gpu-memory-utilization, --kv-cache-dtype fp8, more GPUs "
            "(--tensor-parallel-size)",
            line,
        )
    if r.failure == RestartKind.NO_CACHE_BLOCKS:
        return Finding(
            "No memory left for the KV cache",
            "weights, activations and graphs took everything gpu_memory_utilization allows.",
            "a higher --gpu-memory-utilization, a smaller --max-num-batched-tokens (activation peak), more "
            "GPUs, or a quantized checkpoint",
            line,
        )
    if r.failure == RestartKind.INSUFFICIENT_FREE_MEMORY:
        share = f["free_gib"] / f["total_gib"] if f.get("total_gib") else None
        return Finding(
            "Less free GPU memory than asked for",
            "another process holds memory on the GPU.",
            (
                f"--gpu-memory-utilization {share - 0.01:.2f} or lower"
                if share
                else "a lower --gpu-memory-utilization"
            )
            + ", or free the GPU",
            line,
        )
    if r.failure == RestartKind.MAMBA_CACHE_BLOCKS:
        return Finding(
            "Too few Mamba state blocks for max_num_seqs",
            "each decoding sequence needs one state block.",
            f"--max-num-seqs {int(f.get('cache_blocks', 0)) or 'lower'}, or more --gpu-memory-utilization",
            line,
        )
    if r.failure == RestartKind.CUDA_OOM:
        where = "while serving" if r.failure_while_serving else "at start-up"
        tried = f" (tried to allocate {f['tried_gib']:.2f} GiB)" if "tried_gib" in f else ""
        advice = (
            "a lower --gpu-memory-utilization (more headroom for activations and the sampler), or a lower "
            "--max-num-seqs / --max-num-batched-tokens"
        )
        if not r.failure_while_serving:
            advice += "; during CUDA graph capture: --enforce-eager or fewer capture sizes"
        return Finding(f"CUDA out of memory {where}", f"the engine died{tried}.", advice, line)
    return None


def _storm(r: LogReading) -> Finding | None:
    full = [s.running if s.kv_usage >= STORM_USAGE and s.waiting > 0 else None for s in r.stats]
    stormy: set[int] = set()  # the full lines inside a window that holds a storm
    for i in range(len(full)):
        window = [j for j in range(i, min(i + STORM_WINDOW, len(full))) if full[j] is not None]
        if len(window) >= STORM_LINES:
            stormy.update(window)
    longest = len(stormy)
    peak_running = max((full[j] or 0 for j in stormy), default=0)
    if not longest and r.preempted_lines < STORM_LINES:
        return None
    tokens = next((s.kv_cache_tokens for s in reversed(r.startups) if s.kv_cache_tokens), None)
    held = f" The cache ({tokens} tokens) held {peak_running} running requests when full." if tokens else ""
    seqs = f" (now {r.max_num_seqs})" if r.max_num_seqs else ""
    detail = (
        f"{longest} of {len(r.stats)} stats lines with the KV cache at {STORM_USAGE:.0%} or more and "
        "requests waiting"
        if longest
        else f"{r.preempted_lines} preemption warnings"
    ) + "."
    return Finding(
        "Preemption storm",
        detail + held + " vLLM preempts running requests and recomputes them: throughput and latency suffer.",
        f"--max-num-seqs near {peak_running or 'the running count at saturation'}{seqs}, so requests wait "
        "instead of being preempted; or more KV memory (--gpu-memory-utilization, --kv-cache-dtype fp8) or "
        "replicas",
    )


_TERMS = (
    ("weights_gib", "weights"),
    ("activation_gib", "activation peak"),
    ("kv_cache_gib", "KV cache"),
    ("graphs_gib", "CUDA graphs"),
)


def _growth(r: LogReading) -> Finding | None:
    """Between the first and the last start in the log, which terms grew (and by how much)."""
    if len(r.startups) < 2:
        return None
    first, last = r.startups[0], r.startups[-1]
    moved = []
    for attr, name in _TERMS:
        a, b = getattr(first, attr), getattr(last, attr)
        if a is not None and b is not None and abs(b - a) >= 0.01:
            moved.append(f"{name} {a:.2f} -> {b:.2f} GiB ({b - a:+.2f})")
    if not moved:
        return None
    return Finding(
        f"{len(r.startups)} start-ups in this log",
        "between the first and the last: " + "; ".join(moved) + ".",
        "the term that grew took its memory from the KV cache: look at what changed between the starts "
        "(flags, image, model revision)",
    )


# --- text ---------------------------------------------------------------------------------------


def format_diagnosis(d: Diagnosis) -> str:
    """The diagnosis as the CLI prints it."""
    r = d.reading
    out = [
        f"vLLM {r.version or '(version not in the log)'}, model {r.model or '(not in the log)'}"
        + (f", tensor_parallel_size {r.tensor_parallel_size}" if r.tensor_parallel_size else "")
        + (f", max_model_len {r.max_model_len}" if r.max_model_len else "")
    ]
    for i, s in enumerate(r.startups, 1):
        out.append(f"start-up {i}: " + _format_startup(s))
    if r.stats:
        peak = max(r.stats, key=lambda s: s.kv_usage)
        out.append(
            f"serving: {len(r.stats)} stats lines; peak KV usage {peak.kv_usage:.1%} "
            f"(running {peak.running}, waiting {peak.waiting})"
        )
    if not d.findings:
        out.append("no failure, shortfall or preemption storm found")
    for f in d.findings:
        out += ["", f"{f.title}: {f.detail}"]
        if f.quote:
            out.append(f"  vLLM: {f.quote[:200]}{'...' if len(f.quote) > 200 else ''}")
        out.append(f"  change: {f.advice}")
    return "\n".join(out) + "\n"


def _format_startup(s: Startup) -> str:
    parts = []
    for attr, name in _TERMS:
        value = getattr(s, attr)
        if value is not None:
            parts.append(f"{name} {value:.2f} GiB")
    if s.kv_cache_tokens is not None:
        parts.append(f"{s.device or ''} KV cache {s.kv_cache_tokens:,} tokens".strip())
    if s.concurrency is not None:
        parts.append(f"{s.concurrency:.2f}x concurrency at {s.concurrency_tokens:,} tokens")
    for attr, name in (
        ("load_seconds", "load"),
        ("compile_seconds", "torch.compile"),
        ("graph_seconds", "graph capture"),
        ("init_seconds", "engine init"),
    ):
        value = getattr(s, attr)
        if value is not None:
            parts.append(f"{name} {value:.1f} s")
    return "; ".join(parts) or "no memory lines"
