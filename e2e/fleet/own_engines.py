"""The engines the fleet plays besides vLLM, behind one face: SGLang 0.5.23 (:mod:`e2e.fleet.sglang_truth`,
:mod:`e2e.fleet.sglang_exposition`) and TGI 3.3.7 (:mod:`e2e.fleet.tgi_truth`,
:mod:`e2e.fleet.tgi_exposition`).

:class:`e2e.fleet.fleet.Fleet` asks an :class:`OwnEngine` what vLLM's pods answer from
:class:`e2e.fleet.truth.GroundTruth` directly: the engine model's view of the flags, whether and how the start
fails, the KV tokens, the log while serving, a run-time OOM and its text, the exposition. Deliberately
independent of kvpilot, as the engines' truths are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from e2e.fleet import sglang_truth, tgi_truth
from e2e.fleet.sglang_exposition import SglangMetrics
from e2e.fleet.sglang_truth import SglangArgs
from e2e.fleet.tgi_exposition import TgiMetrics
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import EngineArgs, GroundTruth


class OwnEngine(Protocol):
    """One container of an engine other than vLLM, as the fleet plays it against the scenario's truth."""

    @property
    def kind(self) -> str: ...

    def engine_view(self, truth: GroundTruth) -> EngineArgs: ...

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        """The container's log when its start fails (``None``: it starts)."""
        ...

    def serving_log(self, truth: GroundTruth) -> str: ...

    def kv_blocks(self, truth: GroundTruth) -> int:
        """The engine model's KV blocks (one token each; the first is padding, as vLLM's null block)."""
        ...

    def metrics(self, truth: GroundTruth) -> SglangMetrics | TgiMetrics: ...

    def framebuffer_used_gib(self, truth: GroundTruth) -> float: ...

    def runtime_oom(self, truth: GroundTruth) -> bool: ...

    def cuda_oom_log(self, truth: GroundTruth) -> str: ...

    def pressure_log(self, preemptions: int) -> str | None:
        """What the engine logs when it evicts ``preemptions`` requests for KV room (``None``: it never
        does)."""
        ...

    def summary(self, truth: GroundTruth) -> str: ...


@dataclass(frozen=True)
class SglangPlay:
    args: SglangArgs
    kind: str = "SGLang"

    def engine_view(self, truth: GroundTruth) -> EngineArgs:
        return sglang_truth.engine_view(truth, self.args)

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        error = sglang_truth.startup_error(truth, self.args)
        return None if error is None else sglang_truth.startup_failure_log(truth, self.args, error)

    def serving_log(self, truth: GroundTruth) -> str:
        return sglang_truth.serving_log(truth, self.args)

    def kv_blocks(self, truth: GroundTruth) -> int:
        return sglang_truth.max_total_num_tokens(truth, self.args) + 1  # SGLang's pool keeps slot 0 too

    def metrics(self, truth: GroundTruth) -> SglangMetrics:
        return SglangMetrics(truth, self.args)

    def framebuffer_used_gib(self, truth: GroundTruth) -> float:
        return sglang_truth.framebuffer_used_gib(truth, self.args)

    def runtime_oom(self, truth: GroundTruth) -> bool:
        return sglang_truth.runtime_oom(truth, self.args)

    def cuda_oom_log(self, truth: GroundTruth) -> str:
        return sglang_truth.cuda_oom_message(truth, self.args)

    def pressure_log(self, preemptions: int) -> str | None:
        return sglang_truth.retraction_warning(preemptions, 0, 0.7, 1.0)

    def summary(self, truth: GroundTruth) -> str:
        return sglang_truth.summary(truth, self.args)


@dataclass(frozen=True)
class TgiPlay:
    args: TgiArgs
    kind: str = "TGI"

    def engine_view(self, truth: GroundTruth) -> EngineArgs:
        return tgi_truth.engine_view(truth, self.args)

    def startup_failure_log(self, truth: GroundTruth) -> str | None:
        error = tgi_truth.startup_error(truth, self.args)
        return None if error is None else tgi_truth.startup_failure_log(error)

    def serving_log(self, truth: GroundTruth) -> str:
        return tgi_truth.serving_log(truth, self.args)

    def kv_blocks(self, truth: GroundTruth) -> int:
        return tgi_truth.kv_tokens(truth, self.args) + 1

    def metrics(self, truth: GroundTruth) -> TgiMetrics:
        return TgiMetrics(truth, self.args)

    def framebuffer_used_gib(self, truth: GroundTruth) -> float:
        return tgi_truth.framebuffer_used_gib(truth, self.args)

    def runtime_oom(self, truth: GroundTruth) -> bool:
        return tgi_truth.runtime_oom(truth, self.args)

    def cuda_oom_log(self, truth: GroundTruth) -> str:
        return tgi_truth.cuda_oom_log(truth, self.args)

    def pressure_log(self, preemptions: int) -> str | None:
        return None  # TGI never evicts a running request

    def summary(self, truth: GroundTruth) -> str:
        return tgi_truth.summary(truth, self.args)


def parse_own(argv: Sequence[str], env: Mapping[str, str]) -> OwnEngine | None:
    """The engine a container's ``command + args`` run, when it is not vLLM."""
    if sglang_truth.is_sglang(argv):
        return SglangPlay(SglangArgs.parse(argv, env))
    if tgi_truth.is_tgi(argv):
        return TgiPlay(TgiArgs.parse(argv))
    return None
