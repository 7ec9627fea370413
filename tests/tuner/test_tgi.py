"""TGI's facts (:mod:`kvpilot.tuner.tgi`) against its launcher's own source at v3.3.7.

TGI's launcher is Rust (clap): no parser can be imported. FALLBACK CONTRACT, clearly: the flags and defaults
are checked against the text of its ``struct Args`` (``tests/data/tgi/launcher_args_v3.3.7.rs``, copied
verbatim from ``launcher/src/main.rs`` lines 580-914 at tag v3.3.7), parsed here for ``#[clap(...)]``
attributes: a rendered flag must be a ``long`` field of that struct, with the default kvpilot records.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpilot.tuner import engines, errors, tgi
from kvpilot.tuner.tgi import args as tgi_args

SOURCE = Path(__file__).resolve().parents[1] / "data" / "tgi" / "launcher_args_v3.3.7.rs"
_FIELD = re.compile(r"#\[clap\((?P<attrs>[^\]]*)\)\]\s*(?P<name>\w+): (?P<type>[^,\n]+),")


def _launcher_args() -> dict[str, tuple[str, str | None]]:
    """``field -> (type, default)`` for every ``long`` field of the launcher's ``Args``."""
    text = SOURCE.read_text()
    assert "struct Args {" in text and "v3.3.7" in text
    found: dict[str, tuple[str, str | None]] = {}
    for match in _FIELD.finditer(text):
        attrs = match.group("attrs")
        if re.search(r"\blong\b", attrs):
            default = re.search(r'default_value = "([^"]*)"', attrs)
            found[match.group("name")] = (match.group("type").strip(), default.group(1) if default else None)
    return found


def test_the_source_parser_reads_the_struct() -> None:
    fields = _launcher_args()
    assert len(fields) > 50  # the whole struct, not a fragment
    assert fields["port"] == ("u16", "3000")


def test_every_rendered_flag_is_a_launcher_field() -> None:
    fields = _launcher_args()
    others = [
        ("kv_cache_dtype", tgi.KV_CACHE_DTYPE_FLAG),
        ("model_id", tgi.MODEL_FLAG),
        ("revision", tgi.REVISION_FLAG),
        ("hostname", tgi.HOSTNAME_FLAG),
        ("port", tgi.PORT_FLAG),
    ]
    for name, flag in [*tgi.FLAGS.items(), *others]:
        assert name in fields, name
        assert flag == "--" + name.replace("_", "-")


def test_recorded_defaults_are_the_launchers() -> None:
    fields = _launcher_args()
    assert fields["max_concurrent_requests"] == ("usize", str(tgi.MAX_CONCURRENT_REQUESTS_DEFAULT))
    assert float(fields["cuda_memory_fraction"][1] or "nan") == tgi.CUDA_MEMORY_FRACTION_DEFAULT
    assert fields["port"][1] == str(tgi_args.PORT_DEFAULT)
    for inferred in (
        "max_total_tokens",
        "max_input_tokens",
        "max_batch_prefill_tokens",
        "max_batch_total_tokens",
    ):
        assert fields[inferred][0].startswith("Option<") and fields[inferred][1] is None, inferred


def test_rendering_and_refusals() -> None:
    settings = tgi.TgiSettings(max_input_tokens=4000, max_total_tokens=4096, max_batch_prefill_tokens=4096)
    assert tgi.build_tgi_args(settings) == [
        "--max-input-tokens",
        "4000",
        "--max-total-tokens",
        "4096",
        "--max-batch-prefill-tokens",
        "4096",
    ]
    # A prefill below the input is TGI's rule only without prefill chunking (backends/v3/src/main.rs line
    # 188), which the budget knows (tests/tuner/test_tgi_budget.py), not the settings alone.
    assert tgi.build_tgi_args(tgi.TgiSettings(max_input_tokens=4000, max_batch_prefill_tokens=2048))
    bad = [
        tgi.TgiSettings(max_input_tokens=4096, max_total_tokens=4096),
        tgi.TgiSettings(max_total_tokens=8192, max_batch_total_tokens=4096),
        tgi.TgiSettings(cuda_memory_fraction=0.0),
    ]
    for settings in bad:
        with pytest.raises(errors.InvalidEngineArgs):
            tgi.build_tgi_args(settings)


