"""Read the vLLM metrics of every service from Prometheus, once per tick, into :class:`ObservationWindow`.

The only module that queries Prometheus. One closed-loop tick asks each metric **once for the whole
fleet**, aggregated ``by (namespace, pod)`` (the label names are configurable:
:mod:`.prometheus_settings`), into a :class:`FleetSnapshot`; each service's timer then takes exactly its
pods' series from it (:func:`build_service_window`) and reduces them to the *worst pod*. So the load on
Prometheus is :data:`QUERIES_PER_TICK` queries per tick whatever the number of services
(``bench/prometheus_load.py``). kopf runs one timer per object: :func:`fetch_observations` shares one
snapshot per tick interval between them, with a single fetch in flight (:class:`_Entry`).

Nothing here raises: an unreachable Prometheus, a wrong CA, a 401, an error answer or absent series give
a window marked unavailable, with a cause (``ObservationWindow.unavailable_code``: ``PrometheusTLSError``,
``PrometheusUnauthorized``, ...) that becomes the ``MetricsAvailable=False`` reason; the policy holds.
The message is tenant-safe: a fixed text per class, never an upstream body (:mod:`.prometheus_errors`).

Series are those of vLLM 0.33 (``vllm/v1/metrics/loggers.py``), with the fallbacks older releases need
(``B`` below is ``namespace, pod``; per pod, the first naming that has a series wins):

* ``kv_usage`` (range): ``max by (B) (vllm:kv_cache_usage_perc) or max by (B) (vllm:gpu_cache_usage_perc)``
* ``preemption_rate`` (range): ``max by (B) (rate(vllm:num_preemptions_total[2m]))``, or the same with
  ``vllm:num_preemptions`` (an exporter without the ``_total`` suffix)
* ``running`` / ``waiting`` (range): ``max by (B) (vllm:num_requests_running)`` / ``..._waiting``
* newest scrape (instant): ``max by (B) (timestamp(vllm:kv_cache_usage_perc) or timestamp(...legacy))``
* prompt / output length (instant): ``sum by (B) (rate(vllm:request_prompt_tokens_sum[W]))`` and
  ``_count``; the service's mean is the sum over its pods over the count over its pods; same for
  ``vllm:request_generation_tokens``
* KV capacity (instant): ``vllm:cache_config_info``, label ``kv_cache_size_tokens`` (0.33), else
  ``num_gpu_blocks`` x ``block_size``, the smallest over pods; its ``gpu_memory_utilization`` and
  ``cache_dtype`` labels say which settings the figure is for.
* ``ttft_p95`` / ``itl_p95`` (range): ``histogram_quantile(0.95, sum by (B, le)
  (rate(vllm:time_to_first_token_seconds_bucket[2m])))``, same for ``vllm:inter_token_latency_seconds``;
  the worst pod's (no request in the rate window: NaN, a missing sample)
* ``gpu_memory_free_gib`` / ``gpu_memory_used_gib`` (range): dcgm-exporter's
  ``min by (B) (DCGM_FI_DEV_FB_FREE)`` and ``max by (B) (DCGM_FI_DEV_FB_USED)`` over 1024 (its
  ``namespace``/``pod`` labels name the pod holding the GPU); absent without dcgm-exporter, which only
  disables the early warning

Another engine's series come from the tuner's seam (:class:`kvpilot.tuner.engines.MetricSeries`: SGLang's
token usage for ``kv_usage``, its retractions for ``preemption_rate``, its queued requests for ``waiting``,
its TTFT and ITL histograms, its ``sglang:prompt_tokens_histogram``; TGI's
``tgi_batch_current_max_tokens / tgi_batch_max_total_tokens`` for ``kv_usage``, its batch size and queue,
its ``tgi_request_input_length``; its requests refused at ``--max-concurrent-requests``, the seam's
``MetricSeries.rejected``, as ``max by (B) (rate(R[2m]))`` into ``rejected_rate``, 0 at a sample whose
KV gauges were scraped without it -- TGI's exporter writes the counter only from the first refusal on):
:func:`build_queries` with ``series``; its fleet snapshot is its own
(keyed by the series). The prompt-length histogram (``MetricSeries.prompt_tokens``) is queried as vLLM's,
``sum by (B) (rate(H_sum[W]))`` and ``_count``, into the prompts' mean (what the latency rule's long-prompt
test, :func:`kvpilot.tuner.loop.engine_latency.long_prompts`, compares); no output length or capacity is
queried (the engines' own rules read neither).

A service's series are exactly those of the pods its Deployment owns (looked up by namespace and pod
name, never a name pattern another app's pod could match). The pure halves (:func:`build_queries`,
:func:`build_fleet_snapshot`, :func:`build_service_window`, :func:`build_window`) are tested on canned
answers; the I/O half on a stub HTTP server and the real Prometheus (behind TLS and basic auth in e2e).
"""

