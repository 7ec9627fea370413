"""vLLM engine arguments: render the tuned settings as flags, parse them back, vet the rest.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there); the planner renders a plan's ``args`` with
:func:`build_vllm_args`, the operator splits a user's own arguments with
:func:`parse_vllm_args` (tuned flags become pinned settings, the rest passes
through) and refuses what the pinned vLLM would refuse with
:func:`validate_extra_args`. Strings in, strings out: nothing here runs vLLM.

Spellings follow vLLM 0.33's ``FlexibleArgumentParser`` (``vllm/engine/arg_utils.py``):
``--flag value`` and ``--flag=value``, underscores or dashes in the flag name,
``-tp`` for ``--tensor-parallel-size``, and human-readable integers (``32K`` =
32768, ``32k`` = 32000) for ``--max-model-len`` and ``--max-num-batched-tokens``.
The contract tests (``tests/contract/``) check all of it against the installed
vLLM parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence

from kvpilot.tuner import errors
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm.kv_dtypes import KV_CACHE_DTYPES
from kvpilot.tuner.vllm.versions import AUTO_MAX_MODEL_LEN

FLAGS: Mapping[str, str] = {
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "max_num_batched_tokens": "--max-num-batched-tokens",
}
"""Each tuned :class:`~kvpilot.tuner.types.EngineSettings` field and its flag, in rendering order."""

FLAG_ALIASES: Mapping[str, str] = {
    "-tp": "--tensor-parallel-size",
    "--device-memory-utilization": "--gpu-memory-utilization",
}
"""Other spellings vLLM 0.33 accepts for the tuned flags."""

TOPOLOGY_ALIASES: Mapping[str, str] = {
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dpn": "--data-parallel-rank",
}
"""The short forms vLLM 0.33 accepts for the parallelism flags other than tensor parallelism."""

PIPELINE_PARALLEL_FLAG = "--pipeline-parallel-size"
"""Pipeline stages per engine: GPUs per pod = tensor-parallel size x this (kvpilot renders it when
``gpu.count`` exceeds the tensor-parallel size)."""
DTYPE_FLAG = "--dtype"
"""The weights' compute dtype; ``auto`` follows the config's ``torch_dtype``."""
DTYPE_BYTES: Mapping[str, int] = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}
"""Bytes per weight element of each explicit ``--dtype`` value vLLM 0.33 accepts (besides ``auto``)."""

POD_FLAGS: Mapping[str, str] = {
    "--host": "kvpilot's Deployment listens on every address, which its Service and probes reach",
    "--port": "kvpilot's Deployment serves on its container port, which its Service and probes use",
    "--uds": "a Unix socket replaces the port kvpilot's Service and probes use",
    "--model": "the model is spec.model.id, which kvpilot passes as vllm serve's model argument",
    "--revision": "set spec.model.revision: kvpilot passes it and plans from that revision's config.json",
    "--config": "a config file would set the flags kvpilot plans and renders, out of its sight",
    "--data-parallel-size": "kvpilot runs one engine per pod with spec.gpu.count GPUs; scale with "
    "spec.replicas",
}
"""Flags that contradict the pod kvpilot renders, refused in user arguments, with what to do instead."""

KV_CACHE_MEMORY_FLAG = "--kv-cache-memory-bytes"
"""vLLM's flag that fixes the KV pool in bytes per GPU
(``config/cache.py::CacheConfig.kv_cache_memory_bytes``): the planner may render it
(:func:`build_vllm_args`), users may not pass it."""

UNSUPPORTED_FLAGS: Mapping[str, str] = {
    "--batch-size": "vLLM has no batch-size flag; concurrency is --max-num-seqs (kvpilot tunes it)",
    "--max-batch-size": "that is TGI's flag; vLLM's is --max-num-seqs (kvpilot tunes it)",
    "--max-batch-total-tokens": "that is TGI's flag; vLLM's is --max-num-batched-tokens",
    "--max-total-tokens": "that is TGI's flag; vLLM's is --max-model-len",
    "--mem-fraction-static": "that is SGLang's flag; vLLM's is --gpu-memory-utilization",
    "--context-length": "that is SGLang's flag; vLLM's is --max-model-len",
    "--gpu-memory-fraction": "that is TensorRT-LLM's flag; vLLM's is --gpu-memory-utilization",
    "--max-seq-len": "vLLM's flag is --max-model-len",
    "--kv-cache-size": "vLLM has no such flag; the KV cache is sized by --gpu-memory-utilization",
    "--cache-ttl": "vLLM has no cache TTL; prefix-cache blocks are evicted LRU when memory is needed",
    "--swap-space": "removed in vLLM 0.18; the V1 engine preempts by recomputation",
    "--calculate-kv-scales": "removed in vLLM 0.28",
    "--max-seq-len-to-capture": "not in vLLM 0.33; use --max-cudagraph-capture-size",
    KV_CACHE_MEMORY_FLAG: "it overrides --gpu-memory-utilization, which is how kvpilot sizes the "
    "KV cache; pin --gpu-memory-utilization instead",
    "--num-gpu-blocks-override": "it overrides the KV-cache size kvpilot plans; pin "
    "--gpu-memory-utilization instead",
}
"""Flags refused in user arguments, with what to do instead (vLLM reference §4)."""

SIZING_OVERRIDE_FLAGS = frozenset({KV_CACHE_MEMORY_FLAG, "--num-gpu-blocks-override"})
"""The refused flags vLLM does have: refused because they bypass the planned KV-cache size."""

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_human_int(text: str) -> int:
    """An integer as vLLM's ``human_readable_int`` reads it: ``25.6k`` = 25600, ``32K`` = 32768."""
    value = text.strip()
    match = _HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(f"decimals are not allowed with binary suffixes: {text!r}")
        return int(number) * _BINARY[suffix]
    return int(value)


