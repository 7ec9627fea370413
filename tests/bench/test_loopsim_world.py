"""The bench's simulated Deployment (bench/loopsim/world.py): no request vanishes in a rollout.

A surge rollout's old pod goes once the new one serves; the requests it had waiting go back to the load
balancer and the serving pod takes them at once, their wait carried over (clients still give up after
``MAX_WAIT_S`` in all). Before, they waited for a later pod's start, so a run with one rollout never served
them and one with more rollouts did.
"""

from __future__ import annotations

import dataclasses

from bench.loopsim.scenario import SCENARIO_DIR, load_scenario
from bench.loopsim.world import DT, MAX_WAIT_S, World


def _queued_world() -> World:
    """overload's 80 req/s on 16 sequences: a queue that never empties."""
    sc = load_scenario(SCENARIO_DIR / "overload.json")
    sc = dataclasses.replace(sc, planned=sc.planned.replace(max_num_seqs=16), hours=1.0)
    world = World(sc)
    world.roll_out(sc.planned, 0.0, strategy="surge")
    return world


def _run(world: World, start: float, until: float) -> float:
    t = start
    while t < until:
        world.step(t)
        t += DT
    return t


def _in_flight(world: World) -> int:
    engines = [p.engine for p in world.pods if p.engine is not None]
    return sum(e.num_running + e.num_waiting for e in engines) + len(world.handoff)


def test_surge_hands_the_old_pods_queue_to_the_new_pod_at_once() -> None:
    world = _queued_world()
    t = _run(world, 0.0, 400.0)
    old = world.pods[0]
    assert old.engine is not None and old.engine.num_waiting > 50
    world.roll_out(world.desired.replace(max_num_seqs=24), t, strategy="surge")
    while len(world.pods) > 1:  # until the new pod serves and the old one goes
        world.step(t)
        t += DT
    assert world.handoff == []
    new = world.pods[0]
    assert new is not old and new.engine is not None
    # the old queue is in the new pod's: far more waiting than one step's arrivals
    assert new.engine.num_waiting > 80 * DT
    # and served: the run goes on and the queue keeps moving, nothing is left in a hand-off
    _run(world, t, t + 600.0)
    assert world.handoff == []


def test_no_request_vanishes_across_rollouts() -> None:
    world = _queued_world()
    t = _run(world, 0.0, 400.0)
    for seqs in (24, 32):
        world.roll_out(world.desired.replace(max_num_seqs=seqs), t, strategy="surge")
        t = _run(world, t, t + 400.0)
    s = world.stats
    assert abs(s.arrived - (s.completed + s.dropped + _in_flight(world))) < 1.0


def test_a_handed_off_request_keeps_its_wait() -> None:
    """Recreate: no pod serves while the new one starts (150 s), longer than clients wait: the old pod's
    queue is handed to the new pod and dropped there as stale, not served as if it had just arrived."""
    world = _queued_world()
    t = _run(world, 0.0, 400.0)
    world.roll_out(world.desired.replace(max_num_seqs=24), t, strategy="recreate")
    assert len(world.handoff) > 50
    queued = len(world.handoff)
    dropped = world.stats.dropped
    while not any(p.state == "serving" for p in world.pods):
        world.step(t)
        t += DT
    assert world.stats.dropped - dropped >= queued  # the stale hand-off and the downtime's arrivals
    e = world.pods[0].engine
    assert e is not None
    assert all(e.now - r.arrived <= MAX_WAIT_S + DT for r in e.waiting if r.scheduled_at is None)
