"""TGI 3.3.7 pods in the fleet: the flags a container runs, the KV tokens its warm-up infers, its failures and
their texts.

Deliberately independent of kvpilot (nothing here imports ``kvpilot``; ``e2e/test_fleet.py`` checks): every
fact below is TGI's own, read from tag ``v3.3.7`` (commit ``dfb3fbe7``; the copies under ``tests/data/tgi/``
hold the launcher's arguments and the server's warm-up), by file and line, as :mod:`e2e.fleet.sglang_truth`
does for SGLang. The scenario's physics are the same :class:`e2e.fleet.truth.GroundTruth` (GPU memory, KV
bytes per token, the model's context); the TGI terms it adds are its ``tgi_*`` fields.

* The launcher (``launcher/src/main.rs``): ``--max-concurrent-requests`` 128 (lines 648-649),
  ``--cuda-memory-fraction`` 1.0 (lines 810-813), ``--port`` 3000 (lines 773-774; the image sets 80).
  ``--max-batch-prefill-tokens`` when unset is the launcher's compute-optimal default for the card (lines
  2114-2152): the scenario states it (:attr:`GroundTruth.tgi_default_max_batch_prefill_tokens`).
* The warm-up (``server/text_generation_server/models/flash_causal_lm.py`` ``warmup``, lines 1507-1584):
  a prefill of ``--max-batch-prefill-tokens``; out of memory there is "Not enough memory to handle N prefill
  tokens. You need to decrease `--max-batch-prefill-tokens`" (lines 1549-1553). The fleet's physics: the
  prefill runs out of memory above :attr:`GroundTruth.tgi_prefill_oom_above_tokens`, or when the weights,
  the CUDA context and the prefill's activations leave nothing under the fraction. Then the KV cache gets
  what is free under ``CUDA_MEMORY_FRACTION x TGI_WIGGLE_ROOM`` (0.90, ``models/globals.py`` line 32;
  ``utils/import_utils.py`` lines 13-17): ``fraction x 0.9 x total - context - weights - activations``, in
  tokens (flashinfer: a block is one token, ``models/globals.py`` lines 38-46).
* The router (``backends/v3/src/lib.rs`` lines 98-100): a ``--max-total-tokens`` above the inferred tokens
  is "Not enough memory to handle `max_total_tokens=N`"; unset, it is ``min(tokens, max_position_embeddings)``
  (``flash_causal_lm.py`` lines 1566-1579).
* Run time: CUDA OOM when the fraction is above the scenario's threshold
  (:attr:`GroundTruth.tgi_runtime_oom_above_cuda_memory_fraction`) or more than
  :attr:`GroundTruth.runtime_oom_above_max_num_seqs` requests are admitted: PyTorch's "CUDA out of memory"
  in the shard's traceback, which the launcher relays as it exits. TGI never evicts a running request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from e2e.fleet.truth import EngineArgs, GiB, GroundTruth

LAUNCHER = "text-generation-launcher"
"""The image's entry point (``Dockerfile`` lines 240-249): what a TGI container runs."""
MAX_CONCURRENT_REQUESTS_DEFAULT = 128
CUDA_MEMORY_FRACTION_DEFAULT = 1.0
TGI_WIGGLE_ROOM = 0.90
SERVER = "/usr/src/server/text_generation_server"
"""Where TGI's image installs the server (the traceback's file names)."""


def is_tgi(argv: Sequence[str]) -> bool:
    """Whether a container's ``command + args`` run TGI's launcher."""
    return any(tok == LAUNCHER or tok.endswith(f"/{LAUNCHER}") for tok in argv)


