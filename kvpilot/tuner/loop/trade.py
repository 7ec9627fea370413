"""Is a metrics-driven change worth its restart? vLLM's side of the closed loop's gain-against-cost trade.
Pure. The engine-neutral arithmetic (:class:`Trade`, the cost, the gain shapes) is
:mod:`kvpilot.tuner.loop.restart_trade`, shared with SGLang's and TGI's loops; what is vLLM's is here: which
share each of vLLM's triggers takes (:func:`compute_gain_fraction`) and vLLM's compile cache
(:func:`compute_warm_compile_seconds`).

A retune restarts vLLM: while a pod loads its weights and compiles (``restart_seconds``, measured per
service: ``status.startupSeconds``), it serves nothing. What that costs depends on how the rollout runs
(:mod:`kvpilot.operator.pods.rollout_strategy` chooses it, the operator passes the share it loses):

* **Surge** (a new pod beside the old ones): nothing is lost, ``lost_fraction`` 0;
* **Replace** (``k`` of ``N`` replicas down at a time): ``k / N`` of the capacity while a step restarts;
* **Recreate** (every replica down, e.g. one replica with no spare GPU): all of it, ``lost_fraction`` 1;
* pods that serve nothing anyway (a crash loop) lose nothing, 0.

Both sides are measured in *seconds of the whole service's capacity*:

    cost = lost_fraction x (restart_seconds - warm_compile_seconds)
    gain = expected_gain_fraction x (cooldown_seconds + persisted_seconds)

``warm_compile_seconds`` is the compile a restart skips (:func:`compute_warm_compile_seconds`): when the
pods keep vLLM's compile cache on a persistent volume and the change touches no setting in vLLM's compile
hash (:data:`kvpilot.tuner.vllm.COMPILE_HASH_SETTINGS`: of the tuned settings, only
``gpu_memory_utilization`` stays out of it), or a change back to settings that already ran on that
volume since the last plan (their graphs are still in their ``<hash>/`` folder), the new pod loads the
compiled graphs instead of compiling; otherwise 0.

and a change goes ahead only when ``gain > cost``. The gain is the share of the service's capacity the
change is expected to win back, for as long as it will stay: at least the cooldown (no metrics-driven
change follows sooner), plus as long as the loop has already held for the same trigger
(``persisted_seconds``, from the history, at most ``PolicyConfig.trade_persistence_max_seconds``: a
condition seen for ``t`` is expected to last about ``t`` more). So a held change is re-weighed every
tick, and a small gain that persists wins its restart after a while. The share comes from the metrics
window the change was proposed on:

* **IdleCapacity** (a queue at the sequence limit, KV room to spare): the requests the new limit admits
  that now wait, per running request: ``min(mean waiting, added sequences) / mean running``;
* **KvPressure** (KV usage high with preemptions): each preemption throws a running request's KV away and
  recomputes it; taking one preemption as one request's work lost, the share of the running requests
  preempted over the cooldown: ``mean preemptions per second x cooldown / mean running``;
* **KvBound** (a queue held back by a full KV cache, :mod:`kvpilot.tuner.loop.kv_bound`): the requests a
  cache ``kv_growth`` times larger admits, per running request: ``min(mean waiting / mean running,
  kv_growth - 1)``;
* any other metrics trigger: 1 (the whole capacity; no measure to discount it by).

Each fraction is capped at 1. Crash remedies do not pass through this trade (a crashing pod serves
nothing: there is nothing to lose); docs/closed-loop.md, "Restart cost", says the same for users.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop import remedies
from kvpilot.tuner.loop import restart_trade as rt
from kvpilot.tuner.loop.kv_bound import KV_BOUND
from kvpilot.tuner.loop.observations import ObservationWindow
from kvpilot.tuner.loop.restart_trade import Trade
from kvpilot.tuner.types import EngineSettings

__all__ = ["Trade", "compute_gain_fraction", "compute_trade", "compute_warm_compile_seconds"]


def compute_gain_fraction(
    trigger: str,
    window: ObservationWindow,
    current: EngineSettings,
    proposed: EngineSettings,
    cooldown_seconds: float,
    kv_growth: float | None = None,
) -> float:
    """The share of the service's capacity ``proposed`` is expected to win back (0..1); ``current`` and
    ``proposed`` are effective settings (every field set); ``kv_growth`` the predicted ratio of their KV
    caches."""
    running = obs.compute_mean(window.samples, obs.running) or 0.0
    if trigger == KV_BOUND:
        waiting = obs.compute_mean(window.samples, obs.waiting) or 0.0
        return rt.compute_kv_bound_share(waiting, running, kv_growth)
    if trigger == remedies.IDLE_CAPACITY:
        waiting = obs.compute_mean(window.samples, obs.waiting) or 0.0
        added = max(0, (proposed.max_num_seqs or 0) - (current.max_num_seqs or 0))
        return rt.compute_admission_share(waiting, float(added), running)
    if trigger == remedies.KV_PRESSURE:
        rate = obs.compute_mean(window.samples, obs.preemption_rate) or 0.0
        return rt.compute_preemption_share(rate, cooldown_seconds, running)
    return rt.WHOLE


def compute_warm_compile_seconds(
    current: EngineSettings,
    proposed: EngineSettings,
    *,
    persistent: bool,
    compile_seconds: float,
    restart_seconds: float,
    compiled: Iterable[EngineSettings] = (),
) -> float:
    """The seconds of ``restart_seconds`` a restart from ``current`` to ``proposed`` (effective settings)
    skips: ``compile_seconds`` (at most the restart) when the compile cache is ``persistent`` and it holds
    ``proposed``'s graphs -- no changed setting enters vLLM's compile hash, or settings of the same key
    already ran on it (``compiled``: :func:`kvpilot.tuner.loop.history.compute_compiled_settings`, made
    effective; a retune back to them loads what they compiled) -- else 0."""
    if not persistent:
        return 0.0
    if vllm.compute_compile_invalidating(current, proposed):
        key = vllm.compute_compile_key(proposed)
        if all(vllm.compute_compile_key(c) != key for c in compiled):
            return 0.0
    return min(max(0.0, compile_seconds), max(0.0, restart_seconds))


def compute_trade(
    trigger: str,
    window: ObservationWindow,
    current: EngineSettings,
    proposed: EngineSettings,
    *,
    cooldown_seconds: float,
    restart_seconds: float,
    lost_fraction: float,
    kv_growth: float | None = None,
    persisted_seconds: float = 0.0,
    warm_compile_seconds: float = 0.0,
) -> Trade:
    """The gain against the cost of rolling ``proposed`` out (module docstring); ``persisted_seconds`` is
    how long the loop has held for ``trigger`` already, capped by the caller; ``warm_compile_seconds``
    from :func:`compute_warm_compile_seconds`."""
    share = compute_gain_fraction(trigger, window, current, proposed, cooldown_seconds, kv_growth)
    return rt.weigh(
        share,
        cooldown_seconds=cooldown_seconds,
        restart_seconds=restart_seconds,
        lost_fraction=lost_fraction,
        persisted_seconds=persisted_seconds,
        warm_compile_seconds=warm_compile_seconds,
    )
