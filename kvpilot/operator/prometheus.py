"""Read a service's vLLM metrics from Prometheus into an :class:`ObservationWindow`.

The only module that queries Prometheus. :func:`fetch_observations` runs a handful of
PromQL queries (prometheus-api-client, in a worker thread) and never raises: an
unreachable Prometheus, an error answer or absent series give a window marked
unavailable, and the policy holds on it (``MetricsAvailable=False``).

Series are those of vLLM 0.33 (``vllm/v1/metrics/loggers.py``), with the fallbacks
older releases need; each is selected by ``{namespace="<ns>", pod=~"<pod-1>|<pod-2>"}``
(``S`` below: exactly the pods the service's Deployment owns) and reduced to the *worst pod* (``max``):

* ``kv_usage`` (range): ``max(vllm:kv_cache_usage_perc{S}) or max(vllm:gpu_cache_usage_perc{S})``
* ``preemption_rate`` (range): ``max(rate(vllm:num_preemptions_total{S}[2m]))``, or the same
  with ``vllm:num_preemptions`` (an exporter without the ``_total`` suffix)
* ``running`` / ``waiting`` (range): ``max(vllm:num_requests_running{S})`` /
  ``max(vllm:num_requests_waiting{S})``
* newest scrape (instant): ``max(timestamp(vllm:kv_cache_usage_perc{S}) or timestamp(...legacy))``
* mean prompt / output length (instant): ``sum(rate(vllm:request_prompt_tokens_sum{S}[W]))
  / sum(rate(vllm:request_prompt_tokens_count{S}[W]))``, same for ``vllm:request_generation_tokens``
* KV capacity (instant): ``vllm:cache_config_info{S}``, label ``kv_cache_size_tokens`` (0.33),
  else ``num_gpu_blocks`` x ``block_size``, the smallest over pods; its ``gpu_memory_utilization``
  and ``cache_dtype`` labels say which settings the figure is for.
* ``ttft_p95`` / ``itl_p95`` (range): the worst pod's ``histogram_quantile(0.95, sum by (pod, le)
  (rate(vllm:time_to_first_token_seconds_bucket{S}[2m])))``, same for ``vllm:inter_token_latency_seconds``
  (no request in the rate window: NaN, a missing sample)
* ``gpu_memory_free_gib`` / ``gpu_memory_used_gib`` (range): dcgm-exporter's ``min(DCGM_FI_DEV_FB_FREE{S})``
  and ``max(DCGM_FI_DEV_FB_USED{S})`` over 1024 (its ``namespace``/``pod`` labels name the pod holding the
  GPU); absent without dcgm-exporter, which only disables the early warning

The pure halves (:func:`build_queries`, :func:`build_window`) are tested on canned answers;
the I/O half on a stub HTTP server.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpilot.operator import metrics
from kvpilot.tuner.loop import LengthSummary, MetricsSample, ObservationWindow

PROMETHEUS_URL_ENV = "KVPILOT_PROMETHEUS_URL"
QUERY_TIMEOUT_S = 10
RATE_WINDOW = "2m"
"""Range of ``rate()`` for the preemption counter: 8 scrapes at the chart's 15 s interval."""

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PREEMPTIONS_BARE = "vllm:num_preemptions"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
GENERATION_TOKENS = "vllm:request_generation_tokens"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"
"""dcgm-exporter's framebuffer series (MiB), labelled with the pod that holds the GPU (``namespace``,
``pod``: its Kubernetes mode, ``--kubernetes``; kept as such by a scrape with ``honor_labels``)."""


