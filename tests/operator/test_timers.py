"""The closed loop's timer puts no finalizer on an InferenceService and stops when the watch says it is
deleted (kvpilot.operator.timers)."""

from __future__ import annotations

import kopf

from kvpilot.operator import main, timers
from kvpilot.operator.inferenceservice import closed_loop, service_main


def _timer() -> kopf.TimerHandler:
    assert main.configure  # every kopf registration is made when kvpilot.operator.main is imported
    spawning = kopf.get_default_registry()._spawning.get_all_handlers()
    (handler,) = [h for h in spawning if h.fn is closed_loop.closed_loop_tick]
    return handler  # type: ignore[return-value]


def test_the_closed_loop_timer_needs_no_finalizer() -> None:
    handler = _timer()
    assert handler.requires_finalizer is False
    assert handler.when is timers.is_live
    # nothing else that kopf runs for an InferenceService asks for one either (no delete handler)
    changing = kopf.get_default_registry()._changing.get_all_handlers()
    assert not [h for h in changing if h.requires_finalizer]


def test_a_deleted_object_stops_matching_the_timer_filter() -> None:
    gone = timers.GoneObjects()
    body = {"metadata": {"uid": "u-1", "name": "a"}}
    other = {"metadata": {"uid": "u-2", "name": "b"}}
    for kind in ("ADDED", "MODIFIED", None):
        gone.observe(kind, body)
    assert gone.is_live(body)
    gone.observe("DELETED", body)
    assert not gone.is_live(body) and gone.is_live(other)


def test_the_record_forgets_after_its_ttl() -> None:
    now = [0.0]
    gone = timers.GoneObjects(ttl_s=10, clock=lambda: now[0])
    gone.observe("DELETED", {"metadata": {"uid": "old"}})
    now[0] = 100.0
    for i in range(70):
        gone.observe("DELETED", {"metadata": {"uid": f"u{i}"}})
    assert gone.is_live({"metadata": {"uid": "old"}})  # pruned
    assert not gone.is_live({"metadata": {"uid": "u69"}})
    assert len(gone) <= 70


def test_the_operator_records_deletions_of_inference_services() -> None:
    watching = kopf.get_default_registry()._watching.get_all_handlers()
    (handler,) = [h for h in watching if h.fn is service_main.inference_service_event]
    assert handler.selector.group == "kvpilot.io" and handler.selector.plural == "inferenceservices"
    uid = "u-deleted-by-test"
    body = {"metadata": {"uid": uid}}
    service_main.inference_service_event(event={"type": "DELETED", "object": body}, body=body)  # type: ignore[arg-type]
    assert not timers.is_live(body)  # type: ignore[arg-type]
