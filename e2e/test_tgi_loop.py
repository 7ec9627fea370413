"""TGI's closed loop end to end: real control plane, real Prometheus, the fleet playing TGI pods.

Each scenario is one ``spec.engine.kind: TGI`` InferenceService (Llama-3.1-8B on an H100) in its own
namespace; the fleet plays its pods as TGI 3.3.7 (:mod:`e2e.fleet.tgi_truth`: the KV its warm-up infers, its
failure texts, its ``/metrics``) against the scenario's ground truth, never kvpilot's memory model. The
operator runs on the host with the closed-loop pace of :func:`e2e.fleet.stack.closed_loop_env`, with a 12 s
probation (:data:`PROBATION_S`). Both scenarios' prefill activations are 1.2 GiB per 1000 tokens
(:data:`PREFILL_GIB_PER_1K`, ten times the 8B's): the warm-up's peak outgrows the H100 at about 60 000 prefill
tokens and fits at half that.

* ``prefill`` (mode Auto): kvpilot's plan asks for a 59 870-token prefill (the launcher's compute-optimal
  size on an H100): every start fails with TGI's "Not enough memory to handle N prefill tokens"; the loop
  halves the prefill (``StartOOM``; ``appliedEngineArgs`` and the Deployment follow), and the new pods start,
  become Ready and pass probation (``lastGoodEngineArgs``).
* ``recommend`` (mode Recommend): TGI's own defaults run (the scenario's launcher default, 60 000 prefill
  tokens) and fail the same way: the loop recommends a smaller prefill (``status.recommendation``, a
  ``Recommended`` event) and changes nothing.
* ``admission`` (mode Auto, the scenario's usual prefill): ``serving.concurrency`` 4 is
  ``--max-concurrent-requests`` 4, and eight requests a second keep the router at that limit (the rest
  answered 429 "Model is overloaded" and counted in ``tgi_request_failure{err="overloaded"}``) with the KV
  tokens nearly empty: the loop raises ``--max-concurrent-requests`` (``IdleCapacity``, its reason naming
  the 429 rate Prometheus measured), which rolls out, becomes Ready and passes probation.

All run at once; nothing is skipped: a missing binary fails the fixture.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Workload
from e2e.fleet.stack import Stack, condition, isvc_events, run_engine_cases
from e2e.fleet.testing import H100_8B
from kvpilot.tuner import tgi

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)
ADMISSION = Workload(arrival_rate=8.0, prompt_tokens=500, output_tokens=200)
PROBATION_S = 12.0
PREFILL_GIB_PER_1K = 1.2
PREFILL_LIMIT = 30_000
"""At most this many prefill tokens fit the warm-up (59 870 do not: the peak reaches 95 GiB)."""


@dataclass
class Case:
    serving: dict[str, Any]
    truth: GroundTruth
    mode: str = "Auto"
    workload: Workload = LIGHT
    ns: str = ""


CASES: dict[str, Case] = {
    "prefill": Case(
        {"maxContextLength": 8192},
        dataclasses.replace(H100_8B, tgi_prefill_gib_per_1k_tokens=PREFILL_GIB_PER_1K),
    ),
    "recommend": Case(
        {"maxContextLength": 8192},
        dataclasses.replace(
            H100_8B,
            tgi_prefill_gib_per_1k_tokens=PREFILL_GIB_PER_1K,
            tgi_default_max_batch_prefill_tokens=60_000,
        ),
        mode="Recommend",
    ),
    "admission": Case({"maxContextLength": 8192, "concurrency": 4}, H100_8B, workload=ADMISSION),
}


def isvc_manifest(name: str, ns: str, case: Case) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"id": MODEL, "source": "Catalogue"},
            "gpu": {"count": 1, "product": H100},
            "engine": {"kind": "TGI", "image": IMAGE},
            "serving": case.serving,
            "tuning": {"mode": case.mode, **FAST},
        },
    }


def flags(args: list[str] | None) -> tgi.TgiSettings:
    """TGI's flags parsed as the operator parses them."""
    return tgi.parse_tgi_args([str(a) for a in args or ()])


