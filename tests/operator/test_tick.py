"""The tick both kinds share (kvpilot.operator.loop.tick): the rollout it judges, and the status.rollout the
decision's other steps leave out (kvpilot.operator.status.loop_patch.add_rollout_deadline)."""

from __future__ import annotations

from typing import Any

from kvpilot.operator.loop import tick
from kvpilot.operator.status import loop_patch, status_patch
from kvpilot.tuner.loop import Action, Decision, LoopState, RolloutState, Trigger
from kvpilot.tuner.types import EngineSettings

OLD = EngineSettings(max_num_seqs=64)
NEW = EngineSettings(max_num_seqs=128)
ROLLING = RolloutState(settings=NEW, started_at=1000.0, deadline=1600.0)
WAIT = Decision(Action.HOLD, NEW, Trigger.ROLLOUT_IN_PROGRESS, "waiting")


def rollout_fields(
    old: dict[str, Any], state: LoopState, rollout: RolloutState | None, built: dict[str, Any]
) -> dict[str, Any]:
    """What the deadline step adds to a patch whose earlier steps built ``built``."""
    out = status_patch.StatusPatch(status=dict(built))
    judged = loop_patch.LoopTick(
        state=state, decision=WAIT, rollout=rollout, now=0.0, generation=None, rollout_deadline_seconds=600.0
    )
    assert loop_patch.add_rollout_deadline(old, judged, out) == []
    return {k: v for k, v in out.status.items() if built.get(k) != v or k not in built}


def test_a_rollout_of_other_settings_is_not_judged() -> None:
    state = LoopState(current=OLD, rollout=ROLLING)  # a spec change replaced the settings being rolled out
    assert tick.compute_rollout(state, [], 600.0) is None
    assert rollout_fields({"rollout": {"deadline": "x"}}, state, None, {}) == {"rollout": None}
    # the decision's own patch already says what the rollout is: left alone
    assert rollout_fields({}, state, None, {"rollout": {"a": 1}}) == {}


def test_a_moved_deadline_is_written_over_the_wire_rollout() -> None:
    state = LoopState(current=NEW, rollout=ROLLING)
    moved = RolloutState(settings=NEW, started_at=1000.0, deadline=1900.0)
    old = {"rollout": {"settings": {"maxNumSeqs": 128}, "deadline": status_patch.format_time(1600.0)}}
    fields = rollout_fields(old, state, moved, {})
    later = status_patch.format_time(1900.0)
    assert fields == {"rollout": {"settings": {"maxNumSeqs": 128}, "deadline": later}}
    assert rollout_fields(old, state, ROLLING, {}) == {}  # unchanged deadline: nothing to add
    assert tick.compute_rollout(state, [], 600.0) == ROLLING  # no pod of it started: the deadline holds
