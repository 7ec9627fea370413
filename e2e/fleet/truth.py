"""Each scenario's ground truth: what the simulated GPU, model and traffic really do.

Deliberately independent of kvpilot's tuner (nothing here imports ``kvpilot``):
a scenario states its own physics -- GPU memory, the memory that is not KV cache,
KV bytes per token, the utilisation above which the engine hits CUDA OOM while
serving -- and the fleet derives everything else (KV blocks, start-up failure,
the texts vLLM prints) from it, the way vLLM 0.33 would. The planner and the
closed loop are then judged against facts they did not produce.

``EngineArgs.parse`` reads the vLLM flags of a pod's container (``--flag value``
and ``--flag=value``); defaults are vLLM 0.33's (``gpu_memory_utilization``
0.92, ``block_size`` 16, ``kv_cache_dtype`` auto) or the scenario's
(``max_model_len`` = the model's derived length, ``max_num_seqs``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from e2e.fleet import vllm_logs
from e2e.pods import termination_message

GiB = 1 << 30
MiB = 1 << 20

#: ``--kv-cache-dtype`` values that halve the KV bytes per token (fp8 variants).
FP8_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})

_VLLM = "/usr/local/lib/python3.12/dist-packages/vllm"
NULL_BLOCK_RESERVED_SINCE = (0, 29)
"""vLLM's KV fit check holds back the block pool's null block from this release on (``kv_cache_utils.py``
``check_enough_kv_cache_memory``: "Reserve the null block BlockPool permanently holds back"; the real 0.32
engine's estimate for 16 blocks of 128 is 1920, not 2048)."""
CONSERVING_MEMORY_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"


def _flag_name(token: str) -> str:
    return "--" + token[2:].replace("_", "-")


def _human_int(text: str) -> int:
    """vLLM's human-readable integers: ``32K`` = 32768, ``32k`` = 32000, ``1M`` = 1048576."""
    t = text.strip()
    for suffix, mult in (
        ("K", 1024),
        ("M", 1024**2),
        ("G", 1024**3),
        ("k", 1000),
        ("m", 1000**2),
        ("g", 1000**3),
    ):
        if t.endswith(suffix):
            return int(float(t[:-1]) * mult)
    return int(t)


@dataclasses.dataclass(frozen=True)
class EngineArgs:
    """The engine arguments of one pod, as vLLM would resolve them (``None``: flag absent)."""

    model: str = ""
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    block_size: int | None = None
    load_format: str = "auto"
    """``--load-format``: ``runai_streamer`` reads the weights at :attr:`StartupModel.streamer_gib_per_s`."""
    headless: bool = False
    """``--headless``: a multi-node group's worker, which runs engine ranks but no API server (no port, no
    ``/metrics``); the group's leader serves and reports for the whole group."""
    scheduler: str = "vllm"
    """Whose scheduler composes the engine model's steps (:class:`e2e.fleet.engine.SimEngine`): ``"vllm"``
    (vLLM V1: every step decodes the running sequences and fills the rest of the token budget with prefill
    chunks), ``"sglang"`` (SGLang 0.5.23 without ``--enable-mixed-chunk``: a step with prefill work is a
    prefill-only batch and the decodes wait) or ``"sglang-mixed"`` (``--enable-mixed-chunk``: the decode rows
    join the prefill batch, the chunk less one token per running request). Not a vLLM flag: set by the other
    engines' views (:func:`e2e.fleet.sglang_truth.engine_view`)."""

    @property
    def model_name(self) -> str:
        """The ``model_name`` label: ``--served-model-name`` (first) or ``--model``."""
        return self.served_model_name or self.model

    @classmethod
    def parse(cls, argv: Sequence[str]) -> EngineArgs:
        """Parse a container's ``command + args`` (``vllm serve MODEL`` positional model accepted)."""
        values: dict[str, str] = {}
        positional: list[str] = []
        tokens = list(argv)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.startswith("--"):
                if "=" in tok:
                    name, val = tok.split("=", 1)
                    values[_flag_name(name)] = val
                elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                    values[_flag_name(tok)] = tokens[i + 1]
                    i += 1
                else:
                    values[_flag_name(tok)] = "true"
            elif tok == "-tp" and i + 1 < len(tokens):
                values["--tensor-parallel-size"] = tokens[i + 1]
                i += 1
            else:
                positional.append(tok)
            i += 1
        model = values.get("--model", "")
        if not model:
            # `vllm serve MODEL ...`: the first positional after "serve"
            rest = positional[positional.index("serve") + 1 :] if "serve" in positional else positional
            model = next((p for p in rest if "/" in p or not p.startswith("-")), "") if rest else ""
        util = values.get("--gpu-memory-utilization", values.get("--device-memory-utilization"))
        mml = values.get("--max-model-len")
        return cls(
            model=model,
            served_model_name=(values.get("--served-model-name") or "").split(",")[0].split()[0]
            if values.get("--served-model-name")
            else None,
            max_model_len=None if mml in (None, "-1", "auto") else _human_int(mml),
            max_num_seqs=int(values["--max-num-seqs"]) if "--max-num-seqs" in values else None,
            gpu_memory_utilization=float(util) if util is not None else None,
            kv_cache_dtype=values.get("--kv-cache-dtype", "auto"),
            max_num_batched_tokens=_human_int(values["--max-num-batched-tokens"])
            if "--max-num-batched-tokens" in values
            else None,
            tensor_parallel_size=int(values.get("--tensor-parallel-size", "1")),
            block_size=int(values["--block-size"]) if "--block-size" in values else None,
            load_format=values.get("--load-format", "auto"),
            headless=values.get("--headless") == "true",
        )

    def summary(self) -> str:
        return (
            f"max_model_len={self.max_model_len} max_num_seqs={self.max_num_seqs} "
            f"gpu_memory_utilization={self.gpu_memory_utilization} kv_cache_dtype={self.kv_cache_dtype}"
        )


GPU_PERF: dict[str, tuple[float, float]] = {
    # name: (dense bf16 peak FLOP/s, HBM bytes/s), from NVIDIA's data sheets
    "H100-SXM": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "A100-80GB": (312e12, 2.039e12),
    "A100-40GB": (312e12, 1.555e12),
    "L40S": (362e12, 0.864e12),
    "L4": (121e12, 0.3e12),
    "B200": (2250e12, 8.0e12),
}


@dataclasses.dataclass(frozen=True)
class EnginePerf:
    """How long one vLLM engine step takes: a roofline.

    A step runs ``decode`` sequences one token each and ``prefill`` prompt tokens (chunked prefill within
    ``max_num_batched_tokens``). Its time is ``overhead_s + max(compute, memory)``:

    * compute: ``2 x active parameters x tokens`` FLOPs of the dense layers plus attention's
      ``attention_flops_per_token_pair`` per (token, context token) pair, over ``peak_flops x mfu``;
    * memory: the weights plus the KV cache of every scheduled sequence's context (halved with an fp8
      KV cache), over ``hbm_bytes_per_s x mbu``.

    So decode is memory-bound (a batch of 1 and of 32 cost about the same until the KV read or the
    compute catches up), prefill is compute-bound, long contexts slow decode down, and fp8 KV speeds
    up long-context decode. Defaults: Llama-3.1-8B (8.03 B parameters, 16.06 GB of bf16 weights, 32
    layers x 32 heads x 128) on an H100 SXM; ``mbu``, ``mfu`` and ``overhead_s`` fitted to the
    published sweeps that ``bench/engine_calibration.py`` cites and reproduces (it prints the error).
    """

    gpu: str = "H100-SXM"
    active_params: float = 8.03e9
    weight_bytes: float = 16.06e9
    attention_flops_per_token_pair: float = 4 * 32 * 32 * 128
    """``4 x layers x query heads x head_dim``: QK^T and PV for one query token against one context token."""
    mfu: float = 0.75
    mbu: float = 0.90
    overhead_s: float = 0.0009
    """Per step: scheduling, sampling, kernel launches outside the CUDA graph."""
    fp8_kv_attention_cost: float = 1.05
    """fp8 KV: attention FLOPs cost 5 % more (de-quantisation), its bytes half."""

    def step_seconds(
        self,
        *,
        decode: int,
        prefill: int,
        context_tokens: int,
        prefill_pairs: float,
        kv_bytes_per_token: float,
        fp8_kv: bool,
    ) -> float:
        """One engine step: ``decode`` sequences, ``prefill`` prompt tokens whose attention spans
        ``prefill_pairs`` (token, context) pairs, ``context_tokens`` of KV read by the decodes."""
        peak, bandwidth = GPU_PERF[self.gpu]
        attention = self.attention_flops_per_token_pair * (context_tokens + prefill_pairs)
        if fp8_kv:
            attention *= self.fp8_kv_attention_cost
        flops = 2.0 * self.active_params * (decode + prefill) + attention
        kv_read = kv_bytes_per_token * (context_tokens + prefill) * (0.5 if fp8_kv else 1.0)
        return self.overhead_s + max(
            flops / (peak * self.mfu), (self.weight_bytes + kv_read) / (bandwidth * self.mbu)
        )


@dataclasses.dataclass(frozen=True)
class StartupModel:
    """How long a vLLM container takes from start to listening: engine start-up, plus reading the
    checkpoint from disk, plus downloading it first when the weight cache does not hold it; less the
    compile a warm compile cache spares.

    Calibrated against public GPU start-up logs: ``tests/data/vllm_memory_cases.json`` and
    ``tests/data/vllm_logs/gpu_compile_lines.json`` (each line with its source; the test
    ``tests/tuner/test_fleet_compile_cache.py`` reads them with :mod:`kvpilot.tuner.vllm.log_lines`):

    * load from local disk: "Model loading took 14.99 GiB and 3.65 seconds" (Llama-3.1-8B, L40S),
      "65.97 GiB and 12.80 seconds" (gpt-oss-120b, H100), "48.5 GiB memory and 10.09 seconds"
      (gemma-4-26B-A4B, A100): 4.1-5.2 GiB/s, so :attr:`disk_gib_per_s` = 4.0. One network-volume
      case ("13.72 GiB memory and 62.34 seconds", gpt-oss-20b) reads at 0.22 GiB/s: set it per scenario.
    * engine start-up without the load (torch.compile, profile run, CUDA-graph capture): "Graph
      capturing finished in 2-17 secs" on H100s in the same logs, plus the compile, so
      :attr:`engine_s` = 45 on a cold compile cache.
    * the compile inside it: "torch.compile takes|took S s in total" on a cold cache (nothing under
      ``VLLM_CACHE_ROOT`` for this hash) is 13-82 s in the 8 cold GPU logs, median 23.5 s, so
      :attr:`compile_s` = 25; on a warm cache ("Directly load the compiled graph(s) ... from the cache")
      it is 1.7-9.4 s in the 7 warm ones, median 5.0 s, so :attr:`warm_compile_s` = 5. A warm start is
      the cold one less 20 s.
    * the streaming loader (``--load-format runai_streamer``): "[RunAI Streamer] Overall time to stream 942.3
      MiB of all files: 0.18s, 5.0 GiB/s" from a local disk (https://github.com/InftyAI/llmaz/pull/423, vLLM
      0.7.3), and 124.96 GiB from object storage in 14.29 s over 8 ranks
      (https://github.com/marin-community/marin/issues/7136): it reads many tensors at once, so its rate
      does not fall with a slow volume's per-read latency: :attr:`streamer_gib_per_s` = 5.0 whatever
      :attr:`disk_gib_per_s` is (on local NVMe barely faster than the default loader's 4.0).
    * download: ``huggingface_hub``'s ``snapshot_download`` without hf_transfer (what kvpilot's init
      container runs) from the Hub's CDN in a cloud region, about 4 Gbit/s: 0.5 GiB/s. An assumption:
      no public log in the set times a download; set it per scenario where the network is known.

    ``checkpoint_gib = 0`` keeps the constant :attr:`GroundTruth.startup_s` (fast tests). Otherwise the
    simulated seconds are compressed into wall seconds by :attr:`wall_per_simulated_s`.
    """

    checkpoint_gib: float = 0.0
    disk_gib_per_s: float = 4.0
    streamer_gib_per_s: float = 5.0
    download_gib_per_s: float = 0.5
    engine_s: float = 45.0
    """Engine start-up on a cold compile cache: the compile (:attr:`compile_s`) included."""
    compile_s: float = 25.0
    """The "torch.compile takes S s in total" of a cold start (part of :attr:`engine_s`)."""
    warm_compile_s: float = 5.0
    """The same line when the compiled graphs load from a warm cache instead."""
    wall_per_simulated_s: float = 0.02
    """Wall seconds per simulated second (0.02: a 16 GB model's 105 s cold start takes 2.1 s)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.warm_compile_s <= self.compile_s <= self.engine_s:
            raise ValueError(
                f"start-up terms out of order: warm compile {self.warm_compile_s} s, cold compile "
                f"{self.compile_s} s, engine {self.engine_s} s (want 0 <= warm <= cold <= engine)"
            )

    def simulated_seconds(
        self, *, cached: bool, compile_cached: bool = False, streamer: bool = False
    ) -> float:
        """Start-up seconds on a real GPU: download (unless ``cached``), load (at the streaming loader's
        rate with ``streamer``), engine start-up, whose compile is :attr:`warm_compile_s` instead of
        :attr:`compile_s` when ``compile_cached``."""
        download = 0.0 if cached else self.checkpoint_gib / self.download_gib_per_s
        load = self.checkpoint_gib / (self.streamer_gib_per_s if streamer else self.disk_gib_per_s)
        spared = self.compile_s - self.warm_compile_s if compile_cached else 0.0
        return download + load + self.engine_s - spared


@dataclasses.dataclass(frozen=True)
class GroundTruth:
    """The physics of one scenario (per GPU rank).

    KV-cache bytes = ``gpu_memory_utilization * gpu_memory_gib - non_kv_gib`` (GiB), as vLLM's
    budget does: requested memory minus weights, activation peak, non-torch memory and CUDA
    graphs, all lumped into ``non_kv_gib``. fp8 KV halves the bytes per token.
    """

    gpu_memory_gib: float = 79.11
    """What torch reports as the GPU's total memory (an H100 80GB: 79.11 GiB)."""
    non_kv_gib: float = 20.0
    """Everything that is not KV cache inside the requested budget."""
    kv_bytes_per_token: int = 131072
    """bf16 KV bytes per token over all layers (Llama-3.1-8B: 2 x 32 layers x 8 heads x 128 x 2 B)."""
    block_size: int = 16
    model_max_len: int = 131072
    """The model's derived max_model_len (used when --max-model-len is absent)."""
    default_max_num_seqs: int = 1024
    default_gpu_memory_utilization: float = 0.92
    default_max_num_batched_tokens: int = 8192
    """vLLM 0.33's default on a GPU of 70 GiB or more (``max_num_batched_tokens`` when the args omit it)."""
    activation_gib_per_1k_batched: float = 0.0
    """Activation peak of the profile run per 1000 batched tokens, on top of ``non_kv_gib``: a smaller
    ``max_num_batched_tokens`` leaves more memory for the KV cache."""
    fb_leak_gib_per_min: float = 0.0
    """Memory outside vLLM's budget that grows while serving (allocator fragmentation), up to
    :attr:`fb_leak_max_gib`: dcgm-exporter's framebuffer shows it coming; past the device, CUDA OOM."""
    fb_leak_max_gib: float = 0.0
    startup_gib_per_seq: float = 0.0
    """Start-up memory outside vLLM's budget per sequence (CUDA-graph capture, sampler warm-up): CUDA OOM
    at start-up when ``runtime_headroom_gib`` plus this times ``max_num_seqs`` exceeds
    ``(1 - gpu_memory_utilization) x GPU memory``."""
    fp8_kv_supported: bool = True
    runtime_oom_above_utilization: float | None = None
    """CUDA OOM while serving when ``gpu_memory_utilization`` is strictly above this (fragmentation,
    sampler or NCCL buffers outside vLLM's budget)."""
    runtime_oom_above_max_num_seqs: int | None = None
    """CUDA OOM while serving when ``max_num_seqs`` is strictly above this (activations of a full batch)."""
    runtime_headroom_gib: float | None = None
    """Memory the engine needs *outside* vLLM's ``gpu_memory_utilization`` budget while serving (CUDA
    context, allocator fragmentation, NCCL) on top of ``runtime_gib_per_seq`` per running sequence
    (sampler logits). CUDA OOM while serving when ``(1 - gpu_memory_utilization) x GPU memory`` is
    smaller: both a lower utilisation and fewer sequences cure it."""
    runtime_gib_per_seq: float = 0.0
    startup_oom_above_utilization: float | None = None
    """CUDA OOM during start-up (profiling, CUDA-graph capture, sampler warm-up) when
    ``gpu_memory_utilization`` is strictly above this: the pod never becomes Ready."""
    startup_oom_above_max_num_seqs: int | None = None
    """CUDA OOM during start-up when ``max_num_seqs`` is strictly above this (the sampler warm-up allocates
    logits for ``max_num_seqs`` sequences; vllm_reference.md section 6)."""
    oom_after_s: float = 3.0
    """Wall seconds of serving before such a runtime OOM strikes."""
    startup_s: float = 1.0
    """Wall seconds of model loading/profiling before the engine listens (or fails), when
    :attr:`startup` has no checkpoint size."""
    startup: StartupModel = dataclasses.field(default_factory=StartupModel)
    perf: EnginePerf = dataclasses.field(default_factory=EnginePerf)
    """Step time of the engine (the roofline)."""
    """Start-up time from the checkpoint size and whether the pod's weight cache holds it."""
    backoff_s: float = 4.0
    """Wall seconds of CrashLoopBackOff before the first restart (kubelet: 10 s, doubling)."""
    sglang_weights_gib: float = 14.99
    """SGLang pods: the weights one rank loads (Llama-3.1-8B in bf16: "mem usage=14.99 GB"), charged to the
    ``--mem-fraction-static`` share (:mod:`e2e.fleet.sglang_truth`)."""
    sglang_cuda_context_gib: float = 0.5
    """SGLang pods: memory taken before the weights load (CUDA context, NCCL): the free memory SGLang
    profiles before the load is the GPU's total less this."""
    sglang_default_mem_fraction_static: float = 0.835
    """SGLang pods without ``--mem-fraction-static``: SGLang's default for this GPU
    (``arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``; an H100 80GB: 0.835)."""
    runtime_oom_above_mem_fraction_static: float | None = None
    """SGLang pods: CUDA OOM while serving when ``--mem-fraction-static`` is strictly above this (the
    activations and CUDA graphs outside the share no longer fit)."""
    tgi_prefill_gib_per_1k_tokens: float = 0.12
    """TGI pods: the activations of the warm-up prefill per 1000 of its ``--max-batch-prefill-tokens``, still
    held when the warm-up measures the free memory (:mod:`e2e.fleet.tgi_truth`; Llama-3.1-8B's MLP in bf16:
    about 0.12 GiB)."""
    tgi_default_max_batch_prefill_tokens: int = 4096
    """TGI pods without ``--max-batch-prefill-tokens``: the launcher's default for the scenario's card (4096
    for a card it does not know; compute-optimal on one it knows)."""
    runtime_oom_above_cuda_memory_fraction: float | None = None
    """TGI pods: CUDA OOM while serving when ``--cuda-memory-fraction`` is strictly above this (the CUDA
    graphs and the decode's activations outgrow the memory the fraction leaves)."""
    vllm_release: tuple[int, int] = (0, 33)
    """The release whose start-up failures the engine reproduces: the null block in the fit check
    (:data:`NULL_BLOCK_RESERVED_SINCE`), the fit check's frames in the log (:mod:`e2e.fleet.vllm_logs`)."""

    # ------------------------------------------------------------------ derived
    def startup_wall_s(self, *, cached: bool, compile_cached: bool = False, streamer: bool = False) -> float:
        """Wall seconds from container start to listening (or failing)."""
        if self.startup.checkpoint_gib <= 0:
            return self.startup_s
        simulated = self.startup.simulated_seconds(
            cached=cached, compile_cached=compile_cached, streamer=streamer
        )
        return simulated * self.startup.wall_per_simulated_s

    def utilization(self, args: EngineArgs) -> float:
        return (
            args.gpu_memory_utilization
            if args.gpu_memory_utilization is not None
            else self.default_gpu_memory_utilization
        )

    def max_model_len(self, args: EngineArgs) -> int:
        return args.max_model_len if args.max_model_len is not None else self.model_max_len

    def max_num_seqs(self, args: EngineArgs) -> int:
        return args.max_num_seqs if args.max_num_seqs is not None else self.default_max_num_seqs

    def block(self, args: EngineArgs) -> int:
        return args.block_size or self.block_size

    def bytes_per_token(self, args: EngineArgs) -> int:
        if args.kv_cache_dtype in FP8_KV_DTYPES and self.fp8_kv_supported:
            return self.kv_bytes_per_token // 2
        return self.kv_bytes_per_token

    def max_num_batched_tokens(self, args: EngineArgs) -> int:
        return args.max_num_batched_tokens or self.default_max_num_batched_tokens

    def non_kv(self, args: EngineArgs) -> float:
        """GiB of the budget that is not KV cache: weights, activations (per batched token), the rest."""
        return self.non_kv_gib + self.activation_gib_per_1k_batched * self.max_num_batched_tokens(args) / 1000

    def kv_cache_bytes(self, args: EngineArgs) -> int:
        """Memory left for the KV cache (may be <= 0)."""
        return int((self.utilization(args) * self.gpu_memory_gib - self.non_kv(args)) * GiB)

    def framebuffer_used_gib(self, args: EngineArgs, running: int, serving_s: float) -> float:
        """What dcgm-exporter's ``DCGM_FI_DEV_FB_USED`` shows: vLLM's budget, the run-time memory outside
        it (headroom, per running sequence) and what has leaked since the engine started serving."""
        leak = min(self.fb_leak_max_gib, self.fb_leak_gib_per_min * serving_s / 60.0)
        outside = (self.runtime_headroom_gib or 0.5) + self.runtime_gib_per_seq * running + leak
        return self.utilization(args) * self.gpu_memory_gib + outside

    def outside_budget_gib(self, args: EngineArgs) -> float:
        """``(1 - gpu_memory_utilization) x GPU memory``: what vLLM leaves to everything else."""
        return (1.0 - self.utilization(args)) * self.gpu_memory_gib

    def num_gpu_blocks(self, args: EngineArgs) -> int:
        page = self.bytes_per_token(args) * self.block(args)
        return max(0, self.kv_cache_bytes(args) // page)

    def kv_tokens(self, args: EngineArgs) -> int:
        return self.num_gpu_blocks(args) * self.block(args)

    def max_concurrency(self, args: EngineArgs) -> float:
        """vLLM's "Maximum concurrency for N tokens per request": KV tokens / max_model_len."""
        return self.kv_tokens(args) / max(1, self.max_model_len(args))

    # ------------------------------------------------------------------ faults
    def startup_error(self, args: EngineArgs) -> str | None:
        """The ValueError vLLM (:attr:`vllm_release`) raises at start-up for these args, or None if it starts.

        Exact texts of ``vllm/v1/core/kv_cache_planning.py::_check_enough_kv_cache_memory`` (0.33;
        ``kv_cache_utils.py`` before; vllm_reference.md section 1.6, 0.25+ wording), checked on the memory
        that is left once the null block is held back (0.29+): the figures the message prints.
        """
        if args.kv_cache_dtype in FP8_KV_DTYPES and not self.fp8_kv_supported:
            return (
                f"ValueError: Unknown or unsupported kv cache dtype {args.kv_cache_dtype!r} "
                "for this GPU/attention backend"
            )
        bs = self.block(args)
        page = self.bytes_per_token(args) * bs
        available = self.kv_cache_bytes(args)
        if self.vllm_release >= NULL_BLOCK_RESERVED_SINCE:
            available -= page
        if available <= 0:
            return (
                "ValueError: No available memory for the cache blocks. "
                "Try increasing `gpu_memory_utilization` when initializing the engine "
                "(this flag also controls CPU memory reservation on the CPU backend, despite its name). "
                f"See {CONSERVING_MEMORY_URL} for more details."
            )
        mml = self.max_model_len(args)
        needed = math.ceil(mml / bs) * page
        if needed <= available:
            return None
        estimated = min(mml, (available // page) * bs)
        estimated_msg = (
            f"Based on the available memory, the estimated maximum model length is {estimated}. "
            if estimated > 0
            else ""
        )
        return (
            f"ValueError: To serve at least one request with the model's max seq len ({mml}), "
            f"({round(needed / GiB, 2)} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({round(available / GiB, 2)} GiB). {estimated_msg}"
            "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) "
            "or decreasing `max_model_len` when initializing the engine. "
            f"See {CONSERVING_MEMORY_URL} for more details."
        )

    def runtime_oom(self, args: EngineArgs, running: int | None = None) -> bool:
        """Whether these args hit CUDA OOM while serving: with ``running`` sequences, or (``None``) once
        the batch reaches ``max_num_seqs``."""
        u = self.runtime_oom_above_utilization
        s = self.runtime_oom_above_max_num_seqs
        if self.runtime_headroom_gib is not None:
            batch = self.max_num_seqs(args) if running is None else running
            if (
                self.outside_budget_gib(args) + 1e-9
                < self.runtime_headroom_gib + self.runtime_gib_per_seq * batch
            ):
                return True
        return (u is not None and self.utilization(args) > u + 1e-9) or (
            s is not None and self.max_num_seqs(args) > s
        )

    def startup_oom(self, args: EngineArgs) -> bool:
        """Whether these args hit CUDA OOM before the engine is ready."""
        u = self.startup_oom_above_utilization
        s = self.startup_oom_above_max_num_seqs
        if self.startup_gib_per_seq > 0:
            need = (self.runtime_headroom_gib or 0.0) + self.startup_gib_per_seq * self.max_num_seqs(args)
            if need > self.outside_budget_gib(args) + 1e-9:
                return True
        return (u is not None and self.utilization(args) > u + 1e-9) or (
            s is not None and self.max_num_seqs(args) > s
        )

    def cuda_oom_message(self, args: EngineArgs, *, startup: bool = False) -> str:
        """A CUDA OOM as the container's termination message (torch >= 2.1 wording, in-container)."""
        total = self.gpu_memory_gib
        used = min(total - 0.14, self.utilization(args) * total + 0.35)
        tried_mib = 786.0
        if startup and self.startup_gib_per_seq > 0:  # PyTorch prints the allocation that failed
            tried_mib = self.startup_gib_per_seq * self.max_num_seqs(args) * 1024
            used = self.utilization(args) * total + (self.runtime_headroom_gib or 0.0)
        if startup:
            head = [
                "ERROR [core.py:1584] EngineCore failed to start.",
                "Traceback (most recent call last):",
                f'  File "{_VLLM}/v1/engine/core.py", line 1573, in run_engine_core',
                f'  File "{_VLLM}/v1/worker/gpu_model_runner.py", line 2391, in _dummy_sampler_run',
            ]
        else:
            head = [
                "ERROR [core.py:1586] EngineCore encountered a fatal error.",
                "Traceback (most recent call last):",
                f'  File "{_VLLM}/v1/engine/core.py", line 1084, in run_busy_loop',
                f'  File "{_VLLM}/v1/sample/sampler.py", line 160, in forward',
            ]
        lines = head + [
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib:.2f} MiB. "
            f"GPU 0 has a total capacity of {total:.2f} GiB "
            f"of which {(total - used) * 1024:.2f} MiB is free. "
            f"Including non-PyTorch memory, this process has {used:.2f} GiB memory in use. "
            f"Of the allocated memory {used - 1.1:.2f} GiB is allocated by PyTorch, "
            "with 660.00 MiB allocated in private pools (e.g., CUDA Graphs), "
            "and 331.08 MiB is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            "See documentation for Memory Management "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ]
        if startup:
            lines.append(
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {'EngineCore_DP0': 1}"
            )
        return "\n".join(lines) + "\n"

    def startup_failure_log(self, args: EngineArgs, error: str) -> str:
        """The container's log after a start-up ValueError, in the real engine's shape
        (:func:`e2e.fleet.vllm_logs.startup_failure_log`): the error ~60 lines above the last line."""
        return vllm_logs.startup_failure_log(error, self.vllm_release, _VLLM)

    def startup_failure_message(self, args: EngineArgs, error: str) -> str:
        """The container's termination message after a start-up ValueError: kubelet's tail of
        :meth:`startup_failure_log` (80 lines / 2 KiB), which, as a real vLLM's, no longer holds the error."""
        return termination_message(self.startup_failure_log(args, error))


@dataclasses.dataclass(frozen=True)
class Workload:
    """Traffic one pod receives, in simulated time (requests arrive as a Poisson process)."""

    arrival_rate: float = 2.0
    """Requests per simulated second, per pod."""
    prompt_tokens: int = 512
    """Mean prompt length."""
    output_tokens: int = 256
    """Mean output length (the request's ``max_tokens``; it stops there)."""
    spread: float = 0.25
    """``uniform``: lengths are uniform in ``mean * (1 +- spread)``; ``lognormal``: the coefficient of
    variation (standard deviation / mean), as chat and RAG traces have (ShareGPT's outputs: about 1)."""
    distribution: str = "uniform"
    """``uniform`` or ``lognormal``."""
    time_scale: float = 1.0
    """Simulated seconds per wall second."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What the fleet simulates for one InferenceService: physics, traffic and exposition."""

    truth: GroundTruth = dataclasses.field(default_factory=GroundTruth)
    workload: Workload = dataclasses.field(default_factory=Workload)
    naming: str = "current"
    """``current``: vLLM 0.33 names; ``legacy``: pre-rename (0.8.x V1: ``vllm:gpu_cache_usage_perc`` only);
    ``both``: 0.9.2-0.10 (both gauges)."""
    seed: int = 0
    name: str = "default"

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scenario:
        return cls(
            truth=_ground_truth(d.get("truth", {})),
            workload=Workload(**d.get("workload", {})),
            naming=d.get("naming", "current"),
            seed=int(d.get("seed", 0)),
            name=d.get("name", "default"),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ground_truth(d: dict[str, Any]) -> GroundTruth:
    fields = dict(d)
    if isinstance(fields.get("startup"), dict):
        fields["startup"] = StartupModel(**fields["startup"])
    if isinstance(fields.get("perf"), dict):
        fields["perf"] = EnginePerf(**fields["perf"])
    if "vllm_release" in fields:  # a JSON list
        major, minor = fields["vllm_release"]
        fields["vllm_release"] = (int(major), int(minor))
    return GroundTruth(**fields)
