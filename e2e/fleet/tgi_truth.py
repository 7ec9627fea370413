"""TGI 3.3.7 pods in the fleet: the launcher's flags, the KV its warm-up infers, its failures and its log.

The names and texts TGI prints come from their one home, :mod:`kvpilot.tuner.tgi` (the flags of
``launcher/src/main.rs``, the failure texts, ``Model is overloaded``): the fleet imports those facts and
nothing else of kvpilot. The arithmetic below is the fleet's own, read from TGI's source at tag ``v3.3.7``
(``e2e/test_fleet_tgi.py`` checks it against the verbatim excerpts in ``tests/data/tgi/``), never
kvpilot's budget (:mod:`kvpilot.tuner.engines.tgi_budget`), which it judges.

The scenario's physics are the SGLang pods' :class:`e2e.fleet.truth.GroundTruth` figures, per shard: the
GPU's total (``gpu_memory_gib``), the memory taken before the load (``sglang_cuda_context_gib``), the
weights (``sglang_weights_gib``), ``kv_bytes_per_token``, ``model_max_len`` (``max_position_embeddings``);
TGI's own terms are :attr:`GroundTruth.tgi_prefill_gib_per_1k_tokens`,
:attr:`GroundTruth.tgi_default_max_batch_prefill_tokens` and
:attr:`GroundTruth.runtime_oom_above_cuda_memory_fraction`.

The warm-up (``server/text_generation_server/models/flash_causal_lm.py`` ``warmup``, lines 1507-1584):

* the warm-up batch (``backends/v3/src/client/grpc_client.rs`` lines 109-194): requests of
  ``min(--max-input-tokens, left)`` prompt tokens until ``--max-batch-prefill-tokens`` are used, each asking
  ``--max-total-tokens - prompt`` new tokens (1 without it) and holding ``prompt + new - 1`` tokens of KV
  (``flash_causal_lm.py`` lines 341-350); its blocks are allocated and its prefill runs. When the weights,
  those blocks and the prefill's activations outgrow the GPU or torch's share of it
  (``--cuda-memory-fraction``): "Not enough memory to handle N prefill tokens" (lines 1549-1553);
* then ``free = max(0, free_now - (1 - fraction x 0.90) x total)`` (``utils/import_utils.py`` lines
  13-17, ``TGI_WIGGLE_ROOM`` 0.90 at ``models/globals.py`` line 32) and ``num_blocks = free // block +
  warm-up blocks`` (lines 1556-1563): ``num_blocks x BLOCK_SIZE`` is the max batch total tokens
  (``tgi_batch_max_total_tokens``); ``--max-batch-total-tokens`` is ignored (deprecated for flash models);
* ``--max-total-tokens`` defaults to ``min(that, max_position_embeddings)`` (lines 1566-1579); above the
  inferred total the router stops (``backends/v3/src/lib.rs`` lines 98-100). Its ``main`` returns the error,
  so Rust prints it with ``Debug``: ``Error: Backend(NotEnoughMemory(N))``, not the ``Display`` text
  "Not enough memory to handle `max_total_tokens=N`" (line 181), which TGI never prints.

Modelled as one shard of the ``flashinfer`` backend (Llama-like heads of 64/128/256: a block of one token,
prefill chunking); not modelled: the launcher's compute-optimal prefill default (the scenario states it),
the router's argument checks after the warm-up, ``flashdecoding``/``paged`` blocks, the tokenizer's
``model_max_length``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from e2e.fleet.truth import EngineArgs, GiB, GroundTruth
from kvpilot.tuner.tgi import args as tgi_args
from kvpilot.tuner.tgi import messages, serving

BLOCK_SIZE = 1
"""``models/globals.py`` lines 38-46: the ``flashinfer`` backend's block."""
WIGGLE_ROOM = 0.90
"""``TGI_WIGGLE_ROOM`` (``models/globals.py`` line 32)."""
FP8_KV = frozenset({"fp8_e4m3fn", "fp8_e5m2"})
"""``--kv-cache-dtype`` values (``models/__init__.py`` lines 509-512): one byte per value."""
_STAMP = "2026-12-06T22:31:04.118204Z"


