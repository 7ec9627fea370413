"""How a TGI pod serves, and what it says about itself: command, port, paths and metric series.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). At ``v3.3.7``: the image's entry point runs
``text-generation-launcher`` (``Dockerfile`` lines 240-249) with ``PORT=80`` set (line 149); the router
serves ``GET /health`` and ``GET /metrics`` (``router/src/server.rs`` lines 2241-2243). Series from
``docs/source/reference/metrics.md``, ``backends/v3/src/lib.rs`` line 138 and ``router/src/infer/mod.rs``
line 117.
"""

from __future__ import annotations

from collections.abc import Sequence

CONTAINER_NAME = "tgi"
SERVE_COMMAND: tuple[str, ...] = ("text-generation-launcher",)
IMAGE_REPOSITORY = "ghcr.io/huggingface/text-generation-inference"
"""TGI's official image, whose entry point runs the launcher (a container gives only its arguments)."""
PORT = 80
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"

QUEUE_SIZE = "tgi_queue_size"
BATCH_CURRENT_SIZE = "tgi_batch_current_size"
BATCH_CURRENT_MAX_TOKENS = "tgi_batch_current_max_tokens"
BATCH_MAX_TOTAL_TOKENS = "tgi_batch_max_total_tokens"
"""The inferred (or given) ``--max-batch-total-tokens``: the KV capacity in tokens."""
REQUEST_DURATION = "tgi_request_duration"
REQUEST_QUEUE_DURATION = "tgi_request_queue_duration"
"""Seconds a request waited in the router's queue before its batch's prefill (``router/src/server.rs``):
kvpilot's stand-in for the time to first token, a lower bound of it (the prefill and the first token's
decode are left out)."""
TIME_PER_TOKEN = "tgi_request_mean_time_per_token_duration"
"""Per request, its inference time over the tokens it generated (``router/src/server.rs``): kvpilot's
stand-in for the inter-token latency. Its p95 is over requests' means, so a request's slowest gaps (a
prefill the running batch waited for) are averaged into it: it errs low against a p95 per token."""
REQUEST_FAILURE = "tgi_request_failure"
"""A counter of the requests the router failed, by cause in its ``err`` label (``router/src/infer/mod.rs``).
``metrics-exporter-prometheus`` 0.15.3 (``Cargo.lock`` at ``v3.3.7``) writes a counter under its own name,
no ``_total`` appended (``metrics-exporter-prometheus/src/recorder.rs`` line 124: ``write_metric_line`` with
no suffix), and only once it is first incremented (the router sets no idle timeout, so it stays): a router
that has failed nothing exports no such series."""
FAILURE_CAUSE_LABEL = "err"
FAILURE_OVERLOADED = "overloaded"
"""The ``err`` of a request refused at ``--max-concurrent-requests``: the concurrency semaphore's
``try_acquire_owned`` failed, ``metrics::counter!("tgi_request_failure", "err" => "overloaded")``
(``router/src/infer/mod.rs`` line 117), answered 429 "Model is overloaded" (line 412)."""
REQUEST_OVERLOADED = f'{REQUEST_FAILURE}{{{FAILURE_CAUSE_LABEL}="{FAILURE_OVERLOADED}"}}'
"""The selector of the requests refused at the admission limit, whose ``rate()`` is the 429s per second."""
INPUT_LENGTH = "tgi_request_input_length"
"""A histogram of requests' input lengths in tokens (``docs/source/reference/metrics.md``): the prompts'
mean, which says whether long prompts share the batch's steps."""


def is_server(argv: Sequence[str], image: str = "") -> bool:
    """Whether a container (its ``command + args`` and its image) runs TGI: the launcher named, or TGI's
    image, whose entry point is the launcher."""
    return any(SERVE_COMMAND[0] in tok for tok in argv) or image.split("@")[0].split(":")[0].endswith(
        IMAGE_REPOSITORY
    )