from __future__ import annotations

import asyncio
import datetime
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpilot.operator import conditions
from kvpilot.operator.clients import metrics
from kvpilot.operator.clients.prometheus_errors import classify_error
from kvpilot.operator.clients.prometheus_settings import URL_ENV, PrometheusSettings
from kvpilot.tuner.engines import MetricSeries
from kvpilot.tuner.loop import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.vllm import serving

PROMETHEUS_URL_ENV = URL_ENV
QUERY_TIMEOUT_S = 10
RATE_WINDOW = "2m"
"""Range of ``rate()`` for the preemption counter: 8 scrapes at the chart's 15 s interval."""

# vLLM's series, from their one home (kvpilot.tuner.vllm.serving)
KV_USAGE = serving.KV_USAGE
KV_USAGE_LEGACY = serving.KV_USAGE_LEGACY
PREEMPTIONS = serving.PREEMPTIONS
PREEMPTIONS_BARE = serving.PREEMPTIONS_BARE
RUNNING = serving.RUNNING
WAITING = serving.WAITING
PROMPT_TOKENS = serving.PROMPT_TOKENS
GENERATION_TOKENS = serving.GENERATION_TOKENS
CACHE_CONFIG_INFO = serving.CACHE_CONFIG_INFO
TTFT = serving.TTFT
ITL = serving.ITL
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


PodKey = tuple[str, str]
"""(namespace, pod)."""

_WORST_IS_LOWEST = frozenset({"gpu_memory_free_gib"})
_FRAMEBUFFER = ("gpu_memory_free_gib", "gpu_memory_used_gib")


@dataclass(frozen=True, slots=True)
class Queries:
    """Every PromQL query of one tick, for all services."""

    ranged: Mapping[str, str]
    instant: Mapping[str, str]

    @property
    def all(self) -> list[str]:
        return [*self.ranged.values(), *self.instant.values()]


def build_queries(
    window_seconds: float,
    pod_label: str = "pod",
    namespace_label: str = "namespace",
    series: MetricSeries | None = None,
) -> Queries:
    """The tick's queries, aggregated by the (configurable) namespace and pod labels: vLLM's (``series``
    ``None``), or another engine's by the seam's shared meanings."""
    by = f"{namespace_label}, {pod_label}"
    w = f"{max(60, int(window_seconds))}s"
    if series is not None:
        return _build_engine_queries(series, by, w)

    def rate_sum(family: str, part: str) -> str:
        return f"sum by ({by}) (rate({family}_{part}[{w}]))"

    def p95(family: str) -> str:
        return f"histogram_quantile(0.95, sum by ({by}, le) (rate({family}_bucket[{RATE_WINDOW}])))"

    ranged = {
        "kv_usage": f"max by ({by}) ({KV_USAGE}) or max by ({by}) ({KV_USAGE_LEGACY})",
        "preemption_rate": (
            f"max by ({by}) (rate({PREEMPTIONS}[{RATE_WINDOW}]))"
            f" or max by ({by}) (rate({PREEMPTIONS_BARE}[{RATE_WINDOW}]))"
        ),
        "running": f"max by ({by}) ({RUNNING})",
        "waiting": f"max by ({by}) ({WAITING})",
        "ttft_p95": p95(TTFT),
        "itl_p95": p95(ITL),
        "gpu_memory_free_gib": f"min by ({by}) ({FB_FREE}) / 1024",
        "gpu_memory_used_gib": f"max by ({by}) ({FB_USED}) / 1024",
    }
    instant = {
        "last_scrape": f"max by ({by}) (timestamp({KV_USAGE}) or timestamp({KV_USAGE_LEGACY}))",
        "prompt_sum": rate_sum(PROMPT_TOKENS, "sum"),
        "prompt_count": rate_sum(PROMPT_TOKENS, "count"),
        "generation_sum": rate_sum(GENERATION_TOKENS, "sum"),
        "generation_count": rate_sum(GENERATION_TOKENS, "count"),
        "cache_config": f'{CACHE_CONFIG_INFO}{{{pod_label}!=""}}',
    }
    return Queries(ranged=ranged, instant=instant)


