"""What ``kvpilot timeline`` reads: an InferenceService from the cluster or a file, and Prometheus ranges.

The edge of :mod:`kvpilot.observability` (the timeline itself is pure: :mod:`.timeline`). The object
comes from the Kubernetes API (the operator's client: kubeconfig or in-cluster) or from a file as
``kubectl get -o yaml|json`` writes it; the ranges from Prometheus's ``/api/v1/query_range`` over the
span of ``status.history``, for the queries :func:`build_queries` names (vLLM's series from
:mod:`.series`). A Prometheus that cannot be reached gives no ranges and a warning, not a failure.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kvpilot.observability import series as s
from kvpilot.observability.timeline import Points

__all__ = ["build_queries", "fetch_ranges", "fetch_service", "read_service"]


def read_service(path: str) -> dict[str, Any]:
    """An InferenceService from a YAML or JSON file."""
    try:
        obj = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise ValueError(f"{path} is not a Kubernetes object (no metadata)")
    return obj


def fetch_service(namespace: str, name: str) -> dict[str, Any]:
    """The InferenceService ``namespace/name`` from the cluster."""
    from kvpilot.operator import api
    from kvpilot.operator.clients.kube import get_kube

    custom = get_kube().custom
    obj: Any = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return dict(obj)


def build_queries(namespace: str, name: str) -> dict[str, str]:
    """The timeline's lanes from Prometheus: the service's worst KV usage and its preemptions per second."""
    sel = s.vllm_selector(namespace, name)
    return {
        "kv_usage": f"max({s.KV_USAGE}{{{sel}}} or {s.KV_USAGE_LEGACY}{{{sel}}})",
        "preemptions": f"sum(rate({s.PREEMPTIONS}{{{sel}}}[2m]))",
    }


def fetch_ranges(url: str, namespace: str, name: str, start: float, end: float) -> dict[str, Points]:
    """Each query's points between ``start`` and ``end`` (about 300 steps); raises ``OSError`` when
    Prometheus cannot be reached and ``ValueError`` when it refuses a query."""
    step = max(15.0, math.ceil((end - start) / 300))
    out: dict[str, Points] = {}
    for key, query in build_queries(namespace, name).items():
        params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step})
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{params}", timeout=30) as rsp:
            body = json.loads(rsp.read())
        if body.get("status") != "success":
            raise ValueError(f"Prometheus refused {query!r}: {body.get('error')}")
        results = body["data"]["result"]
        out[key] = [(float(t), float(v)) for t, v in results[0]["values"]] if results else []
    return out
