"""kvpilot's closed loop for SGLang in the bench: ``compute_sglang_decision`` every tick, with the bookkeeping
the operator keeps for an SGLang service in mode Auto.

What :func:`kvpilot.operator.inferenceservice.sglang_loop.run_sglang_tick` reads and writes, mirrored over
the simulated Deployment (:mod:`bench.loopsim.world`):

* the state (:func:`kvpilot.operator.inferenceservice.sglang_reading.build_state_and_evidence`): the flags
  ``status.appliedEngineArgs`` says the Deployment runs, ``status.rollout`` while it is theirs,
  ``status.lastGoodEngineArgs``, the ruled-out runs of ``status.failedEngineArgs`` (the newest
  :data:`~kvpilot.operator.status.sglang_patch.FAILED_LIMIT`), and the changes of ``status.history``
  (``Retuned``/``RolledBack``) and ``lastChangeTime`` (the reconciler's plan at t=0);
* the evidence: the last termination of each pod that runs the current flags, its log classified by the
  seam (:func:`kvpilot.tuner.loop.classify_restart`), Ready when every pod runs them and one serves, not
  started when one waits for a GPU and none restarted; the measured start (the newest pod of the current
  flags' start to Ready: ``status.startupSeconds``, as the operator keeps it for SGLang and vLLM's bench
  passes it); what a rollout of a change would lose under the strategy the cluster allows now, or why it
  cannot roll out (:func:`kvpilot.operator.pods.workloads.fetch_rollout_costs`: a surge 0, a recreate 1; one
  replica, no spare GPU, no ``allowDowntime``: held with the HELD message, as vLLM's), and the history's
  newest ``Held`` entries in a row (a gate's hold, recorded once while it stays the same: the
  restart-cost trade counts its gain over how long the loop has held), as vLLM's bench passes them;
* the answer (:func:`kvpilot.operator.status.sglang_patch.build_sglang_patch`): a change is recorded as
  rolled out (a new rollout with the configured deadline), a rollout's probation kept, a judged one cleared,
  the good flags kept, the failed ones added;
* the Deployment follows a change with the strategy the cluster allows now
  (:func:`kvpilot.operator.pods.workloads.fetch_rollout_strategy`): a surge with a spare GPU, a replace
  when no pod serves, a recreate with ``allowDowntime``; a held choice holds a retune (the plan keeps
  serving), and renders a surge only for a rollback, whose new pod waits for a GPU (the old one keeps
  serving: the rollout pends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.loopsim.engine_loop import EngineLoopSim
from bench.loopsim.scenario import BenchScenario
from kvpilot.tuner import sglang
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangMemory,
    classify_restart,
    compute_sglang_decision,
)
from kvpilot.tuner.loop.engine_state import EngineRestart
from kvpilot.tuner.model import build_model_spec, lookup_checkpoint_bytes, lookup_model_config

DEFAULTS = sglang.SglangSettings()
"""SGLang's own defaults: the fraction its reserve leaves, the model's context, the running requests and
prefill chunk it sizes."""
SAFE = sglang.SglangSettings(
    context_length=32768, mem_fraction_static=0.80, max_running_requests=64, chunked_prefill_size=2048
)
"""A fixed "safe" choice: a lower fraction, 64 running requests, a small prefill chunk, 32k."""


def build_memory(sc: BenchScenario) -> SglangMemory:
    """What the operator resolves for the policy: the GPU, the catalogue model and its checkpoint."""
    plan = sc.sglang_plan
    assert plan is not None
    spec = build_model_spec(lookup_model_config(plan.model))
    return SglangMemory(lookup_gpu(plan.gpu), spec, lookup_checkpoint_bytes(plan.model))


@dataclass
class KvpilotSglang(EngineLoopSim[sglang.SglangSettings]):
    """kvpilot's SGLang loop over the simulated Deployment (module docstring; the bookkeeping is
    :class:`bench.loopsim.engine_loop.EngineLoopSim`'s)."""

    current: sglang.SglangSettings = field(default_factory=sglang.SglangSettings)

    def __post_init__(self) -> None:
        self.context = SglangContext(build_memory(self.scenario), self.scenario.bounds, self.policy)

    def decide(self, state: SglangLoopState, evidence: SglangEvidence, now: float) -> SglangDecision:
        return compute_sglang_decision(state, evidence, self.context, now)

    def classify(self, time: float, log: str, pod: str) -> EngineRestart:
        return classify_restart(time, log, pod)

    def render(self, settings: sglang.SglangSettings) -> str:
        return " ".join(sglang.build_sglang_args(settings))


FRACTIONS = (0.70, 0.75, 0.80, 0.835, 0.85, 0.88, 0.90, 0.92)
"""The oracle's ``--mem-fraction-static`` grid (SGLang's H100 default, 0.835, among them)."""
RUNNING = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, None)
"""The oracle's ``--max-running-requests`` (``None``: SGLang sizes it from the pool)."""
CHUNKS = (2048, 4096, 8192, 16384)


def build_static(
    fraction: float, running: int | None, chunk: int, context: int | None
) -> sglang.SglangSettings:
    """One static setting of the oracle's grid."""
    return sglang.SglangSettings(
        context_length=context,
        mem_fraction_static=fraction,
        max_running_requests=running,
        chunked_prefill_size=chunk,
    )