def _build_engine_queries(series: MetricSeries, by: str, w: str) -> Queries:
    """Another engine's queries from its :class:`MetricSeries` (the names live in the engine's package)."""
    kv_usage = series.kv_usage
    if kv_usage is None and series.kv_used_tokens is not None and series.kv_capacity_tokens is not None:
        kv_usage = f"{series.kv_used_tokens} / {series.kv_capacity_tokens}"  # TGI: no ratio, two gauges
    if kv_usage is None:
        raise ValueError("the closed loop reads an engine's KV usage; this engine exports none")

    def p95(family: str) -> str:
        return f"histogram_quantile(0.95, sum by ({by}, le) (rate({family}_bucket[{RATE_WINDOW}])))"

    ranged = {
        "kv_usage": f"max by ({by}) ({kv_usage})",
        "running": f"max by ({by}) ({series.running})",
        "waiting": f"max by ({by}) ({series.queued})",
        "ttft_p95": p95(series.ttft),
        "itl_p95": p95(series.itl),
        "gpu_memory_free_gib": f"min by ({by}) ({FB_FREE}) / 1024",
        "gpu_memory_used_gib": f"max by ({by}) ({FB_USED}) / 1024",
    }
    if series.preemptions is not None:
        ranged["preemption_rate"] = f"max by ({by}) (rate({series.preemptions}[{RATE_WINDOW}]))"
    if series.rejected is not None:  # TGI's 429s; an absent series is no refusal (build_window)
        ranged["rejected_rate"] = f"max by ({by}) (rate({series.rejected}[{RATE_WINDOW}]))"
    scraped = series.kv_usage or series.kv_used_tokens
    instant = {"last_scrape": f"max by ({by}) (timestamp({scraped}))"}
    if series.prompt_tokens is not None:  # the prompts' mean (build_service_window), as vLLM's
        for part in ("sum", "count"):
            instant[f"prompt_{part}"] = f"sum by ({by}) (rate({series.prompt_tokens}_{part}[{w}]))"
    return Queries(ranged=ranged, instant=instant)


QUERIES_PER_TICK = len(build_queries(300).all)
"""What one tick asks Prometheus, for any number of services (it was 12 per service)."""


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


def _capacity(result: Sequence[Mapping[str, Any]]) -> tuple[int | None, float | None, str | None]:
    """(smallest KV tokens over engines, reported utilisation, cache dtype) from ``cache_config_info``."""
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
    return (min(tokens) if tokens else None), gmu, dtype


RANGES: Mapping[str, tuple[float, float]] = {
    "kv_usage": (0.0, 1.0 + 1e-6),
    "preemption_rate": (0.0, 1e4),
    "rejected_rate": (0.0, 1e6),
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
    pods: int,
    kv_series: str = KV_USAGE,
) -> ObservationWindow:
    """An :class:`ObservationWindow` from Prometheus' answers (the ``data.result`` lists). ``pods``: how many
    pods reported (not the ``cache_config_info`` series: a data-parallel pod has one per engine)."""
    start = now - window_seconds
    series = {key: _series_points(result) for key, result in ranged.items()}
    invalid = _out_of_range(series, instant)
    if invalid is not None:
        return ObservationWindow.unavailable(f"invalid sample: {invalid}; holding until it is sane", now)
    kv = series.get("kv_usage", {})
    if not kv:
        return ObservationWindow.unavailable(f"no {kv_series} series for the service's pods", now)
    last_scrape = _scalar(instant.get("last_scrape", ()))
    # After the newest scrape, Prometheus repeats the last value for 5 minutes (lookback):
    # those points are not new observations, so the window ends one step after it.
    horizon = last_scrape + step_seconds if last_scrape is not None else now
    # The refusals counter appears only once the engine first refuses (TGI's exporter): where it was asked
    # for, a sample (its KV gauges scraped) without it is a pod that refused nothing, 0, not a gap.
    rejected = series.get("rejected_rate", {})
    none_rejected = 0.0 if "rejected_rate" in ranged else None
    samples = tuple(
        MetricsSample(
            time=t,
            kv_usage=value,
            preemption_rate=series.get("preemption_rate", {}).get(t),
            running=series.get("running", {}).get(t),
            waiting=series.get("waiting", {}).get(t),
            ttft_p95=series.get("ttft_p95", {}).get(t),
            itl_p95=series.get("itl_p95", {}).get(t),
            rejected_rate=rejected.get(t, none_rejected),
            gpu_memory_free_gib=series.get("gpu_memory_free_gib", {}).get(t),
            gpu_memory_used_gib=series.get("gpu_memory_used_gib", {}).get(t),
        )
        for t, value in sorted(kv.items())
        if t <= horizon
    )
    prompt = _scalar(instant.get("prompt_mean", ()))
    generation = _scalar(instant.get("generation_mean", ()))
    tokens, gmu, dtype = _capacity(instant.get("cache_config", ()))
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


