"""The bench's simulated Deployment (bench/loopsim/world.py): no request vanishes in a rollout.

A surge rollout's old pod goes once the new one serves; the requests it had waiting go back to the load
balancer and the serving pod takes them at once, their wait carried over (clients still give up after
``MAX_WAIT_S`` in all). Before, they waited for a later pod's start, so a run with one rollout never served
them and one with more rollouts did.
"""

from __future__ import annotations

import dataclasses

from bench.loopsim.scenario import SCENARIO_DIR, load_scenario
from bench.loopsim.world import DT, MAX_WAIT_S, World, engine_args
from e2e.fleet.engine import SimEngine


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


def test_with_a_compile_cache_a_start_back_to_a_hash_that_ran_is_warm() -> None:
    """slow-start's checkpoint with the compile cache on its volume: the first start of a hash compiles;
    after a change of ``max_num_seqs`` (a new hash, cold) a change back loads the first hash's graphs, as
    does a change of ``gpu_memory_utilization`` alone (not hashed).
    Without the volume, every start is cold."""

    def start_seconds(compile_cache: bool) -> list[float]:
        sc = load_scenario(SCENARIO_DIR / "slow-start.json")
        sc = dataclasses.replace(sc, compile_cache=compile_cache, weights_cached=True)
        world = World(sc)
        t, took = 0.0, []
        for settings in (
            sc.planned,
            sc.planned.replace(max_num_seqs=12),
            sc.planned,
            sc.planned.replace(gpu_memory_utilization=0.90),
        ):
            world.roll_out(settings, t, strategy="surge")
            new = next(p for p in world.pods if p.settings == settings)
            while new.ready_at is None:
                world.step(t)
                t += DT
            assert new.started_at is not None
            took.append(new.ready_at - new.started_at)
        return took

    startup = load_scenario(SCENARIO_DIR / "slow-start.json").truth.startup
    spared = startup.compile_s - startup.warm_compile_s
    cold = start_seconds(False)
    assert len(set(cold)) == 1
    warm = start_seconds(True)
    assert warm[:2] == cold[:2]
    assert [round(c - w) for c, w in zip(cold[2:], warm[2:], strict=True)] == [round(spared)] * 2


def test_a_handed_off_queue_leaks_no_kv_blocks_in_the_new_pod() -> None:
    """The old pod's waiting requests carry its ids, which the new pod's own arrivals reuse: taken over
    under new ids, the new pod's running set and block count stay exact. (Kept under the old ids, two
    requests shared one slot of the running set, their blocks were never freed, and the pod stalled with
    nothing running and its KV cache "full": long-output-bursts with a checkpoint served 23 %.)"""
    sc = load_scenario(SCENARIO_DIR / "overload.json")
    args = engine_args(sc.planned.replace(max_num_seqs=16))
    old = SimEngine(sc.truth, sc.workload_at(0.0), args, seed=1)
    old.advance(300.0)
    handed = list(old.waiting)
    assert len(handed) > 100
    new = SimEngine(sc.truth, sc.workload_at(0.0), args, seed=2)
    new.advance(300.0)
    assert {r.id for r in new.running} & {r.id for r in handed}  # the ids do collide
    new.take_over(handed)
    for _ in range(300):
        new.advance(1.0)
        queued = [*new.running, *new.waiting]
        assert len({r.id for r in queued}) == len(queued)
        assert sum(new._residues) == len(new.decoding)
        exact = sum(new._blocks_for(r.key + new.counter) for r in new.decoding.values())
        assert new.decode_blocks == exact
    assert new.total_finished > 1000  # it keeps serving: no stall
