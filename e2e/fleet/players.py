"""How the fleet plays an engine other than vLLM: one small protocol, one implementation per engine.

vLLM is the fleet's own engine (:mod:`e2e.fleet.truth`, the engine model's native terms, real engines,
headless workers, leaks); every other engine is a :class:`Player`, built from a container's
``command + args`` by :func:`player_for`, and the fleet asks it the same questions at the same points of a
container's life: what the engine model sees (:meth:`Player.engine_view`), whether start-up fails and with
which log, the log once it serves, the engine model and the exposition to run, the pressure lines and the
run-time CUDA OOM while serving. SGLang 0.5.23 (:mod:`e2e.fleet.sglang_truth`) and TGI 3.3.7
(:mod:`e2e.fleet.tgi_truth`) answer them from their own source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from e2e.fleet import sglang_truth, tgi_truth
from e2e.fleet.engine import Deltas, SimEngine
from e2e.fleet.sglang_exposition import SglangMetrics
from e2e.fleet.sglang_truth import SglangArgs
from e2e.fleet.tgi_exposition import TgiMetrics
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import EngineArgs, GroundTruth, Workload


class Metrics(Protocol):
    """An engine's exposition, fed by the engine model."""

    def record(
        self, *, running: int, waiting: int, kv_usage: float, deltas: Deltas, fb_used_gib: float | None = None
    ) -> None: ...

    def render(self) -> bytes: ...


class Player(Protocol):
    """One non-vLLM engine's container, asked at each point of its life (``truth``: the scenario's now)."""

    @property
    def kind(self) -> str:
        """``SGLang``, ``TGI``: the pod snapshot's ``kind``."""
        ...

    def engine_view(self, truth: GroundTruth) -> EngineArgs:
        """The engine model's terms for these flags, at a container start (memory sized again)."""
        ...

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        """The container's whole log when the engine stops during start-up; ``None`` when it serves."""
        ...

    def serving_log(self, truth: GroundTruth) -> str: ...

    def simulate(self, truth: GroundTruth, workload: Workload, view: EngineArgs, seed: int) -> SimEngine: ...

    def metrics(self, truth: GroundTruth) -> Metrics: ...

    def framebuffer_used_gib(self, truth: GroundTruth) -> float: ...

    def pressure_lines(self, deltas: Deltas) -> list[str]:
        """What the engine logs of the load since the last step (SGLang's retractions, TGI's 429s)."""
        ...

    def runtime_oom(self, truth: GroundTruth) -> bool: ...

    def batch_lines(self, truth: GroundTruth, running: int, kv_usage: float) -> list[str]:
        """What the engine logs of its batch each step (SGLang's decode-batch line; none for TGI)."""
        ...

    def cuda_oom_lines(self, truth: GroundTruth, running: int) -> list[str]:
        """The log of a CUDA OOM while serving with ``running`` requests."""
        ...

    def summary(self, truth: GroundTruth) -> str: ...


@dataclasses.dataclass(frozen=True)
class SglangPlayer:
    args: SglangArgs
    kind: str = "SGLang"

    def engine_view(self, truth: GroundTruth) -> EngineArgs:
        return sglang_truth.engine_view(truth, self.args)

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        error = sglang_truth.startup_error(truth, self.args)
        return None if error is None else sglang_truth.startup_failure_log(truth, self.args, error)

    def serving_log(self, truth: GroundTruth) -> str:
        return sglang_truth.serving_log(truth, self.args)

    def simulate(self, truth: GroundTruth, workload: Workload, view: EngineArgs, seed: int) -> SimEngine:
        # SGLang's token pool keeps slot 0 for padding, as vLLM's block pool keeps its null block
        tokens = sglang_truth.max_total_num_tokens(truth, self.args)
        return SimEngine(truth, workload, view, seed=seed, num_gpu_blocks=tokens + 1)

    def metrics(self, truth: GroundTruth) -> Metrics:
        return SglangMetrics(truth, self.args)

    def framebuffer_used_gib(self, truth: GroundTruth) -> float:
        return sglang_truth.framebuffer_used_gib(truth, self.args)

    def pressure_lines(self, deltas: Deltas) -> list[str]:
        if not deltas.preemptions:
            return []
        return [sglang_truth.retraction_warning(deltas.preemptions, 0, 0.7, 1.0)]

    def runtime_oom(self, truth: GroundTruth) -> bool:
        return sglang_truth.runtime_oom(truth, self.args)

    def batch_lines(self, truth: GroundTruth, running: int, kv_usage: float) -> list[str]:
        return [sglang_truth.decode_batch_line(truth, self.args, running, kv_usage)] if running else []

    def cuda_oom_lines(self, truth: GroundTruth, running: int) -> list[str]:
        return [sglang_truth.cuda_oom_message(truth, self.args)]  # its batch lines are in the log already

    def summary(self, truth: GroundTruth) -> str:
        return sglang_truth.summary(truth, self.args)


@dataclasses.dataclass(frozen=True)
class TgiPlayer:
    args: TgiArgs
    kind: str = "TGI"

    def engine_view(self, truth: GroundTruth) -> EngineArgs:
        return tgi_truth.engine_view(truth, self.args)

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        return tgi_truth.startup_failure_log(truth, self.args)

    def serving_log(self, truth: GroundTruth) -> str:
        return tgi_truth.serving_log(truth, self.args)

    def simulate(self, truth: GroundTruth, workload: Workload, view: EngineArgs, seed: int) -> SimEngine:
        """The KV tokens the warm-up inferred (one more for the engine model's null block), and the router's
        admission limit: beyond ``--max-concurrent-requests`` in flight a request is refused, not queued."""
        tokens = tgi_truth.warmup(truth, self.args).max_batch_total_tokens
        return SimEngine(
            truth,
            workload,
            view,
            seed=seed,
            num_gpu_blocks=tokens + 1,
            admission_limit=self.args.max_concurrent_requests,
        )

    def metrics(self, truth: GroundTruth) -> Metrics:
        return TgiMetrics(truth, self.args)

    def framebuffer_used_gib(self, truth: GroundTruth) -> float:
        return tgi_truth.framebuffer_used_gib(truth, self.args)

    def pressure_lines(self, deltas: Deltas) -> list[str]:
        return tgi_truth.overloaded_lines(deltas.refused)

    def runtime_oom(self, truth: GroundTruth) -> bool:
        return tgi_truth.runtime_oom(truth, self.args)

    def batch_lines(self, truth: GroundTruth, running: int, kv_usage: float) -> list[str]:
        return []

    def cuda_oom_lines(self, truth: GroundTruth, running: int) -> list[str]:
        return tgi_truth.cuda_oom_lines(truth, self.args, running)

    def summary(self, truth: GroundTruth) -> str:
        return tgi_truth.summary(truth, self.args)


def player_for(argv: Sequence[str], image: str, env: Mapping[str, str]) -> Player | None:
    """The player of a container's ``command + args`` (and image: TGI's entry point is the launcher);
    ``None``: vLLM, the fleet's own."""
    if sglang_truth.is_sglang(argv):
        return SglangPlayer(SglangArgs.parse(argv, env))
    if tgi_truth.is_tgi(argv, image):
        return TgiPlayer(TgiArgs.parse(argv))
    return None
