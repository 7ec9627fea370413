"""How one closed-loop tick of an InferenceService records what it saw and decided: one conditional PATCH.

:func:`apply_record` builds the tick's whole status in one go
(:func:`kvpilot.operator.status.loop_patch.build_loop_patch`, with the ``Schedulable`` view of
:mod:`.loop_schedulable`) and writes it
(:func:`kvpilot.operator.status.status_write.apply_status`); :func:`apply_off` does the same for mode Off,
where only the pods' view is recorded. A change is recorded before it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator.clients import metrics
from kvpilot.operator.inferenceservice import engine_ticks, loop_observing, loop_reading, loop_schedulable
from kvpilot.operator.inferenceservice.loop_observing import Observed
from kvpilot.operator.inferenceservice.loop_reading import Resolved, Service
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status import loop_patch, status_write
from kvpilot.operator.status.status_patch import StatusPatch
from kvpilot.tuner.loop import Action, Decision, RolloutState

UNKNOWN = status_write.UNKNOWN
"""The write's request failed without an answer: it may have landed (:mod:`.status_write`)."""


@dataclass(frozen=True)
class Recorded:
    """What :func:`apply_record` wrote (``written``: one of :mod:`.status_write`'s outcomes), and what goes
    with it: the new status fields, the events to post and the decisions to count once it landed."""

    written: str
    status: Mapping[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)

    @property
    def landed(self) -> bool:
        return self.written in (status_write.WRITTEN, status_write.UNCHANGED)


async def apply_record(
    deps: LoopDeps,
    svc: Service,
    resolved: Resolved,
    observed: Observed,
    decision: Decision,
    rollout: RolloutState | None,
    *,
    changed: bool,
    choice: RolloutChoice | None,
    cluster: loop_observing.Cluster | None,
    patch: Any,
    logger: Any,
) -> Recorded:
    """The tick's whole status (``rollout``: the one the tick judged; ``changed``: a change to apply now,
    rolled out with ``choice``) as one conditional PATCH."""
    schedulable = await loop_schedulable.fetch_schedulable(
        deps, svc, resolved.inputs, observed.views, cluster
    )
    tick = loop_patch.LoopTick(
        state=svc.state,
        decision=decision,
        rollout=rollout,
        now=svc.now,
        generation=svc.generation,
        rollout_deadline_seconds=resolved.policy.rollout_deadline_seconds,
        mode=svc.mode,
        applied=changed,
        serving=observed.serving,
        rollout_choice=choice,
        extra_conditions=schedulable,
        startup_seconds=observed.startup,
        resolve_failure=resolved.failure,
    )
    out = loop_patch.build_loop_patch(svc.old, tick)
    written = await apply_patch(deps, patch, svc, out, logger)
    return Recorded(written, out.status, out.events, out.decisions)


async def apply_off(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> None:
    """Mode Off: the pods' view alone (``Available``, ``Degraded``, ``Ready``, ``Schedulable``)."""
    try:
        views = await loop_observing.fetch_pods(deps, svc.namespace, svc.name)
    except Exception as exc:  # noqa: BLE001 -- API hiccup: the next tick retries
        logger.warning(f"closed loop: listing pods failed ({exc}); skipping this tick")
        return
    serving = loop_observing.compute_serving(svc, views)
    schedulable = await loop_schedulable.fetch_schedulable(deps, svc, None, views, None)
    out = loop_patch.build_off_patch(
        svc.old, serving, generation=svc.generation, now=svc.now, extra_conditions=schedulable
    )
    await apply_patch(deps, patch, svc, out, logger)


async def apply_other_engine(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> None:
    """Another engine than vLLM: its own loop, which recommends and in mode Auto rolls out (SGLang's, TGI's:
    :func:`.engine_ticks.run_engine_rules`; nothing in mode Off), or, for an engine the loop has no rules
    for, its hold (:func:`apply_engine_hold`). vLLM's remedies never reach it."""
    if svc.engine_recommended:
        if svc.mode != "Off":
            await engine_ticks.run_engine_rules(deps, svc, patch, logger)
        return
    await apply_engine_hold(deps, svc, patch, logger)


async def apply_engine_hold(deps: LoopDeps, svc: Service, patch: Any, logger: Any) -> None:
    """An engine the loop has no rules for: its hold, written once
    (:func:`.loop_patch.build_engine_hold_patch`), with its event; nothing else is read or changed."""
    out = loop_patch.build_engine_hold_patch(
        svc.old, svc.spec.engine.kind, svc.mode, generation=svc.generation, now=svc.now
    )
    if out is not None and await apply_patch(deps, patch, svc, out, logger) == status_write.WRITTEN:
        for type_, reason, message in out.events:
            deps.emit(svc.body, type_, reason, message)


async def apply_patch(deps: LoopDeps, patch: Any, svc: Service, out: StatusPatch, logger: Any) -> str:
    """The tick's status as one conditional PATCH (:func:`status_write.apply_status`): what became of it.
    Without a Kubernetes client, kopf's ``patch`` carries it."""
    if deps.kube is None:
        out.add_to(patch, old=svc.old)
        return status_write.WRITTEN
    return await status_write.apply_status(
        deps.kube, svc.namespace, svc.name, svc.version, out, svc.old, logger
    )


def is_notable_hold(decision: Decision, old: Mapping[str, Any]) -> bool:
    """Whether the tick holds back a change it wants (a hold that is not routine:
    :func:`.loop_patch.is_quiet_hold`): the ``kvpilot_service_held`` gauge the alert rules read."""
    return decision.action == Action.HOLD and not loop_patch.is_quiet_hold(decision, old)


def record_metrics(
    svc: Service, resolved: Resolved, decision: Decision, change: bool, recorded: Recorded
) -> None:
    """The operator's own series for this tick: the decisions recorded, the settings now running, the
    policy's band and SLO, and whether the service is held (the dashboard's and the alerts' inputs)."""
    for kind in recorded.decisions:
        metrics.record_decision(kind, svc.namespace, svc.name)
    running = decision.settings if change else svc.state.current
    held = is_notable_hold(decision, svc.old)
    slo = loop_reading.build_context(svc, resolved).slo
    metrics.record_service(svc.namespace, svc.name, running, resolved.policy, slo, held=held)
