"""The tick both kinds share (kvpilot.operator.loop.tick): the rollout it judges, and the status.rollout the
decision's other steps leave out (kvpilot.operator.status.loop_patch.add_rollout_deadline)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator import api
from kvpilot.operator.loop import tick
from kvpilot.operator.pods import pod_summary, storage
from kvpilot.operator.status import loop_patch, status_patch
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.loop import (
    Action,
    Decision,
    LoopState,
    ObservationWindow,
    RolloutState,
    Trigger,
    TuningContext,
)
from kvpilot.tuner.types import EngineSettings, MemoryBudget

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


def test_the_reading_s_checkpoint_and_weight_cache_reach_the_evidence() -> None:
    """What the kind knows of the model (the whole checkpoint) and its storage (a shared weight cache) is
    what the tuner predicts the rollout's start from."""
    budget = MemoryBudget(
        gpu_total_gib=79.19,
        requested_gib=72.85,
        weights_gib=14.99,
        activation_gib=2.5,
        non_torch_gib=0.4,
        cuda_graph_gib=0.5,
        available_kv_cache_gib=54.46,
        kv_bytes_per_token=131072,
        num_gpu_blocks=27883,
        kv_cache_tokens=446128,
        max_concurrency=13.6,
        starts=True,
    )
    reading = tick.TickReading(
        budget=budget,
        window=ObservationWindow.unavailable("no samples", 2000.0),
        pods=[],
        summary=pod_summary.compute_pod_summary([], NEW, 1),
        replica_view=pod_summary.compute_replica_view([], 1),
        replicas=1,
        restart_seconds=None,
        checkpoint_gib=600.0,
        weights_cached=True,
    )
    context = TuningContext(gpu=lookup_gpu("H100-SXM"), default_max_model_len=8192)
    judged = tick.compute_tick(LoopState(current=NEW), reading, context, 2000.0)
    assert (judged.evidence.checkpoint_gib, judged.evidence.weights_cached) == (600.0, True)


@pytest.mark.parametrize(
    ("kind", "cached"),
    [
        (None, False),  # no volume: every start downloads
        ({"hostPath": {"path": "/w"}}, False),  # only the nodes that downloaded it hold it
        ({"persistentVolumeClaim": {"claimName": "w"}}, True),
        ({"persistentVolumeClaim": {"claimName": "w", "readOnly": True}}, True),
        ({"claimTemplate": {}}, True),
    ],
)
def test_weights_are_cached_on_a_claim_any_node_mounts(kind: dict[str, Any] | None, cached: bool) -> None:
    spec = api.Storage.model_validate(kind) if kind is not None else None
    assert storage.keeps_weights(spec) == cached
