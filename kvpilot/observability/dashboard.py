"""The Grafana dashboard of one InferenceService, as data: ``build_dashboard()`` returns its JSON model.

Variables ``datasource``, ``namespace`` and ``service`` (an InferenceService's name: the services the
operator exports settings for). Each panel sets the engine's series against what kvpilot decided:
KV usage against the policy's band (``kvpilot_kv_usage_threshold``), running against the applied
``max_num_seqs``, TTFT and ITL p95 against ``spec.serving.slo``, the GPU's framebuffer from
dcgm-exporter; kvpilot's decisions are annotations on every panel and a panel of their own.
docs/observability.md describes each panel; the chart ships the JSON as a ConfigMap for Grafana's
sidecar (``dashboards.enabled``).
"""

from __future__ import annotations

from typing import Any

from kvpilot.observability import series as s

__all__ = ["TITLE", "UID", "build_dashboard", "expressions"]

UID = "kvpilot-inferenceservice"
TITLE = "kvpilot / InferenceService"
RATE = "$__rate_interval"
_DS = {"type": "prometheus", "uid": "${datasource}"}
_VLLM = s.vllm_selector()
_MINE = s.service_selector()
_KV_USAGE = f"max by (pod) ({s.KV_USAGE}{{{_VLLM}}} or {s.KV_USAGE_LEGACY}{{{_VLLM}}})"


def _target(ref: str, expr: str, legend: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": _DS, "expr": expr, "legendFormat": legend}


def _kvpilot_dashed() -> dict[str, Any]:
    """kvpilot's own lines (thresholds, limits, objectives) dashed, so the engine's stand out."""
    return {
        "matcher": {"id": "byRegexp", "options": "^kvpilot .*"},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.lineWidth", "value": 2},
        ],
    }


def _panel(
    title: str, description: str, targets: list[dict[str, Any]], unit: str, **custom: Any
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": _DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"drawStyle": "line", "showPoints": "never", **custom}},
            "overrides": [_kvpilot_dashed()],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
    }


def _p95(histogram: str) -> str:
    return f"histogram_quantile(0.95, sum by (le) (rate({histogram}_bucket{{{_VLLM}}}[{RATE}])))"


def _slo_panel(short: str, meaning: str, histogram: str, objective: str) -> dict[str, Any]:
    """A latency's p95 over the service's pods, dashed against its objective in spec.serving.slo."""
    return _panel(
        f"{short} p95 against the SLO",
        f"{meaning}, 95th percentile over the service's pods; dashed: spec.serving.slo.",
        [
            _target("A", _p95(histogram), f"{short} p95"),
            _target(
                "B", f'max({s.SLO_SECONDS}{{{_MINE}, objective="{objective}"}})', f"kvpilot SLO {objective}"
            ),
        ],
        "s",
    )