def _parse_max_model_len(text: str) -> int:
    if text.strip().lower() == "auto":
        return AUTO_MAX_MODEL_LEN
    return parse_human_int(text)


def _parse_kv_cache_dtype(text: str) -> str:
    if text not in KV_CACHE_DTYPES:
        raise ValueError(f"valid values are: {', '.join(KV_CACHE_DTYPES)}")
    return text


_PARSERS: Mapping[str, Callable[[str], object]] = {
    "max_model_len": _parse_max_model_len,
    "max_num_seqs": int,
    "gpu_memory_utilization": float,
    "kv_cache_dtype": _parse_kv_cache_dtype,
    "tensor_parallel_size": int,
    "max_num_batched_tokens": parse_human_int,
}

_FIELD_BY_FLAG = {flag: name for name, flag in FLAGS.items()}

INT_BOUNDS: Mapping[str, int] = {
    "max_model_len": 1 << 24,
    "max_num_seqs": 1 << 16,
    "tensor_parallel_size": 64,
    "max_num_batched_tokens": 1 << 24,
}
"""The largest value a tuned integer flag may take in ``extraArgs``, and the API's bounds on the same pins
(``kvpilot.operator.api.MAX_TOKENS`` and ``MAX_SEQS`` are read from here), so a flag and its pin accept the
same values. Past them a figure only overflows
later arithmetic (400 nines became an ``InternalError``)."""
_MAX_INT_CHARS = 32
"""Longer numbers are refused before they are parsed (and never echoed whole)."""


def _canonical(token: str) -> tuple[str, str | None]:
    """``(flag, inline value)`` of one token: dashes for underscores, ``=value`` split off."""
    name, sep, value = token.partition("=")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    name = FLAG_ALIASES.get(name, TOPOLOGY_ALIASES.get(name, name))
    return name, (value if sep else None)


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _is_number(token)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def iter_flags(args: Sequence[str]) -> Iterator[tuple[int, str, str | None]]:
    """``(index, flag, inline value)`` of every flag token of ``args``, its spelling made canonical (dashes
    for underscores, aliases resolved, ``=value`` split off); negative numbers are values, not flags."""
    for index, token in enumerate(args):
        if _is_flag(token):
            flag, inline = _canonical(token)
            yield index, flag, inline


