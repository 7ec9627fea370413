"""Vertical and horizontal, coordinated: the replica count's side of the closed loop. Pure.

kvpilot tunes each replica's engine (vertical); ``kubectl scale``, a HorizontalPodAutoscaler or KEDA set
how many replicas there are (horizontal, through the InferenceService's ``/scale`` subresource). The two
must not fight:

* :func:`compute_replica_change`: while the replica count is changing (pods missing, extra or not Ready
  against ``spec.replicas``, or a pod that joined less than a metrics window ago, whose window mixes two
  replica counts), no metrics-driven retune starts (:func:`kvpilot.tuner.loop.policy.compute_decision`
  holds it with this reason). Crash remedies still act: a crashing pod is not capacity either way. A
  retune that starts afterwards applies to the replicas there are (the Deployment renders
  ``spec.replicas`` as it is then).
* :func:`compute_scale_out`: sustained pressure with the tuning at its floor (KV pressure with
  preemptions and ``max_num_seqs`` at its lower bound, or the latency SLO violated with nothing left to
  tune) is something only more replicas can cure: the replicas to recommend
  (``status.recommendation.replicas`` and a ``ScaleOutRecommended`` event). kvpilot never scales by
  itself; whoever owns ``/scale`` decides.
* :func:`recommend_scale_out`: when a rule's exhausted answer recommends it, for every engine's loop
  (vLLM's :func:`kvpilot.tuner.loop.policy.compute_decision`; SGLang's and TGI's through
  :func:`kvpilot.tuner.loop.engine_chain.choose`): only pressure more replicas relieve
  (:data:`SCALE_OUT_TRIGGERS`), and never while the count is changing -- the window then mixes two counts,
  and the replicas on their way may be the cure already.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.engine_latency import LATENCY_SLO
from kvpilot.tuner.loop.observations import ObservationWindow
from kvpilot.tuner.loop.remedies import KV_PRESSURE

MAX_REPLICAS = 1000
"""The API's ``spec.replicas`` maximum (``kvpilot.operator.api``'s field says the same)."""
SCALE_OUT_TRIGGERS = frozenset({KV_PRESSURE, LATENCY_SLO})
"""Pressure that more replicas relieve once the engine has nothing left to give: the KV (vLLM's preemptions,
SGLang's retractions, TGI's queue at a full KV) and the latency objective; not a crash, not a GPU another
process fills (the trigger names are every engine's)."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """The replica count as the pods show it (the operator counts them)."""

    desired: int
    """``spec.replicas``."""
    live: int
    """Pods not terminating, whatever settings they run."""
    ready: int
    """Of them, Ready."""
    newest_start: float | None = None
    """When the newest live pod started (``status.startTime``), if any has."""


def compute_replica_change(view: ReplicaView, now: float, settle_seconds: float) -> str | None:
    """Why the replica count is changing now, or ``None`` when it has settled."""
    if view.live != view.desired:
        return f"{view.live} pod(s) for {view.desired} replica(s)"
    if view.ready < view.desired:
        return f"{view.ready} of {view.desired} replica(s) Ready"
    if view.newest_start is not None and now - view.newest_start < settle_seconds:
        age = now - view.newest_start
        return f"a pod joined {age:.0f}s ago (the metrics window of {settle_seconds:.0f}s spans two counts)"
    return None


def compute_scale_out(window: ObservationWindow, replicas: int) -> int | None:
    """The replica count to recommend when tuning is at its floor and the service is still under pressure:
    the demand the window shows (running plus waiting requests) over what the replicas run now, at least one
    more replica; ``None`` when no replica runs or the maximum is reached."""
    if replicas < 1 or replicas >= MAX_REPLICAS:
        return None
    running = obs.compute_mean(window.samples, obs.running) or 0.0
    waiting = obs.compute_mean(window.samples, obs.waiting) or 0.0
    wanted = replicas + 1
    if running > 0:
        demand = replicas * (running + waiting) / running
        # a demand too large to be a number (a queue of 1e308 behind a fraction of a request) is the maximum
        wanted = max(wanted, math.ceil(demand)) if math.isfinite(demand) else MAX_REPLICAS
    return min(wanted, MAX_REPLICAS)


def recommend_scale_out(
    trigger: str, window: ObservationWindow, replicas: int, replicas_changing: str | None
) -> int | None:
    """The replicas a rule for ``trigger`` recommends once it has nothing left to propose
    (:func:`compute_scale_out` on the window it judged); ``None`` for a trigger more replicas do not relieve
    (:data:`SCALE_OUT_TRIGGERS`) or while the replica count is changing (``replicas_changing``:
    :func:`compute_replica_change`'s reason)."""
    if trigger not in SCALE_OUT_TRIGGERS or replicas_changing is not None:
        return None
    return compute_scale_out(window, replicas)