@dataclasses.dataclass(frozen=True)
class TgiArgs:
    """The flags of one TGI container (``None``: absent, TGI's default)."""

    model_id: str = ""
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_concurrent_requests: int | None = None
    cuda_memory_fraction: float | None = None
    num_shard: int = 1
    port: int = 3000

    @classmethod
    def parse(cls, argv: Sequence[str]) -> TgiArgs:
        """Parse ``command + args`` (``--flag value`` and ``--flag=value``, clap's spelling)."""
        values: dict[str, str] = {}
        tokens = list(argv)
        for i, tok in enumerate(tokens):
            if not tok.startswith("--"):
                continue
            if "=" in tok:
                name, val = tok.split("=", 1)
                values[name] = val
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                values[tok] = tokens[i + 1]

        def num(flag: str) -> int | None:
            return int(values[flag]) if flag in values else None

        fraction = values.get("--cuda-memory-fraction")
        return cls(
            model_id=values.get("--model-id", ""),
            max_input_tokens=num("--max-input-tokens"),
            max_total_tokens=num("--max-total-tokens"),
            max_batch_prefill_tokens=num("--max-batch-prefill-tokens"),
            max_concurrent_requests=num("--max-concurrent-requests"),
            cuda_memory_fraction=float(fraction) if fraction is not None else None,
            num_shard=int(values.get("--num-shard", "1")),
            port=int(values.get("--port", "3000")),
        )


# ---------------------------------------------------------------------------- memory


def fraction(args: TgiArgs) -> float:
    given = args.cuda_memory_fraction
    return given if given is not None else CUDA_MEMORY_FRACTION_DEFAULT


def prefill_tokens(truth: GroundTruth, args: TgiArgs) -> int:
    return args.max_batch_prefill_tokens or truth.tgi_default_max_batch_prefill_tokens


def concurrent_requests(args: TgiArgs) -> int:
    return args.max_concurrent_requests or MAX_CONCURRENT_REQUESTS_DEFAULT


def kv_tokens(truth: GroundTruth, args: TgiArgs) -> int:
    """The KV tokens the warm-up infers (``tgi_batch_max_total_tokens``); <= 0 when nothing is left."""
    share = fraction(args) * TGI_WIGGLE_ROOM * truth.gpu_memory_gib
    activations = prefill_tokens(truth, args) * truth.tgi_activation_bytes_per_token / GiB
    free = share - truth.tgi_cuda_context_gib - truth.tgi_weights_gib - activations
    return int(free * GiB) // truth.kv_bytes_per_token if free > 0 else 0


def max_total_tokens(truth: GroundTruth, args: TgiArgs) -> int:
    """``--max-total-tokens``, else ``min(inferred tokens, max_position_embeddings)``."""
    if args.max_total_tokens is not None:
        return args.max_total_tokens
    return max(2, min(kv_tokens(truth, args), truth.model_max_len))


def engine_view(truth: GroundTruth, args: TgiArgs) -> EngineArgs:
    """The engine model's arguments for this TGI server (:class:`e2e.fleet.engine.SimEngine` runs every
    engine): the context is ``--max-total-tokens``, the sequences the admission limit (the fleet queues what
    TGI would answer 429), the batched tokens the prefill, a block one token (flashinfer); the KV tokens are
    passed apart (:func:`kv_tokens`)."""
    return EngineArgs(
        model=args.model_id,
        max_model_len=max_total_tokens(truth, args),
        max_num_seqs=concurrent_requests(args),
        gpu_memory_utilization=fraction(args),
        max_num_batched_tokens=prefill_tokens(truth, args),
        tensor_parallel_size=args.num_shard,
        block_size=1,
    )


def framebuffer_used_gib(truth: GroundTruth, args: TgiArgs) -> float:
    """What dcgm-exporter shows: torch's share, the CUDA context and the activations."""
    outside = truth.runtime_headroom_gib if truth.runtime_headroom_gib is not None else 2.0
    share = fraction(args) * TGI_WIGGLE_ROOM * truth.gpu_memory_gib
    return min(truth.gpu_memory_gib, share + outside)


# ---------------------------------------------------------------------------- failures