def check_settings(settings: EngineSettings) -> None:
    """Raise :class:`~kvpilot.tuner.errors.InvalidEngineArgs` for values vLLM 0.33 would reject."""
    s = settings
    problems: list[tuple[str, str]] = []
    if s.max_model_len is not None and s.max_model_len < 1 and s.max_model_len != AUTO_MAX_MODEL_LEN:
        problems.append(("--max-model-len", f"must be positive or -1 (auto), got {s.max_model_len}"))
    for name in ("max_num_seqs", "tensor_parallel_size", "max_num_batched_tokens"):
        value = getattr(s, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append((FLAGS[name], f"must be a positive integer, got {value!r}"))
    util = s.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        problems.append(("--gpu-memory-utilization", f"must be in (0, 1], got {util!r}"))
    if s.kv_cache_dtype is not None and s.kv_cache_dtype not in KV_CACHE_DTYPES:
        valid = ", ".join(KV_CACHE_DTYPES)
        problems.append(("--kv-cache-dtype", f"{s.kv_cache_dtype!r} is not one of: {valid}"))
    seqs, tokens = s.max_num_seqs, s.max_num_batched_tokens
    if not problems and seqs is not None and tokens is not None and tokens < seqs:
        text = f"({tokens}) must be greater than or equal to --max-num-seqs ({seqs})"
        problems.append(("--max-num-batched-tokens", text))
    if problems:
        flag, text = problems[0]
        raise errors.InvalidEngineArgs("; ".join(f"{f} {t}" for f, t in problems), flag=flag)


def _render_value(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def build_vllm_args(
    settings: EngineSettings, extra: Sequence[str] = (), *, kv_cache_memory_bytes: int | None = None
) -> tuple[str, ...]:
    """The ``vllm serve`` flags for ``settings`` (set fields only), followed by ``extra``.

    ``extra`` must not repeat a tuned flag (split it off with :func:`parse_vllm_args`
    first and pin it) and must pass :func:`validate_extra_args`. With ``kv_cache_memory_bytes``
    the KV pool is pinned: ``--kv-cache-memory-bytes N`` is rendered in place of
    ``--gpu-memory-utilization``, which vLLM 0.33 ignores for the pool then
    (``v1/worker/gpu_worker.py::determine_available_memory``; its default still sets the free-memory
    check at start-up).
    """
    check_settings(settings)
    validate_extra_args(extra)
    for _, flag, _ in iter_flags(extra):
        if flag in _FIELD_BY_FLAG:
            raise errors.InvalidEngineArgs(
                f"{flag} is a tuned setting; pass it as a pinned value, not as an extra argument", flag=flag
            )
    if kv_cache_memory_bytes is not None and kv_cache_memory_bytes < 1:
        raise errors.InvalidEngineArgs(
            f"{KV_CACHE_MEMORY_FLAG} must be a positive integer, got {kv_cache_memory_bytes}",
            flag=KV_CACHE_MEMORY_FLAG,
        )
    rendered: list[str] = []
    for name, flag in FLAGS.items():
        value = getattr(settings, name)
        if name == "gpu_memory_utilization" and kv_cache_memory_bytes is not None:
            rendered += [KV_CACHE_MEMORY_FLAG, str(kv_cache_memory_bytes)]
        elif value is not None:
            rendered += [flag, _render_value(value)]
    return (*rendered, *extra)


def _shown(text: str) -> str:
    return text if len(text) <= _MAX_INT_CHARS else f"{text[:12]}...({len(text)} characters)"


def _out_of_range(flag: str, text: str, bound: int) -> str:
    return f"{flag} {_shown(text)!r} is out of range: at most {bound}"


def parse_vllm_args(args: Sequence[str]) -> tuple[EngineSettings, tuple[str, ...]]:
    """Split ``args`` into the tuned settings they set and everything else, untouched.

    Later occurrences win, as with argparse. A tuned flag without a value, or with
    a value vLLM would reject, raises :class:`~kvpilot.tuner.errors.InvalidEngineArgs`.
    """
    values: dict[str, object] = {}
    rest: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        flag, inline = _canonical(token) if _is_flag(token) else (token, None)
        field = _FIELD_BY_FLAG.get(flag)
        if field is None:
            rest.append(token)
            index += 1
            continue
        if inline is None:
            if index + 1 >= len(args) or _is_flag(args[index + 1]):
                raise errors.InvalidEngineArgs(f"{flag} expects a value", flag=flag)
            inline = args[index + 1]
            index += 2
        else:
            index += 1
        bound = INT_BOUNDS.get(field)
        if bound is not None and len(inline.strip()) > _MAX_INT_CHARS:
            raise errors.InvalidEngineArgs(_out_of_range(flag, inline, bound), flag=flag)
        try:
            values[field] = _PARSERS[field](inline)
        except (ValueError, OverflowError) as exc:  # OverflowError: "1e999k", a float past infinity
            raise errors.InvalidEngineArgs(f"{flag} {_shown(inline)!r}: {exc}", flag=flag) from None
        value = values[field]
        if bound is not None and isinstance(value, int) and abs(value) > bound:
            raise errors.InvalidEngineArgs(_out_of_range(flag, inline, bound), flag=flag)
    # The keys are EngineSettings' field names (FLAGS') and each value comes from that field's parser in
    # _PARSERS; a checker cannot tie a run-time key to its field's type. check_settings validates the result.
    settings = EngineSettings(**values)  # type: ignore[arg-type]
    check_settings(settings)
    return settings, tuple(rest)


def find_flag_values(args: Sequence[str], flag: str) -> list[str]:
    """Every value given to ``flag`` in ``args`` (``--flag value``, ``--flag=value``, short forms and
    underscores alike), in order; a missing value is ``""``."""
    found = []
    for index, name, inline in iter_flags(args):
        if name == flag:
            nxt = args[index + 1] if index + 1 < len(args) else ""
            found.append(inline if inline is not None else ("" if _is_flag(nxt) else nxt))
    return found


def find_last_int(args: Sequence[str], flag: str) -> int | None:
    """The integer ``flag`` takes in ``args`` (its last value, as argparse keeps it); ``None`` when it is
    absent or its last value is not a whole number (the parser's check reports that)."""
    values = find_flag_values(args, flag)
    return int(values[-1]) if values and values[-1].strip().isdigit() else None


def find_pod_flags(args: Sequence[str]) -> list[tuple[str, str]]:
    """``(flag, why)`` for each flag of :data:`POD_FLAGS` in ``args``, in any spelling or as an
    abbreviation (vLLM accepts unique prefixes, so ``--po`` is ``--port``)."""
    found = []
    for _, flag, _ in iter_flags(args):
        if flag in POD_FLAGS:
            found.append((flag, POD_FLAGS[flag]))
        elif len(flag) > 3 and flag not in _FIELD_BY_FLAG:
            found += [(flag, f"it abbreviates {p}: {w}") for p, w in POD_FLAGS.items() if p.startswith(flag)]
    return found


def check_dtype(args: Sequence[str], model_dtype: str) -> None:
    """Refuse a ``--dtype`` whose weights are not the size the plan assumed (the model's ``model_dtype``):
    ``auto`` and a dtype of the same element size (``float16`` for ``bfloat16``) plan the same."""
    planned = DTYPE_BYTES.get(model_dtype)
    for value in find_flag_values(args, DTYPE_FLAG):
        if value == "auto" or (value in DTYPE_BYTES and DTYPE_BYTES[value] == planned):
            continue
        if value not in DTYPE_BYTES:
            valid = ", ".join(("auto", *DTYPE_BYTES))
            message = f"{DTYPE_FLAG} {value!r} is not a vLLM 0.33 dtype ({valid})"
            raise errors.InvalidEngineArgs(message, flag=DTYPE_FLAG)
        raise errors.InvalidEngineArgs(
            f"{DTYPE_FLAG} {value} stores {DTYPE_BYTES[value]} bytes a weight, but the plan is for the "
            f"model's {model_dtype} ({planned} bytes): the weights would not fit what was planned; remove "
            "it or use auto",
            flag=DTYPE_FLAG,
        )


def validate_extra_args(args: Sequence[str]) -> None:
    """Refuse arguments vLLM 0.33 would refuse or that defeat kvpilot's sizing.

    Catches flags that do not exist in vLLM (``--batch-size``, ``--cache-ttl``,
    other servers' spellings), flags removed before 0.33 (``--swap-space``),
    flags that override the planned KV-cache size, abbreviations of tuned flags
    (vLLM accepts unique prefixes, so ``--max-model`` would silently fight the
    plan), a repeated ``serve`` sub-command and invalid ``--kv-cache-dtype`` values. The flags that
    contradict the pod kvpilot renders are :func:`find_pod_flags`'.
    """
    if args and args[0] == "serve":
        raise errors.InvalidEngineArgs(
            "do not repeat 'serve': the vLLM image's entrypoint is already 'vllm serve', and vLLM would "
            "fail with 'unrecognized arguments: serve'",
            flag="serve",
        )
    for index, flag, inline in iter_flags(args):
        reason = UNSUPPORTED_FLAGS.get(flag)
        if reason is None and flag.startswith("--kv-cache-memory"):
            reason = UNSUPPORTED_FLAGS[KV_CACHE_MEMORY_FLAG]
        if reason is None and len(flag) > 2:
            # vLLM accepts unique prefixes, so --num-gpu-blocks is --num-gpu-blocks-override.
            for override in sorted(SIZING_OVERRIDE_FLAGS):
                if override.startswith(flag):
                    reason = f"it abbreviates {override}: {UNSUPPORTED_FLAGS[override]}"
                    break
        if reason is not None:
            raise errors.InvalidEngineArgs(f"vLLM argument {flag} is not accepted: {reason}.", flag=flag)
        if flag not in _FIELD_BY_FLAG and len(flag) > 2:
            for tuned in _FIELD_BY_FLAG:
                if tuned.startswith(flag):
                    raise errors.InvalidEngineArgs(
                        f"vLLM argument {flag} abbreviates {tuned}; spell it out as {tuned}", flag=flag
                    )

        if flag == "--kv-cache-dtype":
            check_choice(flag, flag_value(args, index, inline), KV_CACHE_DTYPES, "KV-cache dtype")


def flag_value(args: Sequence[str], index: int, inline: str | None) -> str:
    """The value of the flag at ``index`` (as :func:`iter_flags` yields it): its ``=value``, else the next
    token; ``""`` when there is none."""
    if inline is not None:
        return inline
    return args[index + 1] if index + 1 < len(args) else ""


def check_choice(flag: str, value: str, choices: Sequence[str], what: str) -> None:
    """Refuse ``value`` for ``flag`` unless it is one of vLLM 0.33's ``choices`` (a ``what``)."""
    if value not in choices:
        raise errors.InvalidEngineArgs(
            f"{flag} {value!r} is not a vLLM 0.33 {what}; valid values are: {', '.join(choices)}", flag=flag
        )


def _fmt(value: object) -> str:
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def describe_settings(settings: EngineSettings) -> str:
    """``max-model-len 8192, max-num-seqs 64`` (set fields only): the one vocabulary of settings in
    events, conditions and history, the flags' own names as the pods' arguments show them."""
    parts = [
        f"{flag[2:]} {_fmt(value)}"
        for name, flag in FLAGS.items()
        if (value := getattr(settings, name)) is not None
    ]
    return ", ".join(parts) or "vLLM defaults"


def describe_change(old: EngineSettings, new: EngineSettings) -> str:
    """``gpu-memory-utilization 0.92 -> 0.9, max-num-seqs 256 -> 192`` (changed fields only)."""
    parts = [
        f"{flag[2:]} {_fmt(getattr(old, name))} -> {_fmt(getattr(new, name))}"
        for name, flag in FLAGS.items()
        if getattr(old, name) != getattr(new, name)
    ]
    return ", ".join(parts) or "no change"
