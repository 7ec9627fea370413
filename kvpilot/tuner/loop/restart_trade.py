"""Is a metrics-driven change worth its restart? The engine-neutral arithmetic of the trade. Pure.

Every engine kvpilot tunes restarts to take new flags, and serves nothing from that pod while it loads and
starts (``restart_seconds``, measured per service: ``status.startupSeconds``). What that costs depends on
how the rollout runs (:mod:`kvpilot.operator.pods.rollout_strategy` chooses it, the operator passes the
share it loses, ``lost_fraction``): 0 for a surge or pods that serve nothing anyway, ``k / N`` replacing
``k`` of ``N`` replicas at a time, 1 recreating. Both sides are seconds of the whole service's capacity
(:func:`weigh`):

    cost = lost_fraction x (restart_seconds - warm_compile_seconds)
    gain = gain_fraction x (cooldown_seconds + persisted_seconds)

and a change goes ahead only when ``gain > cost``. ``warm_compile_seconds`` is what the engine skips on a
warm compile cache (vLLM's: :func:`kvpilot.tuner.loop.trade.compute_warm_compile_seconds`; 0 for engines
kvpilot models no such cache for); ``persisted_seconds`` how long the loop has already held for the same
trigger (:func:`compute_persisted_seconds`: a condition seen for ``t`` is expected to last about ``t``
more), so a small gain that persists wins its restart after a while and a transient never does.

The gain fraction is the share of the service's capacity the change is expected to win back, each engine in
its own terms from these shapes (each capped at 1):

* :func:`compute_admission_share` -- a queue at a concurrency limit: the requests the new limit admits that
  now wait, per running request (vLLM's ``--max-num-seqs``, SGLang's ``--max-running-requests``, TGI's
  ``--max-concurrent-requests``);
* :func:`compute_preemption_share` -- KV pressure that throws running requests' KV away (vLLM's preemptions,
  SGLang's retractions): one preemption as one request's work lost, the share of the running requests
  preempted over the cooldown;
* :func:`compute_kv_bound_share` -- a queue held back by a full KV cache: the requests a cache ``kv_growth``
  times larger admits, per running request;
* any other trigger: 1 (:data:`WHOLE`: no measure to discount it by).

vLLM's per-trigger choice and its compile cache are :mod:`kvpilot.tuner.loop.trade`; SGLang's and TGI's are
their policies' (:func:`kvpilot.tuner.loop.sglang_policy.compute_gain_fraction`,
:func:`kvpilot.tuner.loop.tgi_policy.compute_gain_fraction`), weighed at their chain's gate
(:func:`kvpilot.tuner.loop.engine_chain.choose`). Crash remedies and rollbacks never pass through the trade
(a crashing pod serves nothing: there is nothing to lose).
"""

from __future__ import annotations

from dataclasses import dataclass

WHOLE = 1.0
"""The gain fraction of a trigger with no measure to discount it by: the whole capacity."""


@dataclass(frozen=True, slots=True)
class Trade:
    gain_seconds: float
    """Seconds of the whole service's capacity the change is expected to win over the horizon."""
    cost_seconds: float
    """Seconds of the whole service's capacity the rollout loses."""
    horizon_seconds: float
    """How long the gain is counted for: the cooldown plus how long the condition has persisted."""
    warm_compile_seconds: float = 0.0
    """The compile the restart skips on a warm cache, already taken off :attr:`cost_seconds`."""

    @property
    def worth_it(self) -> bool:
        return self.gain_seconds > self.cost_seconds

    def describe(self) -> str:
        warm = self.warm_compile_seconds
        return (
            f"expected gain {self.gain_seconds:.0f}s of full capacity over {self.horizon_seconds:.0f}s, "
            f"restart cost {self.cost_seconds:.0f}s"
        ) + (f" (warm compile cache: {warm:.0f}s less)" if warm else "")


def weigh(
    gain_fraction: float,
    *,
    cooldown_seconds: float,
    restart_seconds: float,
    lost_fraction: float,
    persisted_seconds: float = 0.0,
    warm_compile_seconds: float = 0.0,
) -> Trade:
    """The gain of winning back ``gain_fraction`` of the capacity against the cost of the restart (module
    docstring); ``persisted_seconds`` capped by the caller (:func:`compute_persisted_seconds`)."""
    horizon = cooldown_seconds + max(0.0, persisted_seconds)
    restart = max(0.0, restart_seconds - max(0.0, warm_compile_seconds))
    cost = min(1.0, max(0.0, lost_fraction)) * restart
    return Trade(gain_fraction * horizon, cost, horizon, warm_compile_seconds)


def compute_admission_share(waiting: float, added: float, running: float) -> float:
    """A raise of a concurrency limit by ``added`` while ``waiting`` requests wait (means over the window):
    the requests it admits per running request (``running`` at least 1)."""
    return min(1.0, min(max(0.0, waiting), max(0.0, added)) / max(1.0, running))


def compute_preemption_share(rate: float, cooldown_seconds: float, running: float) -> float:
    """Preemptions (or retractions) at ``rate`` per second: the share of the ``running`` requests (at least
    1) whose work is thrown away over the cooldown."""
    return min(1.0, max(0.0, rate) * cooldown_seconds / max(1.0, running))


def compute_kv_bound_share(waiting: float, running: float, kv_growth: float | None) -> float:
    """A queue held back by a full KV cache, the cache grown ``kv_growth`` times (``None``: not predicted,
    taken as no growth): the requests it admits per running request (``running`` at least 1)."""
    return min(1.0, max(0.0, waiting) / max(1.0, running), max(0.0, (kv_growth or 1.0) - 1.0))


def compute_persisted_seconds(held_since: float | None, now: float, limit: float) -> float:
    """How long the loop has held for a trigger (``held_since``: the oldest hold for it in the newest run of
    holds, ``None``: not holding for it), at most ``limit``
    (``PolicyConfig.trade_persistence_max_seconds``)."""
    return 0.0 if held_since is None else max(0.0, min(limit, now - held_since))
