"""kvpilot's closed loop for TGI in the bench: ``compute_tgi_decision`` every tick, with the bookkeeping the
operator keeps for a TGI service in mode Auto (the counterpart of :mod:`bench.loopsim.sglang`).

What :func:`kvpilot.operator.inferenceservice.tgi_loop.run_tgi_tick` (:func:`~kvpilot.operator.
inferenceservice.engine_loop.run_engine_tick` with TGI's profile) reads and writes, mirrored over the
simulated Deployment (:mod:`bench.loopsim.world`):

* the context (:func:`kvpilot.operator.loop.engine_profiles.build_tgi_context`): the GPU, the catalogue
  model and its checkpoint as :class:`~kvpilot.tuner.loop.TgiMemory`; the scenario's bounds merged with the
  plan's ``serving.maxContextLength`` (``spec.to_bounds``: the context the plan was asked for bounds
  ``--max-total-tokens``); no fp8 KV (the operator passes none for TGI);
* the state (:func:`kvpilot.operator.loop.engine_reading.build_state_and_evidence`): the flags
  ``status.appliedEngineArgs`` says the Deployment runs, ``status.rollout`` while it is theirs,
  ``status.lastGoodEngineArgs``, the ruled-out runs of ``status.failedEngineArgs`` (the newest
  :data:`~kvpilot.operator.status.engine_patch.FAILED_LIMIT`), and the changes of ``status.history``
  (``Retuned``/``RolledBack``; the reconciler's ``Planned`` at t=0);
* the evidence: the last termination of each pod that runs the current flags, its log classified by the
  seam (:func:`kvpilot.tuner.loop.classify_tgi_restart`: the warm-up's "Not enough memory to handle N
  prefill tokens", ``NotEnoughMemory(N)``, a CUDA OOM while serving), Ready when every pod runs them and
  one serves, not started when one waits for a GPU and none restarted; the measured start (the newest pod
  of the current flags' start to Ready: ``status.startupSeconds``, as the operator keeps it for TGI and vLLM's
  bench passes it); what a rollout of a change would lose under the strategy the cluster allows now (a surge
  0, a recreate 1) or why it cannot roll out (one replica, no spare GPU, no ``allowDowntime``: held with
  :data:`~kvpilot.operator.pods.rollout_strategy.HELD_MESSAGE`, as vLLM's), and the history's newest
  ``Held`` entries in a row (the restart-cost trade counts its gain over how long the loop has held), as
  SGLang's and vLLM's benches pass them;
* the answer (:func:`kvpilot.operator.status.engine_patch`): a change recorded as rolled out (a new rollout
  with the configured deadline), a rollout's probation kept, a judged one cleared, the good flags kept, the
  failed ones added;
* the Deployment follows a change with the strategy the cluster allows now
  (:func:`kvpilot.operator.pods.rollout_strategy.compute_rollout_choice`), as for SGLang.

The oracle's grid (:func:`oracle_grid`) is TGI's static flags: ``--cuda-memory-fraction`` x
``--max-concurrent-requests`` x ``--max-batch-prefill-tokens`` x ``--max-total-tokens`` (never below the
workload's longest requests; ``--max-input-tokens`` one below it, as kvpilot's plan renders it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.loopsim.engine_loop import EngineLoopSim
from bench.loopsim.scenario import BenchScenario, TgiPlan
from kvpilot.tuner import tgi
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    PolicyConfig,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    classify_tgi_restart,
    compute_tgi_decision,
)
from kvpilot.tuner.loop.engine_state import EngineRestart
from kvpilot.tuner.model import build_model_spec, lookup_checkpoint_bytes, lookup_model_config

DEFAULTS = tgi.TgiSettings()
"""TGI's own defaults: the launcher's prefill for the card, the KV and ``--max-total-tokens`` the warm-up
infers, 128 concurrent requests, the whole GPU (``--cuda-memory-fraction`` 1)."""
SAFE = tgi.TgiSettings(
    max_input_tokens=8191,
    max_total_tokens=8192,
    max_batch_prefill_tokens=4096,
    max_concurrent_requests=64,
    cuda_memory_fraction=0.85,
)
"""A fixed "safe" choice: 8k per request, a 4096-token prefill, 64 concurrent requests, 0.85 of the GPU."""


def _plan(sc: BenchScenario) -> TgiPlan:
    assert sc.tgi_plan is not None, "a TGI scenario states its plan"
    return sc.tgi_plan


def build_context(sc: BenchScenario, policy: PolicyConfig) -> TgiContext:
    """What the operator resolves for the policy (module docstring)."""
    plan = _plan(sc)
    spec = build_model_spec(lookup_model_config(plan.model))
    memory = TgiMemory(lookup_gpu(plan.gpu), spec, lookup_checkpoint_bytes(plan.model))
    bounds = sc.bounds
    if plan.max_context and bounds.max_max_model_len is None:
        bounds = replace(bounds, max_max_model_len=plan.max_context)
    return TgiContext(memory, bounds, policy)


@dataclass
class KvpilotTgi(EngineLoopSim[tgi.TgiSettings]):
    """kvpilot's TGI loop over the simulated Deployment (module docstring; the bookkeeping is
    :class:`bench.loopsim.engine_loop.EngineLoopSim`'s)."""

    current: tgi.TgiSettings = field(default_factory=tgi.TgiSettings)

    def __post_init__(self) -> None:
        self.context = build_context(self.scenario, self.policy)

    def decide(self, state: TgiLoopState, evidence: TgiEvidence, now: float) -> TgiDecision:
        return compute_tgi_decision(state, evidence, self.context, now)

    def classify(self, time: float, log: str, pod: str) -> EngineRestart:
        return classify_tgi_restart(time, log, pod)

    def render(self, settings: tgi.TgiSettings) -> str:
        return " ".join(tgi.build_tgi_args(settings))


