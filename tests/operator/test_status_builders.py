"""Each writer's whole status is built in one go by the status package (kvpilot.operator.status.loop_patch,
tuner_status): what used to be edits of a built patch by its callers is now an input of the builder."""

from __future__ import annotations

from kvpilot.operator import api, conditions
from kvpilot.operator.errors import Failure
from kvpilot.operator.status import loop_patch, status_patch, tuner_status
from kvpilot.tuner.loop import Action, Decision, LoopState, MetricsStatus, RolloutState, Trigger
from kvpilot.tuner.types import EngineSettings

OLD = EngineSettings(max_num_seqs=64)
NEW = EngineSettings(max_num_seqs=32)
METRICS = MetricsStatus(True, "Observed", "metrics usable")
RETUNE = Decision(Action.RETUNE, NEW, Trigger.KV_PRESSURE, "KV cache full", metrics=METRICS)


def _tick(**fields: object) -> loop_patch.LoopTick:
    base: dict[str, object] = dict(
        state=LoopState(current=OLD),
        decision=RETUNE,
        rollout=None,
        now=1000.0,
        generation=3,
        rollout_deadline_seconds=600.0,
        mode="Auto",
        applied=True,
    )
    return loop_patch.LoopTick(**{**base, **fields})  # type: ignore[arg-type]


def test_a_change_is_recorded_with_its_rollout_event_and_history() -> None:
    out = loop_patch.build_loop_patch({}, _tick(startup_seconds=42.04))
    assert out.status["applied"] == status_patch.build_settings(NEW)
    assert out.status["rollout"]["deadline"] == status_patch.format_time(1600.0)
    assert out.status["startupSeconds"] == 42.0  # the step, not an edit by the caller
    assert [e[1] for e in out.events] == ["Retuned"] and out.decisions == ["Retuned"]
    assert out.lists is not None and [h[0]["action"] for h in out.lists.history] == ["Retuned"]
    types = [u[0] for u in out.lists.updates]
    assert types == [conditions.METRICS_AVAILABLE, conditions.ROLLOUT_IN_PROGRESS]


def test_an_engine_tuners_patch_keeps_only_the_fields_its_status_has() -> None:
    out = loop_patch.build_loop_patch({}, _tick(kind=api.ENGINE_TUNER_KIND, startup_seconds=42.0))
    assert "rollout" in out.status  # the EngineTuner's recommendation rolls out too
    for absent in ("applied", "lastChangeTime", "calibration", "recommendation", "startupSeconds"):
        assert absent not in out.status, absent
    assert set(out.status) <= loop_patch.KIND_FIELDS[api.ENGINE_TUNER_KIND]


def test_a_replaced_rollout_is_cleared_and_a_moved_deadline_written_by_the_builder() -> None:
    rolling = RolloutState(settings=OLD, started_at=900.0, deadline=1500.0)
    hold = Decision(Action.HOLD, OLD, Trigger.ROLLOUT_IN_PROGRESS, "waiting", metrics=METRICS)
    wire = {"rollout": {"settings": {"maxNumSeqs": 64}, "deadline": status_patch.format_time(1500.0)}}
    moved = RolloutState(settings=OLD, started_at=900.0, deadline=1700.0)
    state = LoopState(current=OLD, rollout=rolling)
    out = loop_patch.build_loop_patch(wire, _tick(state=state, decision=hold, rollout=moved, applied=False))
    assert out.status["rollout"]["deadline"] == status_patch.format_time(1700.0)
    replaced = _tick(state=state, decision=hold, rollout=None, applied=False)  # a spec change replaced it
    cleared = loop_patch.build_loop_patch(wire, replaced)
    assert cleared.status["rollout"] is None


def test_a_tuners_failure_warns_once_per_verdict() -> None:
    failure = Failure("TargetNotFound", "Deployment ns/x does not exist", conditions.TARGET_FOUND, True)
    first = tuner_status.build_tuner_failure_status({}, generation=1, now=10.0, failure=failure)
    assert first.events == [("Warning", "TargetNotFound", failure.message)]
    assert first.lists is not None
    assert [u[0] for u in first.lists.updates] == [conditions.READY, conditions.TARGET_FOUND]
    old = {
        "conditions": [
            {"type": "Ready", "status": "False", "reason": failure.reason, "message": failure.message}
        ]
    }
    again = tuner_status.build_tuner_failure_status(old, generation=1, now=20.0, failure=failure)
    assert again.events == []
