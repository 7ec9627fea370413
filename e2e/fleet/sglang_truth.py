"""SGLang 0.5.23 pods in the fleet: the flags a container runs, its KV pool, its failures and their texts.

Deliberately independent of kvpilot (nothing here imports ``kvpilot``; ``e2e/test_fleet.py`` checks): every
fact below is read from SGLang 0.5.23's own source (``sglang/srt/`` of the wheel in ``.venv-sglang``), by file
and line, as :mod:`e2e.fleet.truth` does for vLLM. The scenario's physics are the same
:class:`e2e.fleet.truth.GroundTruth` (GPU memory, KV bytes per token, the model's context, the roofline);
the SGLang terms it adds are its ``sglang_*`` fields and
:attr:`GroundTruth.runtime_oom_above_mem_fraction_static`.

Memory, as SGLang sizes it:

* ``--mem-fraction-static`` is the share of the memory free before the weights load that holds weights +
  KV pool; activations and CUDA graphs live outside it. ``mem_cache/kv_cache_configurator.py``
  ``_profile_available_bytes`` (lines 2990-3060): ``rest = available_after_load - pre_model_load x (1 -
  fraction)``, i.e. ``pre_model_load x fraction - weights``; ``rest <= 0`` raises "Loaded weights leave no
  GPU memory for the KV cache ..." (lines 3043-3058). ``pre_model_load`` is the free memory before the load
  (``model_executor/model_runner.py`` line 1262): the GPU's total less the CUDA context
  (:attr:`GroundTruth.sglang_cuda_context_gib`).
* Tokens: ``rest // cell`` rounded down to ``--page-size`` (``model_executor/pool_configurator.py``
  ``calculate_pool_sizes``, lines 637-647), capped by ``--max-total-tokens`` (``kv_cache_configurator.py``
  lines 398-401); zero tokens raises "Not enough memory. Please try to increase --mem-fraction-static.
  Current value: mem_fraction_static=X" (``MemoryPoolConfig.__post_init__``, lines 94-98 of
  ``pool_configurator.py``).
* ``--max-running-requests``: given, ``min(given, tokens // 2)``; absent, ``min(max(min(tokens / context x
  512, 4096), 2048), tokens // 2)`` (``kv_cache_configurator.py`` ``resolve_max_num_reqs``, lines 3119-3132).
* A request is at most ``min(context - 1, tokens - 1)`` tokens (``managers/tp_worker.py`` lines 421-425):
  a pool shorter than the context shortens requests; it does not stop the start.
* Run time: CUDA OOM when the fraction is above the scenario's threshold
  (:attr:`GroundTruth.runtime_oom_above_mem_fraction_static`: too little left outside the share for the
  activations), or the running requests above :attr:`GroundTruth.runtime_oom_above_max_num_seqs`; the
  scheduler logs "Scheduler hit an exception: <traceback>" and signals its parent, which logs "Received
  sigquit from a child process. It usually means the child failed." (``managers/scheduler.py`` lines
  6362-6373, ``entrypoints/engine.py`` lines 1977-1980; the frames the fleet prints are real lines).
* Batch lines: the scheduler logs every prefill batch and every ``--decode-log-interval`` (40) decode steps
  with ``#running-req`` (``managers/scheduler_components/metrics_reporter.py`` lines 753-762 and 963,
  :func:`decode_batch_line`), so a CUDA OOM's log shows how many requests ran before it; a batch-driven OOM
  strikes the first batch above the threshold, so the last line shows at most the threshold
  (:func:`logged_running`).
* Retraction: a decode short of KV retracts the newest requests and logs "KV cache pool is full. Retract
  requests. #retracted_reqs: N, #new_tokens_gained: M, #new_token_ratio: a -> b" (``managers/scheduler.py``
  lines 4525-4536); the fleet's engine model (:mod:`e2e.fleet.engine`) preempts the same way, so its
  preemptions are SGLang's retractions.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

from e2e.fleet.truth import EngineArgs, GiB, GroundTruth

SGLANG = "/sgl-workspace/sglang/python/sglang"
"""Where SGLang's image installs the package (the traceback's file names)."""
LAUNCH_MODULE = "sglang.launch_server"
"""``python3 -m sglang.launch_server``: the SGLang server a container runs."""
DEFAULT_PAGE_SIZE = 1
"""``--page-size`` default (``arg_groups/fields/schedule.py`` line 143) for the CUDA attention backends."""
FP8_KV = frozenset({"fp8_e4m3", "fp8_e5m2"})


def is_sglang(argv: Sequence[str]) -> bool:
    """Whether a container's ``command + args`` launch SGLang's server."""
    return any(tok == LAUNCH_MODULE or tok.endswith("/sglang/launch_server.py") for tok in argv)


@dataclasses.dataclass(frozen=True)
class SglangArgs:
    """The flags of one SGLang container (``None``: absent, SGLang's default)."""

    model_path: str = ""
    served_model_name: str | None = None
    context_length: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    enable_metrics: bool = False
    enable_mixed_chunk: bool = False
    """``--enable-mixed-chunk`` (``arg_groups/fields/schedule.py``, default off): the running decode batch
    joins a prefill batch (``Scheduler.is_mixed_chunk``); off, a prefill batch runs alone."""
    port: int = 30000
    nnodes: int = 1
    node_rank: int = 0
    """``--node-rank``: a rank >= 1 of a group over several nodes runs its schedulers and no HTTP server
    (``entrypoints/http_server.py`` line 3163): no port, no ``/metrics``."""

    @property
    def model_name(self) -> str:
        """The ``model_name`` label: ``--served-model-name``, else ``--model-path``
        (``arg_groups/fields/serving.py`` line 168)."""
        return self.served_model_name or self.model_path

    @classmethod
    def parse(cls, argv: Sequence[str], env: Mapping[str, str] | None = None) -> SglangArgs:
        """Parse ``command + args`` (``--flag value`` and ``--flag=value``; ``--model`` is SGLang's alias),
        with ``$(VAR)`` references expanded from the container's ``env`` as the kubelet expands them (a
        LeaderWorkerSet's ``--node-rank $(LWS_WORKER_INDEX)``)."""
        env = env or {}
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
        values: dict[str, str] = {}
        tokens = list(argv)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.startswith("--"):
                if "=" in tok:
                    name, val = tok.split("=", 1)
                    values[name.replace("_", "-")] = val
                elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    values[tok.replace("_", "-")] = tokens[i + 1]
                    i += 1
                else:
                    values[tok.replace("_", "-")] = "true"
            i += 1

        def num(flag: str) -> int | None:
            return int(values[flag]) if flag in values else None

        tp = values.get("--tp-size", values.get("--tensor-parallel-size", "1"))
        return cls(
            model_path=values.get("--model-path", values.get("--model", "")),
            served_model_name=values.get("--served-model-name"),
            context_length=num("--context-length"),
            mem_fraction_static=float(values["--mem-fraction-static"])
            if "--mem-fraction-static" in values
            else None,
            max_running_requests=num("--max-running-requests"),
            max_total_tokens=num("--max-total-tokens"),
            chunked_prefill_size=num("--chunked-prefill-size"),
            page_size=num("--page-size"),
            kv_cache_dtype=values.get("--kv-cache-dtype", "auto"),
            tp_size=int(tp),
            enable_metrics=values.get("--enable-metrics") == "true",
            enable_mixed_chunk=values.get("--enable-mixed-chunk") == "true",
            port=int(values.get("--port", "30000")),
            nnodes=int(values.get("--nnodes", "1")),
            node_rank=int(values.get("--node-rank", "0")),
        )


# ---------------------------------------------------------------------------- memory


def mem_fraction_static(truth: GroundTruth, args: SglangArgs) -> float:
    return (
        args.mem_fraction_static
        if args.mem_fraction_static is not None
        else truth.sglang_default_mem_fraction_static
    )


def pre_model_load_gib(truth: GroundTruth) -> float:
    """Free memory before the weights load: the GPU's total less the CUDA context."""
    return truth.gpu_memory_gib - truth.sglang_cuda_context_gib


def rest_memory_gib(truth: GroundTruth, args: SglangArgs) -> float:
    """``_profile_available_bytes``' ``rest_memory``: free after load less the slack outside the share."""
    pre = pre_model_load_gib(truth)
    available = pre - truth.sglang_weights_gib
    return available - pre * (1.0 - mem_fraction_static(truth, args))


def cell_bytes(truth: GroundTruth, args: SglangArgs) -> int:
    """KV bytes per token on one rank (fp8 KV: half the bf16 cell)."""
    return truth.kv_bytes_per_token // 2 if args.kv_cache_dtype in FP8_KV else truth.kv_bytes_per_token


def page(args: SglangArgs) -> int:
    return args.page_size or DEFAULT_PAGE_SIZE


def max_total_num_tokens(truth: GroundTruth, args: SglangArgs) -> int:
    """The pool's tokens (``sglang:max_total_num_tokens``); <= 0 when it holds none."""
    rest = rest_memory_gib(truth, args)
    if rest <= 0:
        return 0
    tokens = int(rest * GiB) // cell_bytes(truth, args) // page(args) * page(args)
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens)
    return tokens