class PromClient(Protocol):
    """The two calls of ``prometheus_api_client.PrometheusConnect`` we use."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def custom_query_range(
        self, query: str, start_time: datetime.datetime, end_time: datetime.datetime, step: str
    ) -> list[dict[str, Any]]: ...


_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def build_promql_selector(namespace: str, pods: Sequence[str]) -> str:
    """The label matchers of exactly these pods (the ones the service's Deployment owns): never a name
    pattern, which another app's pod could match. PromQL regexes are fully anchored."""
    # Pod names are DNS subdomains: only "." is special in a regex, and PromQL's string needs "\\." for it.
    names = "|".join(p.replace(".", "\\\\.") for p in sorted(pods) if _POD_NAME.fullmatch(p))
    return f'namespace="{namespace}",pod=~"{names}"'


@dataclass(frozen=True, slots=True)
class Queries:
    kv_usage: str
    preemption_rate: str
    running: str
    waiting: str
    last_scrape: str
    prompt_mean: str
    generation_mean: str
    cache_config: str
    ttft_p95: str = ""
    itl_p95: str = ""
    gpu_memory_free_gib: str = ""
    gpu_memory_used_gib: str = ""

    @property
    def ranged(self) -> dict[str, str]:
        queries = {
            "kv_usage": self.kv_usage,
            "preemption_rate": self.preemption_rate,
            "running": self.running,
            "waiting": self.waiting,
            "ttft_p95": self.ttft_p95,
            "itl_p95": self.itl_p95,
            "gpu_memory_free_gib": self.gpu_memory_free_gib,
            "gpu_memory_used_gib": self.gpu_memory_used_gib,
        }
        return {k: q for k, q in queries.items() if q}

    @property
    def instant(self) -> dict[str, str]:
        return {
            "last_scrape": self.last_scrape,
            "prompt_mean": self.prompt_mean,
            "generation_mean": self.generation_mean,
            "cache_config": self.cache_config,
        }


def build_queries(namespace: str, pods: Sequence[str], window_seconds: float) -> Queries:
    """Every PromQL query of one fetch, over ``pods``."""
    s = build_promql_selector(namespace, pods)
    w = f"{max(60, int(window_seconds))}s"

    def mean(family: str) -> str:
        return f"sum(rate({family}_sum{{{s}}}[{w}])) / sum(rate({family}_count{{{s}}}[{w}]))"

    def p95(family: str) -> str:  # the worst pod's
        rate = f"rate({family}_bucket{{{s}}}[{RATE_WINDOW}])"
        return f"max(histogram_quantile(0.95, sum by (pod, le) ({rate})))"

    return Queries(
        kv_usage=f"max({KV_USAGE}{{{s}}}) or max({KV_USAGE_LEGACY}{{{s}}})",
        preemption_rate=(
            f"max(rate({PREEMPTIONS}{{{s}}}[{RATE_WINDOW}]))"
            f" or max(rate({PREEMPTIONS_BARE}{{{s}}}[{RATE_WINDOW}]))"
        ),
        running=f"max({RUNNING}{{{s}}})",
        waiting=f"max({WAITING}{{{s}}})",
        last_scrape=f"max(timestamp({KV_USAGE}{{{s}}}) or timestamp({KV_USAGE_LEGACY}{{{s}}}))",
        prompt_mean=mean(PROMPT_TOKENS),
        generation_mean=mean(GENERATION_TOKENS),
        cache_config=f"{CACHE_CONFIG_INFO}{{{s}}}",
        ttft_p95=p95(TTFT),
        itl_p95=p95(ITL),
        gpu_memory_free_gib=f"min({FB_FREE}{{{s}}}) / 1024",
        gpu_memory_used_gib=f"max({FB_USED}{{{s}}}) / 1024",
    )


# --- parsing (pure) ---------------------------------------------------------------------------------


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _series_points(result: Sequence[Mapping[str, Any]]) -> dict[float, float]:
    """``{time: value}`` of the first series of a range answer (queries reduce to one series)."""
    for series in result:
        return {
            float(t): v
            for t, v in ((t, _number(raw)) for t, raw in series.get("values") or ())
            if v is not None
        }
    return {}


def _scalar(result: Sequence[Mapping[str, Any]]) -> float | None:
    for series in result:
        value = series.get("value") or (None, None)
        return _number(value[1])
    return None


def _capacity(result: Sequence[Mapping[str, Any]]) -> tuple[int | None, float | None, str | None, int]:
    """(smallest KV tokens over pods, reported utilisation, cache dtype, pods) from ``cache_config_info``."""
    tokens: list[int] = []
    gmu: float | None = None
    dtype: str | None = None
    for series in result:
        labels = series.get("metric") or {}
        size = _number(labels.get("kv_cache_size_tokens"))
        if size is None:
            blocks, block = _number(labels.get("num_gpu_blocks")), _number(labels.get("block_size"))
            size = blocks * block if blocks is not None and block is not None else None
        if size is not None and size > 0:
            tokens.append(int(size))
        gmu = gmu if gmu is not None else _number(labels.get("gpu_memory_utilization"))
        dtype = dtype or labels.get("cache_dtype") or None
    return (min(tokens) if tokens else None), gmu, dtype, len(result)


RANGES: Mapping[str, tuple[float, float]] = {
    "kv_usage": (0.0, 1.0 + 1e-6),
    "preemption_rate": (0.0, 1e4),
    "running": (0.0, 1e6),
    "waiting": (0.0, 1e7),
    "prompt_mean": (0.0, 1e8),
    "generation_mean": (0.0, 1e8),
    "ttft_p95": (0.0, 1e5),
    "itl_p95": (0.0, 1e5),
    "gpu_memory_free_gib": (0.0, 1e4),
    "gpu_memory_used_gib": (0.0, 1e4),
}
"""What each figure can be: a fraction, rates and counts a vLLM pod can reach (with room), token lengths
below any context. A value outside is an impossible sample (a broken exporter, a relabelling mistake,
an attacker): the window is unusable and the loop holds, rather than retuning on "KV usage 1e308"."""


def _out_of_range(
    series: Mapping[str, Mapping[float, float]], instant: Mapping[str, Sequence[Mapping[str, Any]]]
) -> str | None:
    """The first impossible value, in words, or ``None``."""
    values: list[tuple[str, float]] = [(k, v) for k, points in series.items() for v in points.values()]
    for key in ("prompt_mean", "generation_mean"):
        scalar = _scalar(instant.get(key, ()))
        if scalar is not None:
            values.append((key, scalar))
    for key, value in values:
        low, high = RANGES.get(key, (-math.inf, math.inf))
        if not low <= value <= high:
            return f"{key} = {value:g} (outside [{low:g}, {high:g}])"
    tokens = _capacity(instant.get("cache_config", ()))[0]
    if tokens is not None and tokens > 1 << 40:
        return f"KV capacity {tokens} tokens (more than any GPU holds)"
    return None


def build_window(
    ranged: Mapping[str, Sequence[Mapping[str, Any]]],
    instant: Mapping[str, Sequence[Mapping[str, Any]]],
    now: float,
    window_seconds: float,
    step_seconds: float,
) -> ObservationWindow:
    """An :class:`ObservationWindow` from Prometheus' answers (the ``data.result`` lists)."""
    start = now - window_seconds
    series = {key: _series_points(result) for key, result in ranged.items()}
    invalid = _out_of_range(series, instant)
    if invalid is not None:
        return ObservationWindow.unavailable(f"invalid sample: {invalid}; holding until it is sane", now)
    kv = series.get("kv_usage", {})
    if not kv:
        return ObservationWindow.unavailable("no vllm:kv_cache_usage_perc series for the service's pods", now)
    last_scrape = _scalar(instant.get("last_scrape", ()))
    # After the newest scrape, Prometheus repeats the last value for 5 minutes (lookback):
    # those points are not new observations, so the window ends one step after it.
    horizon = last_scrape + step_seconds if last_scrape is not None else now
    samples = tuple(
        MetricsSample(
            time=t,
            kv_usage=value,
            preemption_rate=series.get("preemption_rate", {}).get(t),
            running=series.get("running", {}).get(t),
            waiting=series.get("waiting", {}).get(t),
            ttft_p95=series.get("ttft_p95", {}).get(t),
            itl_p95=series.get("itl_p95", {}).get(t),
            gpu_memory_free_gib=series.get("gpu_memory_free_gib", {}).get(t),
            gpu_memory_used_gib=series.get("gpu_memory_used_gib", {}).get(t),
        )
        for t, value in sorted(kv.items())
        if t <= horizon
    )
    prompt = _scalar(instant.get("prompt_mean", ()))
    generation = _scalar(instant.get("generation_mean", ()))
    tokens, gmu, dtype, pods = _capacity(instant.get("cache_config", ()))
    return ObservationWindow(
        start=start,
        end=now,
        samples=samples,
        prompt_tokens=LengthSummary(prompt) if prompt is not None else None,
        generation_tokens=LengthSummary(generation) if generation is not None else None,
        kv_capacity_tokens=tokens,
        reported_gpu_memory_utilization=gmu,
        reported_kv_cache_dtype=dtype,
        pods=pods,
    )


# --- I/O ---------------------------------------------------------------------------------------------

_clients: dict[str, PromClient] = {}
_clients_lock = threading.Lock()


def _default_client(url: str) -> PromClient:
    """One ``PrometheusConnect`` per URL (one connection pool), with one quick retry."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            client = PrometheusConnect(
                url=url,
                disable_ssl=True,
                retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]),
                timeout=QUERY_TIMEOUT_S,
            )
            _clients[url] = client
        return client


def _fetch_sync(
    client: PromClient, queries: Queries, now: float, window_seconds: float, step_seconds: float
) -> ObservationWindow:
    end = datetime.datetime.fromtimestamp(now, datetime.UTC)
    start = end - datetime.timedelta(seconds=window_seconds)
    ranged: dict[str, Any] = {}
    instant: dict[str, Any] = {}
    for key, query in queries.ranged.items():
        with metrics.time_prometheus_query():
            ranged[key] = client.custom_query_range(
                query, start_time=start, end_time=end, step=f"{step_seconds:g}"
            )
        if key == "kv_usage" and not ranged[key]:
            return ObservationWindow.unavailable(
                "no vllm:kv_cache_usage_perc series for the service's pods", now
            )
    for key, query in queries.instant.items():
        with metrics.time_prometheus_query():
            instant[key] = client.custom_query(query, params={"time": f"{now:.3f}"})
    return build_window(ranged, instant, now, window_seconds, step_seconds)


async def fetch_observations(
    prom_url: str,
    namespace: str,
    name: str,
    now: float,
    *,
    pods: Sequence[str],
    window_seconds: float = 300.0,
    step_seconds: float = 30.0,
    client_factory: Callable[[str], PromClient] = _default_client,
) -> ObservationWindow:
    """The last ``window_seconds`` of the metrics of the service's ``pods`` at ``now``; never raises."""
    if not prom_url:
        return ObservationWindow.unavailable(f"no Prometheus URL configured (${PROMETHEUS_URL_ENV})", now)
    if not pods:
        return ObservationWindow.unavailable(f"no running pods of {namespace}/{name} to read metrics of", now)
    queries = build_queries(namespace, pods, window_seconds)
    try:
        client = client_factory(prom_url)
        return await asyncio.to_thread(_fetch_sync, client, queries, now, window_seconds, step_seconds)
    except Exception as exc:  # connection refused, timeouts, HTTP 4xx/5xx, bad JSON: all mean "no data"
        detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return ObservationWindow.unavailable(f"Prometheus query failed: {detail}", now)
