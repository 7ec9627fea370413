"""The closed-loop bench for TGI (bench/loopsim/tgi.py, bench/scenarios/tgi-*.json).

Every TGI scenario loads, and its plan is what ``kvpilot plan --engine tgi`` renders for the inputs it states
(not hand-picked to pass); short kvpilot runs show the loop acting as TGI's failures and metrics say: the
warm-up's "Not enough memory to handle N prefill tokens" halves the prefill and the pod serves, a CUDA OOM
while serving lowers ``--cuda-memory-fraction``, ``--max-concurrent-requests`` binding with the router's
429s and spare KV tokens raises it, and a full pool holds the change while the old pod serves.
"""

from __future__ import annotations

import dataclasses
import io

import pytest

from bench.loopsim.controllers import compute_oracle, contexts, longest_request, run
from bench.loopsim.physics import TgiPhysics
from bench.loopsim.scenario import SCENARIO_DIR, BenchScenario, load_scenario, load_scenarios
from bench.loopsim.tgi import KvpilotTgi, oracle_grid
from kvpilot.cli.main import main as cli_main
from kvpilot.tuner import tgi

TGI = [sc for sc in load_scenarios() if sc.engine == "tgi"]


def _settings(settings: object) -> tgi.TgiSettings:
    assert isinstance(settings, tgi.TgiSettings)
    return settings


def test_there_are_tgi_scenarios_of_every_class() -> None:
    names = {sc.name for sc in TGI}
    assert {"tgi-admission", "tgi-kv-pressure", "tgi-startup-prefill", "tgi-runtime-oom"} <= names
    assert {"tgi-bad-new-settings", "tgi-slow-start"} <= names
    assert any(not sc.spare_gpu and not sc.allow_downtime for sc in TGI)
    assert any(not sc.spare_gpu and sc.allow_downtime for sc in TGI)
    assert any(not sc.weights_cached for sc in TGI)
    assert any(f.kind == "prometheus_down" for sc in TGI for f in sc.faults)
    assert any(sc.noise > 0 for sc in TGI)


def _cli_plan(sc: BenchScenario) -> list[str]:
    """The flags ``kvpilot plan --engine tgi`` prints for the scenario's stated inputs."""
    plan = sc.tgi_plan
    assert plan is not None
    argv = ["plan", "--engine", "tgi", "--model", plan.model, "--gpu", plan.gpu]
    argv += ["--max-context", str(plan.max_context)] if plan.max_context else []
    argv += ["--concurrency", str(plan.concurrency)] if plan.concurrency else []
    out = io.StringIO()
    assert cli_main(argv, out=out) == 0
    lines = out.getvalue().splitlines()
    return lines[lines.index("Args") + 1].split()


@pytest.mark.parametrize("sc", TGI, ids=lambda sc: sc.name)
def test_the_plan_is_kvpilot_plan_engine_tgi_for_the_inputs_it_states(sc: BenchScenario) -> None:
    plan = sc.tgi_plan
    assert plan is not None and sc.start == plan.settings
    assert tgi.build_tgi_args(plan.settings) == _cli_plan(sc)


def test_a_scenario_names_its_engine() -> None:
    assert load_scenario(SCENARIO_DIR / "overload.json").engine == "vllm"
    assert all(isinstance(sc.start, tgi.TgiSettings) for sc in TGI)


def test_the_router_refuses_beyond_the_admission_limit_and_refused_requests_are_lost() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-admission.json")
    assert TgiPhysics(sc.truth).admission_limit(sc.start) == 16
    r = run(sc, sc.start, closed_loop=False, hours=0.25)
    assert r.stats.refused > 0
    assert r.stats.completed + r.stats.refused <= r.stats.arrived + 1e-9


def test_the_warm_up_prefill_failure_halves_the_prefill_and_the_pod_serves() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-startup-prefill.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.25)
    assert isinstance(r.loop, KvpilotTgi)
    start, final = _settings(sc.start), _settings(r.final)
    assert start.max_batch_prefill_tokens is not None and final.max_batch_prefill_tokens is not None
    assert final.max_batch_prefill_tokens <= start.max_batch_prefill_tokens // 2
    assert "StartOOM" in r.loop.log[1]
    assert r.stats.rollouts == 1 and r.stats.rollbacks == 0 and r.stats.crashes == 1
    assert r.stats.completed > 0 and r.stats.failed_never_ran == 0
    # TGI's defaults fail the same way every start and never serve
    assert run(sc, tgi.TgiSettings(), closed_loop=False, hours=0.25).stats.completed == 0


def test_a_runtime_oom_lowers_the_fraction() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-runtime-oom.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.25)
    final = _settings(r.final)
    assert final.cuda_memory_fraction is not None and final.cuda_memory_fraction < 1.0
    assert r.stats.rollbacks == 0 and r.stats.completed > 0


def test_the_admission_limit_binding_with_spare_kv_raises_it() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-admission.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.5)
    assert isinstance(r.loop, KvpilotTgi)
    limit = _settings(r.final).max_concurrent_requests
    assert limit is not None and limit > 16
    assert any("IdleCapacity" in line for line in r.loop.log)
    static = run(sc, sc.start, closed_loop=False, hours=0.5)
    assert r.stats.refused < static.stats.refused and r.goodput > static.goodput


def test_without_a_spare_gpu_or_downtime_the_change_waits_and_the_old_pod_serves() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-no-spare-gpu.json")
    r = run(sc, sc.start, closed_loop=True, hours=0.5)
    assert r.stats.holds >= 1 and r.stats.downtime_s <= 300
    recreate = dataclasses.replace(sc, allow_downtime=True)
    again = run(recreate, sc.start, closed_loop=True, hours=0.5)
    assert again.stats.holds == 0 and again.stats.rollouts >= 1


def test_the_oracle_serves_the_longest_requests_and_searches_tgis_flags() -> None:
    sc = load_scenario(SCENARIO_DIR / "tgi-kv-pressure.json")
    lengths = contexts(sc)
    assert all(n is None or n >= longest_request(sc) for n in lengths)
    sizes, starts, build = oracle_grid(lengths)
    assert len(sizes) == 4 and all(all(0 <= v < n for v, n in zip(p, sizes, strict=True)) for p in starts)
    short = dataclasses.replace(load_scenario(SCENARIO_DIR / "tgi-startup-prefill.json"), hours=0.1)
    best = compute_oracle(short)
    assert isinstance(best.final, tgi.TgiSettings) and best.stats.crashes == 0 and best.goodput > 0