def context_len(truth: GroundTruth, args: SglangArgs) -> int:
    return args.context_length if args.context_length is not None else truth.model_max_len


def max_running_requests(truth: GroundTruth, args: SglangArgs) -> int:
    """``resolve_max_num_reqs`` (``kv_cache_configurator.py`` lines 3119-3132)."""
    tokens = max_total_num_tokens(truth, args)
    if args.max_running_requests is not None:
        return min(max(1, args.max_running_requests), tokens // 2)
    estimated = max(min(int(tokens / context_len(truth, args) * 512), 4096), 2048)
    return min(estimated, tokens // 2)


def chunked_prefill_size(truth: GroundTruth, args: SglangArgs) -> int:
    """``--chunked-prefill-size``, else the tier default the scenario states (H100: 8192)."""
    return args.chunked_prefill_size or truth.default_max_num_batched_tokens


def max_req_len(truth: GroundTruth, args: SglangArgs) -> int:
    """``tp_worker.py`` lines 421-425: ``min(context - 1, tokens - 1)``."""
    return min(context_len(truth, args) - 1, max_total_num_tokens(truth, args) - 1)


def scheduler(args: SglangArgs) -> str:
    """How SGLang's scheduler composes a step (:attr:`EngineArgs.scheduler`), from
    ``managers/scheduler.py``: ``Scheduler.get_next_batch_to_run`` runs the prefill batch
    ``get_new_batch_prefill`` returns when there is one ("Run prefill first if possible") and the running
    batch's decode (``update_running_batch``) only when there is none; ``_get_new_batch_prefill_raw`` mixes
    the decode rows into the prefill batch (``ScheduleBatch.mix_with_running``) only when
    ``is_mixed_chunk`` (``init_chunked_prefill``: a chunk size and ``--enable-mixed-chunk``), and then
    takes one token per running request off the chunk (``PrefillAdder``'s ``num_mixed_decode_tokens``)."""
    return "sglang-mixed" if args.enable_mixed_chunk else "sglang"


def engine_view(truth: GroundTruth, args: SglangArgs) -> EngineArgs:
    """The engine model's arguments for this SGLang server (:class:`e2e.fleet.engine.SimEngine` runs both
    engines): the context is the longest request, sequences the running requests, the batched tokens the
    prefill chunk, a block the page, the steps SGLang's (:func:`scheduler`); the KV pool is passed apart
    (:func:`max_total_num_tokens`)."""
    return EngineArgs(
        model=args.model_path,
        served_model_name=args.served_model_name,
        max_model_len=max(2, max_req_len(truth, args) + 1),
        max_num_seqs=max(1, max_running_requests(truth, args)),
        gpu_memory_utilization=mem_fraction_static(truth, args),
        kv_cache_dtype="fp8" if args.kv_cache_dtype in FP8_KV else "auto",
        max_num_batched_tokens=chunked_prefill_size(truth, args),
        tensor_parallel_size=args.tp_size,
        block_size=page(args),
        headless=args.node_rank >= 1,
        scheduler=scheduler(args),
    )


def framebuffer_used_gib(truth: GroundTruth, args: SglangArgs) -> float:
    """What dcgm-exporter shows: the CUDA context, the share of the rest, and the activations outside it."""
    outside = truth.runtime_headroom_gib if truth.runtime_headroom_gib is not None else 2.0
    share = pre_model_load_gib(truth) * mem_fraction_static(truth, args)
    return min(truth.gpu_memory_gib, truth.sglang_cuda_context_gib + share + outside)


# ---------------------------------------------------------------------------- failures


def startup_error(truth: GroundTruth, args: SglangArgs) -> str | None:
    """The exception SGLang raises while sizing the pool, or None when it starts."""
    fraction = mem_fraction_static(truth, args)
    pre = pre_model_load_gib(truth)
    if rest_memory_gib(truth, args) <= 0:  # kv_cache_configurator.py lines 3043-3058
        available = pre - truth.sglang_weights_gib
        minimum = 1 - available / pre
        suggested = math.ceil(minimum * 1000) / 1000
        return (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={fraction}. Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative decoding, draft "
            "weights are now counted."
        )
    if max_total_num_tokens(truth, args) <= 0:  # pool_configurator.py lines 94-98
        return (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={fraction}"
        )
    return None


def runtime_oom(truth: GroundTruth, args: SglangArgs, running: int | None = None) -> bool:
    """Whether serving runs out of memory: the share leaves too little outside it (the scenario's fraction
    threshold), or the running requests' activations outgrow it
    (:attr:`GroundTruth.runtime_oom_above_max_num_seqs`: with ``running`` requests in the batch, or, ``None``,
    once the batch reaches the resolved ``--max-running-requests``)."""
    limit = truth.runtime_oom_above_mem_fraction_static
    if limit is not None and mem_fraction_static(truth, args) > limit + 1e-9:
        return True
    seqs = truth.runtime_oom_above_max_num_seqs
    batch = max_running_requests(truth, args) if running is None else running
    return seqs is not None and batch > seqs


def _frame(path: str, line: int, function: str, code: str) -> tuple[str, str]:
    """One traceback frame of SGLang 0.5.23's own code, as Python prints it: the file, then its line."""
    return f'  File "{SGLANG}/srt/{path}", line {line}, in {function}', f"    {code}"


def _scheduler_exception(last: list[str]) -> list[str]:
    return [
        "[2026-12-05 18:31:04 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        *last,
        "",
        "[2026-12-05 18:31:04] Received sigquit from a child process. It usually means the child failed.",
    ]


def startup_failure_log(truth: GroundTruth, args: SglangArgs, error: str) -> str:
    """The container's log when the pool cannot be sized: the scheduler's traceback, then the parent."""
    tokens_line = (
        f"[2026-12-05 18:31:02 TP0] Load weight end. elapsed=3.65 s, type=LlamaForCausalLM, "
        f"avail mem={pre_model_load_gib(truth) - truth.sglang_weights_gib:.2f} GB, "
        f"mem usage={truth.sglang_weights_gib:.2f} GB."
    )
    frames = [
        f'  File "{SGLANG}/srt/managers/scheduler.py", line 6362, in run_scheduler_process',
        f'  File "{SGLANG}/srt/model_executor/model_runner.py", line 982, in alloc_memory_pool',
        f'  File "{SGLANG}/srt/mem_cache/kv_cache_configurator.py", line 476, in configure',
        error,
    ]
    return "\n".join([tokens_line, *_scheduler_exception(frames)]) + "\n"


def decode_batch_line(truth: GroundTruth, args: SglangArgs, running: int, token_usage: float) -> str:
    """The scheduler's decode-batch line (``metrics_reporter.py`` line 963 with ``pool_stats_observer.py``
    lines 145-148's usage part, then lines 1039-1043's graph and throughput fields)."""
    tokens = max(0, round(token_usage * max_total_num_tokens(truth, args)))
    return (
        f"[2026-12-05 18:31:03 TP0] Decode batch, #running-req: {running}, #token: {tokens}, "
        f"token usage: {token_usage:.2f}, cuda graph: True, gen throughput (token/s): 2871.40, "
        "#queue-req: 0"
    )


def logged_running(truth: GroundTruth, args: SglangArgs, running: int) -> int:
    """The running requests the last batch line before a run-time OOM shows: a batch-driven OOM
    (:attr:`GroundTruth.runtime_oom_above_max_num_seqs`) strikes the first batch above the threshold, so the
    batches logged before it held at most the threshold."""
    seqs = truth.runtime_oom_above_max_num_seqs
    return min(running, seqs) if seqs is not None else running


def cuda_oom_message(
    truth: GroundTruth, args: SglangArgs, running: int | None = None, token_usage: float = 0.0
) -> str:
    """A CUDA OOM while serving (PyTorch's text), as SGLang's scheduler logs it; with ``running``, after the
    batch line the scheduler logged last (:func:`logged_running`)."""
    total = truth.gpu_memory_gib
    used = min(total - 0.14, framebuffer_used_gib(truth, args))
    frames = [
        *_frame("managers/scheduler.py", 6368, "run_scheduler_process", "scheduler.run_event_loop()"),
        *_frame("managers/scheduler.py", 2048, "event_loop_normal", "result = self.run_batch(batch)"),
        *_frame(
            "managers/scheduler.py",
            4870,
            "run_batch",
            "batch_result = self.model_worker.forward_batch_generation(",
        ),
        *_frame("managers/tp_worker.py", 675, "forward_batch_generation", "out = self.model_runner.forward("),
        *_frame("model_executor/model_runner.py", 1860, "forward", "output = self._forward_raw("),
        *_frame("models/llama.py", 625, "forward", "return self.logits_processor("),
        *_frame(
            "layers/logits_processor.py",
            634,
            "forward",
            "logits = self._get_logits(pruned_states, lm_head, logits_metadata)",
        ),
        *_frame("layers/logits_processor.py", 999, "_get_logits", "logits = self._compute_lm_head("),
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. "
        f"GPU 0 has a total capacity of {total:.2f} GiB of which {(total - used) * 1024:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. "
        f"Of the allocated memory {used - 1.1:.2f} GiB is allocated by PyTorch, "
        "with 512.00 MiB allocated in private pools (e.g., CUDA Graphs), "
        "and 301.08 MiB is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]
    batch = (
        []
        if running is None
        else [decode_batch_line(truth, args, logged_running(truth, args, running), token_usage)]
    )
    return "\n".join([*batch, *_scheduler_exception(frames)]) + "\n"


def retraction_warning(retracted: int, new_tokens_gained: int, old_ratio: float, new_ratio: float) -> str:
    """``managers/scheduler.py`` lines 4525-4536."""
    return (
        "[2026-12-05 18:31:04 TP0] KV cache pool is full. Retract requests. "
        f"#retracted_reqs: {retracted}, #new_tokens_gained: {new_tokens_gained}, "
        f"#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}"
    )


def serving_log(truth: GroundTruth, args: SglangArgs) -> str:
    """The scheduler's start-up summary (``managers/scheduler.py`` lines 1268-1276)."""
    return (
        f"[2026-12-05 18:31:03 TP0] max_total_num_tokens={max_total_num_tokens(truth, args)}, "
        f"chunked_prefill_size={chunked_prefill_size(truth, args)}, "
        f"max_prefill_tokens=16384, max_running_requests={max_running_requests(truth, args)}, "
        f"context_len={context_len(truth, args)}, available_gpu_mem="
        f"{truth.gpu_memory_gib - framebuffer_used_gib(truth, args):.2f} GB"
    )


def summary(truth: GroundTruth, args: SglangArgs) -> str:
    return (
        f"sglang mem_fraction_static={mem_fraction_static(truth, args)} "
        f"context_length={context_len(truth, args)} max_running_requests={max_running_requests(truth, args)} "
        f"max_total_num_tokens={max_total_num_tokens(truth, args)}"
    )
