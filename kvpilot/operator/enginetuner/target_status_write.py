"""An EngineTuner's status written: the patch into kopf's, its events and decision counts, or a failure.

Shared by the reconcile of a vLLM target (:mod:`.target_handlers`) and of an SGLang or TGI one
(:mod:`.target_engine_reconcile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import kopf

from kvpilot.operator import errors
from kvpilot.operator.clients import metrics
from kvpilot.operator.enginetuner.target_deps import TargetDeps
from kvpilot.operator.status import status_patch, tuner_status


def apply_tuner_status(
    deps: TargetDeps, body: Mapping[str, Any], patch: kopf.Patch, out: status_patch.StatusPatch
) -> None:
    """The status into kopf's patch, then its events and decision counts."""
    out.add_to(patch)
    for type_, reason, message in out.events:
        deps.emit(body, type_, reason, message)
    for kind in out.decisions:
        metrics.record_decision(kind)


def apply_failure(
    deps: TargetDeps,
    body: Mapping[str, Any],
    meta: Mapping[str, Any],
    old: Mapping[str, Any],
    patch: kopf.Patch,
    exc: Exception,
    now: float,
    logger: Any,
    retry: int,
) -> NoReturn:
    """A failed read or plan: ``Ready=False`` with the reason, a Warning when new; kopf's back-off or
    nothing until the next spec change (:func:`kvpilot.operator.errors.to_kopf`, raised)."""
    failure = errors.classify(exc)
    if failure.reason == "InternalError":
        logger.exception("EngineTuner reconciliation failed unexpectedly")
    generation = meta.get("generation")
    apply_tuner_status(
        deps,
        body,
        patch,
        tuner_status.build_tuner_failure_status(old, generation=generation, now=now, failure=failure),
    )
    raise errors.to_kopf(failure, retry) from None
