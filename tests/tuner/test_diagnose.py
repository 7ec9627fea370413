"""``kvpilot diagnose``: real vLLM logs, and lines in the formats of vLLM's code, read into findings.

Real logs: every ``*.log`` under ``tests/data/vllm_logs/`` (a new capture needs no new code: it must
read without error, name the release and give at least one start-up or finding); the cases below say
what the ones captured for this module show (``tests/data/vllm_logs/diagnose_captures.md`` has how each
was made). GPU-only lines (``Model loading took``, ``Available KV cache memory``, ``Graph capturing
finished``, CUDA OOM) are built from the format strings the vLLM reference lists (§1.5) and from
:mod:`kvpilot.tuner.vllm.messages`' formatters, so that the texts the reader parses are vLLM's own.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kvpilot import cli
from kvpilot.tuner import diagnose
from kvpilot.tuner.vllm import messages

LOGS = Path(__file__).resolve().parents[1] / "data" / "vllm_logs"
REAL = sorted(LOGS.rglob("*.log"))

# Formats of vllm 0.33's gpu_model_runner.py / gpu_worker.py / kv_cache_utils.py / loggers.py (§1.5)
W = "(Worker pid=7) INFO 12-05 10:00:0{} [gpu_model_runner.py:4879] "
GPU_START = "\n".join(
    [
        "(EngineCore pid=5) INFO 12-05 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.33.0) with "
        "config: model='meta-llama/Llama-3.1-8B-Instruct', tokenizer='meta-llama/Llama-3.1-8B-Instruct', "
        "max_seq_len=131072, tensor_parallel_size=1, pipeline_parallel_size=1",
        W.format(1) + "Model loading took 14.99 GiB memory and 31.657031 seconds",
        W.format(2) + "torch.compile took 18.21 s in total",
        W.format(3) + "Available KV cache memory: 52.31 GiB",
        "(EngineCore pid=5) INFO 12-05 10:00:04 [kv_cache_utils.py:2327] GPU KV cache size: 428,512 tokens, "
        "Maximum concurrency for 131,072 tokens per request: 3.27x",
        W.format(5) + "Graph capturing finished in 9 secs, took 0.47 GiB",
        "(EngineCore pid=5) INFO 12-05 10:00:06 [core.py:250] init engine (profile, create kv cache, warmup "
        "model) took 42.10 s",
        "(APIServer pid=1) INFO 12-05 10:00:07 [api_server.py:1900] Starting vLLM API server 0 on http://0.0.0.0:8000",
    ]
)


def _stats(running: int, waiting: int, usage: float) -> str:
    return (
        f"(APIServer pid=1) INFO 12-05 10:01:00 [loggers.py:259] Engine 000: Avg prompt throughput: "
        f"900.1 tokens/s, Avg generation throughput: 1500.2 tokens/s, Running: {running} reqs, Waiting: "
        f"{waiting} reqs, GPU KV cache usage: {usage:.1f}%, Prefix cache hit rate: 0.0%"
    )


def _diagnose(text: str) -> diagnose.Diagnosis:
    return diagnose.compute_diagnosis(diagnose.read_log(text))


def test_there_are_real_logs() -> None:
    assert REAL, f"no vLLM logs under {LOGS}"


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_every_real_log_reads(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    reading = diagnose.read_log(text)
    if "[api_utils.py:" in text or "LLM engine (v" in text:  # the banner or the engine's config line
        assert reading.version, "the release is in every vLLM start-up log past argument parsing"
    assert reading.startups or reading.failure or reading.stats
    diagnose.format_diagnosis(diagnose.compute_diagnosis(reading))


def test_real_cpu_kv_shortfall() -> None:
    d = _diagnose((LOGS / "cpu-0.32.0-kv-shortfall.log").read_text())
    assert (d.reading.version, d.reading.model, d.reading.max_model_len) == ("0.32.0", "tiny", 4096)
    (start,) = d.reading.startups
    assert start.kv_cache_gib == 0.0  # "Explicitly set (0.0/23.54) GiB for KV cache": 1 MiB
    (finding,) = d.findings
    assert finding.title == "Start-up KV shortfall"
    assert "max_model_len 4096 needs 0.02 GiB" in finding.detail and "128 tokens fit" in finding.detail
    assert finding.advice.startswith("--max-model-len 128")


def test_gpu_start_up_memory_terms() -> None:
    d = _diagnose(GPU_START)
    (s,) = d.reading.startups
    assert (s.weights_gib, s.kv_cache_gib, s.graphs_gib) == (14.99, 52.31, 0.47)
    assert (s.device, s.kv_cache_tokens) == ("GPU", 428512)
    assert (s.concurrency, s.concurrency_tokens) == (3.27, 131072)
    assert (s.load_seconds, s.compile_seconds) == (31.657031, 18.21)
    assert (s.graph_seconds, s.init_seconds) == (9, 42.1)
    assert d.reading.model == "meta-llama/Llama-3.1-8B-Instruct" and d.reading.max_model_len == 131072
    assert d.findings == ()
    text = diagnose.format_diagnosis(d)
    assert "weights 14.99 GiB; KV cache 52.31 GiB; CUDA graphs 0.47 GiB; GPU KV cache 428,512 tokens" in text


def test_split_and_v0_lines() -> None:
    """Before 0.28 the size and the concurrency were two lines; V0 printed its whole profile on one."""
    split = "\n".join(
        [
            W.format(1) + "Model loading took 15.4137 GB and 9.033798 seconds",
            "INFO [kv_cache_utils.py:634] GPU KV cache size: 190,464 tokens",
            "INFO [kv_cache_utils.py:637] Maximum concurrency for 8,192 tokens per request: 23.25x",
        ]
    )
    (s,) = diagnose.read_log(split).startups
    assert (s.weights_gib, s.kv_cache_tokens, s.concurrency) == (14.3551, 190464, 23.25)
    v0 = (
        "INFO 04-23 14:48:44 [worker.py:287] model weights take 10.30GiB; non_torch_memory takes "
        "0.33GiB; PyTorch activation peak memory takes 1.77GiB; the rest of the memory reserved for KV "
        "Cache is 14.26GiB."
    )
    (s,) = diagnose.read_log(v0).startups
    assert (s.weights_gib, s.activation_gib, s.kv_cache_gib) == (10.3, 1.77, 14.26)


def test_which_term_grew_between_two_starts() -> None:
    second = GPU_START.replace("took 0.47 GiB", "took 2.10 GiB").replace("52.31 GiB", "50.68 GiB")
    d = _diagnose(GPU_START + "\n" + second)
    assert len(d.reading.startups) == 2
    (growth,) = d.findings
    assert "KV cache 52.31 -> 50.68 GiB (-1.63)" in growth.detail
    assert "CUDA graphs 0.47 -> 2.10 GiB (+1.63)" in growth.detail and "weights" not in growth.detail


def test_cuda_oom_while_serving_and_at_start_up() -> None:
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total "
        "capacity of 79.11 GiB of which 140.75 MiB is free."
    )
    serving = _diagnose(GPU_START + "\n" + _stats(40, 0, 71.0) + "\n" + oom)
    (f,) = serving.findings
    assert f.title == "CUDA out of memory while serving" and "0.77 GiB" in f.detail
    assert "enforce-eager" not in f.advice
    at_start = _diagnose(GPU_START.split("\n")[1] + "\n" + oom)
    assert at_start.findings[0].title == "CUDA out of memory at start-up"
    assert "--enforce-eager" in at_start.findings[0].advice


@pytest.mark.parametrize(
    ("text", "title", "advice"),
    [
        (messages.no_memory_error((0, 33)), "No memory left for the KV cache", "--gpu-memory-utilization"),
        (
            messages.free_memory_error((0, 33), 30.0, 79.11, 0.9, 71.2),
            "Less free GPU memory than asked for",
            "--gpu-memory-utilization 0.37 or lower",
        ),
        (
            messages.mamba_cache_blocks_error(256, 170),
            "Too few Mamba state blocks for max_num_seqs",
            "--max-num-seqs 170",
        ),
        (
            messages.max_len_error((0, 21), 131072, 16.0, 10.53, 86240),
            "Start-up KV shortfall",
            "--max-model-len 86240",
        ),
    ],
)
def test_start_up_errors_from_vllms_texts(text: str, title: str, advice: str) -> None:
    (f,) = _diagnose(f"ValueError: {text}").findings
    assert f.title == title and advice in f.advice


def test_preemption_storm_from_stats_lines() -> None:
    calm = [
        _stats(30, 0, 60.0),
        _stats(40, 2, 99.5),
        _stats(38, 0, 80.0),
        _stats(38, 0, 80.0),
        _stats(38, 3, 99.0),
        _stats(38, 0, 100.0),
    ]  # full twice in 5 lines, or full with none waiting
    assert _diagnose(GPU_START + "\n" + "\n".join(calm)).findings == ()
    storm = [_stats(31, 12, 99.1), _stats(29, 20, 100.0), _stats(30, 25, 70.0), _stats(28, 30, 100.0)]
    d = _diagnose(GPU_START + "\n" + "\n".join(calm + storm))
    (f,) = d.findings
    assert f.title == "Preemption storm" and "4 of 10 stats lines" in f.detail
    assert "428512 tokens) held 38 running" in f.detail and f.advice.startswith("--max-num-seqs near 38")


def test_real_cpu_preemption_storm() -> None:
    d = _diagnose((LOGS / "cpu-0.32.0-preemption-storm.log").read_text())
    (s,) = d.reading.startups
    assert (s.device, s.kv_cache_tokens, s.kv_cache_gib) == ("CPU", 2048, 0.01)
    assert [x.kv_usage for x in d.reading.stats][:4] == [1.0, 1.0, 0.733, 1.0]
    (f,) = d.findings
    assert f.title == "Preemption storm" and "3 of 6 stats lines" in f.detail
    assert "(2048 tokens) held 7 running" in f.detail and "(now 64)" in f.advice


def test_real_cpu_long_storm() -> None:
    """96 requests on a 2,048-token cache: vLLM counted 117 preemptions (its /metrics after the load)."""
    d = _diagnose((LOGS / "cpu-0.32.0-preemption-storm-96-requests.log").read_text())
    assert len(d.reading.stats) == 28 and max(s.waiting for s in d.reading.stats) == 90
    (f,) = d.findings
    assert f.title == "Preemption storm" and "15 of 28 stats lines" in f.detail
    assert f.advice.startswith("--max-num-seqs near 4 (now 64)")


def test_a_log_without_anything_says_so() -> None:
    d = _diagnose("hello\nworld\n")
    assert d.reading == diagnose.LogReading() and d.findings == ()
    assert "no failure, shortfall or preemption storm found" in diagnose.format_diagnosis(d)


def test_cli_reads_a_file_and_stdin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(GPU_START + "\n" + messages.no_memory_error((0, 33)))
    out = io.StringIO()
    assert cli.main(["diagnose", str(log)], out=out) == 0
    assert "No memory left for the KV cache" in out.getvalue()
    monkeypatch.setattr("sys.stdin", io.StringIO(GPU_START))
    out = io.StringIO()
    assert cli.main(["diagnose"], out=out) == 0 and "start-up 1: weights 14.99 GiB" in out.getvalue()
    err = io.StringIO()
    assert cli.main(["diagnose", str(tmp_path / "missing.log")], out=io.StringIO(), err=err) == 2
    assert "cannot read" in err.getvalue()


def test_cli_plans_the_logs_model_on_a_gpu(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(GPU_START)
    out = io.StringIO()
    assert cli.main(["diagnose", str(log), "--gpu", "H100-SXM"], out=out) == 0
    text = out.getvalue()
    assert "kvpilot's plan for this model and GPU:" in text and "meta-llama/Llama-3.1-8B-Instruct" in text
