"""Failures at the edge: the operator's own errors, and every error mapped to an outcome.

Tree::

    OperatorError                    -- raised by kvpilot.operator; carries reason + retry policy
    ├── InvalidSpec                  -- a spec the CRD's CEL rules would refuse, or contradictory parts
    ├── PolicyViolation              -- a spec the tenant guard refuses (reason Forbidden: pods/tenant_guard)
    ├── ConfigNotFound               -- the ConfigMap / Secret / key named by the spec is missing (retried)
    ├── HubUnreachable               -- the Hugging Face Hub did not answer (retried with back-off)
    ├── HubAccessDenied              -- the Hub refused the token (retried slowly: fix the Secret)
    ├── NoMatchingNodes              -- no node matches nodeSelector, so no GPU to plan for (retried)
    ├── AmbiguousGpu                 -- nodes matching nodeSelector carry several GPU products
    ├── ApplyFailed                  -- the API server failed a write, or cannot be reached (retried)
    ├── NameConflict                 -- an object of a wanted name is another's: never adopted (retried)
    ├── ApplyRejected                -- the API server refused the manifest as invalid (HTTP 400/422)
    ├── LeaderWorkerSetNotInstalled  -- gpu.nodesPerReplica > 1 and the LWS CRD is not served
    └── EngineNotSupported           -- what an engine's path does not render (SGLang, TGI over several nodes)

plus the tuner's domain errors (:mod:`kvpilot.tuner.errors`). :func:`classify` turns
any exception into a :class:`Failure`: which condition it falsifies, its CamelCase
reason, a message saying what to change, and whether retrying can help.
:func:`to_kopf` turns that into ``kopf.TemporaryError`` (with exponential back-off)
or ``kopf.PermanentError`` (the next spec change retries). Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import kopf

from kvpilot.operator import conditions
from kvpilot.tuner import errors as tuner_errors

BACKOFF_BASE_S = 15.0
BACKOFF_CAP_S = 600.0


class OperatorError(Exception):
    reason = "OperatorError"
    condition = conditions.READY
    retry = False
    delay_s = BACKOFF_BASE_S

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpec(OperatorError):
    reason = "InvalidSpec"


class PolicyViolation(OperatorError):
    """A spec that escalates past the tenant policy the operator enforces itself
    (:mod:`kvpilot.operator.pods.tenant_guard`): reason ``Forbidden``, as the admission policy's."""

    reason = "Forbidden"


class ConfigNotFound(OperatorError):
    reason = "ConfigNotFound"
    condition = conditions.CONFIG_RESOLVED
    retry = True
    delay_s = 30.0


class HubUnreachable(OperatorError):
    reason = "HubUnreachable"
    condition = conditions.CONFIG_RESOLVED
    retry = True


class HubCacheUnwritable(OperatorError):
    """The operator cannot write the Hugging Face cache it downloads config.json into (``HF_HOME``): its own
    deployment's fault, not the Hub's or the tenant's. Retried: the platform team can fix the volume."""

    reason = "HubCacheUnwritable"
    condition = conditions.CONFIG_RESOLVED
    retry = True
    delay_s = 120.0


class HubAccessDenied(OperatorError):
    reason = "HubAccessDenied"
    condition = conditions.CONFIG_RESOLVED
    retry = True
    delay_s = 120.0


class NoMatchingNodes(OperatorError):
    reason = "NoMatchingNodes"
    condition = conditions.CONFIG_RESOLVED
    retry = True
    delay_s = 30.0


class AmbiguousGpu(OperatorError):
    reason = "AmbiguousGpu"
    condition = conditions.CONFIG_RESOLVED


class ApplyFailed(OperatorError):
    reason = "ApplyFailed"
    retry = True


class NameConflict(OperatorError):
    """An object kvpilot would create already exists and is controlled by someone else: never modified or
    adopted (:mod:`kvpilot.operator.pods.ownership`). Retried: the other object may be removed or renamed."""

    reason = "NameConflict"
    retry = True
    delay_s = 60.0


