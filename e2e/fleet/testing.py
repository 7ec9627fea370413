"""Helpers the fleet and closed-loop e2e tests share (manifests, waits, Prometheus queries)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from e2e.fleet.truth import GroundTruth

# H100 80GB (torch sees 79.11 GiB) and Llama-3.1-8B in bf16: 128 KiB of KV per token.
# 20 GiB outside the KV cache (15 GiB of weights, activations, CUDA graphs, non-torch memory).
H100_8B = GroundTruth(
    gpu_memory_gib=79.11,
    non_kv_gib=20.0,
    kv_bytes_per_token=131072,
    default_max_num_seqs=1024,
    startup_s=1.0,
    backoff_s=3.0,
    oom_after_s=3.0,
)
"""The e2e suites' usual pod: a fast start (1 s), a short back-off and a quick OOM."""


def catalogue_isvc(
    name: str, namespace: str, model: str, gpu_product: str, serving: dict[str, Any], tuning: dict[str, Any]
) -> dict[str, Any]:
    """An InferenceService of a catalogue model on one GPU of ``gpu_product`` (a GFD product name)."""
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"id": model, "source": "Catalogue"},
            "gpu": {"count": 1, "product": gpu_product},
            "serving": serving,
            "tuning": tuning,
        },
    }


MANAGED_LABELS = {"app.kubernetes.io/managed-by": "kvpilot", "app.kubernetes.io/name": "vllm"}


def vllm_deployment(
    name: str,
    namespace: str,
    args: list[str],
    *,
    replicas: int = 1,
    gpu_product: str | None = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 1,
) -> dict[str, Any]:
    """A Deployment shaped like the operator's (labels per docs/api-contract.md) running ``vllm serve``."""
    labels = {**MANAGED_LABELS, "app.kubernetes.io/instance": name, "kvpilot.io/inferenceservice": name}
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.33.0",
                "args": args,
                "ports": [{"name": "http", "containerPort": 8000}],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
    }
    if gpu_product:
        pod_spec["nodeSelector"] = {"nvidia.com/gpu.product": gpu_product}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name, **MANAGED_LABELS}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def wait_until(cond: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.5) -> Any:
    """Poll ``cond`` until it returns something truthy; raise with ``what`` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    err: Exception | None = None
    while True:
        try:
            last = cond()
            if last:
                return last
        except Exception as e:  # retried until the deadline
            err = e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last={last!r} error={err!r}"
            )
        time.sleep(interval)


def pod_json(kubectl: Callable[..., Any], namespace: str, selector: str) -> list[dict[str, Any]]:
    out = kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def series_value(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None