def is_tgi(argv: Sequence[str], image: str = "") -> bool:
    return serving.is_server(argv, image)


@dataclasses.dataclass(frozen=True)
class TgiArgs:
    """The launcher flags of one TGI container (``None``: absent, left to the launcher or the warm-up)."""

    model_id: str = ""
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_concurrent_requests: int = tgi_args.MAX_CONCURRENT_REQUESTS_DEFAULT
    cuda_memory_fraction: float = tgi_args.CUDA_MEMORY_FRACTION_DEFAULT
    num_shard: int = 1
    kv_cache_dtype: str | None = None
    port: int = serving.PORT
    """``--port``; the official image sets ``PORT=80``, which the launcher reads when the flag is absent."""

    @classmethod
    def parse(cls, argv: Sequence[str]) -> TgiArgs:
        """``command + args`` (``--flag value`` and ``--flag=value``; the launcher's own name skipped)."""
        values: dict[str, str] = {}
        i = 0
        while i < len(argv):
            tok = argv[i]
            if tok.startswith("--") and "=" in tok:
                name, val = tok.split("=", 1)
                values[name] = val
            elif tok.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values[tok] = argv[i + 1]
                i += 1
            i += 1
        flags = tgi_args.FLAGS

        def num(field: str) -> int | None:
            flag = flags[field]
            return int(values[flag]) if flag in values else None

        fraction = values.get(flags["cuda_memory_fraction"])
        return cls(
            model_id=values.get(tgi_args.MODEL_FLAG, ""),
            max_input_tokens=num("max_input_tokens"),
            max_total_tokens=num("max_total_tokens"),
            max_batch_prefill_tokens=num("max_batch_prefill_tokens"),
            max_batch_total_tokens=num("max_batch_total_tokens"),
            max_concurrent_requests=num("max_concurrent_requests")
            or tgi_args.MAX_CONCURRENT_REQUESTS_DEFAULT,
            cuda_memory_fraction=float(fraction) if fraction else tgi_args.CUDA_MEMORY_FRACTION_DEFAULT,
            num_shard=num("num_shard") or 1,
            kv_cache_dtype=values.get(tgi_args.KV_CACHE_DTYPE_FLAG),
            port=int(values.get(tgi_args.PORT_FLAG, serving.PORT)),
        )


# ---------------------------------------------------------------------------- the warm-up


@dataclasses.dataclass(frozen=True)
class Warmup:
    """What one shard's warm-up arrives at."""

    prefill_tokens: int
    warmup_tokens: int
    """KV tokens the warm-up batch holds (its blocks x ``BLOCK_SIZE``)."""
    peak_gib: float
    """In use at the end of the warm-up prefill: before the load, weights, warm-up KV, activations."""
    prefill_fits: bool
    max_batch_total_tokens: int
    """The inferred KV capacity (0 when the prefill did not fit)."""
    max_total_tokens: int
    """``--max-total-tokens``, or its default."""

    @property
    def starts(self) -> bool:
        return self.prefill_fits and self.max_total_tokens <= self.max_batch_total_tokens


def cell_bytes(truth: GroundTruth, args: TgiArgs) -> int:
    return truth.kv_bytes_per_token // 2 if args.kv_cache_dtype in FP8_KV else truth.kv_bytes_per_token


def prefill_tokens(truth: GroundTruth, args: TgiArgs) -> int:
    return args.max_batch_prefill_tokens or truth.tgi_default_max_batch_prefill_tokens


def warmup_kv_tokens(prefill: int, max_input: int | None, max_total: int | None) -> int:
    """The warm-up batch's KV tokens (``grpc_client.rs`` lines 109-194, ``flash_causal_lm.py`` 341-350)."""
    held, used = 0, 0
    while used < prefill:
        prompt = prefill - used if max_input is None else min(max_input, prefill - used)
        new = max_total - prompt if max_total is not None else 1
        held += math.ceil((prompt + new - 1) / BLOCK_SIZE) * BLOCK_SIZE
        used += prompt
    return held


