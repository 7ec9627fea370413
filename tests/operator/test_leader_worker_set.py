"""kvpilot's LeaderWorkerSet (:mod:`kvpilot.operator.pods.leader_worker_set`) against the LWS CRD's schema.

The schema is LWS v0.10.0's CRD (``tests/data/lws``, provenance in ``tests/data/README.md``), checked with
jsonschema (the OpenAPI v3 structural subset it uses is JSON Schema; ``x-kubernetes-*`` keys are ignored).
The Deployment it starts from is the one ``kvpilot render`` builds for a single-node spec of the same pod.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # locked in requirements/dev.txt (via vllm)
import pytest
import yaml

from kvpilot.operator import api
from kvpilot.operator.pods import leader_worker_set as lws
from kvpilot.operator.pods import rollout_strategy, workloads
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings

CRD = (
    Path(__file__).resolve().parents[1] / "data" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
)
META = {"name": "dsv3", "namespace": "ml", "uid": "u-1"}


def _schema() -> dict[str, Any]:
    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"]) == (
        "leaderworkerset.x-k8s.io",
        "v1",
        lws.KIND,
    )
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


SCHEMA = _schema()


def _spec(nodes: int, **rollout: Any) -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": "meta-llama/Llama-3.1-70B-Instruct"},
            "replicas": 2,
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": nodes},
            **({"rollout": rollout} if rollout else {}),
        }
    )


def _lws(nodes: int = 2, **rollout: Any) -> dict[str, Any]:
    spec = _spec(nodes, **rollout)
    settings = EngineSettings(max_model_len=32768, tensor_parallel_size=8, gpu_memory_utilization=0.9)
    deployment = workloads.build_deployment(META, spec, settings, [], ["NVIDIA-H100-80GB-HBM3"])
    return lws.build_leader_worker_set(deployment, nodes)


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    out: dict[str, Any] = container
    return out


def test_the_leader_worker_set_is_valid_against_the_lws_crd_schema() -> None:
    for nodes in (2, 4):
        jsonschema.validate(_lws(nodes), SCHEMA)
    jsonschema.validate(_lws(2, strategy="Recreate"), SCHEMA)


def test_the_schema_check_would_catch_a_wrong_field() -> None:
    bad = _lws()
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    bad = _lws()
    del bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_every_pod_runs_the_group_flags_the_leader_serves_the_workers_are_headless() -> None:
    group = _lws(2)["spec"]["leaderWorkerTemplate"]
    assert (group["size"], group["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    leader, worker = _container(group["leaderTemplate"]), _container(group["workerTemplate"])
    assert leader["args"][-6:] == [
        vllm.NNODES_FLAG,
        "2",
        vllm.NODE_RANK_FLAG,
        "0",
        vllm.MASTER_ADDR_FLAG,
        "$(LWS_LEADER_ADDRESS)",
    ]
    assert worker["args"][-7:] == [
        vllm.NNODES_FLAG,
        "2",
        vllm.NODE_RANK_FLAG,
        "$(LWS_WORKER_INDEX)",
        vllm.MASTER_ADDR_FLAG,
        "$(LWS_LEADER_ADDRESS)",
        vllm.HEADLESS_FLAG,
    ]
    # TP 8 within a node, one pipeline stage per node: 2 x 8 GPUs, 8 per pod.
    for args in (leader["args"], worker["args"]):
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    # quantities as strings: LWS's webhook turns an integer into one on create only (a flip at each apply)
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" in leader and "ports" in leader
    assert not {"readinessProbe", "livenessProbe", "startupProbe", "ports"} & set(worker)
    assert "prometheus.io/scrape" in group["leaderTemplate"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in group["workerTemplate"]["metadata"].get("annotations", {})


def test_the_pod_is_the_deployments_but_for_the_role_flags() -> None:
    spec = _spec(2)
    settings = EngineSettings(max_model_len=32768, tensor_parallel_size=8)
    deployment = workloads.build_deployment(META, spec, settings, [], ["NVIDIA-H100-80GB-HBM3"])
    leader = lws.build_leader_worker_set(deployment, 2)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    expected = deployment["spec"]["template"]
    quantities = {b: {k: str(v) for k, v in q.items()} for b, q in _container(expected)["resources"].items()}
    assert {**_container(leader), "args": None} == {
        **_container(expected),
        "args": None,
        "resources": quantities,  # the same quantities, written as strings
    }
    assert {k: v for k, v in leader["spec"].items() if k != "containers"} == {
        k: v for k, v in expected["spec"].items() if k != "containers"
    }


def test_groups_roll_as_the_deployment_would() -> None:
    surge = lws.build_rollout_strategy(
        rollout_strategy.build_deployment_strategy(rollout_strategy.DEFAULT), 2
    )
    assert surge == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert lws.build_rollout_strategy({"type": "Recreate"}, 3)["rollingUpdateConfiguration"] == {
        "maxUnavailable": 3,
        "maxSurge": 0,
    }


def test_one_node_is_not_a_group() -> None:
    with pytest.raises(ValueError, match="at least 2 nodes"):
        lws.build_leader_worker_set({"spec": {}}, 1)
