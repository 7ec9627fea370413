"""What a pod's engine does with its settings, per engine: the fleet's physics behind one interface.

The bench's Deployment (:mod:`bench.loopsim.world`) runs vLLM pods or SGLang pods; both serve through the
fleet's engine model (:class:`e2e.fleet.engine.SimEngine`), and differ in how their settings size the KV
cache, fail at start-up, run out of memory and fill the framebuffer:

* vLLM (:class:`VllmPhysics`): :class:`e2e.fleet.truth.GroundTruth`'s own methods (start-up failures with
  vLLM's texts, CUDA OOM at start-up and with the running batch);
* SGLang (:class:`SglangPhysics`): :mod:`e2e.fleet.sglang_truth` (the pool SGLang sizes from
  ``--mem-fraction-static``, its "Not enough memory" / "Loaded weights leave no GPU memory" start-up errors in
  the scheduler's log, run-time CUDA OOM above the scenario's fraction or running-request threshold, and
  :func:`~e2e.fleet.sglang_truth.engine_view` for the engine model), exactly as the e2e fleet plays them;
* TGI (:class:`TgiPhysics`): :mod:`e2e.fleet.tgi_truth` (the KV tokens TGI 3.3.7's warm-up infers from what
  its prefill leaves, "Not enough memory to handle N prefill tokens" and ``NotEnoughMemory`` at start-up,
  run-time CUDA OOM above the scenario's fraction or concurrency threshold), and the router's admission
  limit (:meth:`Physics.admission_limit`: beyond ``--max-concurrent-requests`` in flight a request is
  answered 429 "Model is overloaded", never queued), as the e2e fleet's TGI player plays them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bench.loopsim.scenario import Settings
from e2e.fleet import sglang_truth, tgi_truth
from e2e.fleet.sglang_truth import SglangArgs
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import EngineArgs, GroundTruth
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.types import EngineSettings


@dataclass(frozen=True)
class StartFailure:
    log: str
    """What the operator classifies: the container's termination message or previous log."""
    oom: bool


class Physics(Protocol):
    def view(self, settings: Settings) -> EngineArgs:
        """The engine model's arguments (and the compile cache's key)."""
        ...

    def num_blocks(self, settings: Settings) -> int | None:
        """The KV blocks the engine model gets (``None``: the truth sizes them from :meth:`view`)."""
        ...

    def start_failure(self, settings: Settings) -> StartFailure | None: ...

    def runtime_oom(self, settings: Settings, running: int) -> bool: ...

    def oom_message(self, settings: Settings, running: int, kv_usage: float) -> str:
        """The log of a CUDA OOM while serving with ``running`` requests at ``kv_usage`` (what the engine
        logged of its batch before it, where it logs that)."""
        ...

    def framebuffer_used_gib(self, settings: Settings, running: int, serving_s: float) -> float: ...

    def admission_limit(self, settings: Settings) -> int | None:
        """Requests in flight (running + queued) beyond which one is refused, not queued (``None``: none)."""
        ...


def engine_args(s: EngineSettings) -> EngineArgs:
    return EngineArgs(
        model="model",
        max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs,
        gpu_memory_utilization=s.gpu_memory_utilization,
        kv_cache_dtype=s.kv_cache_dtype or "auto",
        max_num_batched_tokens=s.max_num_batched_tokens,
        tensor_parallel_size=s.tensor_parallel_size or 1,
    )


def _vllm(s: Settings) -> EngineSettings:
    if not isinstance(s, EngineSettings):
        raise TypeError(f"a vLLM pod runs EngineSettings, not {type(s).__name__}")
    return s


def _sglang(s: Settings) -> sglang.SglangSettings:
    if not isinstance(s, sglang.SglangSettings):
        raise TypeError(f"an SGLang pod runs SglangSettings, not {type(s).__name__}")
    return s


@dataclass(frozen=True)
class VllmPhysics:
    truth: GroundTruth

    def view(self, settings: Settings) -> EngineArgs:
        return engine_args(_vllm(settings))

    def num_blocks(self, settings: Settings) -> int | None:
        return None

    def start_failure(self, settings: Settings) -> StartFailure | None:
        args = self.view(settings)
        error = self.truth.startup_error(args)
        if error is not None:
            return StartFailure(self.truth.startup_failure_log(args, error), oom=False)
        if self.truth.startup_oom(args):
            return StartFailure(self.truth.cuda_oom_message(args, startup=True), oom=True)
        return None

    def runtime_oom(self, settings: Settings, running: int) -> bool:
        return self.truth.runtime_oom(self.view(settings), running=running)

    def oom_message(self, settings: Settings, running: int, kv_usage: float) -> str:
        return self.truth.cuda_oom_message(self.view(settings))

    def framebuffer_used_gib(self, settings: Settings, running: int, serving_s: float) -> float:
        return self.truth.framebuffer_used_gib(self.view(settings), running, serving_s)

    def admission_limit(self, settings: Settings) -> int | None:
        return None