def test_failure_texts_round_trip() -> None:
    prefill = tgi.classify_log("2025-12-01 ERROR warmup\n" + tgi.prefill_tokens_error(8192) + "\n")
    assert prefill is not None and (prefill.kind, prefill.tokens) == ("prefill_too_large", 8192)
    total = tgi.classify_log(tgi.max_total_tokens_error(32768))
    assert total is not None and (total.kind, total.tokens) == ("total_tokens_too_large", 32768)
    # as the router's main prints the error it returns (Rust's Debug form), the form a real log shows
    printed = tgi.classify_log(
        "2026-01-01T00:00:00Z  INFO text_generation_router_v3: Warming up model\n"
        "Error: Backend(NotEnoughMemory(480000))\n"
    )
    assert printed is not None and (printed.kind, printed.tokens) == ("total_tokens_too_large", 480000)
    assert printed.line == "Error: Backend(NotEnoughMemory(480000))"
    assert tgi.classify_log('{"error":"Model is overloaded","error_type":"overloaded"}') is not None
    assert tgi.classify_log("Connected") is None


ROUTER = SOURCE.with_name("router_errors_v3.3.7.rs.txt")


def test_a_cuda_oom_while_serving_reads_the_failed_batch_from_the_routers_spans() -> None:
    """The router logs the shard's error inside the failed batch's spans: the batch span ``batch`` with its
    ``batch_size`` field, ``decode`` (``#[instrument(skip_all)]``: no fields), then each client's ``decode``
    with ``size``; its target ``text_generation_router_v3::client`` at ``client/mod.rs`` line 45, the
    ``tracing::error!`` of ``impl From<Status>``, with ``ClientError::Generation``'s "Server error: {0}"."""
    source = ROUTER.read_text()
    assert 'info_span!(parent: None, "batch", batch_size = next_batch_size)' in source
    assert "#[instrument(skip_all)]\nasync fn decode(" in source
    assert source.count("#[instrument(skip_all, fields(size = batches.iter()") == 2
    mod_rs = source.split("# --- backends/v3/src/client/mod.rs 32-47\n")[1].splitlines()
    assert (
        mod_rs[45 - 32] == '        tracing::error!("{err}");'
        and '#[error("Server error: {0}")]' in mod_rs[4]
    )
    assert "status_pb2.Status(code=code_pb2.INTERNAL, message=str(err))" in source  # the error's own text
    oom = "CUDA out of memory. Tried to allocate 896.00 MiB."
    log = "\n".join(
        [
            "2026-12-06T22:31:04Z ERROR text_generation_launcher: Method Decode encountered an error.",
            f"torch.OutOfMemoryError: {oom}",
            "2026-12-06T22:31:04Z ERROR " + tgi.batch_oom_error_line(49, oom),
            "2026-12-06T22:31:04Z ERROR text_generation_launcher: Shard 0 crashed",
        ]
    )
    found = tgi.classify_log(log)
    assert found is not None and found.kind == "cuda_oom" and found.batch_size == 49
    seam = engines.lookup_engine("tgi").classify_failure(log)
    assert seam is not None and seam.running == 49 and not seam.more_in_log
    bare = engines.lookup_engine("tgi").classify_failure(f"torch.OutOfMemoryError: {oom}")
    assert bare is not None and bare.running is None and bare.more_in_log  # the previous log may say
    warmup = "ERROR warmup{max_batch_size=None}:warmup: Server error: " + oom  # no batch span: no size
    found = tgi.classify_log(warmup)
    assert found is not None and found.batch_size is None


def test_the_seam_reads_tgi() -> None:
    engine = engines.lookup_engine("tgi")
    assert engine.serving.port == 80 and engine.serving.command == ("text-generation-launcher",)
    assert engine.knobs.sequences == "--max-concurrent-requests"
    assert engine.metrics.queued == "tgi_queue_size" and engine.metrics.preemptions is None
    assert (
        engine.metrics.kv_usage is None and engine.metrics.kv_capacity_tokens == "tgi_batch_max_total_tokens"
    )
    failure = engine.classify_failure(tgi.prefill_tokens_error(8192))
    assert failure is not None and failure.memory_share_direction == 0
