"""The closed loop's status write: one conditional PATCH per tick, and a change recorded before it is applied.

A tick's whole status (the decision's fields, its conditions and its ``history`` entry) goes to the API server
as one JSON merge patch of ``/status``
(:meth:`kvpilot.operator.status.status_patch.StatusPatch.build_conditional`),
made on the status the tick read and carrying that read's ``metadata.resourceVersion``. The API server applies
it whole or, if any other writer came between (the reconciler after a spec change, kopf, another replica), not
at all (HTTP 409, :class:`kvpilot.operator.clients.kube.Conflict`). So the lists it replaces are never put
back stale,
and on a conflict the tick does nothing more: no apply, no event, no fleet-learning sample; the next tick
decides again on the fresh object. (kopf's own ``patch`` would send a merge patch and then a JSON patch of
the lists: two requests, with a window between them.)

A closed-loop change (mode Auto) is written *first* and applied to the Deployment after, so
``status.applied`` and ``status.rollout`` are the intent and the Deployment follows them:

- killed before the write: nothing was written or applied; the next leader decides again, once;
- killed between the write and the apply: the record is complete (one ``Retuned`` or ``RolledBack`` entry);
  the next leader's resume handler re-applies ``status.applied``
  (:func:`kvpilot.operator.inferenceservice.handlers.reconcile`
  keeps it on resume) and its timer continues the rollout;
- the apply failed (the API server refused or timed out): a ``RetuneFailed`` event, and the next tick applies
  the same settings again (:class:`PendingApplies`) before it decides anything;
- the write's request failed without an answer (:data:`UNKNOWN`: it may have landed): the change is not
  applied now but kept pending, and the next tick applies it only if ``status.applied`` says it landed.

``tests/operator/test_status_write.py`` stops the operator at each point: one record, one rollout.
``e2e/test_ha_resume.py`` SIGKILLs the leader before the write and between the write and the apply on the real
control plane, and the follower completes the change once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import errors
from kvpilot.operator.clients.kube import Conflict, Kube
from kvpilot.operator.pods.rollout_strategy import RolloutChoice
from kvpilot.operator.status.status_patch import StatusPatch
from kvpilot.tuner.types import EngineSettings

Pending = tuple[EngineSettings, RolloutChoice | None]
"""Settings recorded in ``status.applied`` and the rollout strategy chosen for them."""

WRITTEN, UNCHANGED, CONFLICT, GONE, UNKNOWN = "written", "unchanged", "conflict", "gone", "unknown"
"""What :func:`apply_status` did: sent and applied; nothing to send; refused (another writer came between);
the object no longer exists; the request failed (a timeout, HTTP 5xx), so it may or may not have landed."""


async def apply_status(
    kube: Kube,
    namespace: str,
    name: str,
    resource_version: str | None,
    out: StatusPatch,
    old: Mapping[str, Any],
    logger: Any,
) -> str:
    """Send ``out`` as one merge patch made on ``old`` (read at ``resource_version``); one of :data:`WRITTEN`,
    :data:`UNCHANGED`, :data:`CONFLICT`, :data:`GONE`, :data:`UNKNOWN` (logged)."""
    body = out.build_conditional(old, resource_version)
    if body is None:
        return UNCHANGED
    try:
        result = await asyncio.to_thread(kube.patch_inference_service_status, namespace, name, body)
    except Conflict:
        logger.info("closed loop: the object changed during the tick; deciding again on the next one")
        return CONFLICT
    except errors.ApplyFailed as exc:
        logger.warning(f"closed loop: writing the status failed ({exc}); deciding again on the next tick")
        return UNKNOWN
    return WRITTEN if result is not None else GONE


@dataclass
class PendingApplies:
    """Changes recorded in the status whose apply to the Deployment failed, by ``(namespace, name)``: the next
    tick applies them again (in memory: after a restart the resume handler re-applies ``status.applied``)."""

    pending: dict[tuple[str, str], Pending] = field(default_factory=dict)

    def add(self, namespace: str, name: str, pending: Pending) -> None:
        self.pending[(namespace, name)] = pending

    def take(self, namespace: str, name: str, applied: EngineSettings) -> Pending | None:
        """The service's pending apply if its settings are still ``status.applied`` (a later change or a spec
        change replaced them otherwise); forgotten either way."""
        pending = self.pending.pop((namespace, name), None)
        return pending if pending is not None and pending[0] == applied else None
