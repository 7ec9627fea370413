"""EngineTuner (target mode) in mode Recommend on the real local control plane.

A Deployment shaped like vLLM production-stack's chart renders (``vllm serve MODEL --flag value`` in
``command``) or like KServe's vLLM runtime (a ``bash -c`` script, the flags in ``args``), created by the
test (not by kvpilot), gets an EngineTuner; the operator (on the host, as in test_drift.py) reads its
arguments, plans, and writes ``status.recommendation``; the Deployment is never written (its generation
stays 1). Initial and Auto (the webhook called over TLS): test_enginetuner_webhook.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.targets import (
    KSERVE,
    LLAMA,
    PRODUCTION_STACK,
    RESOURCE,
    engine_tuner,
    foreign_deployment,
    get,
    install_crds,
)
from e2e.waits import host_operator, wait_for

WAIT_S = 120.0


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    install_crds(cluster)
    log = tmp_path_factory.mktemp("enginetuner-operator") / "kopf.log"
    with host_operator(cluster, log, "kvtarget-*", {"KVPILOT_TARGET_INTERVAL": "3"}):
        yield log


@pytest.mark.e2e
@pytest.mark.parametrize("layout", [PRODUCTION_STACK, KSERVE], ids=["production-stack", "kserve"])
def test_recommend_mode_writes_a_recommendation_and_never_the_target(
    cluster: LocalCluster, operator: Path, layout: tuple[list[str], list[str] | None]
) -> None:
    ns = f"kvtarget-{uuid.uuid4().hex[:8]}"
    with cluster.temporary_namespace(ns):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(foreign_deployment("llama", *layout)))
        tuner = engine_tuner("llama", "Recommend")
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

        def available() -> Any:  # from the target's pod, Ready (KWOK), whatever flags it runs
            conds = ((get(cluster, RESOURCE, "llama", "-n", ns) or {}).get("status") or {}).get("conditions")
            found = {x["type"]: x for x in conds or ()}
            return found if found.get("Available", {}).get("status") == "True" else None

        found = wait_for(available, WAIT_S, f"{ns}/llama Available=True")
        assert found["Available"]["reason"] == "Serving"
        assert (found["Degraded"]["status"], found["Degraded"]["reason"]) == ("False", "Healthy")
