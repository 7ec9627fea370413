"""The fleet's SGLang pods against SGLang 0.5.23's own source, and against what kvpilot reads of them.

* The exposition (:mod:`e2e.fleet.sglang_exposition`) declares what ``observability/metrics_collector.py``
  declares: names, types, label names, buckets (AST of the installed wheel, no import).
* The texts and the lines :mod:`e2e.fleet.sglang_truth` cites are SGLang's.
* The memory accounting: ``pre x fraction - weights`` per rank, tokens per cell, SGLang's default
  running requests; start-up failures where SGLang fails; a pool full of long requests retracts.
* kvpilot's seam classifies what the fleet's pods print (the fleet itself never imports kvpilot).

Never skipped: without ``.venv-sglang`` (``make sglang-venv``) the source checks fail, naming it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import random
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.fleet import sglang_exposition, sglang_truth
from e2e.fleet.engine import Request, SimEngine
from e2e.fleet.sglang_exposition import SglangMetrics
from e2e.fleet.sglang_truth import SglangArgs
from e2e.fleet.testing import H100_8B
from e2e.fleet.truth import EngineArgs, GiB, Workload
from e2e.pods import termination_message
from kvpilot.tuner.engines import SglangEngine
from kvpilot.tuner.sglang import serving

ROOT = Path(__file__).resolve().parents[1]
PLAN = [
    *("python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"),
    *("--host", "0.0.0.0", "--port", "30000", "--context-length", "8192", "--mem-fraction-static", "0.835"),
    *("--chunked-prefill-size", "8192", "--tp-size", "1", "--enable-metrics"),
]
"""What kvpilot renders for Llama-3.1-8B on an H100 at 8K (``kvpilot plan --engine sglang``)."""


def sglang_dir() -> Path:
    found = sorted((ROOT / ".venv-sglang" / "lib").glob("python3*/site-packages/sglang/srt"))
    assert found, (
        f"SGLang 0.5.23's source is missing: run `make sglang-venv` (looked under {ROOT}/.venv-sglang)"
    )
    return found[0]


def source(rel: str) -> str:
    return (sglang_dir() / rel).read_text()


def _with(**changes: object) -> SglangArgs:
    return dataclasses.replace(SglangArgs.parse(PLAN), **changes)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- SGLang's source


def _declared() -> dict[str, tuple[str, str, tuple[float, ...] | None]]:
    """{name: (kind, collector class, buckets)} of every metric ``metrics_collector.py`` declares by name."""
    out: dict[str, tuple[str, str, tuple[float, ...] | None]] = {}
    tree = ast.parse(source("observability/metrics_collector.py"))
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in ("Gauge", "Counter", "Histogram"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = kw.get("name")
            if not isinstance(name, ast.Constant):
                continue
            buckets = kw.get("buckets")
            values = None
            if isinstance(buckets, ast.List | ast.Tuple):
                values = tuple(float(ast.literal_eval(e)) for e in buckets.elts)
            out[str(name.value)] = (node.func.id.lower(), cls.name, values)
    return out


def _gauges_of_mode_all() -> set[str]:
    """Gauges ``metrics_collector.py`` declares without a ``multiprocess_mode`` (prometheus_client's ``all``:
    a ``pid`` label per writing process)."""
    out = set()
    for node in ast.walk(ast.parse(source("observability/metrics_collector.py"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Gauge":
            kw = {k.arg: k.value for k in node.keywords}
            name = kw.get("name")
            if isinstance(name, ast.Constant) and "multiprocess_mode" not in kw:
                out.add(str(name.value))
    return out


def _exported() -> dict[str, tuple[str, set[str]]]:
    m = SglangMetrics(H100_8B, SglangArgs.parse(PLAN))
    text = m.render().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        labels = set().union(*(set(s.labels) - {"le"} for s in fam.samples)) if fam.samples else set()
        out[fam.name] = (fam.type, labels)
    return out


def test_exposition_matches_sglangs_metrics_collector() -> None:
    declared = _declared()
    exported = _exported()
    ours = {n: f for n, f in exported.items() if n.startswith("sglang:")}
    assert set(ours) >= {
        serving.TOKEN_USAGE,
        serving.NUM_RUNNING,
        serving.NUM_QUEUED,
        serving.MAX_TOTAL_NUM_TOKENS,
        "sglang:num_retracted_requests",  # the parser strips a counter's _total
        serving.TTFT,
        serving.ITL,
        serving.E2E_LATENCY,
        serving.QUEUE_TIME,
        serving.PROMPT_TOKENS_HISTOGRAM,
    }
    for name, (kind, labels) in ours.items():
        declared_name = name + "_total" if kind == "counter" else name
        assert declared_name in declared, f"{declared_name} is not declared in SGLang 0.5.23"
        dkind, cls, _ = declared[declared_name]
        assert kind == dkind, (name, kind, dkind)
        base = set(
            sglang_exposition.SCHEDULER_LABELS
            if cls == "SchedulerMetricsCollector"
            else sglang_exposition.TOKENIZER_LABELS
        )
        assert base <= labels <= base | {"is_streaming", "pid"}, (name, cls, labels)
        assert ("pid" in labels) == (name in _gauges_of_mode_all()), (name, labels)
    for name, buckets in (
        ("sglang:queue_time_seconds", sglang_exposition.QUEUE_TIME_BUCKETS),
        ("sglang:time_to_first_token_seconds", sglang_exposition.TIME_TO_FIRST_TOKEN_BUCKETS),
        ("sglang:inter_token_latency_seconds", sglang_exposition.INTER_TOKEN_LATENCY_BUCKETS),
        ("sglang:e2e_request_latency_seconds", sglang_exposition.E2E_REQUEST_LATENCY_BUCKETS),
    ):
        if declared[name][2] is not None:
            assert tuple(map(float, buckets)) == declared[name][2], name
    collector = source("observability/metrics_collector.py")
    for default in ("bucket_time_to_first_token", "bucket_e2e_request_latency", "bucket_inter_token_latency"):
        block = collector.split(f"if {default} is None:", 1)[1].split("]", 1)[0]
        values = tuple(float(v) for v in re.findall(r"[0-9.]+", block.split("[", 1)[1]))
        ours_buckets = {
            "bucket_time_to_first_token": sglang_exposition.TIME_TO_FIRST_TOKEN_BUCKETS,
            "bucket_e2e_request_latency": sglang_exposition.E2E_REQUEST_LATENCY_BUCKETS,
            "bucket_inter_token_latency": sglang_exposition.INTER_TOKEN_LATENCY_BUCKETS,
        }[default]
        assert tuple(map(float, ours_buckets)) == values, default
    # the prompt-length histogram's buckets: a local list passed through generate_buckets (sorted, unique)
    block = collector.split("default_bucket_prompt_tokens = [", 1)[1].split("]", 1)[0]
    prompt_buckets = sorted({float(v) for v in re.findall(r"[0-9.]+", block)})
    assert tuple(map(float, sglang_exposition.PROMPT_TOKENS_BUCKETS)) == tuple(prompt_buckets)
    # the scheduler's labels and engine_type, as SGLang builds them
    assert '"engine_type": engine_type' in collector and 'return "unified"' in source(
        "disaggregation/utils.py"
    )
    for label in sglang_exposition.SCHEDULER_LABELS:
        assert f'"{label}":' in collector, label
    assert "_created" not in SglangMetrics(H100_8B, SglangArgs.parse(PLAN)).render().decode()


def test_texts_and_cited_lines_are_sglangs() -> None:
    lines = {
        "model_executor/pool_configurator.py": {
            96: "Not enough memory. Please try to increase --mem-fraction-static.",
            98: "Current value: mem_fraction_static=",
            642: "available_bytes // self._cell_size",
        },
        "mem_cache/kv_cache_configurator.py": {
            3007: "pre_model_load_memory * (1 - get_schedule().mem_fraction_static)",
            3038: "rest_memory = available_gpu_memory - slack_gb",
            3045: "1 - available_gpu_memory / pre_model_load_memory",
            3051: "Loaded weights leave no GPU memory for the KV cache under",
            3123: "int(token_capacity / self.model_config.context_len * 512)",
            3124: "max(min(estimated, 4096), 2048)",
            3129: "min(requested_per_worker, token_capacity // 2)",
        },
        "managers/scheduler.py": {
            2698: "else 1 << 30",
            2714: "self.max_req_len - input_len - 1,",
            4162: "self.new_token_ratio_tracker.current,",
            4282: "running_batch.batch_is_full = len(adder.can_run_list) > 0 or (",
            4513: "self.new_token_ratio_tracker.current = new_token_ratio",
            4542: "self.new_token_ratio_tracker.decay_step()",
            5318: "self.new_token_ratio_tracker.reset()",
            1377: "self.chunked_prefill_size is not None and get_schedule().enable_mixed_chunk",
            2048: "result = self.run_batch(batch)",
            3993: "# Run prefill first if possible",
            3994: "ret = new_batch",
            3998: "decode_batch = self.update_running_batch(running_batch)",
            4099: "running_batch.batch_is_full or len(self.waiting_queue) == 0",
            4100: ") and self.chunked_req is None:",
            4165: "running_bs if self.is_mixed_chunk else 0,",
            4184: "self.chunked_req = adder.add_chunked_req(self.chunked_req)",
            4395: "new_batch.mix_with_running(running_batch)",
            4526: "KV cache pool is full. Retract requests. ",
            4870: "batch_result = self.model_worker.forward_batch_generation(",
            4530: "#retracted_reqs: {len(retracted_reqs)}, #new_tokens_gained: {new_token_gained}",
            6362: "scheduler = Scheduler(server_args, port_args)",
            6368: "scheduler.run_event_loop()",
            6372: "Scheduler hit an exception: {traceback}",
        },
        "entrypoints/engine.py": {
            1978: "Received sigquit from a child process. It usually means the child failed."
        },
        "managers/tp_worker.py": {
            422: "self.model_config.context_len - 1",
            675: "out = self.model_runner.forward(",
        },
        "models/llama.py": {625: "return self.logits_processor("},
        "layers/logits_processor.py": {
            634: "logits = self._get_logits(pruned_states, lm_head, logits_metadata)",
            999: "logits = self._compute_lm_head(",
        },
        "managers/schedule_policy.py": {
            90: 'os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4096")',
            638: "self.rem_input_tokens = rem_input_tokens - num_mixed_decode_tokens",
            655: "self.rem_chunk_tokens -= num_mixed_decode_tokens",
            787: "ratio = 1.0 if req.sampling_params.ignore_eos else self.new_token_ratio",
            790: "(req.sampling_params.max_new_tokens - len(req.output_ids)),",
            1407: "max_new = min(",
            1411: "cand_extend_input_len = len(req.full_untruncated_fill_ids) - req.prefix_len",
            1412: "total_tokens = cand_extend_input_len + max_new + self.per_req_token_overhead",
        },
        "mem_cache/prefill_budget.py": {
            101: "return self._available_and_evictable() - self.total_offset",
            128: "if total_tokens < self.remaining_total",
            167: "self.total_offset += immediate + max_new_tokens",
        },
        "environ.py": {
            646: "SGLANG_INIT_NEW_TOKEN_RATIO = EnvFloat(0.7)",
            647: "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = EnvFloat(0.14)",
            648: "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = EnvInt(600)",
            649: "SGLANG_RETRACT_DECODE_STEPS = EnvInt(20)",
        },
        "managers/scheduler_components/new_token_ratio_tracker.py": {
            31: "decay = (init - min_ratio) / envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.get()",
            35: "self.current = max(self.current - self.decay, self.min)",
            46: "total_decoded_tokens + envs.SGLANG_RETRACT_DECODE_STEPS.get() * len(reqs)",
            47: ") / (total_max_new_tokens + 1)",
        },
        "arg_groups/fields/schedule.py": {208: "enable_mixed_chunk: A[", 211: "] = False"},
        "model_executor/model_runner.py": {
            982: "self.kv_cache_configurator.configure(",
            1373: "Load weight end. ",
            1860: "output = self._forward_raw(",
        },
        "utils/common.py": {2848: "multiprocess.MultiProcessCollector(registry)"},
        "managers/scheduler_components/metrics_reporter.py": {
            754: "Prefill batch{iter_msg}, ",
            759: "#running-req: {prefill_stats.num_running_reqs.total}, ",
            963: 'msg = f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"',
            1041: "gen throughput (token/s): {self.last_gen_throughput:.2f}, ",
        },
        "managers/scheduler_components/pool_stats_observer.py": {
            147: "#token: {self.full_num_used}, token usage: {self.full_token_usage:.2f}"
        },
        "arg_groups/fields/observability.py": {136: "decode_log_interval: A[", 139: "] = 40"},
    }
    for rel, want in lines.items():
        text = source(rel).splitlines()
        for n, fragment in want.items():
            assert fragment in text[n - 1], f"{rel}:{n} is {text[n - 1]!r}, not {fragment!r}"


# ----------------------------------------------------------------------------- memory


def test_the_pool_is_the_share_of_free_memory_less_the_weights() -> None:
    truth, args = H100_8B, SglangArgs.parse(PLAN)
    assert sglang_truth.is_sglang(PLAN) and not sglang_truth.is_sglang(["vllm", "serve", "m"])
    assert (args.context_length, args.mem_fraction_static, args.chunked_prefill_size) == (8192, 0.835, 8192)
    pool = (79.11 - 0.5) * 0.835 - 14.99
    assert sglang_truth.rest_memory_gib(truth, args) == pytest.approx(pool)
    tokens = sglang_truth.max_total_num_tokens(truth, args)
    assert tokens == int(pool * GiB) // 131072  # about kvpilot's plan: 415,408 tokens
    assert abs(tokens - 415408) / 415408 < 0.01
    # SGLang's default running requests: 512 per context's worth of tokens, within [2048, 4096]
    assert sglang_truth.max_running_requests(truth, args) == 4096
    assert sglang_truth.max_running_requests(truth, _with(max_running_requests=48)) == 48
    fp8 = _with(kv_cache_dtype="fp8_e4m3")
    assert sglang_truth.max_total_num_tokens(truth, fp8) == int(pool * GiB) // 65536
    paged = _with(page_size=64)
    assert sglang_truth.max_total_num_tokens(truth, paged) % 64 == 0
    assert sglang_truth.max_total_num_tokens(truth, _with(max_total_tokens=1000)) == 1000
    view = sglang_truth.engine_view(truth, args)
    assert (view.max_model_len, view.max_num_seqs, view.max_num_batched_tokens, view.block_size) == (
        8192,
        4096,
        8192,
        1,
    )
    # a pool shorter than the context shortens requests (tp_worker.py), it does not stop the start
    short = dataclasses.replace(truth, sglang_weights_gib=65.0)
    assert 0 < sglang_truth.max_total_num_tokens(short, args) < 8192
    assert sglang_truth.startup_error(short, args) is None
    assert sglang_truth.engine_view(short, args).max_model_len == sglang_truth.max_total_num_tokens(
        short, args
    )


def test_start_up_fails_with_sglangs_texts_and_kvpilot_reads_them_as_memory_short() -> None:
    truth = H100_8B
    low = _with(mem_fraction_static=0.15)
    error = sglang_truth.startup_error(truth, low)
    assert error is not None and error.startswith("ValueError: Loaded weights leave no GPU memory")
    minimum = 1 - (79.11 - 0.5 - 14.99) / (79.11 - 0.5)
    assert f"minimum viable = 1 - available/pre = {minimum:.4f}" in error
    # a share that leaves less than one token's cell: MemoryPoolConfig's text
    tiny = dataclasses.replace(truth, sglang_weights_gib=(79.11 - 0.5) * 0.835 - 64 * 131072 / GiB)
    paged = _with(page_size=128)
    error2 = sglang_truth.startup_error(tiny, paged)
    assert error2 == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.835"
    )
    engine = SglangEngine()
    for e, args in ((error, low), (error2, paged)):
        log = sglang_truth.startup_failure_log(tiny if e is error2 else truth, args, e)
        found = engine.classify_failure(termination_message(log))
        assert (
            found is not None and found.kind == "start_memory_short" and found.memory_share_direction > 0
        ), found


def test_a_runtime_oom_above_the_threshold_and_kvpilot_reads_it_as_lower_the_fraction() -> None:
    truth = dataclasses.replace(H100_8B, runtime_oom_above_mem_fraction_static=0.815)
    assert sglang_truth.runtime_oom(truth, SglangArgs.parse(PLAN))
    assert not sglang_truth.runtime_oom(truth, _with(mem_fraction_static=0.8))
    assert not sglang_truth.runtime_oom(H100_8B, SglangArgs.parse(PLAN))
    batch = dataclasses.replace(H100_8B, runtime_oom_above_max_num_seqs=4)
    assert sglang_truth.runtime_oom(batch, _with(max_running_requests=5))
    assert not sglang_truth.runtime_oom(batch, _with(max_running_requests=4))
    assert sglang_truth.runtime_oom(batch, SglangArgs.parse(PLAN))  # SGLang's default: 4096
    assert sglang_truth.runtime_oom(batch, _with(max_running_requests=200), running=5)  # the batch's own size
    assert not sglang_truth.runtime_oom(batch, _with(max_running_requests=200), running=4)
    text = sglang_truth.cuda_oom_message(truth, SglangArgs.parse(PLAN))
    log = "\n".join([sglang_truth.serving_log(truth, SglangArgs.parse(PLAN)), text])
    found = SglangEngine().classify_failure(termination_message(log))
    assert found is not None and found.kind == "runtime_oom" and found.memory_share_direction < 0, found
    # a batch-driven OOM: the scheduler's last batch line shows at most the threshold, and kvpilot reads it
    oom = sglang_truth.cuda_oom_message(batch, _with(max_running_requests=200), running=150, token_usage=0.4)
    batch_oom = SglangEngine().classify_failure(oom)
    assert batch_oom is not None and batch_oom.kind == "runtime_oom" and batch_oom.running == 4
    # kubelet's 2 KiB of it: SGLang's traceback pushes the batch line out; kvpilot reads the previous log then
    cut = SglangEngine().classify_failure(termination_message(oom))
    assert cut is not None and cut.running is None and cut.more_in_log
    fraction_oom = sglang_truth.cuda_oom_message(truth, SglangArgs.parse(PLAN), running=150)
    assert SglangEngine().classify_failure(fraction_oom).running == 150  # type: ignore[union-attr]
    # the retraction warning kvpilot reads as pressure in a restart's log
    warning = sglang_truth.retraction_warning(3, 1200, 0.7, 1.0)
    pressure = SglangEngine().classify_failure(warning)
    assert pressure is not None and pressure.kind == "kv_pressure"


def test_the_engine_model_composes_steps_as_sglangs_scheduler() -> None:
    """The view runs SGLang's step composition (:func:`sglang_truth.scheduler`, the lines cited above):
    without ``--enable-mixed-chunk`` a prefill batch runs alone, with it the decodes join it."""
    argv = [*PLAN, "--chunked-prefill-size", "2048"]
    plain = sglang_truth.engine_view(H100_8B, SglangArgs.parse(argv))
    mixed = sglang_truth.engine_view(H100_8B, SglangArgs.parse([*argv, "--enable-mixed-chunk"]))
    assert (plain.scheduler, mixed.scheduler) == ("sglang", "sglang-mixed")
    tokens = sglang_truth.max_total_num_tokens(H100_8B, SglangArgs.parse(argv))
    generated = {}
    for view in (plain, mixed):
        sim = SimEngine(H100_8B, Workload(arrival_rate=0), view, num_gpu_blocks=tokens + 1, resolution_s=0.0)
        for _ in range(8):
            sim.submit(250, 100)
        sim.step()  # the eight prompts in one prefill batch
        sim.drain()
        sim.submit(6000, 10)  # three chunks of 2048 (mixed: of 2040 beside the 8 decodes)
        for _ in range(3):
            sim.step()
        generated[view.scheduler] = sim.drain().generation_tokens
    assert generated == {"sglang": 1, "sglang-mixed": 3 * 8 + 1}


def test_a_full_pool_retracts_and_the_counter_shows_it() -> None:
    """Long requests at a high rate into a ~24K-token pool: the engine model retracts (its preemptions), and
    the exposition counts them in ``sglang:num_retracted_requests_total`` with the token usage near 1."""
    weights = (79.11 - 0.5) * 0.835 - 24576 * 131072 / GiB
    truth = dataclasses.replace(H100_8B, sglang_weights_gib=weights)
    args = SglangArgs.parse(PLAN)
    tokens = sglang_truth.max_total_num_tokens(truth, args)
    assert 24000 <= tokens <= 24576
    sim = SimEngine(
        truth,
        Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500),
        sglang_truth.engine_view(truth, args),
        num_gpu_blocks=tokens + 1,
    )
    metrics = SglangMetrics(truth, args)
    usage = []
    for _ in range(60):
        sim.advance(1.0)
        metrics.record(
            running=sim.num_running, waiting=sim.num_waiting, kv_usage=sim.kv_usage, deltas=sim.drain()
        )
        usage.append(sim.kv_usage)
    assert sim.total_preemptions > 0
    assert sim.used_blocks <= tokens
    assert max(usage) >= 0.95
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    retracted = fams["sglang:num_retracted_requests"].samples[0].value
    assert retracted == sim.total_preemptions
    assert fams["sglang:max_total_num_tokens"].samples[0].value == tokens


def _admission_state(rng: random.Random) -> SimEngine:
    """An engine in SGLang's mode on a constructed state: decoding requests part way through their outputs
    (some past SGLang's 4,096-token clip), perhaps a prompt mid-chunk, a queue (some retracted before, with
    tokens generated), a free pool from nearly none to ample, and a ``new_token_ratio`` anywhere in its
    range."""
    chunk = rng.choice([512, 2048, 8192])
    args = EngineArgs(
        model="m", max_model_len=1 << 20, max_num_seqs=4096, max_num_batched_tokens=chunk, block_size=1
    )
    free = rng.choice([0, rng.randrange(1, 3000), rng.randrange(3000, 60000)])
    decoding = []
    for _ in range(rng.choice([rng.randrange(0, 6), rng.randrange(6, 40)])):
        out = rng.choice([rng.randrange(20, 1500), rng.randrange(4000, 9000)])
        req = Request(id=0, prompt=rng.randrange(10, 3000), output=out, arrived=0.0)
        req.generated = rng.randrange(1, out)
        req.computed = req.prompt + req.generated - 1
        decoding.append(req)
    chunked = None
    if rng.random() < 0.4:
        chunked = Request(
            id=0, prompt=rng.randrange(chunk + 1, 4 * chunk), output=rng.randrange(5, 5000), arrived=0.0
        )
        chunked.computed = chunked.blocks = rng.randrange(1, chunked.prompt // chunk + 1) * chunk // 2
        free = max(free, chunk)  # its next chunk fits the pool (SGLang would evict or fail otherwise)
    used = sum(r.computed for r in decoding) + (chunked.computed if chunked else 0)
    e = SimEngine(
        H100_8B,
        Workload(arrival_rate=0),
        dataclasses.replace(args, scheduler="sglang"),
        num_gpu_blocks=used + free + 1,
    )
    for i, req in enumerate(decoding):
        req.id = i
        e._start_decoding(req)
    if chunked is not None:
        chunked.id = len(decoding)
        e.prefilling.append(chunked)
        e.prefill_blocks += chunked.blocks
    for _ in range(rng.randrange(0, 10)):
        e.submit(rng.choice([rng.randrange(5, 600), rng.randrange(600, 20000)]), rng.randrange(1, 2000))
        if rng.random() < 0.2:  # retracted once: its generated tokens are prefilled again
            e.waiting[-1].generated = rng.randrange(0, e.waiting[-1].output)
    e.new_token_ratio = rng.choice([e.ratio_init, e.ratio_min, rng.uniform(e.ratio_min, 1.0)])
    return e


def _prefill_adder_state(e: SimEngine) -> dict:
    """The same state as ``e2e/sglang_prefill_adder.py`` reads it: SGLang's requests as the model sees them
    (``max_new_tokens`` the model's, :meth:`SimEngine._max_new`)."""
    return {
        "page_size": e.block_size,
        "free": e._free_blocks() * e.block_size,
        "ratio": e.new_token_ratio,
        "chunk": e.max_num_batched_tokens,
        "running": [[e._max_new(r), e._generated(r)] for r in e.decoding.values()],
        "chunked": [[r.prefill_target, r.computed, e._max_new(r)] for r in e.prefilling][0]
        if e.prefilling
        else None,
        "waiting": [[r.prefill_target, e._max_new(r), r.generated] for r in e.waiting],
    }


def test_admission_is_sglangs_prefill_adder() -> None:
    """The engine model's SGLang admission (:meth:`SimEngine._schedule_prefill_sglang`) against SGLang
    0.5.23's own ``PrefillAdder`` (``managers/schedule_policy.py``, run by SGLang's interpreter in
    ``e2e/sglang_prefill_adder.py``) on the same 150 constructed states: the chunk of the request mid-prefill
    and the requests admitted, with their chunks, are the same."""
    rng = random.Random(7)
    engines = [_admission_state(rng) for _ in range(150)]
    states = [_prefill_adder_state(e) for e in engines]
    python = ROOT / ".venv-sglang" / "bin" / "python"
    proc = subprocess.run(
        [str(python), str(ROOT / "e2e" / "sglang_prefill_adder.py")],
        input=json.dumps(states),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    theirs = json.loads(proc.stdout)
    outcomes = set()
    for e, state, adder in zip(engines, states, theirs, strict=True):
        assert e._running_reserve() == sum(min(m - g, 4096) for m, g in state["running"])  # the aggregate
        work = e._schedule_prefill_sglang(e.max_num_batched_tokens, 0)
        ours = {
            "chunked": work[0][1] if state["chunked"] is not None and work else None,
            "admitted": [
                [t, t < r.prefill_target] for r, t in work[1 if state["chunked"] is not None else 0 :]
            ],
        }
        assert ours == {k: adder[k] for k in ("chunked", "admitted")}, (state, adder)
        outcomes.add((len(adder["admitted"]) > 0, adder["result"]))
    # the states reach every way a pass ends: out of room before or after an admission, out of chunk
    assert {(False, "NO_TOKEN"), (True, "NO_TOKEN"), (True, "OTHER")} <= outcomes, outcomes


def test_admission_reserves_decode_room_so_fewer_are_admitted_and_fewer_retracted() -> None:
    """A pool that fills (long outputs at a high rate into a ~24K-token pool, as above): with SGLang's
    admission (each running request's remaining ``max_new_tokens`` x ``new_token_ratio`` kept free) the
    engine model runs fewer requests at once and retracts far fewer than with vLLM's (only the prompt need
    fit), and the ratio climbs from its floor after retractions."""
    weights = (79.11 - 0.5) * 0.835 - 24576 * 131072 / GiB
    truth = dataclasses.replace(H100_8B, sglang_weights_gib=weights)
    args = SglangArgs.parse(PLAN)
    tokens = sglang_truth.max_total_num_tokens(truth, args)
    runs = {}
    for sglang in (True, False):
        sim = SimEngine(
            truth,
            Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500),
            sglang_truth.engine_view(truth, args),
            num_gpu_blocks=tokens + 1,
        )
        sim.sglang = sglang
        running, ratios = [], set()
        for _ in range(120):
            sim.advance(1.0)
            running.append(sim.num_running)
            ratios.add(round(sim.new_token_ratio, 3))
        runs[sglang] = (sim.total_preemptions, max(running), sim.total_finished, ratios)
    (retracted, most, finished, ratios), (retracted_v, most_v, finished_v, _) = runs[True], runs[False]
    assert retracted < retracted_v / 2, runs
    assert most < most_v, runs
    assert finished >= 0.9 * finished_v, runs
    assert len(ratios) > 3


def test_long_prompts_show_in_the_prompt_histogram_kvpilot_reads() -> None:
    """``sglang:prompt_tokens_histogram`` observes each finished request's prompt beside the counters SGLang
    increments in the same call (``observe_one_finished_request``): its ``_sum`` over its ``_count`` is the
    workload's mean prompt, the series kvpilot's seam names for the latency rule's long-prompt test."""
    args = SglangArgs.parse(PLAN)
    sim = SimEngine(
        H100_8B,
        Workload(arrival_rate=2.0, prompt_tokens=4000, output_tokens=32),
        sglang_truth.engine_view(H100_8B, args),
        num_gpu_blocks=sglang_truth.max_total_num_tokens(H100_8B, args) + 1,
    )
    metrics = SglangMetrics(H100_8B, args)
    for _ in range(30):
        sim.advance(1.0)
        metrics.record(
            running=sim.num_running, waiting=sim.num_waiting, kv_usage=sim.kv_usage, deltas=sim.drain()
        )
    samples = {
        s.name: s.value
        for fam in text_string_to_metric_families(metrics.render().decode())
        for s in fam.samples
        if "le" not in s.labels
    }
    name = SglangEngine().metrics.prompt_tokens
    assert name == serving.PROMPT_TOKENS_HISTOGRAM
    count, total = samples[f"{name}_count"], samples[f"{name}_sum"]
    assert count >= 20 and count == samples["sglang:num_requests_total"]
    assert total == samples["sglang:prompt_tokens_total"]
    assert 3000 <= total / count <= 5000  # 4000 +- 25 %