def warmup(truth: GroundTruth, args: TgiArgs) -> Warmup:
    total, fraction, cell = truth.gpu_memory_gib, args.cuda_memory_fraction, cell_bytes(truth, args)
    prefill = prefill_tokens(truth, args)
    held = warmup_kv_tokens(prefill, args.max_input_tokens, args.max_total_tokens)
    activations = truth.tgi_prefill_gib_per_1k_tokens * prefill / 1000
    peak = truth.sglang_cuda_context_gib + truth.sglang_weights_gib + held * cell / GiB + activations
    fits = peak <= total and peak - truth.sglang_cuda_context_gib <= fraction * total
    inferred = 0
    if fits:
        free = max(0.0, (total - peak) - (1 - fraction * WIGGLE_ROOM) * total)
        inferred = (int(free * GiB) // (cell * BLOCK_SIZE) + held // BLOCK_SIZE) * BLOCK_SIZE
    max_total = args.max_total_tokens or min(inferred, truth.model_max_len)
    return Warmup(prefill, held, peak, fits, inferred, max_total)


def engine_view(truth: GroundTruth, args: TgiArgs) -> EngineArgs:
    """The engine model's view: the running requests at most ``--max-concurrent-requests`` (the router admits
    no more; :func:`admission_limit`), ``--max-total-tokens`` per request, ``--max-batch-prefill-tokens`` of
    prefill per step, blocks of one token."""
    w = warmup(truth, args)
    return EngineArgs(
        model=args.model_id,
        max_model_len=max(1, w.max_total_tokens),
        max_num_seqs=args.max_concurrent_requests,
        gpu_memory_utilization=args.cuda_memory_fraction,
        kv_cache_dtype="fp8" if args.kv_cache_dtype in FP8_KV else "auto",
        max_num_batched_tokens=w.prefill_tokens,
        tensor_parallel_size=args.num_shard,
        block_size=BLOCK_SIZE,
    )


def framebuffer_used_gib(truth: GroundTruth, args: TgiArgs) -> float:
    """What dcgm-exporter shows while serving: the peak of the warm-up, then the KV it inferred."""
    w = warmup(truth, args)
    kv = (w.max_batch_total_tokens - w.warmup_tokens) * cell_bytes(truth, args) / GiB
    return min(truth.gpu_memory_gib, w.peak_gib + max(0.0, kv))


# ---------------------------------------------------------------------------- the log


def _launcher(level: str, text: str) -> str:
    return f"{_STAMP} {level:>5} text_generation_launcher: {text}"


def _router(level: str, where: str, text: str) -> str:
    return f"{_STAMP} {level:>5} text_generation_router_v3: {where}: {text}"


def _start_lines(args: TgiArgs) -> list[str]:
    return [
        _launcher("INFO", f"Args {{ model_id: {args.model_id!r}, num_shard: Some({args.num_shard}), .. }}"),
        _launcher("INFO", "Starting shard rank=0"),
        _launcher("INFO", "Shard ready in 12.41s rank=0"),
        _launcher("INFO", "Starting Webserver"),
        _router("INFO", "backends/v3/src/lib.rs:125", "Warming up model"),
    ]


def _shutdown(failed: str) -> list[str]:
    return [_launcher("ERROR", failed), _launcher("INFO", "Shutting down shards")]


def startup_failure_log(truth: GroundTruth, args: TgiArgs) -> str | None:
    """The container's log when the warm-up or the router's check stops it; ``None`` when it starts."""
    w = warmup(truth, args)
    if w.prefill_fits and w.starts:
        return None
    if not w.prefill_fits:
        text = messages.prefill_tokens_error(w.prefill_tokens)
        lines = [
            _launcher("ERROR", "Method Warmup encountered an error."),
            "Traceback (most recent call last):",
            '  File "/usr/src/server/text_generation_server/models/flash_causal_lm.py", line 1545, in warmup',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.12 GiB.",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            f"RuntimeError: {text}",
            f"{_STAMP} ERROR warmup{{max_input_length={args.max_input_tokens} "
            f"max_prefill_tokens={w.prefill_tokens} max_total_tokens={args.max_total_tokens} "
            "max_batch_size=None}:warmup: text_generation_router_v3::client: "
            f"backends/v3/src/client/mod.rs:45: Server error: {text}",
            f'Error: Backend(Warmup(Generation("{text}")))',
        ]
    else:
        lines = [
            _router("INFO", "backends/v3/src/lib.rs:137", f"Inferred max batch total tokens: "
                    f"{w.max_batch_total_tokens}"),
            f"Error: Backend(NotEnoughMemory({w.max_total_tokens}))",
        ]  # fmt: skip
    return "\n".join([*_start_lines(args), *lines, *_shutdown("Webserver Crashed"), "Error: WebserverFailed"])


def serving_log(truth: GroundTruth, args: TgiArgs) -> str:
    w = warmup(truth, args)
    return "\n".join([
        *_start_lines(args),
        _router("INFO", "backends/v3/src/lib.rs:137",
                f"Setting max batch total tokens to {w.max_batch_total_tokens}"),
        _router("INFO", "backends/v3/src/lib.rs:166", "Using backend V3"),
        f"{_STAMP}  INFO text_generation_router::server: router/src/server.rs:2393: Connected",
    ])  # fmt: skip


def overloaded_lines(refused: int) -> list[str]:
    """What the router logs for each request refused beyond ``--max-concurrent-requests``
    (``router/src/infer/mod.rs`` lines 116-119)."""
    line = (
        f"{_STAMP} ERROR generate_stream: text_generation_router::infer: router/src/infer/mod.rs:118: "
        f"{messages.OVERLOADED}"
    )
    return [line] * refused


def runtime_oom(truth: GroundTruth, args: TgiArgs, running: int | None = None) -> bool:
    """Whether serving runs out of memory: the fraction above the scenario's threshold, or a decode batch of
    more requests than :attr:`GroundTruth.runtime_oom_above_max_num_seqs` (``running`` of them, or, ``None``,
    once the batch reaches ``--max-concurrent-requests``)."""
    limit = truth.runtime_oom_above_cuda_memory_fraction
    if limit is not None and args.cuda_memory_fraction > limit + 1e-9:
        return True
    seqs = truth.runtime_oom_above_max_num_seqs
    batch = args.max_concurrent_requests if running is None else running
    return seqs is not None and batch > seqs


def failed_batch(truth: GroundTruth, args: TgiArgs, running: int) -> int:
    """The requests of the decode batch that ran out of memory: a batch-driven OOM
    (:attr:`GroundTruth.runtime_oom_above_max_num_seqs`) strikes the first batch above the threshold."""
    seqs = truth.runtime_oom_above_max_num_seqs
    return min(running, seqs + 1) if seqs is not None else running


def cuda_oom_lines(truth: GroundTruth, args: TgiArgs, running: int | None = None) -> list[str]:
    """A CUDA OOM in a decode: the shard's interceptor logs it, shuts the shard down and answers the router
    with the error (``interceptor.py`` lines 25-41), which the router logs in the failed batch's spans (with
    ``running``: :func:`failed_batch`); the launcher stops."""
    total = truth.gpu_memory_gib
    used = min(total - 0.14, framebuffer_used_gib(truth, args))
    error = (
        "CUDA out of memory. Tried to allocate 896.00 MiB. "
        f"GPU 0 has a total capacity of {total:.2f} GiB of which {(total - used) * 1024:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {used:.2f} GiB memory in use."
    )
    router = (
        []
        if running is None
        else [f"{_STAMP} ERROR " + messages.batch_oom_error_line(failed_batch(truth, args, running), error)]
    )
    return [
        _launcher("ERROR", "Method Decode encountered an error."),
        "Traceback (most recent call last):",
        '  File "/usr/src/server/text_generation_server/models/flash_causal_lm.py", line 1921, in forward',
        f"torch.OutOfMemoryError: {error}",
        *router,
        _launcher("ERROR", "Shard 0 crashed"),
        _launcher("INFO", "Terminating webserver"),
        "Error: ShardFailed",
    ]


def summary(truth: GroundTruth, args: TgiArgs) -> str:
    w = warmup(truth, args)
    return (
        f"tgi max_batch_prefill_tokens={w.prefill_tokens} max_total_tokens={w.max_total_tokens} "
        f"max_concurrent_requests={args.max_concurrent_requests} "
        f"cuda_memory_fraction={args.cuda_memory_fraction} max_batch_total_tokens={w.max_batch_total_tokens}"
    )
