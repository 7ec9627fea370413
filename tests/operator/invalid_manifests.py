"""A table of invalid InferenceServices and how each must be answered.

Used by the unit tests (tests/operator/test_invalid_manifests.py: the pydantic models +
CEL equivalents refuse the ``schema`` and ``cel`` cases; the handler answers the
``operator`` cases with Ready=False) and by the e2e suite (e2e/test_operator.py:
``kubectl apply`` is refused by the API server for ``schema`` and ``cel`` cases, and the
running operator answers the others with Ready=False + a Warning event).

``expect``:
  * ``schema``   -- the structural schema (types, enums, patterns, minimums, unknown fields); ``match``
    is the full path of the refused field as the API server prints it (``spec.engine.tolerations[0].effect``)
  * ``cel``      -- an ``x-kubernetes-validations`` rule; ``match`` is a substring of its message
  * ``operator`` -- accepted by the API server; ``match`` is the Ready condition's reason
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

BASE: dict[str, Any] = {
    "apiVersion": "kvpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "invalid"},
    "spec": {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpu": {"count": 1, "product": "L4"}},
}


@dataclass(frozen=True)
class Case:
    name: str
    expect: str
    match: str
    patch: dict[str, Any]
    """Merged into BASE["spec"] (a ``None`` value deletes the key)."""

    def manifest(self) -> dict[str, Any]:
        body = copy.deepcopy(BASE)
        body["metadata"]["name"] = f"invalid-{self.name}"
        _merge(body["spec"], self.patch)
        return body


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


CASES: tuple[Case, ...] = (
    # --- structural schema ---------------------------------------------------------------------------
    Case("no-model", "schema", "spec.model", {"model": None}),
    Case("bad-model-id", "schema", "spec.model.id", {"model": {"id": "not a model id!"}}),
    Case("zero-gpus", "schema", "spec.gpu.count", {"gpu": {"count": 0}}),
    Case("zero-nodes", "schema", "spec.gpu.nodesPerReplica", {"gpu": {"nodesPerReplica": 0}}),
    Case("unknown-mode", "schema", "spec.tuning.mode", {"tuning": {"mode": "Turbo"}}),
    Case("unknown-engine-kind", "schema", "spec.engine.kind", {"engine": {"kind": "Triton"}}),
    Case(
        "utilisation-above-one",
        "schema",
        "spec.engine.pinned.gpuMemoryUtilization",
        {"engine": {"pinned": {"gpuMemoryUtilization": 1.5}}},
    ),
    Case(
        "bad-kv-dtype",
        "schema",
        "spec.engine.pinned.kvCacheDtype",
        {"engine": {"pinned": {"kvCacheDtype": "int3"}}},
    ),
    Case("negative-replicas", "schema", "spec.replicas", {"replicas": -1}),
    Case("unknown-field", "schema", "spec.engine.batchSize", {"engine": {"batchSize": 32}}),
    Case(
        "bad-toleration-effect",
        "schema",
        "spec.engine.tolerations[0].effect",
        {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "Sometimes"}]}},
    ),
    # --- CEL rules --------------------------------------------------------------------------------------
    Case(
        "min-context-above-max",
        "cel",
        "minContextLength must not exceed",
        {"serving": {"minContextLength": 32768, "maxContextLength": 8192}},
    ),
    Case("configmap-without-ref", "cel", "configMapRef is required", {"model": {"source": "ConfigMap"}}),
    Case(
        "configmapref-with-catalogue",
        "cel",
        "configMapRef is only used",
        {"model": {"configMapRef": {"name": "cfg"}}},
    ),
    Case(
        "hub-token-without-hub",
        "cel",
        "hubTokenSecretRef is only used",
        {"model": {"hubTokenSecretRef": {"name": "hf"}}},
    ),
    Case(
        "tp-does-not-divide",
        "cel",
        "tensorParallelSize must divide",
        {"gpu": {"count": 4, "tensorParallelSize": 3}},
    ),
    Case(
        "too-many-gpus-across-nodes",
        "cel",
        "a replica holds at most 512 GPUs",
        {"gpu": {"count": 64, "nodesPerReplica": 9}},
    ),
    Case(
        "nodes-share-a-read-write-once-claim",
        "cel",
        "mounts model.storage.claimTemplate on",
        {
            "gpu": {"count": 8, "nodesPerReplica": 2},
            "model": {"storage": {"claimTemplate": {"size": "100Gi"}}},
        },
    ),
    Case(
        "pinned-outside-bounds",
        "cel",
        "maxNumSeqs is outside",
        {"engine": {"pinned": {"maxNumSeqs": 512}}, "tuning": {"bounds": {"maxNumSeqs": {"max": 256}}}},
    ),
    Case(
        "bounds-min-above-max",
        "cel",
        "min must not exceed max",
        {"tuning": {"bounds": {"gpuMemoryUtilization": {"min": 0.9, "max": 0.8}}}},
    ),
    Case(
        "inline-hf-token",
        "cel",
        "do not inline a Hugging Face token",
        {"engine": {"env": [{"name": "HF_TOKEN", "value": "hf_abc"}]}},
    ),
    Case(
        "gpus-in-resources",
        "cel",
        "set GPUs with gpu.count",
        {"engine": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
    ),
    Case("pinned-fp8-not-allowed", "cel", "allowFp8KvCache", {"engine": {"pinned": {"kvCacheDtype": "fp8"}}}),
    Case("recreate-without-downtime", "cel", "allowDowntime", {"rollout": {"strategy": "Recreate"}}),
    Case("sglang-with-vllm-image", "cel", "engine.image is a vLLM image", {"engine": {"kind": "SGLang"}}),
    Case(
        "rollout-strategy-unknown", "schema", "spec.rollout.strategy", {"rollout": {"strategy": "BlueGreen"}}
    ),
    Case(
        "rollout-max-unavailable-zero",
        "schema",
        "spec.rollout.maxUnavailable",
        {"rollout": {"maxUnavailable": 0}},
    ),
    Case(
        "pinned-len-below-min-context",
        "cel",
        "below serving.minContextLength",
        {"engine": {"pinned": {"maxModelLen": 4096}}, "serving": {"minContextLength": 8192}},
    ),
    Case(
        "node-selector-bad-key",
        "cel",
        "nodeSelector keys must be label keys",
        {"nodeSelector": {"zone name!": "a"}},
    ),
    Case(
        "node-selector-bad-value",
        "cel",
        "nodeSelector values must be label values",
        {"nodeSelector": {"example.com/zone": "a b"}},
    ),
    Case(
        "node-selector-long-value",
        "cel",
        "nodeSelector values must be label values",
        {"nodeSelector": {"example.com/zone": "a" * 64}},
    ),
    Case(
        "toleration-bad-key",
        "cel",
        "a toleration key must be a label key",
        {"engine": {"tolerations": [{"key": "-gpu-", "operator": "Exists"}]}},
    ),
    Case(
        "toleration-exists-with-value",
        "cel",
        "operator Exists takes no value",
        {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}},
    ),
    Case(
        "toleration-no-key-equal",
        "cel",
        "without a key must use operator Exists",
        {"engine": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
    ),
    Case(
        "toleration-seconds-not-noexecute",
        "cel",
        "tolerationSeconds is only for effect NoExecute",
        {"engine": {"tolerations": [{"key": "gpu", "operator": "Exists", "tolerationSeconds": 60}]}},
    ),
    # --- semantic: accepted by the API server, refused by the operator ---------------------------------
    Case("unknown-model", "operator", "UnknownModel", {"model": {"id": "acme/NoSuchModel-7B"}}),
    Case(
        "nodes-per-replica-without-leaderworkerset",
        "operator",
        "LeaderWorkerSetNotInstalled",
        {"gpu": {"count": 8, "nodesPerReplica": 2}},
    ),
    Case("unknown-gpu", "operator", "UnknownGpu", {"gpu": {"product": "GTX-480"}}),
    Case(
        "tgi-model-type-it-does-not-serve",  # Qwen3: no model of TGI 3.3.7's own (models/__init__.py)
        "operator",
        "InvalidEngineArgs",
        {
            "model": {"id": "Qwen/Qwen3-8B"},
            "engine": {"kind": "TGI", "image": "ghcr.io/huggingface/text-generation-inference:3.3.7"},
        },
    ),
    Case(
        "bogus-extra-arg", "operator", "InvalidEngineArgs", {"engine": {"extraArgs": ["--batch-size", "32"]}}
    ),
    Case(
        "bogus-kv-dtype-arg",
        "operator",
        "InvalidEngineArgs",
        {"engine": {"extraArgs": ["--kv-cache-dtype", "int3"]}},
    ),
    Case(
        "extra-arg-out-of-range",
        "operator",
        "InvalidEngineArgs",
        {"engine": {"extraArgs": ["--max-model-len", "9" * 400]}},
    ),
    Case(
        "extra-arg-contradicts-pinned",
        "operator",
        "InvalidSpec",
        {"engine": {"extraArgs": ["--max-num-seqs", "4"], "pinned": {"maxNumSeqs": 8}}},
    ),
    Case("extra-arg-port", "operator", "InvalidSpec", {"engine": {"extraArgs": ["--port=9000"]}}),
    Case(
        "extra-arg-pipeline-overflows-gpus",
        "operator",
        "InvalidSpec",
        {"engine": {"extraArgs": ["-pp", "8"]}},
    ),
    Case(
        "extra-arg-dtype-float32",
        "operator",
        "InvalidSpec",
        {"engine": {"extraArgs": ["--dtype", "float32"]}},
    ),
    Case(
        "gpu-product-vs-node-selector",
        "operator",
        "InvalidSpec",
        {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    ),
    Case(
        "does-not-fit",
        "operator",
        "Infeasible",
        {
            "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
            "gpu": {"count": 1, "product": "L4"},
            "serving": {"minContextLength": 8192},
        },
    ),
)