# --- the fleet snapshot and one service's share of it (pure) ----------------------------------------


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every pod's series at ``time``, indexed by (namespace, pod); or why there are none (``error``)."""

    time: float
    ranged: Mapping[str, Mapping[PodKey, Mapping[float, float]]] = field(default_factory=dict)
    instant: Mapping[str, Mapping[PodKey, float]] = field(default_factory=dict)
    cache_config: Mapping[PodKey, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    error: tuple[str, str] | None = None
    """(condition reason, message) when the fetch failed."""
    queries: int = 0
    """How many queries the fetch sent."""
    kv_series: str = KV_USAGE
    """The engine's KV-usage series: what an absent window names."""


def _key(labels: Mapping[str, Any], pod_label: str, namespace_label: str) -> PodKey:
    return str(labels.get(namespace_label, "")), str(labels.get(pod_label, ""))


def build_fleet_snapshot(
    ranged: Mapping[str, Sequence[Mapping[str, Any]]],
    instant: Mapping[str, Sequence[Mapping[str, Any]]],
    time: float,
    *,
    pod_label: str = "pod",
    namespace_label: str = "namespace",
    queries: int = 0,
    kv_series: str = KV_USAGE,
) -> FleetSnapshot:
    """Index Prometheus' answers (the ``data.result`` lists) by pod."""
    by_pod: dict[str, dict[PodKey, Mapping[float, float]]] = {}
    for name, result in ranged.items():
        table = by_pod[name] = {}
        for series in result:
            table[_key(series.get("metric") or {}, pod_label, namespace_label)] = _series_points([series])
    _drop_blank_framebuffers(by_pod)
    scalars: dict[str, dict[PodKey, float]] = {}
    configs: dict[PodKey, list[Mapping[str, Any]]] = {}
    for name, result in instant.items():
        if name == "cache_config":
            for series in result:
                configs.setdefault(_key(series.get("metric") or {}, pod_label, namespace_label), []).append(
                    series
                )
            continue
        values = scalars[name] = {}
        for series in result:
            value = _scalar([series])
            if value is not None:
                values[_key(series.get("metric") or {}, pod_label, namespace_label)] = value
    return FleetSnapshot(
        time=time, ranged=by_pod, instant=scalars, cache_config=configs, queries=queries, kv_series=kv_series
    )


def _drop_blank_framebuffers(by_pod: dict[str, dict[PodKey, Mapping[float, float]]]) -> None:
    """Drop the instants at which a pod's framebuffer reads 0 MiB free and 0 MiB used: no GPU has a
    framebuffer of 0 MiB, so that is a GPU the exporter did not read (not yet, or no longer), not one with
    no memory free. Left in, the worst-pod minimum would take it for a full GPU and retune on it."""
    free, used = (by_pod.get(name, {}) for name in _FRAMEBUFFER)
    for key in set(free) & set(used):
        blank = {t for t, v in free[key].items() if v <= 0 and used[key].get(t, math.nan) <= 0}
        if blank:
            for table in (free, used):
                table[key] = {t: v for t, v in table[key].items() if t not in blank}


def _reduce(tables: Sequence[Mapping[float, float]], lowest: bool) -> list[list[float]]:
    merged: dict[float, float] = {}
    pick = min if lowest else max
    for table in tables:
        for t, v in table.items():
            merged[t] = pick(merged[t], v) if t in merged else v
    return [[t, merged[t]] for t in sorted(merged)]


def build_service_window(
    snapshot: FleetSnapshot,
    namespace: str,
    pods: Sequence[str],
    window_seconds: float,
    step_seconds: float,
) -> ObservationWindow:
    """The window of exactly ``pods`` in ``namespace``: each figure the worst pod's (the mean lengths over
    all of them, the smallest KV capacity), as of the snapshot's time."""
    now = snapshot.time
    if snapshot.error is not None:
        code, message = snapshot.error
        return ObservationWindow.unavailable(message, now, code)
    keys = [(namespace, p) for p in sorted(set(pods))]
    ranged: dict[str, list[dict[str, Any]]] = {}
    for name, table in snapshot.ranged.items():
        found = [table[k] for k in keys if k in table]
        ranged[name] = [{"metric": {}, "values": _reduce(found, name in _WORST_IS_LOWEST)}] if found else []
    instant: dict[str, list[Mapping[str, Any]]] = {}
    scrapes = [snapshot.instant.get("last_scrape", {}).get(k) for k in keys]
    newest = max((s for s in scrapes if s is not None), default=None)
    instant["last_scrape"] = [{"value": [now, newest]}] if newest is not None else []
    for family in ("prompt", "generation"):
        sums = [snapshot.instant.get(f"{family}_sum", {}).get(k) for k in keys]
        counts = [snapshot.instant.get(f"{family}_count", {}).get(k) for k in keys]
        total, n = sum(s for s in sums if s is not None), sum(c for c in counts if c is not None)
        present = any(s is not None for s in sums) and any(c is not None for c in counts)
        instant[f"{family}_mean"] = [{"value": [now, total / n if n > 0 else "NaN"]}] if present else []
    instant["cache_config"] = [s for k in keys for s in snapshot.cache_config.get(k, ())]
    reporting = sum(1 for k in keys if snapshot.cache_config.get(k))  # pods, not engines
    if snapshot.kv_series != KV_USAGE:  # another engine: no cache_config_info, its KV series says who reports
        reporting = sum(1 for k in keys if k in snapshot.ranged.get("kv_usage", {}))
    return build_window(
        ranged, instant, now, window_seconds, step_seconds, pods=reporting, kv_series=snapshot.kv_series
    )


# --- I/O ---------------------------------------------------------------------------------------------

_clients: dict[PrometheusSettings, PromClient] = {}
_clients_lock = threading.Lock()


def _default_client(settings: PrometheusSettings) -> PromClient:
    """One ``PrometheusConnect`` per settings (one connection pool), with one quick retry, the settings'
    TLS verification (a CA bundle, the system's, or off), auth (read per request) and extra headers."""
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            import requests
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            session = requests.Session()
            session.verify = settings.verify
            client = PrometheusConnect(
                url=settings.url,
                headers=dict(settings.headers) or None,
                auth=settings.build_auth(),
                session=session,
                retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]),
                timeout=QUERY_TIMEOUT_S,
            )
            _clients[settings] = client
        return client