def prefill_error(num_tokens: int) -> str:
    """``flash_causal_lm.py`` lines 1550-1553."""
    return (
        f"Not enough memory to handle {num_tokens} prefill tokens. "
        "You need to decrease `--max-batch-prefill-tokens`"
    )


def total_tokens_error(max_total: int) -> str:
    """``backends/v3/src/lib.rs`` lines 98-100 (``V3Error::NotEnoughMemory``)."""
    return f"Not enough memory to handle `max_total_tokens={max_total}`"


def startup_error(truth: GroundTruth, args: TgiArgs) -> str | None:
    """The text TGI fails its start with, or ``None`` when it starts."""
    prefill = prefill_tokens(truth, args)
    limit = truth.tgi_prefill_oom_above_tokens
    if (limit is not None and prefill > limit) or kv_tokens(truth, args) <= 0:
        return prefill_error(prefill)
    if max_total_tokens(truth, args) > kv_tokens(truth, args):
        return total_tokens_error(max_total_tokens(truth, args))
    return None


def startup_failure_log(error: str) -> str:
    """The launcher's log when the warm-up or the router's check fails: the shard's traceback (a warm-up
    OOM) or the router's error, then the launcher's own exit."""
    lines = ["2026-12-05T18:31:02.101Z  INFO text_generation_launcher: Starting shard rank=0"]
    if "prefill tokens" in error:
        lines += [
            "2026-12-05T18:31:04.322Z ERROR warmup{max_input_length=None max_prefill_tokens=None "
            "max_total_tokens=None max_batch_size=None}:warmup: text_generation_router_v3::client: "
            "router/src/client/mod.rs:45: Server error: " + error,
            f'  File "{SERVER}/models/flash_causal_lm.py", line 1550, in warmup',
            f"RuntimeError: {error}",
        ]
    crashed = "2026-12-05T18:31:04.401Z ERROR text_generation_launcher: Webserver Crashed"
    lines += [crashed, f'Error: "{error}"']
    return "\n".join(lines) + "\n"


def runtime_oom(truth: GroundTruth, args: TgiArgs) -> bool:
    """Whether serving runs out of memory: the fraction above the scenario's threshold, or more requests
    admitted than the scenario's activations allow."""
    limit = truth.tgi_runtime_oom_above_cuda_memory_fraction
    if limit is not None and fraction(args) > limit + 1e-9:
        return True
    seqs = truth.runtime_oom_above_max_num_seqs
    return seqs is not None and concurrent_requests(args) > seqs


def cuda_oom_log(truth: GroundTruth, args: TgiArgs) -> str:
    """A CUDA OOM while serving (PyTorch's text in the shard's traceback), as the launcher relays it."""
    total = truth.gpu_memory_gib
    used = min(total - 0.14, framebuffer_used_gib(truth, args))
    return (
        "2026-12-05T18:31:09.512Z ERROR text_generation_launcher: Shard 0 crashed\n"
        f'  File "{SERVER}/models/flash_causal_lm.py", line 1937, in generate_token\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. "
        f"GPU 0 has a total capacity of {total:.2f} GiB of which {(total - used) * 1024:.2f} MiB is free.\n"
    )


def serving_log(truth: GroundTruth, args: TgiArgs) -> str:
    """The warm-up's answer (``flash_causal_lm.py`` line 1584)."""
    return (
        "2026-12-05T18:31:03.870Z  INFO text_generation_launcher: "
        f"KV-cache blocks: {kv_tokens(truth, args)}, size: 1"
    )


def summary(truth: GroundTruth, args: TgiArgs) -> str:
    return (
        f"tgi cuda_memory_fraction={fraction(args)} max_batch_prefill_tokens={prefill_tokens(truth, args)} "
        f"max_total_tokens={max_total_tokens(truth, args)} "
        f"max_concurrent_requests={concurrent_requests(args)} max_batch_total_tokens={kv_tokens(truth, args)}"
    )
