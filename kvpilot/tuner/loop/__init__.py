"""The closed loop's policy: what vLLM's metrics and restarts say, and what to change.

VPA's recommender and updater for vLLM engine arguments, pure and deterministic:

* :mod:`.observations` -- what the loop sees (metrics windows, classified restarts);
* :mod:`.restarts` -- why a container stopped (vLLM's and PyTorch's texts, parsed);
* :mod:`.history` -- the bounded record of decisions, and the queries the gates ask of it;
* :mod:`.config` -- the policy's knobs, the user's bounds, the service's tuning context;
* :mod:`.decision` -- what the policy is given (:class:`LoopState`, :class:`Evidence`) and answers
  (:class:`Decision`);
* :mod:`.remedies` -- the metrics rules and what every rule shares (:class:`~.remedies.Situation`,
  :class:`~.remedies.Proposal`, capacity predictions, single moves);
* :mod:`.crash_remedies` -- one small rule per crash that engine arguments can cure;
* :mod:`.kv_bound` -- a queue held back by a full KV cache: a larger one;
* :mod:`.slo` -- the latency objectives' and GPU memory telemetry's rules;
* :mod:`.trade` -- is a metrics-driven change worth its restart;
* :mod:`.scaling` -- replica changes and the scale-out recommendation;
* :mod:`.candidates` -- the filters every candidate passes;
* :mod:`.rollout` -- a retune on its way: probation, success, rollback (judged the same for every engine);
* :mod:`.policy` -- :func:`compute_decision`, the chain of steps and the gates.

SGLang's loop, in SGLang's terms (``--mem-fraction-static`` covers weights + KV pool only):

* :mod:`.sglang_fit` -- SGLang's memory model as the loop asks it: the fraction's ceiling and floor, the
  pool a candidate holds, what the history ruled out;
* :mod:`.sglang_rules` -- one rule per failure and metrics condition (:mod:`.sglang_idle`: IdleCapacity);
* :mod:`.sglang_state` -- what the SGLang policy is given and answers;
* :mod:`.sglang_policy` -- :func:`compute_sglang_decision`, SGLang's chain.

TGI's loop, in TGI's terms (``--cuda-memory-fraction`` caps torch; the KV is what the warm-up leaves):

* :mod:`.tgi_fit` -- TGI's warm-up model as the loop asks it: the defaults, the KV tokens a candidate holds,
  what the history ruled out;
* :mod:`.tgi_rules` -- one rule per failure (the warm-up's prefill, ``max_total_tokens``, a CUDA OOM) and
  metrics condition (KV full with a queue, the latency objective missed; :mod:`.tgi_idle`: the admission
  limit binding);
* :mod:`.tgi_state` -- what the TGI policy is given and answers;
* :mod:`.tgi_policy` -- :func:`compute_tgi_decision`, TGI's chain.

What both engines' own loops share: :mod:`.engine_state` (the state, evidence and decision, generic in the
engine's settings), :mod:`.engine_rollout` (flags on their way to the pods, judged as vLLM's),
:mod:`.engine_chain` (the gates, the crash a remedy answers, the metrics gate, a proposal's choice weighed
against its restart, the chain's order), :mod:`.restart_trade` (the restart-cost trade's engine-neutral
arithmetic, vLLM's :mod:`.trade` too), and the engine-neutral halves of their metrics rules:
:mod:`.engine_latency` (the inter-token latency objective), :mod:`.engine_flap` (the idle raise's flap
guard) and :mod:`.engine_room` (the room an idle raise measures).

The top layer of the tuner beside :mod:`kvpilot.tuner.plan`; the two never import each other.
Time and observations are arguments: nothing here reads a clock, the cluster or Prometheus.
"""

from kvpilot.tuner.loop.config import LatencySlo, PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.decision import (
    Action,
    Decision,
    Evidence,
    LoopState,
    MetricsStatus,
    RolloutState,
    Trigger,
    compute_cooldown,
    compute_metrics_status,
)
from kvpilot.tuner.loop.engine_state import EngineFailedRun, EngineHold
from kvpilot.tuner.loop.history import (
    HISTORY_LIMIT,
    HistoryAction,
    HistoryEntry,
    build_history,
    compute_last_change_time,
)
from kvpilot.tuner.loop.observations import (
    CRASH_KINDS_FIXABLE_BY_ARGS,
    LengthSummary,
    MetricsSample,
    ObservationWindow,
    RestartCause,
    RestartEvent,
    RestartKind,
)
from kvpilot.tuner.loop.policy import compute_decision
from kvpilot.tuner.loop.remedies import compute_effective
from kvpilot.tuner.loop.restarts import classify_termination
from kvpilot.tuner.loop.sglang_fit import FailedRun, SglangMemory
from kvpilot.tuner.loop.sglang_policy import compute_sglang_decision
from kvpilot.tuner.loop.sglang_state import (
    SglangChange,
    SglangContext,
    SglangDecision,
    SglangEvidence,
    SglangLoopState,
    SglangRestart,
    SglangRollout,
    classify_restart,
)
from kvpilot.tuner.loop.tgi_fit import TgiMemory
from kvpilot.tuner.loop.tgi_policy import compute_tgi_decision
from kvpilot.tuner.loop.tgi_state import (
    TgiChange,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiRestart,
    TgiRollout,
    classify_tgi_restart,
)

__all__ = [
    "Action",
    "CRASH_KINDS_FIXABLE_BY_ARGS",
    "Decision",
    "EngineFailedRun",
    "EngineHold",
    "Evidence",
    "FailedRun",
    "HISTORY_LIMIT",
    "HistoryAction",
    "HistoryEntry",
    "LatencySlo",
    "LengthSummary",
    "LoopState",
    "MetricsSample",
    "MetricsStatus",
    "ObservationWindow",
    "PolicyConfig",
    "RestartCause",
    "RestartEvent",
    "RestartKind",
    "RolloutState",
    "SglangChange",
    "SglangContext",
    "SglangDecision",
    "SglangEvidence",
    "SglangLoopState",
    "SglangMemory",
    "SglangRestart",
    "SglangRollout",
    "TgiChange",
    "TgiContext",
    "TgiDecision",
    "TgiEvidence",
    "TgiLoopState",
    "TgiMemory",
    "TgiRestart",
    "TgiRollout",
    "Trigger",
    "TuningBounds",
    "TuningContext",
    "build_history",
    "classify_restart",
    "classify_termination",
    "classify_tgi_restart",
    "compute_cooldown",
    "compute_decision",
    "compute_effective",
    "compute_last_change_time",
    "compute_metrics_status",
    "compute_sglang_decision",
    "compute_tgi_decision",
]