def _fetch_sync(
    client: PromClient,
    settings: PrometheusSettings,
    now: float,
    window_seconds: float,
    step_seconds: float,
    series: MetricSeries | None = None,
) -> FleetSnapshot:
    queries = build_queries(window_seconds, settings.pod_label, settings.namespace_label, series)
    end = datetime.datetime.fromtimestamp(now, datetime.UTC)
    start = end - datetime.timedelta(seconds=window_seconds)
    ranged: dict[str, Any] = {}
    instant: dict[str, Any] = {}
    sent = 0
    for key, query in queries.ranged.items():
        with metrics.time_prometheus_query():
            sent += 1
            ranged[key] = client.custom_query_range(
                query, start_time=start, end_time=end, step=f"{step_seconds:g}"
            )
        if key == "kv_usage" and not ranged[key]:  # no pod of the engine anywhere: nothing else to ask
            break
    else:
        for key, query in queries.instant.items():
            with metrics.time_prometheus_query():
                sent += 1
                instant[key] = client.custom_query(query, params={"time": f"{now:.3f}"})
    return build_fleet_snapshot(
        ranged,
        instant,
        now,
        pod_label=settings.pod_label,
        namespace_label=settings.namespace_label,
        queries=sent,
        kv_series=(series.kv_usage or series.kv_used_tokens or KV_USAGE) if series is not None else KV_USAGE,
    )


