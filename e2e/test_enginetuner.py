"""EngineTuner (target mode) in mode Recommend on the real local control plane.

A Deployment shaped like vLLM production-stack's chart renders (``vllm serve MODEL --flag value`` in
``command``) or like KServe's vLLM runtime (a ``bash -c`` script, the flags in ``args``), created by the
test (not by kvpilot), gets an EngineTuner; the operator (on the host, as in test_drift.py) reads its
arguments, plans, and writes ``status.recommendation``; the Deployment is never written (its generation
stays 1). Initial/Auto (the webhook over TLS) are not covered here yet.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.waits import host_operator, wait_for

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "crds" / "inferenceservices.kvpilot.io.yaml", ROOT / "crds" / "enginetuners.kvpilot.io.yaml"]
RESOURCE = "enginetuners.kvpilot.io"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
WAIT_S = 120.0


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for crd in CRDS:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{RESOURCE}", "--timeout=60s")
    log = tmp_path_factory.mktemp("enginetuner-operator") / "kopf.log"
    with host_operator(cluster, log, "kvtarget-*", {"KVPILOT_TARGET_INTERVAL": "3"}):
        yield log


# production-stack's helm/templates/deployment-vllm-multi.yaml: everything in command
PRODUCTION_STACK = (["vllm", "serve", LLAMA, "--host", "0.0.0.0", "--port", "8000",
                     "--max-model-len", "131072", "--max-num-seqs", "256",
                     "--gpu_memory_utilization", "0.95"], None)  # fmt: skip
# KServe's vLLM runtime: a bash script passing "$@", the flags in args, the model from MODEL_DIR
KSERVE = (["bash", "-c", "export MODEL=${MODEL_DIR}\nvllm serve ${MODEL} --host 0.0.0.0 --port 8000 $@\n",
           "bash"], ["--max-model-len=131072", "--max-num-seqs", "128"])  # fmt: skip


def foreign_deployment(name: str, command: list[str], args: list[str] | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "command": command,
                                 "env": [{"name": "MODEL_DIR", "value": LLAMA}],
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}  # fmt: skip
    if args is not None:
        container["args"] = args
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"model": name}},
                 "template": {"metadata": {"labels": {"model": name}}, "spec": {
                     "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [container]}}},
    }  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("layout", [PRODUCTION_STACK, KSERVE], ids=["production-stack", "kserve"])
def test_recommend_mode_writes_a_recommendation_and_never_the_target(
    cluster: LocalCluster, operator: Path, layout: tuple[list[str], list[str] | None]
) -> None:
    ns = f"kvtarget-{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(ns):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(foreign_deployment("llama", *layout)))
        tuner = {"apiVersion": "kvpilot.io/v1alpha1", "kind": "EngineTuner", "metadata": {"name": "llama"},
                 "spec": {"targetRef": {"kind": "Deployment", "name": "llama"}, "updateMode": "Recommend",
                          "model": {"id": LLAMA, "source": "Catalogue"},
                          "gpu": {"product": "NVIDIA-L4", "count": 1}}}  # fmt: skip
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(tuner))

        def recommended() -> Any:
            obj = get(cluster, RESOURCE, "llama", "-n", ns)
            rec = ((obj or {}).get("status") or {}).get("recommendation") or {}
            return obj if rec.get("settings") else None

        obj = wait_for(recommended, WAIT_S, f"{ns}/llama status.recommendation")
        status = obj["status"]
        assert status["discovered"]["model"] == LLAMA
        assert status["discovered"]["settings"]["maxModelLen"] == 131072
        # an L4 cannot hold 131072 tokens of context next to 15 GiB of weights: the plan is smaller
        assert status["recommendation"]["settings"]["maxModelLen"] < 131072
        deploy = get(cluster, "deployment", "llama", "-n", ns)
        assert deploy["metadata"]["generation"] == 1
        (c,) = deploy["spec"]["template"]["spec"]["containers"]
        assert (c["command"], c.get("args")) == layout
