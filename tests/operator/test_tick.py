"""The tick both kinds share (kvpilot.operator.loop.tick): the rollout it judges and the status.rollout the
decision's patch leaves out."""

from __future__ import annotations

from kvpilot.operator.loop import tick
from kvpilot.operator.status import status_patch
from kvpilot.tuner.loop import LoopState, RolloutState
from kvpilot.tuner.types import EngineSettings

OLD = EngineSettings(max_num_seqs=64)
NEW = EngineSettings(max_num_seqs=128)
ROLLING = RolloutState(settings=NEW, started_at=1000.0, deadline=1600.0)


def test_a_rollout_of_other_settings_is_not_judged() -> None:
    state = LoopState(current=OLD, rollout=ROLLING)  # a spec change replaced the settings being rolled out
    assert tick.compute_rollout(state, [], 600.0) is None
    assert tick.build_rollout_fields({"rollout": {"deadline": "x"}}, state, None, {}) == {"rollout": None}
    # the decision's own patch already says what the rollout is: left alone
    assert tick.build_rollout_fields({}, state, None, {"rollout": {"a": 1}}) == {}


def test_a_moved_deadline_is_written_over_the_wire_rollout() -> None:
    state = LoopState(current=NEW, rollout=ROLLING)
    moved = RolloutState(settings=NEW, started_at=1000.0, deadline=1900.0)
    old = {"rollout": {"settings": {"maxNumSeqs": 128}, "deadline": status_patch.format_time(1600.0)}}
    fields = tick.build_rollout_fields(old, state, moved, {})
    later = status_patch.format_time(1900.0)
    assert fields == {"rollout": {"settings": {"maxNumSeqs": 128}, "deadline": later}}
    assert tick.build_rollout_fields(old, state, ROLLING, {}) == {}  # unchanged deadline: nothing to add
    assert tick.compute_rollout(state, [], 600.0) == ROLLING  # no pod of it started: the deadline holds
