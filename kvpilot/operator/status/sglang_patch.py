"""The status an SGLang service's closed-loop tick writes: its recommendation, the flags ruled out, why.

The SGLang loop (:mod:`kvpilot.operator.inferenceservice.sglang_loop`) recommends and never rolls out, so its
status is small and in SGLang's own spelling (``status.applied`` and ``status.failedSettings`` are vLLM's
settings; these are not):

* ``status.recommendation.engineArgs`` -- the flags of the latest change the loop decided (or would have,
  past a gate), with its ``reason``, ``trigger`` and ``time``; rewritten only when the flags or the trigger
  change, with a Normal ``Recommended`` event;
* ``status.failedEngineArgs`` -- the flags that failed and how (the seam's failure kind); read back into the
  policy's ruled-out runs (:func:`read_failed_runs`), with a Warning event named by the trigger when a
  failure is first recorded;
* ``ClosedLoop=True`` (reason ``Recommending``) saying the loop recommends and what it last decided (its
  message changes only with the action and trigger, so a steady service is not rewritten each tick), and
  ``MetricsAvailable`` as for vLLM. A newly infeasible decision is a Warning ``Infeasible`` event.

Pure: builds the patch; :func:`kvpilot.operator.inferenceservice.loop_record.apply_patch` writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import conditions
from kvpilot.operator.status import events
from kvpilot.operator.status.status_patch import ListPatch, StatusPatch, Update, cap, format_time
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import sglang
from kvpilot.tuner.engines import FailureKind
from kvpilot.tuner.loop import Action, FailedRun, SglangDecision

RECOMMENDING = "Recommending"
FAILED_LIMIT = 32
"""``status.failedEngineArgs`` keeps this many (the CRD's ``maxItems``)."""
_FAILURES: tuple[FailureKind, ...] = ("start_memory_short", "start_oom", "runtime_oom")


def read_failed_runs(status: Mapping[str, Any]) -> tuple[FailedRun, ...]:
    """``status.failedEngineArgs`` as the policy's ruled-out runs (an entry that does not parse: skipped)."""
    runs: list[FailedRun] = []
    for item in status.get("failedEngineArgs") or ():
        kind = next((k for k in _FAILURES if k == item.get("failure")), None)
        if kind is None:
            continue
        try:
            runs.append(FailedRun(sglang.parse_sglang_args([str(a) for a in item.get("args") or ()]), kind))
        except tuner_errors.TunerError:
            continue
    return tuple(runs)


def describe_loop(mode: str) -> str:
    """What the loop does for SGLang in ``mode`` (the ``ClosedLoop`` condition's first sentence)."""
    if mode == "Auto":
        return (
            "the closed loop recommends SGLang flags (status.recommendation.engineArgs) and does not roll "
            "them out yet: the Deployment keeps the reconciler's plan"
        )
    return (
        f"the closed loop recommends SGLang flags (status.recommendation.engineArgs); mode {mode}: the pods "
        "keep SGLang's own defaults"
    )


def build_sglang_patch(
    old: Mapping[str, Any], decision: SglangDecision, mode: str, *, generation: int | None, now: float
) -> StatusPatch:
    """The tick's status (:mod:`this module <kvpilot.operator.status.sglang_patch>`) and its events."""
    stamp = format_time(now)
    last = f"last decision: {decision.action} ({decision.trigger})"
    updates: list[Update] = [
        (conditions.CLOSED_LOOP, conditions.TRUE, RECOMMENDING, f"{describe_loop(mode)}; {last}")
    ]
    metrics = decision.metrics
    if metrics is not None:
        available = conditions.TRUE if metrics.available else conditions.FALSE
        updates.append((conditions.METRICS_AVAILABLE, available, metrics.reason, metrics.message))
    out = StatusPatch(status={}, lists=ListPatch(generation, stamp, updates=updates))
    _add_failed(old, decision, out)
    _add_recommendation(old, decision, out, stamp)
    was = conditions.find_condition(old.get("conditions"), conditions.CLOSED_LOOP) or {}
    if decision.action == Action.INFEASIBLE and last not in str(was.get("message") or ""):
        out.events.append((events.WARNING, "Infeasible", decision.reason))
    return out


def _add_failed(old: Mapping[str, Any], decision: SglangDecision, out: StatusPatch) -> None:
    if decision.failed is None:
        return
    entry = {"args": sglang.build_sglang_args(decision.failed.settings), "failure": decision.failed.kind}
    recorded = list(old.get("failedEngineArgs") or ())
    if entry in recorded:
        return
    out.status["failedEngineArgs"] = [*recorded, entry][-FAILED_LIMIT:]
    out.events.append((events.WARNING, decision.trigger, decision.reason))


def _add_recommendation(
    old: Mapping[str, Any], decision: SglangDecision, out: StatusPatch, stamp: str
) -> None:
    target = decision.settings if decision.changes else decision.recommended
    if target is None:
        return
    args = sglang.build_sglang_args(target)
    was = old.get("recommendation") or {}
    if was.get("engineArgs") == args and was.get("trigger") == decision.trigger:
        return
    out.status["recommendation"] = {
        "engineArgs": args,
        "reason": cap(decision.reason),
        "trigger": decision.trigger,
        "time": stamp,
    }
    why = "; ".join(decision.explanation)
    out.events.append(
        (events.NORMAL, "Recommended", cap(f"{decision.reason}" + (f" [{why}]" if why else "")))
    )
