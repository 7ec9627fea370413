"""How a vLLM pod serves, and what it says about itself: command, port, paths and metric series.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). The operator renders the pod from these
(:mod:`kvpilot.operator.pods.workloads`), reads its container back by :data:`CONTAINER_NAME`
(:mod:`kvpilot.operator.pods.pod_view`, drift repair, the pod template's merge) and asks Prometheus for
the series below (:mod:`kvpilot.operator.clients.prometheus`); the chart's PodMonitor scrapes :data:`PORT`
at :data:`METRICS_PATH` (``tests/chart`` checks it against these).

The OpenAI-compatible server of vLLM 0.9-0.33 (``vllm/entrypoints/openai/api_server.py``): ``vllm serve``
listens on ``--port`` (default 8000), answers ``GET /health`` with 200 once the engine is up, and exposes
Prometheus metrics at ``/metrics``. Metric names from ``vllm/v1/metrics/loggers.py``; their history is in
docs/closed-loop.md.
"""

from __future__ import annotations

CONTAINER_NAME = "vllm"
"""The name of the engine's container in the pods kvpilot renders (and the only one it tunes)."""
SERVE_COMMAND: tuple[str, ...] = ("vllm", "serve")
"""The entry point: ``vllm serve MODEL [flags]``."""
PORT = 8000
"""vLLM's default ``--port``; kvpilot renders it explicitly and names the port ``http``."""
HEALTH_PATH = "/health"
"""200 once the engine serves: the readiness and liveness probes' path."""
METRICS_PATH = "/metrics"
"""The Prometheus exposition."""

KV_USAGE = "vllm:kv_cache_usage_perc"
"""The share of KV blocks in use (0-1; ``1 - free / (num_gpu_blocks - 1)``): 0.9 and later."""
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
"""The same gauge's name before 0.9 (V0, V1 0.8.x); emitted beside :data:`KV_USAGE` in 0.9-0.10, gone in 0.12:
queried as a fallback so that older images are read too."""
PREEMPTIONS = "vllm:num_preemptions_total"
"""Preempted requests (a counter; the exposed name of every V1 release)."""
PREEMPTIONS_BARE = "vllm:num_preemptions"
"""The counter's declared name without ``_total`` (0.9+ declares it so): a fallback for exporters that
keep it."""
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
"""Histogram of prompt lengths (buckets capped at ``max_model_len``)."""
GENERATION_TOKENS = "vllm:request_generation_tokens"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""An info gauge whose labels are the engine's ``CacheConfig`` (``num_gpu_blocks``, ``block_size``, ...)."""
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
"""Inter-token latency histogram: 0.10.2 and later."""
