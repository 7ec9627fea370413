"""The bench's what-if schedules (bench/closed_loop_schedule.py): changes at given minutes over a scenario's
world, as a loop with a spare GPU would roll them out."""

from __future__ import annotations

import dataclasses

from bench.closed_loop_schedule import Change, parse_change, run_schedule
from bench.loopsim.controllers import run
from bench.loopsim.scenario import SCENARIO_DIR, load_scenario


def test_a_change_names_its_minute_and_the_fields_it_changes() -> None:
    assert parse_change("7.5:max_running_requests=64,mem_fraction_static=0.84,kv_cache_dtype=none") == Change(
        7.5, {"max_running_requests": 64, "mem_fraction_static": 0.84, "kv_cache_dtype": None}
    )


def test_no_change_is_the_plans_static_run_and_a_change_at_once_the_new_settings() -> None:
    sc = dataclasses.replace(load_scenario(SCENARIO_DIR / "sglang-bad-new-settings.json"), hours=0.25)
    stats, final, served = run_schedule(sc, [])
    assert final == sc.start and served is not None
    assert stats.output_tokens == run(sc, sc.start, closed_loop=False).stats.output_tokens
    # 64 -> 209 runs out of memory as soon as it serves (the scenario's truth: above 96 running requests)
    stats, final, _ = run_schedule(sc, [parse_change("0:max_running_requests=209")], from_serving=True)
    assert final == dataclasses.replace(sc.start, max_running_requests=209)
    assert stats.ooms >= 1