async def fetch_snapshot(
    settings: PrometheusSettings,
    now: float,
    *,
    window_seconds: float,
    step_seconds: float,
    client_factory: Callable[[PrometheusSettings], PromClient] = _default_client,
    series: MetricSeries | None = None,
) -> FleetSnapshot:
    """Every pod's series at ``now`` (one query per metric; ``series``: another engine's); never raises."""
    try:
        client = client_factory(settings)
        return await asyncio.to_thread(
            _fetch_sync, client, settings, now, window_seconds, step_seconds, series
        )
    except Exception as exc:  # connection refused, TLS, timeouts, HTTP 4xx/5xx, bad JSON: all mean "no data"
        return FleetSnapshot(time=now, error=classify_error(exc, settings.url))


@dataclass(slots=True)
class _Entry:
    loop: asyncio.AbstractEventLoop
    time: float
    task: asyncio.Task[FleetSnapshot]


_snapshots: dict[tuple[Any, ...], _Entry] = {}


async def fetch_shared_snapshot(
    settings: PrometheusSettings,
    now: float,
    *,
    window_seconds: float,
    step_seconds: float,
    max_age_seconds: float,
    client_factory: Callable[[PrometheusSettings], PromClient] = _default_client,
    series: MetricSeries | None = None,
) -> FleetSnapshot:
    """The snapshot every service's timer shares: fetched again once it is ``max_age_seconds`` old (the
    tick interval), with one fetch in flight at a time (the timers that come meanwhile wait for it).
    Keyed by the settings, the window and the ``client_factory``: callers that want to share a snapshot
    pass the same factory object (a new lambda per call would fetch per service)."""
    key = (settings, window_seconds, step_seconds, client_factory, series)
    loop = asyncio.get_running_loop()
    entry = _snapshots.get(key)
    if entry is None or entry.loop is not loop or not 0 <= now - entry.time < max_age_seconds:
        task = loop.create_task(
            fetch_snapshot(
                settings,
                now,
                window_seconds=window_seconds,
                step_seconds=step_seconds,
                client_factory=client_factory,
                series=series,
            )
        )
        entry = _snapshots[key] = _Entry(loop, now, task)
    return await asyncio.shield(entry.task)


async def fetch_observations(
    prom: PrometheusSettings | str,
    namespace: str,
    name: str,
    now: float,
    *,
    pods: Sequence[str],
    window_seconds: float = 300.0,
    step_seconds: float = 30.0,
    max_age_seconds: float | None = None,
    client_factory: Callable[[PrometheusSettings], PromClient] = _default_client,
    series: MetricSeries | None = None,
) -> ObservationWindow:
    """The last ``window_seconds`` of the metrics of the service's ``pods``, from the tick's shared
    snapshot (at most ``max_age_seconds`` old, default one step); never raises. ``prom``: the settings, or
    a bare URL (no auth, system CAs). ``series``: another engine's (:class:`MetricSeries`); ``None``:
    vLLM's."""
    settings = PrometheusSettings(url=prom) if isinstance(prom, str) else prom
    if not settings.url:
        return ObservationWindow.unavailable(
            f"no Prometheus URL configured (${PROMETHEUS_URL_ENV})", now, conditions.PROMETHEUS_NOT_CONFIGURED
        )
    if not pods:
        return ObservationWindow.unavailable(f"no running pods of {namespace}/{name} to read metrics of", now)
    snapshot = await fetch_shared_snapshot(
        settings,
        now,
        window_seconds=window_seconds,
        step_seconds=step_seconds,
        max_age_seconds=step_seconds if max_age_seconds is None else max_age_seconds,
        client_factory=client_factory,
        series=series,
    )
    return build_service_window(snapshot, namespace, pods, window_seconds, step_seconds)