class ApplyRejected(OperatorError):
    """The API server refused the manifest itself (HTTP 400/422): retrying the same spec cannot help."""

    reason = "ApplyRejected"


class LeaderWorkerSetNotInstalled(OperatorError):
    """A replica over several nodes (``gpu.nodesPerReplica`` > 1) runs as a LeaderWorkerSet, and the API
    server does not serve ``leaderworkerset.x-k8s.io/v1`` (the CRD of sigs.k8s.io/lws is not installed):
    refused before anything is applied, never deployed as one node. Retried: installing LWS cures it."""

    reason = "LeaderWorkerSetNotInstalled"
    retry = True
    delay_s = 60.0


class EngineNotSupported(OperatorError):
    """``spec.engine.kind`` names an engine kvpilot cannot plan or render yet
    (:mod:`kvpilot.operator.planning.engines`): refused with what is missing, never guessed. Permanent: the
    kind is fixed at creation, so the cure is another InferenceService (or a kvpilot that plans it)."""

    reason = "EngineNotSupported"
    condition = conditions.PLANNED


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed reconciliation reports and whether it is retried."""

    reason: str
    message: str
    condition: str
    """The domain condition set to False (Ready is always set to False as well)."""
    retry: bool
    delay_s: float = BACKOFF_BASE_S
    infeasible: bool = False


_TUNER_CONDITIONS: dict[type[tuner_errors.TunerError], str] = {
    tuner_errors.UnknownModel: conditions.CONFIG_RESOLVED,
    tuner_errors.InvalidModelConfig: conditions.CONFIG_RESOLVED,
    tuner_errors.UnknownGpu: conditions.CONFIG_RESOLVED,
    tuner_errors.InvalidEngineArgs: conditions.PLANNED,
    tuner_errors.InfeasiblePlan: conditions.PLANNED,
}


def classify(exc: BaseException) -> Failure:
    """The :class:`Failure` for any exception; unknown ones are retried as ``InternalError``, whose message
    names only the exception's type: the text of an unexpected exception (a URL with credentials, another
    object's content, an upstream body) never reaches status or events, which tenants read; the caller logs
    it."""
    if isinstance(exc, OperatorError):
        return Failure(exc.reason, exc.message, exc.condition, exc.retry, exc.delay_s)
    if isinstance(exc, tuner_errors.TunerError):
        message = exc.message
        suggestions = getattr(exc, "suggestions", ())
        if suggestions:
            message = f"{message.rstrip('.')}. Options: {' '.join(s.rstrip('.') + '.' for s in suggestions)}"
        field = getattr(exc, "field", None) or getattr(exc, "flag", None)
        if isinstance(exc, tuner_errors.InvalidModelConfig) and field and field not in message:
            message = f"{message} (field {field})"
        condition = next((c for t, c in _TUNER_CONDITIONS.items() if isinstance(exc, t)), conditions.PLANNED)
        return Failure(
            exc.reason,
            message,
            condition,
            retry=False,
            infeasible=isinstance(exc, tuner_errors.InfeasiblePlan),
        )
    return Failure(  # the exception's text stays in the operator's log: it may quote other tenants or secrets
        "InternalError",
        f"kvpilot failed unexpectedly ({type(exc).__name__}); it will retry. "
        "If this persists, report it with the operator's log, which holds the details.",
        conditions.READY,
        retry=True,
    )


def compute_delay(failure: Failure, retry: int) -> float:
    """Exponential back-off from the failure's base delay, capped at :data:`BACKOFF_CAP_S`."""
    return min(failure.delay_s * (1 << max(0, min(retry, 16))), BACKOFF_CAP_S)


def to_kopf(failure: Failure, retry: int = 0) -> kopf.TemporaryError | kopf.PermanentError:
    """The kopf error that makes kopf retry (with back-off) or wait for the next spec change."""
    text = f"{failure.reason}: {failure.message}"
    if failure.retry:
        return kopf.TemporaryError(text, delay=compute_delay(failure, retry))
    return kopf.PermanentError(text)
