"""The bench's ``reachable`` controller (bench/loopsim/controllers.py::compute_reachable): the plan until its
first evidence, then the oracle's settings; the most a closed loop can serve from the plan.

It is what tells a policy's loss from the plan's: on ``slow-start`` (a 21-minute start, planned at 9
sequences) even a loop that knew the answer at the first scrape serves 21 more minutes at 9 sequences.
"""

from __future__ import annotations

import dataclasses

from bench.loopsim.controllers import Run, compute_reachable, run
from bench.loopsim.scenario import SCENARIO_DIR, BenchScenario, load_scenario


def _slow_start(hours: float = 1.5) -> tuple[BenchScenario, Run]:
    sc = load_scenario(SCENARIO_DIR / "slow-start.json")
    sc = dataclasses.replace(sc, hours=hours)
    best = sc.planned.replace(max_num_seqs=29, gpu_memory_utilization=0.94, max_num_batched_tokens=2048)
    return sc, run(sc, best, closed_loop=False)


def test_a_plan_far_from_the_best_with_a_long_start_caps_what_any_loop_serves() -> None:
    sc, best = _slow_start()
    reachable = compute_reachable(sc, best)
    plan = run(sc, sc.planned, closed_loop=False)
    assert reachable.final == best.final  # it switched
    assert plan.goodput < reachable.goodput < best.goodput
    # the loss is the second start at the plan's settings: 21 of the 69 serving minutes at about 0.6 of
    # the best's rate, some 12 % of the best's goodput, not a few per cent
    assert 0.80 < reachable.goodput / best.goodput < 0.93


def test_a_plan_that_is_already_the_oracles_is_reachable_in_full() -> None:
    sc, _ = _slow_start()
    as_planned = run(sc, sc.planned, closed_loop=False)
    reachable = compute_reachable(sc, as_planned)
    assert reachable.goodput == as_planned.goodput
    assert reachable.final == sc.planned


def test_with_no_spare_gpu_and_no_downtime_allowed_the_plan_is_what_any_loop_serves() -> None:
    """A full pool with ``allowDowntime: false`` (``no-spare-gpu``, ``sglang-no-spare-gpu``): no surge pod
    finds a GPU and the serving pod may not be taken down, so no loop changes what serves: reachable is the
    plan's static run (it recreated the pod: 0.99 of the oracle where any loop gets the plan's 0.44). With
    ``allowDowntime`` the oracle's settings are recreated."""
    sc = dataclasses.replace(load_scenario(SCENARIO_DIR / "sglang-no-spare-gpu.json"), hours=1.0)
    best = run(
        sc,
        dataclasses.replace(sc.start, max_running_requests=211, mem_fraction_static=0.836),
        closed_loop=False,
    )
    plan = run(sc, sc.start, closed_loop=False)
    held = compute_reachable(sc, best)
    assert (held.final, held.goodput) == (sc.start, plan.goodput)
    recreated = compute_reachable(dataclasses.replace(sc, allow_downtime=True), best)
    # SGLang's steps (a prefill batch alone): 5,290 against the plan's 2,836 tok/s in this hour
    assert recreated.final == best.final and recreated.goodput > 1.5 * plan.goodput
