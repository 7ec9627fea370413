"""TGI's launcher flags that kvpilot renders, their defaults, and the settings value they render from.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). From ``launcher/src/main.rs`` at ``v3.3.7``
(``struct Args``, lines 580-914; a verbatim copy is ``tests/data/tgi/launcher_args_v3.3.7.rs``, which
``tests/tuner/test_tgi.py`` reads to check every flag and default below). The launcher is Rust (clap), so
there is no parser to import: the check against its source text is the contract, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from kvpilot.tuner import errors, flags

PINNED_TGI_VERSION = "3.3.7"

FLAGS: Mapping[str, str] = {
    "max_input_tokens": "--max-input-tokens",
    "max_total_tokens": "--max-total-tokens",
    "max_batch_prefill_tokens": "--max-batch-prefill-tokens",
    "max_batch_total_tokens": "--max-batch-total-tokens",
    "max_concurrent_requests": "--max-concurrent-requests",
    "cuda_memory_fraction": "--cuda-memory-fraction",
    "num_shard": "--num-shard",
}
"""``Args`` field -> its flag (clap's ``long``: ``_`` -> ``-``), for each field of :class:`TgiSettings`."""

MODEL_FLAG = "--model-id"
"""``model_id`` (``launcher/src/main.rs`` lines 588-589)."""
MODEL_ID_DEFAULT = "bigscience/bloom-560m"
"""The model the launcher serves when neither ``--model-id`` nor ``MODEL_ID`` names one (lines 588-589)."""
REVISION_FLAG = "--revision"
"""``revision: Option<String>`` (lines 593-594): the checkpoint's branch, tag or commit."""
HOSTNAME_FLAG = "--hostname"
"""``hostname`` (lines 769-770, default ``0.0.0.0``)."""
PORT_FLAG = "--port"
"""``port`` (lines 773-774)."""

KV_CACHE_DTYPE_FLAG = "--kv-cache-dtype"
"""The launcher's ``kv_cache_dtype: Option<KVCacheDtype>`` (``launcher/src/main.rs``): a knob the seam names,
though kvpilot renders no TGI setting for it (not a :class:`TgiSettings` field)."""

MAX_CONCURRENT_REQUESTS_DEFAULT = 128
"""``max_concurrent_requests`` (line 648-649); beyond it the router answers 429 "Model is overloaded"."""
CUDA_MEMORY_FRACTION_DEFAULT = 1.0
"""``cuda_memory_fraction`` (lines 810-813): the share of visible memory TGI may use."""
PORT_DEFAULT = 3000
"""``port`` (lines 773-774); the official image sets ``PORT=80`` (``Dockerfile`` line 149)."""


@dataclass(frozen=True)
class TgiSettings:
    """The launcher arguments kvpilot chooses (``None``: TGI's own default or inference at warm-up)."""

    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    """Per request, prompt + new tokens (default ``min(max_allocatable, max_position_embeddings)``)."""
    max_batch_prefill_tokens: int | None = None
    """The launcher's default: compute-optimal for the card, capped (:mod:`.warmup`); its help text's
    "``max_input_tokens + 50``" is out of date."""
    max_batch_total_tokens: int | None = None
    """Inferred at warm-up from the memory left after a prefill when unset."""
    max_concurrent_requests: int | None = None
    cuda_memory_fraction: float | None = None
    num_shard: int | None = None


def env_name(flag: str) -> str:
    """The environment variable the launcher reads ``flag`` from when the command line leaves it out: every
    flag of :data:`FLAGS` and the model's and revision's are ``#[clap(long, env)]``, whose variable is the
    field's name in upper case (clap's default ``SCREAMING_SNAKE_CASE``): ``--max-total-tokens`` is
    ``MAX_TOTAL_TOKENS``. A flag on the command line wins over its variable (clap)."""
    return flag.removeprefix("--").replace("-", "_").upper()


ENV_FLAGS: tuple[str, ...] = (MODEL_FLAG, REVISION_FLAG, *FLAGS.values())
"""The flags kvpilot reads from a container's environment too (:func:`env_name`)."""


def build_env_args(env: Mapping[str, str]) -> list[str]:
    """The flags a container's environment (literal values) stands for, in :data:`ENV_FLAGS`' order."""
    out: list[str] = []
    for flag in ENV_FLAGS:
        value = env.get(env_name(flag))
        if value is not None:
            out += [flag, value]
    return out


def check_settings(settings: TgiSettings) -> None:
    """Refuse what TGI would refuse whatever the model and GPU (``backends/v3/src/main.rs`` lines 182-196,
    ``launcher/src/main.rs`` lines 2157-2160), naming the flags. ``--max-batch-prefill-tokens`` below
    ``--max-input-tokens`` is refused only without prefill chunking (``main.rs`` line 188), which depends on
    the attention backend: :mod:`kvpilot.tuner.engines.tgi_budget` checks it."""
    s = settings
    fraction = s.cuda_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise errors.InvalidEngineArgs(f"--cuda-memory-fraction must be in (0, 1], got {fraction}")
    if (
        s.max_input_tokens is not None
        and s.max_total_tokens is not None
        and s.max_input_tokens >= s.max_total_tokens
    ):
        raise errors.InvalidEngineArgs("--max-input-tokens must be < --max-total-tokens")
    if s.max_batch_total_tokens is not None:
        for name in ("max_total_tokens", "max_batch_prefill_tokens"):
            value = getattr(s, name)
            if value is not None and value > s.max_batch_total_tokens:
                raise errors.InvalidEngineArgs(f"{FLAGS[name]} must be <= --max-batch-total-tokens")


def build_tgi_args(settings: TgiSettings) -> list[str]:
    """The flags for ``settings``, in :data:`FLAGS`' order; unset fields are left to TGI."""
    check_settings(settings)
    args: list[str] = []
    for field in fields(settings):
        value = getattr(settings, field.name)
        if value is not None:
            args += [FLAGS[field.name], str(value)]
    return args


def parse_tgi_args(args: Sequence[str]) -> TgiSettings:
    """The :class:`TgiSettings` a container's arguments carry (``--flag value`` or ``--flag=value``; flags
    outside :data:`FLAGS` are ignored): the inverse of :func:`build_tgi_args`. A value that does not parse is
    an error naming the flag."""
    values = flags.parse_flag_values(args, FLAGS, floats=("cuda_memory_fraction",))
    return TgiSettings(**values)  # type: ignore[arg-type]