def status(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


@dataclass
class Loop:
    stack: Stack
    cases: dict[str, Case]
    t0: float

    def wait(self, case: str, cond: Any, *, timeout: float, what: str) -> dict[str, Any]:
        return self.stack.wait_isvc(self.cases[case].ns, case, cond, timeout=timeout, what=f"{case}: {what}")

    def events(self, case: str) -> list[dict[str, Any]]:
        return isvc_events(self.stack.kubectl, self.cases[case].ns, case)

    def deployment_args(self, case: str) -> list[str]:
        out = self.stack.kubectl("get", "deployment", case, "-n", self.cases[case].ns, "-o", "json").stdout
        container = json.loads(out)["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["text-generation-launcher"], container["command"]
        return [str(a) for a in container.get("args") or ()]

    def budget_left(self, seconds: float) -> float:
        return max(10.0, seconds - (time.monotonic() - self.t0))


@pytest.fixture(scope="module")
def loop(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    run_dir = Path(tmp_path_factory.mktemp("tgi-loop"))
    cases = {k: dataclasses.replace(v) for k, v in CASES.items()}
    with run_engine_cases(
        cluster, run_dir, "e2e-tgi", cases, isvc_manifest, probation_s=PROBATION_S, what="TGI loop"
    ) as stack:
        yield Loop(stack, cases, time.monotonic())


def test_a_warmup_that_cannot_hold_the_prefill_gets_a_smaller_one_rolled_out_and_becomes_ready(
    loop: Loop,
) -> None:
    def good(o: dict[str, Any]) -> bool:
        st = status(o)
        applied = st.get("appliedEngineArgs")
        prefill = flags(applied).max_batch_prefill_tokens if applied else None
        return (
            prefill is not None
            and prefill <= PREFILL_LIMIT
            and st.get("lastGoodEngineArgs") == applied
            and not st.get("rollout")
            and condition(o, "Available").get("status") == "True"
        )

    obj = loop.wait("prefill", good, timeout=loop.budget_left(180), what="a smaller prefill, Ready, good")
    st = status(obj)
    now = flags(st["appliedEngineArgs"])
    assert flags(loop.deployment_args("prefill")) == now
    failed = st.get("failedEngineArgs") or []
    assert any(
        f["failure"] == "start_oom" and (flags(f["args"]).max_batch_prefill_tokens or 0) > PREFILL_LIMIT
        for f in failed
    ), failed
    retuned = [h for h in st.get("history") or () if h.get("action") == "Retuned"]
    assert retuned and retuned[0]["trigger"] == "StartOOM", st.get("history")
    reasons = [e["reason"] for e in loop.events("prefill")]
    assert {"Retuned", "StartOOM", "RolloutSucceeded"} <= set(reasons), reasons
    assert condition(obj, "ClosedLoop")["reason"] == "Tuning"


def test_recommend_records_a_smaller_prefill_and_changes_nothing(loop: Loop) -> None:
    obj = loop.wait(
        "recommend",
        lambda o: (status(o).get("recommendation") or {}).get("trigger") == "StartOOM",
        timeout=loop.budget_left(180),
        what="a smaller prefill recommended",
    )
    recommended = flags(status(obj)["recommendation"]["engineArgs"])
    assert (recommended.max_batch_prefill_tokens or 0) <= PREFILL_LIMIT, recommended
    assert "--max-batch-prefill-tokens" not in loop.deployment_args("recommend")  # TGI's defaults run
    assert not status(obj).get("appliedEngineArgs")
    reasons = [e["reason"] for e in loop.events("recommend")]
    assert "Recommended" in reasons and "Retuned" not in reasons, reasons


def test_requests_at_the_admission_limit_with_spare_kv_raise_it_and_the_raise_rolls_out(loop: Loop) -> None:
    def raised(o: dict[str, Any]) -> bool:
        st = status(o)
        applied = st.get("appliedEngineArgs")
        limit = flags(applied).max_concurrent_requests if applied else None
        return (
            limit is not None
            and limit > 4
            and st.get("lastGoodEngineArgs") == applied
            and not st.get("rollout")
            and condition(o, "Available").get("status") == "True"
        )

    obj = loop.wait("admission", raised, timeout=loop.budget_left(300), what="a raised admission limit, good")
    st = status(obj)
    assert flags(loop.deployment_args("admission")) == flags(st["appliedEngineArgs"])
    retuned = [h for h in st.get("history") or () if h.get("action") == "Retuned"]
    assert retuned and retuned[0]["trigger"] == "IdleCapacity", st.get("history")
    assert "429s" in retuned[0]["reason"] and "/s on average" in retuned[0]["reason"], retuned[0]  # the rate
    assert not st.get("failedEngineArgs"), st.get("failedEngineArgs")
    reasons = [e["reason"] for e in loop.events("admission")]
    assert {"Retuned", "RolloutSucceeded"} <= set(reasons), reasons