def sglang_args(s: sglang.SglangSettings) -> SglangArgs:
    """The fleet's view of the flags kvpilot renders (``None``: absent, SGLang's default)."""
    return SglangArgs(
        model_path="model",
        context_length=s.context_length,
        mem_fraction_static=s.mem_fraction_static,
        max_running_requests=s.max_running_requests,
        max_total_tokens=s.max_total_tokens,
        chunked_prefill_size=s.chunked_prefill_size,
        page_size=s.page_size,
        kv_cache_dtype=s.kv_cache_dtype or "auto",
        tp_size=s.tp_size or 1,
        enable_metrics=True,
    )


@dataclass(frozen=True)
class SglangPhysics:
    truth: GroundTruth

    def _args(self, settings: Settings) -> SglangArgs:
        return sglang_args(_sglang(settings))

    def view(self, settings: Settings) -> EngineArgs:
        return sglang_truth.engine_view(self.truth, self._args(settings))

    def num_blocks(self, settings: Settings) -> int | None:
        # SGLang's token pool keeps slot 0 for padding, as vLLM's block pool keeps its null block
        return sglang_truth.max_total_num_tokens(self.truth, self._args(settings)) + 1

    def start_failure(self, settings: Settings) -> StartFailure | None:
        args = self._args(settings)
        error = sglang_truth.startup_error(self.truth, args)
        if error is None:
            return None
        return StartFailure(sglang_truth.startup_failure_log(self.truth, args, error), oom=False)

    def runtime_oom(self, settings: Settings, running: int) -> bool:
        return sglang_truth.runtime_oom(self.truth, self._args(settings), running)

    def oom_message(self, settings: Settings, running: int, kv_usage: float) -> str:
        return sglang_truth.cuda_oom_message(self.truth, self._args(settings), running, kv_usage)

    def framebuffer_used_gib(self, settings: Settings, running: int, serving_s: float) -> float:
        return sglang_truth.framebuffer_used_gib(self.truth, self._args(settings))

    def admission_limit(self, settings: Settings) -> int | None:
        return None


def _tgi(s: Settings) -> tgi.TgiSettings:
    if not isinstance(s, tgi.TgiSettings):
        raise TypeError(f"a TGI pod runs TgiSettings, not {type(s).__name__}")
    return s


def tgi_args(s: tgi.TgiSettings) -> TgiArgs:
    """The fleet's view of the launcher flags kvpilot renders: :func:`kvpilot.tuner.tgi.build_tgi_args`
    parsed as the fleet parses a container's command (absent flags: the launcher's defaults)."""
    return TgiArgs.parse(["--model-id", "model", *tgi.build_tgi_args(s)])


@dataclass(frozen=True)
class TgiPhysics:
    truth: GroundTruth

    def _args(self, settings: Settings) -> TgiArgs:
        return tgi_args(_tgi(settings))

    def view(self, settings: Settings) -> EngineArgs:
        return tgi_truth.engine_view(self.truth, self._args(settings))

    def num_blocks(self, settings: Settings) -> int | None:
        # the KV tokens the warm-up inferred, one more for the engine model's null block (the fleet's player)
        return tgi_truth.warmup(self.truth, self._args(settings)).max_batch_total_tokens + 1

    def start_failure(self, settings: Settings) -> StartFailure | None:
        log = tgi_truth.startup_failure_log(self.truth, self._args(settings))
        return None if log is None else StartFailure(log, oom=False)

    def runtime_oom(self, settings: Settings, running: int) -> bool:
        return tgi_truth.runtime_oom(self.truth, self._args(settings), running)

    def oom_message(self, settings: Settings, running: int, kv_usage: float) -> str:
        return "\n".join(tgi_truth.cuda_oom_lines(self.truth, self._args(settings), running))

    def framebuffer_used_gib(self, settings: Settings, running: int, serving_s: float) -> float:
        return tgi_truth.framebuffer_used_gib(self.truth, self._args(settings))

    def admission_limit(self, settings: Settings) -> int | None:
        return self._args(settings).max_concurrent_requests


def physics_for(engine: str, truth: GroundTruth) -> Physics:
    if engine == "tgi":
        return TgiPhysics(truth)
    return SglangPhysics(truth) if engine == "sglang" else VllmPhysics(truth)
