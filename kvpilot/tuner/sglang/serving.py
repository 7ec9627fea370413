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
NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
DIST_INIT_ADDR_FLAG = "--dist-init-addr"
"""SGLang's node flags (``arg_groups/fields/parallel.py``: ``nnodes``, ``node_rank``, ``dist_init_addr``
``host:port``, alias ``--nccl-init-addr``). A rank >= 1 runs its schedulers and no HTTP server
(``entrypoints/http_server.py`` line 3163, ``entrypoints/engine.py`` line 1234)."""
DIST_INIT_PORT = 20000
"""The port kvpilot's groups rendezvous on at node 0 (SGLang has no default; its LeaderWorkerSet example
uses 20000)."""
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
"""Prompt tokens of the finished requests (a counter labelled ``is_streaming``, line 1856), counted in
``TokenizerMetricsCollector.observe_one_finished_request`` (line 2109) with ``sglang:num_requests_total``
(line 1941, +1 per request, line 2136): the ratio of their rates is the same mean as
:data:`PROMPT_TOKENS_HISTOGRAM`'s, which kvpilot reads instead (one series, the seam's histogram shape)."""
PROMPT_TOKENS_HISTOGRAM = "sglang:prompt_tokens_histogram"
"""Each finished request's prompt length in tokens, a histogram (line 1909) observed by
``TokenizerMetricsCollector.observe_one_finished_request`` (line 2146) for every request, with the
tokenizer's labels (``model_name``, ``engine_type``; no ``is_streaming``). In 0.5.23 no flag gates it: the
tokenizer's collector exists with ``--enable-metrics`` (``managers/tokenizer_manager.py`` line 837), and the
wheel has no ``--collect-tokens-histogram`` (earlier releases' ``collect_tokens_histogram=False`` kept it
off; 0.5.23's argument parser refuses that flag, so kvpilot never renders it). Buckets:
``default_bucket_prompt_tokens`` (lines 1871-1907: 100, 300, ... 1,100,000) unless ``--prompt-tokens-buckets``
(``arg_groups/fields/observability.py`` line 116); kvpilot reads its ``_sum`` over its ``_count``, the
window's mean prompt (the full prompt, cached tokens included, as vLLM's and TGI's lengths;
``sglang:uncached_prompt_tokens_histogram``, line 1917, would leave the radix cache's hits out)."""
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


def build_node_role_args(nnodes: int, node_rank: str, leader: str) -> tuple[str, ...]:
    """The flags of one node of a group of ``nnodes`` (none for one node): the group's size, this node's rank
    and node 0's rendezvous address (strings: a pod renders them as ``$(VAR)`` references). Node 0 serves
    the API; the others only run their schedulers (no flag says so: the rank does)."""
    if nnodes <= 1:
        return ()
    return (
        NNODES_FLAG,
        str(nnodes),
        NODE_RANK_FLAG,
        node_rank,
        DIST_INIT_ADDR_FLAG,
        f"{leader}:{DIST_INIT_PORT}",
    )
