"""How an SGLang pod serves, and what it says about itself: command, port, paths and metric series.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). SGLang 0.5.23's HTTP server
(``entrypoints/http_server.py``): ``python -m sglang.launch_server --model-path M`` listens on ``--port``
(default 30000, ``arg_groups/fields/serving.py`` line 66), answers ``GET /health`` (line 721) and exposes
Prometheus metrics at ``/metrics`` only with ``--enable-metrics``. Series names from
``observability/metrics_collector.py`` (line of each below).
"""

from __future__ import annotations

from collections.abc import Sequence

CONTAINER_NAME = "sglang"
SERVE_COMMAND: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
SERVER_MODULE = "sglang.launch_server"
IMAGE_REPOSITORY = "lmsysorg/sglang"
"""SGLang's official image (Docker Hub), whose containers are given the server's command."""
PORT = 30000
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"

TOKEN_USAGE = "sglang:token_usage"
"""KV pool tokens in use / pool size (0-1), line 405: the analogue of vLLM's KV-cache usage."""
NUM_RUNNING = "sglang:num_running_reqs"
"""Line 365."""
NUM_QUEUED = "sglang:num_queue_reqs"
"""Line 371."""
NUM_USED_TOKENS = "sglang:num_used_tokens"
"""Line 433."""
MAX_TOTAL_NUM_TOKENS = "sglang:max_total_num_tokens"
"""The pool's size in tokens, line 1290: the analogue of vLLM's blocks x block size."""
RETRACTIONS = "sglang:num_retracted_requests_total"
"""Retracted requests (a counter, line 559): the analogue of vLLM's preemptions."""
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
TTFT = "sglang:time_to_first_token_seconds"
"""Line 2041."""
ITL = "sglang:inter_token_latency_seconds"
"""Line 2051."""
E2E_LATENCY = "sglang:e2e_request_latency_seconds"
"""Line 2068."""
QUEUE_TIME = "sglang:queue_time_seconds"
"""Line 838."""


def is_server(argv: Sequence[str], image: str = "") -> bool:
    """Whether a container (its ``command + args``, or a shell script among them, and its image) starts
    SGLang's server: ``python -m sglang.launch_server`` in any spelling, or SGLang's image."""
    text = " ".join(argv)
    return (
        SERVER_MODULE in text
        or "sglang/launch_server.py" in text
        or image.split("@")[0].split(":")[0].endswith(IMAGE_REPOSITORY)
    )