FRACTIONS = (0.80, 0.85, 0.90, 0.95, 1.0)
"""The oracle's ``--cuda-memory-fraction`` grid (TGI's default, 1, among them)."""
CONCURRENT = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
"""The oracle's ``--max-concurrent-requests`` (TGI's default, 128, among them)."""
PREFILLS = (2048, 4096, 8192, 16384, 32768)
"""The oracle's ``--max-batch-prefill-tokens``."""

Build = Callable[[tuple[int, ...]], tgi.TgiSettings]


def build_static(fraction: float, concurrent: int, prefill: int, total: int | None) -> tgi.TgiSettings:
    """One static setting of the oracle's grid (``total``: ``--max-total-tokens``, ``None``: TGI's own)."""
    return tgi.TgiSettings(
        max_input_tokens=total - 1 if total else None,
        max_total_tokens=total,
        max_batch_prefill_tokens=prefill,
        max_concurrent_requests=concurrent,
        cuda_memory_fraction=fraction,
    )


def oracle_grid(
    lengths: Sequence[int | None],
) -> tuple[tuple[int, ...], list[tuple[int, ...]], Build]:
    """The oracle's grid over TGI's flags (``lengths``: the ``--max-total-tokens`` that serve the workload's
    longest requests, :func:`bench.loopsim.controllers.contexts`): its sizes, the starting points of the
    coordinate search (0.95 of the GPU; 16, 64, 128 and 512 concurrent requests; 4096 and 16384 prefill
    tokens; the shortest and the longest context), and the settings of a point."""
    sizes = (len(FRACTIONS), len(CONCURRENT), len(PREFILLS), len(lengths))
    starts = [(3, q, b, c) for q in (2, 5, 7, 11) for b in (1, 3) for c in sorted({0, len(lengths) - 1})]

    def build(p: tuple[int, ...]) -> tgi.TgiSettings:
        return build_static(FRACTIONS[p[0]], CONCURRENT[p[1]], PREFILLS[p[2]], lengths[p[3]])

    return sizes, starts, build
