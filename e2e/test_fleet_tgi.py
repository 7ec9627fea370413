"""The fleet's TGI pods against what kvpilot reads of them (the fleet itself never imports kvpilot).

* The exposition (:mod:`e2e.fleet.tgi_exposition`) serves every series kvpilot's seam names for TGI
  (:mod:`kvpilot.tuner.tgi.serving`), usage as the running batch's tokens over the warm-up's capacity.
* The memory accounting: the warm-up's KV tokens under ``--cuda-memory-fraction x 0.9``; the start fails
  where TGI fails, with TGI's texts, which kvpilot's seam classifies by their remedy.
* A CUDA OOM while serving is read as a run-time OOM.

No cluster: these run in a second.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from e2e.fleet import tgi_truth
from e2e.fleet.engine import SimEngine
from e2e.fleet.own_engines import TgiPlay, parse_own
from e2e.fleet.testing import H100_8B
from e2e.fleet.tgi_exposition import TgiMetrics
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import Workload
from e2e.pods import termination_message
from kvpilot.tuner import tgi
from kvpilot.tuner.engines import TgiEngine

PLAN = [
    *("text-generation-launcher", "--model-id", "meta-llama/Llama-3.1-8B-Instruct"),
    *("--hostname", "0.0.0.0", "--port", "80", "--max-input-tokens", "8191", "--max-total-tokens", "8192"),
    *("--max-batch-prefill-tokens", "59870", "--max-concurrent-requests", "128"),
]
"""What kvpilot renders for Llama-3.1-8B on an H100 at 8K (``kvpilot plan --engine tgi``)."""


def test_the_fleet_plays_tgis_launcher_with_the_flags_kvpilot_renders() -> None:
    own = parse_own(PLAN, {})
    assert isinstance(own, TgiPlay) and own.kind == "TGI"
    args = own.args
    assert (args.max_total_tokens, args.max_batch_prefill_tokens, args.port) == (8192, 59870, 80)
    rendered = tgi.parse_tgi_args(PLAN)  # kvpilot's reading of the same container
    assert (rendered.max_total_tokens, rendered.max_batch_prefill_tokens) == (8192, 59870)
    view = own.engine_view(H100_8B)
    assert (view.max_model_len, view.max_num_seqs, view.block_size) == (8192, 128, 1)


def test_the_warmup_leaves_the_kv_what_the_fraction_holds() -> None:
    args = TgiArgs.parse(PLAN)
    tokens = tgi_truth.kv_tokens(H100_8B, args)
    assert 350_000 < tokens < 420_000  # about kvpilot's own estimate for this plan (397 959)
    less = tgi_truth.kv_tokens(H100_8B, dataclasses.replace(args, cuda_memory_fraction=0.8))
    assert less < tokens - 0.2 * 0.9 * 79 * 2**30 / H100_8B.kv_bytes_per_token * 0.9
    assert tgi_truth.startup_error(H100_8B, args) is None


def test_start_up_fails_with_tgis_texts_and_kvpilot_reads_them_by_their_remedy() -> None:
    args = TgiArgs.parse(PLAN)
    engine = TgiEngine()
    truth = dataclasses.replace(H100_8B, tgi_prefill_oom_above_tokens=40_000)
    error = tgi_truth.startup_error(truth, args)
    assert error == tgi.prefill_tokens_error(59870)  # kvpilot's copy of TGI's text is the fleet's
    found = engine.classify_failure(termination_message(tgi_truth.startup_failure_log(error)))
    assert found is not None and found.kind == "start_oom", found
    assert tgi_truth.startup_error(truth, dataclasses.replace(args, max_batch_prefill_tokens=29935)) is None
    heavy = dataclasses.replace(H100_8B, tgi_weights_gib=70.0)
    error = tgi_truth.startup_error(heavy, args)
    assert error is not None and "prefill tokens" in error  # nothing left even for the prefill
    long = dataclasses.replace(args, max_total_tokens=1_000_000, max_input_tokens=999_999)
    error = tgi_truth.startup_error(H100_8B, long)
    assert error == tgi.max_total_tokens_error(1_000_000)
    found = engine.classify_failure(termination_message(tgi_truth.startup_failure_log(error)))
    assert found is not None and found.kind == "start_memory_short", found


def test_a_runtime_oom_above_the_threshold_and_kvpilot_reads_it_as_lower_the_fraction() -> None:
    args = TgiArgs.parse(PLAN)
    truth = dataclasses.replace(H100_8B, tgi_runtime_oom_above_cuda_memory_fraction=0.9)
    assert tgi_truth.runtime_oom(truth, args)
    assert not tgi_truth.runtime_oom(truth, dataclasses.replace(args, cuda_memory_fraction=0.9))
    log = "\n".join([tgi_truth.serving_log(truth, args), tgi_truth.cuda_oom_log(truth, args)])
    found = TgiEngine().classify_failure(termination_message(log))
    assert found is not None and found.kind == "runtime_oom" and found.memory_share_direction < 0, found


def test_the_exposition_serves_the_series_kvpilot_reads() -> None:
    args = TgiArgs.parse(PLAN)
    tokens = tgi_truth.kv_tokens(H100_8B, args)
    sim = SimEngine(
        H100_8B,
        Workload(arrival_rate=4.0, prompt_tokens=1500, output_tokens=500),
        tgi_truth.engine_view(H100_8B, args),
        num_gpu_blocks=tokens + 1,
    )
    metrics = TgiMetrics(H100_8B, args)
    for _ in range(20):
        sim.advance(1.0)
        metrics.record(
            running=sim.num_running, waiting=sim.num_waiting, kv_usage=sim.kv_usage, deltas=sim.drain()
        )
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    series = TgiEngine().metrics
    for name in (series.running, series.queued, series.kv_used_tokens, series.kv_capacity_tokens):
        assert name is not None and name in families, (name, sorted(families))
    for name in (series.ttft, series.itl):
        assert families[name].type == "histogram", name
    capacity = families[tgi.serving.BATCH_MAX_TOTAL_TOKENS].samples[0].value
    used = families[tgi.serving.BATCH_CURRENT_MAX_TOKENS].samples[0].value
    assert capacity == tokens and 0 < used <= capacity
    assert not any(n.endswith("_created") for n in families)
