"""The closed-loop bench for SGLang (bench/loopsim/sglang.py, bench/scenarios/sglang-*.json).

Every SGLang scenario loads, and its plan is what kvpilot's SGLang planner renders for the inputs it states
(not hand-picked to pass); short kvpilot runs of the start-up and run-time failure scenarios show the loop
moving ``--mem-fraction-static`` the way SGLang's failure says, and ending up serving with no repeat OOM.
"""

from __future__ import annotations

import dataclasses

import pytest

from bench.loopsim.controllers import run
from bench.loopsim.scenario import SCENARIO_DIR, BenchScenario, load_scenario, load_scenarios
from bench.loopsim.sglang import KvpilotSglang
from kvpilot.tuner import engines, gpus, sglang
from kvpilot.tuner.model import build_model_spec, lookup_checkpoint_bytes, lookup_model_config

SGLANG = [sc for sc in load_scenarios() if sc.engine == "sglang"]


def _fraction(settings: object) -> float:
    assert isinstance(settings, sglang.SglangSettings) and settings.mem_fraction_static is not None
    return settings.mem_fraction_static


def test_there_are_sglang_scenarios_of_every_class() -> None:
    names = {sc.name for sc in SGLANG}
    assert {"sglang-queue", "sglang-retractions", "sglang-startup-short", "sglang-runtime-oom"} <= names
    assert any(not sc.spare_gpu and not sc.allow_downtime for sc in SGLANG)
    assert any(not sc.spare_gpu and sc.allow_downtime for sc in SGLANG)
    assert any(not sc.weights_cached for sc in SGLANG)
    assert any(f.kind == "prometheus_down" for sc in SGLANG for f in sc.faults)
    assert any(sc.noise > 0 for sc in SGLANG)


@pytest.mark.parametrize("sc", SGLANG, ids=lambda sc: sc.name)
def test_the_plan_is_kvpilots_sglang_plan_for_the_inputs_it_states(sc: BenchScenario) -> None:
    plan = sc.sglang_plan
    assert plan is not None and sc.start == plan.settings
    spec = build_model_spec(lookup_model_config(plan.model))
    asked = sglang.SglangSettings(
        context_length=min(plan.max_context, spec.max_model_len) if plan.max_context else None,
        max_running_requests=plan.concurrency,
        tp_size=1,
    )
    budget = engines.plan_sglang_budget(
        spec, gpus.lookup_gpu(plan.gpu), asked, weights_total_bytes=lookup_checkpoint_bytes(plan.model)
    )
    assert budget.feasible and budget.rendered == plan.settings


def test_a_scenario_names_its_engine() -> None:
    assert load_scenario(SCENARIO_DIR / "overload.json").engine == "vllm"
    assert all(isinstance(sc.start, sglang.SglangSettings) for sc in SGLANG)


def test_start_up_with_no_kv_pool_raises_the_fraction_and_ends_serving() -> None:
    sc = load_scenario(SCENARIO_DIR / "sglang-startup-short.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.75)
    assert isinstance(r.loop, KvpilotSglang)
    assert _fraction(r.final) > _fraction(sc.start)
    assert r.stats.rollouts >= 1 and r.stats.rollbacks == 0 and r.stats.ooms == 0
    assert r.stats.completed > 0 and r.stats.failed_never_ran == 0
    # SGLang's "Raise --mem-fraction-static above X": the new flags are above it
    assert "StartMemoryShort" in r.loop.log[1]


def test_a_runtime_oom_lowers_the_fraction_with_no_repeat_oom() -> None:
    sc = load_scenario(SCENARIO_DIR / "sglang-runtime-oom.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.75)
    assert _fraction(r.final) < _fraction(sc.start)
    assert r.stats.ooms == 1 and r.stats.rollbacks == 0
    assert r.stats.completed > 0


def test_without_a_spare_gpu_or_downtime_the_change_waits_and_the_old_pod_serves() -> None:
    sc = load_scenario(SCENARIO_DIR / "sglang-no-spare-gpu.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.5)
    assert r.stats.holds >= 1 and r.stats.downtime_s <= 300
    recreate = dataclasses.replace(sc, allow_downtime=True)
    again = run(recreate, sc.start, closed_loop=True, hours=0.5)
    assert again.stats.holds == 0 and again.stats.rollouts >= 1
