"""How a change of the pods rolls out: ``spec.rollout.strategy`` resolved against the cluster. Pure.

A GPU pool is normally full, so the Deployment's surge pod (``maxSurge: 1, maxUnavailable: 0``) may
find no GPU. :func:`compute_rollout_choice` picks, for ``Auto``:

1. **Surge** when one more pod of this shape fits now
   (:func:`kvpilot.operator.pods.capacity.compute_fits_now`);
2. else **Replace** every replica at once (``maxSurge: 0``) when no replica serves anyway (a crash loop,
   a start-up failure): nothing is lost by taking their GPUs, and the fix needs them;
3. else, when the cluster's capacity could not be read, **Surge** (the pod waits Pending for a GPU;
   Pending is not failure, so nothing is lost either);
4. else, with 2 or more replicas, **Replace** ``spec.rollout.maxUnavailable`` replicas at a time (at most
   ``replicas - 1``, so one keeps serving; the PodDisruptionBudget says the same);
5. else (one replica) **Recreate** when ``spec.rollout.allowDowntime``;
6. else *held*: :data:`HELD_MESSAGE`, and the change stays a recommendation.

``Surge``, ``Replace`` and ``Recreate`` in the spec are honoured as written (a surge on a full pool waits
Pending, which the closed loop holds without marking the settings failed). :func:`build_deployment_strategy`
renders a choice as the Deployment's ``spec.strategy``; :func:`compute_lost_fraction` says what a choice
costs in serving while a pod restarts (the policy's trade, :mod:`kvpilot.tuner.loop.trade`), and
:func:`compute_costs` that with why a held choice blocks the change (every engine's loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api

HELD_MESSAGE = "no spare GPU for a surge pod; allow downtime or add capacity"
"""Why a one-replica service on a full pool does not roll out (event, condition, history)."""


@dataclass(frozen=True, slots=True)
class RolloutChoice:
    strategy: api.AppliedStrategy | None
    """``None``: held (:data:`HELD_MESSAGE`)."""
    reason: str
    max_unavailable: int = 0
    """Replace: replicas taken down at a time."""

    @property
    def held(self) -> bool:
        return self.strategy is None


DEFAULT = RolloutChoice("Surge", "no choice made yet: a new pod beside the old ones")
"""What a Deployment is rendered with when nothing was chosen (``kvpilot render``, a first create)."""


def compute_rollout_choice(
    rollout: api.RolloutSpec,
    replicas: int,
    *,
    fits_now: bool | None,
    serving: bool,
    not_serving_why: str = "",
) -> RolloutChoice:
    """The strategy for the next change of the pods (module docstring). ``fits_now``: one more pod fits
    (``None``: the capacity could not be read); ``serving``: a replica is Ready now."""
    n = max(1, replicas)
    step = min(rollout.max_unavailable, max(1, n - 1))
    if rollout.strategy == "Surge":
        return RolloutChoice("Surge", "spec.rollout.strategy is Surge")
    if rollout.strategy == "Replace":
        return RolloutChoice("Replace", f"spec.rollout.strategy is Replace ({step} at a time)", step)
    if rollout.strategy == "Recreate":
        return RolloutChoice("Recreate", "spec.rollout.strategy is Recreate (allowDowntime)")
    if fits_now:
        return RolloutChoice("Surge", "Auto: a surge pod fits on a node with spare GPUs")
    if not serving:
        why = f" ({not_serving_why})" if not_serving_why else ""
        return RolloutChoice(
            "Replace", f"Auto: no replica serves{why}; replacing without waiting for a spare GPU", n
        )
    if fits_now is None:
        return RolloutChoice("Surge", "Auto: the cluster's spare GPUs could not be read; surging")
    if n >= 2:
        return RolloutChoice(
            "Replace", f"Auto: no spare GPU for a surge pod; replacing {step} of {n} replicas at a time", step
        )
    if rollout.allow_downtime:
        return RolloutChoice("Recreate", "Auto: no spare GPU for a surge pod; recreating (allowDowntime)")
    return RolloutChoice(None, HELD_MESSAGE)


def compute_declared_choice(rollout: api.RolloutSpec, replicas: int) -> RolloutChoice:
    """The choice the spec declares without looking at the cluster: an explicit ``Surge``, ``Replace`` or
    ``Recreate`` is what it says; ``Auto`` renders :data:`DEFAULT` until the cluster is read. What a first
    create applies and ``kvpilot render`` prints."""
    if rollout.strategy == "Auto":
        return DEFAULT
    return compute_rollout_choice(rollout, replicas, fits_now=None, serving=True)


def build_deployment_strategy(choice: RolloutChoice) -> dict[str, Any]:
    """The Deployment's ``spec.strategy`` for ``choice`` (a held choice renders a surge: nothing rolls)."""
    if choice.strategy == "Replace":
        rolling = {"maxSurge": 0, "maxUnavailable": choice.max_unavailable}
        return {"type": "RollingUpdate", "rollingUpdate": rolling}
    if choice.strategy == "Recreate":
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def compute_lost_fraction(choice: RolloutChoice, replicas: int, *, serving: bool) -> float:
    """The share of serving capacity lost while a pod restarts under ``choice`` (0 when nothing serves)."""
    if not serving or choice.strategy in (None, "Surge"):
        return 0.0
    if choice.strategy == "Recreate":
        return 1.0
    return min(1.0, choice.max_unavailable / max(1, replicas))


def compute_costs(choice: RolloutChoice, replicas: int, *, serving: bool) -> tuple[float, str | None]:
    """What a change's rollout under ``choice`` costs the policy, for every engine's loop: the share of the
    capacity it loses (:func:`compute_lost_fraction`, ``Evidence.rollout_lost_fraction``) and why it cannot
    roll out at all (a held choice: its reason, :data:`HELD_MESSAGE`, ``Evidence.rollout_blocked``; else
    ``None``)."""
    return compute_lost_fraction(choice, replicas, serving=serving), choice.reason if choice.held else None