def _panels() -> list[dict[str, Any]]:
    kv = _panel(
        "KV cache usage against kvpilot's band",
        "vLLM's share of KV blocks in use, per pod; dashed: the closed loop's band (above 'high' it calls "
        "the cache under pressure, below 'low' it may give memory back; 'target' is where a retune aims).",
        [
            _target("A", _KV_USAGE, "{{pod}}"),
            _target("B", f"max by (threshold) ({s.KV_THRESHOLD}{{{_MINE}}})", "kvpilot {{threshold}}"),
        ],
        "percentunit",
        min=0,
        max=1,
    )
    preempt = _panel(
        "Preemptions",
        "Requests vLLM preempted (its KV cache was full) per second, per pod.",
        [_target("A", f"sum by (pod) (rate({s.PREEMPTIONS}{{{_VLLM}}}[{RATE}]))", "{{pod}}")],
        "reqps",
    )
    queue = _panel(
        "Queue",
        "Requests waiting for a place in the running batch, per pod.",
        [_target("A", f"sum by (pod) ({s.WAITING}{{{_VLLM}}})", "{{pod}}")],
        "short",
    )
    running = _panel(
        "Running against max_num_seqs",
        "Requests in the running batch, per pod; dashed: the max_num_seqs kvpilot applied.",
        [
            _target("A", f"sum by (pod) ({s.RUNNING}{{{_VLLM}}})", "{{pod}}"),
            _target(
                "B", f'max({s.APPLIED_SETTING}{{{_MINE}, setting="max_num_seqs"}})', "kvpilot max_num_seqs"
            ),
        ],
        "short",
    )
    ttft = _slo_panel("TTFT", "Time to first token", s.TTFT, "ttft_p95")
    itl = _slo_panel("ITL", "Inter-token latency", s.ITL, "itl_p95")
    gpu = _panel(
        "GPU memory (dcgm-exporter)",
        "Framebuffer used and free on the service's GPUs (dcgm-exporter in its Kubernetes mode); what "
        "gpu_memory_utilization leaves free shows here. Empty without dcgm-exporter.",
        [
            _target("A", s.gpu_of_service(s.FB_USED), "used {{pod}}"),
            _target("B", s.gpu_of_service(s.FB_FREE), "free {{pod}}"),
        ],
        "decmbytes",
        stacking={"mode": "normal"},
        fillOpacity=20,
    )
    settings = _panel(
        "Applied settings",
        "What kvpilot gives the engine, as steps: each retune or rollback moves one.",
        [_target("A", f"max by (setting) ({s.APPLIED_SETTING}{{{_MINE}}})", "{{setting}}")],
        "short",
        lineInterpolation="stepAfter",
    )
    decisions = _panel(
        "Decisions",
        "kvpilot's decisions for this service (status.history actions), by kind.",
        [_target("A", f"sum by (kind) (increase({s.DECISIONS}{{{_MINE}}}[{RATE}])) > 0", "{{kind}}")],
        "short",
        drawStyle="bars",
        fillOpacity=80,
    )
    return [kv, preempt, queue, running, ttft, itl, gpu, settings, decisions]


def _layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two panels a row, 8 units high; ids in order."""
    return [
        {"id": i + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}, **p}
        for i, p in enumerate(panels)
    ]


def _variables() -> list[dict[str, Any]]:
    def query(name: str, label: str, selector: str) -> dict[str, Any]:
        q = f"label_values({s.APPLIED_SETTING}{selector}, {label})"
        return {
            "name": name,
            "label": name.capitalize(),
            "type": "query",
            "datasource": _DS,
            "query": {"query": q, "refId": f"{name}-values"},
            "definition": q,
            "refresh": 2,
            "sort": 1,
            "includeAll": False,
            "multi": False,
        }

    datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    return [
        datasource,
        query("namespace", "namespace", ""),
        query("service", "inferenceservice", '{namespace="$namespace"}'),
    ]


def _annotations() -> list[dict[str, Any]]:
    return [
        {
            "name": "kvpilot decisions",
            "datasource": _DS,
            "enable": True,
            "iconColor": "orange",
            "expr": f"increase({s.DECISIONS}{{{_MINE}}}[2m]) > 0",
            "step": "1m",
            "titleFormat": "kvpilot: {{kind}}",
            "textFormat": "{{namespace}}/{{inferenceservice}}",
            "tagKeys": "kind",
        }
    ]


def build_dashboard() -> dict[str, Any]:
    """The dashboard's JSON model (Grafana 10+, schema 39)."""
    return {
        "uid": UID,
        "title": TITLE,
        "description": "One InferenceService: vLLM's KV cache, queue and latency against what kvpilot "
        "decided (generated by python -m kvpilot.observability; docs/observability.md).",
        "tags": ["kvpilot", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": _variables()},
        "annotations": {"list": _annotations()},
        "panels": _layout(_panels()),
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of ``dashboard``: panels' targets, annotations, variables' queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    return exprs
