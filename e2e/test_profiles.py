"""Fleet learning end to end: what one service learns about a model on an L4, the next one starts from.

Real control plane, real Prometheus, the fleet simulator, the operator on the host (as in
``e2e/test_closed_loop.py``), and the TuningProfile CRD (crds/tuningprofiles.kvpilot.io.yaml), installed
for this module and removed after it (so no other module's plans start from what this one learned).

The story, on the KWOK L4 pool with Llama-3.1-8B-Instruct (ground truth: ``L4_8B``, the fleet's physics):

1. service A is planned at the memory model's utilisation U (0.91 on an L4); the GPU hits CUDA OOM
   while serving above U - 0.02, so the closed loop lowers A and it settles; the operator records the OOM in
   the TuningProfile of (its namespace, config digest, L4, vLLM 0.33.0, the plain engine, auto KV, TP 1 /
   PP 1), which ``kubectl get tuningprofiles`` shows with its scope, namespace and OOM ceiling;
2. service B (same model, same pool, same namespace) is planned at or below that ceiling from the start,
   its Planned event and ``status.profile`` name the profile, and it serves past the time the OOM used to
   strike; service D, the same in another namespace (no sharing configured: the default), is planned by the
   memory model alone (U), and an administrator freezes the profile (``spec.frozen``, the FROZEN column);
3. the profile is deleted; the re-plans (a new service C, and B after a spec change) are the memory model's
   again (U, no profile named). The fleet stops injecting OOMs from then on, so that nothing relearns the
   ceiling while those plans are read.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.stack import REPO, Stack, condition, deployment_args, isvc_events
from e2e.fleet.testing import catalogue_isvc, wait_until
from e2e.waits import wait_established
from kvpilot.operator.planning.profiles import LIST_TTL_S
from kvpilot.tuner.memory import MEMORY_MODEL_VERSION
from kvpilot.tuner.plan.profiles import UTILIZATION_MARGIN

PROFILE_CRD = REPO / "crds" / "tuningprofiles.kvpilot.io.yaml"
PROFILES = "tuningprofiles.kvpilot.io"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
L4 = "NVIDIA-L4"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
SERVING = {"maxContextLength": 4096, "concurrency": 4}

# An L4 (torch sees 21.96 GiB) and Llama-3.1-8B in bf16 (128 KiB of KV per token): 15.9 GiB outside the
# KV cache, so 0.91 leaves 4.1 GiB (33k tokens) and 0.89 leaves 3.6 GiB (29k tokens) for a 4096 context.
L4_8B = GroundTruth(
    gpu_memory_gib=21.96,
    non_kv_gib=15.9,
    kv_bytes_per_token=131072,
    default_max_num_seqs=256,
    startup_s=1.0,
    backoff_s=3.0,
    oom_after_s=3.0,
)
LIGHT = Workload(arrival_rate=1.0, prompt_tokens=400, output_tokens=100)


def isvc(name: str, ns: str, serving: dict[str, Any] = SERVING) -> dict[str, Any]:
    return catalogue_isvc(name, ns, MODEL, L4, serving, {"mode": "Auto", **FAST})


@dataclasses.dataclass
class World:
    stack: Stack
    ns: str
    other: str
    """Another tenant's namespace: nothing learned in ``ns`` reaches its plans."""

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.stack.kubectl(*args, **kw)

    def get(self, name: str) -> dict[str, Any]:
        return self.stack.isvc(self.ns, name)

    def wait(self, name: str, cond: Any, *, timeout: float, what: str) -> dict[str, Any]:
        return self.stack.wait_isvc(self.ns, name, cond, timeout=timeout, what=f"{name}: {what}")

    def profiles(self) -> list[dict[str, Any]]:
        return list(json.loads(self.kubectl("get", PROFILES, "-o", "json").stdout)["items"])

    def truth(self, name: str, oom_above: float | None) -> None:
        assert self.stack.fleet is not None
        truth = dataclasses.replace(L4_8B, runtime_oom_above_utilization=oom_above)
        self.stack.fleet.set_scenario(self.ns, name, Scenario(name=name, truth=truth, workload=LIGHT))


def applied(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("applied") or {})


def history(obj: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [e for e in obj.get("status", {}).get("history") or [] if e.get("action") == action]


def settled(obj: dict[str, Any]) -> bool:
    s = obj.get("status", {})
    return (
        condition(obj, "Ready").get("status") == "True"
        and not s.get("rollout")
        and condition(obj, "RolloutInProgress").get("status") != "True"
    )


def planned_message(world: World, name: str) -> str:
    found = [e for e in isvc_events(world.kubectl, world.ns, name) if e.get("reason") == "Planned"]
    assert found, f"{name}: no Planned event"
    return str(found[-1].get("message") or found[-1].get("note") or "")


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    run_dir = Path(tmp_path_factory.mktemp("profiles"))
    ns = f"e2e-tp-{uuid.uuid4().hex[:5]}"
    other = f"{ns}-other"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "namespace", other)
    cluster.kubectl("apply", "--server-side", "--field-manager=kvpilot-e2e", "-f", str(PROFILE_CRD))
    wait_established(cluster.kubectl, f"crd/{PROFILES}")
    stack = Stack(
        cluster,
        run_dir,
        namespaces=[ns, other],
        operator_namespaces=[ns, other],
        scenarios={(n, "*"): Scenario(name="l4", truth=L4_8B, workload=LIGHT) for n in (ns, other)},
    )
    stack.start()
    try:
        for n in (ns, other):
            cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", n, "--timeout=60s")
        yield World(stack, ns, other)
        assert stack.fleet is not None and not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([ns, other])
        cluster.kubectl("delete", PROFILES, "--all", "--wait=false", check=False)
        cluster.kubectl("delete", "crd", PROFILES, "--wait=false", check=False)
        print(f"profiles run directory (operator and Prometheus logs): {run_dir}")


def test_an_oom_learned_by_one_service_plans_the_next_below_it(world: World) -> None:
    # 1. A: planned by the memory model, OOMs while serving above U - 0.02, lowered by the closed loop
    world.truth("a", None)
    world.stack.cluster.apply([isvc("a", world.ns)])
    first = world.wait("a", applied, timeout=120, what="planned and applied")
    u = float(applied(first)["gpuMemoryUtilization"])
    assert not first["status"].get("profile"), first["status"].get("profile")  # nothing learned yet
    oom_above = round(u - 0.02, 2)
    world.truth("a", oom_above)
    a = world.wait(
        "a",
        lambda o: history(o, "Retuned") and settled(o) and applied(o)["gpuMemoryUtilization"] <= oom_above,
        timeout=300,
        what=f"retuned to at most {oom_above} after the CUDA OOM, and Ready",
    )
    retuned = history(a, "Retuned")[0]
    assert retuned["trigger"] == "CudaOOM" and retuned["from"]["gpuMemoryUtilization"] == u, retuned

    # the profile: one per key, named by its hash, labelled readably, the OOM and its ceiling in status
    def learned_profile() -> dict[str, Any] | None:
        items = [p for p in world.profiles() if p["spec"].get("gpu") == "L4"]
        ok = [p for p in items if (p.get("status", {}).get("learned") or {}).get("utilizationCeiling")]
        return ok[0] if ok else None

    profile = wait_until(learned_profile, timeout=60, what="a TuningProfile with an OOM ceiling")
    name = profile["metadata"]["name"]
    status, spec, labels = profile["status"], profile["spec"], profile["metadata"]["labels"]
    ceiling = round(u - UTILIZATION_MARGIN, 2)
    assert name.startswith("tp-") and len(world.profiles()) == 1, world.profiles()
    assert spec["modelId"] == MODEL and spec["kvCacheDtype"] == "auto", spec
    assert (spec["scope"], spec["namespace"], spec["frozen"]) == ("Namespace", world.ns, False), spec
    assert labels["profiles.kvpilot.io/namespace"] == world.ns, labels
    assert (spec["tensorParallelSize"], spec["pipelineParallelSize"]) == (1, 1), spec
    assert spec["memoryModelVersion"] == MEMORY_MODEL_VERSION
    assert (
        labels["profiles.kvpilot.io/gpu"] == "L4" and labels["profiles.kvpilot.io/vllm-version"] == "0.33.0"
    )
    assert [o["gpuMemoryUtilization"] for o in status["oomSamples"]] == [u], status["oomSamples"]
    assert status["oomSamples"][0]["source"] == f"{world.ns}/a"
    assert status["learned"]["utilizationCeiling"] == ceiling, status["learned"]
    assert f"{world.ns}/a" in status["contributors"]
    table = world.kubectl("get", PROFILES).stdout
    print(table)
    header, row = table.splitlines()[0], next(line for line in table.splitlines() if line.startswith(name))
    assert "OOM CEILING" in header and "KV RATIO" in header and "SAMPLES" in header, header
    assert "SCOPE" in header and "NAMESPACE" in header and "FROZEN" in header, header
    assert MODEL in row and " L4 " in f" {row} " and f"{ceiling}" in row, row
    assert f" {world.ns} " in row and " Namespace " in row and " false " in f"{row} ", row
    explained = " ".join(world.kubectl("explain", "tuningprofile.spec.frozen").stdout.split())
    assert "stops learning" in explained and "delete it" in explained, explained

    # 2. B: same model, same pool, planned at the ceiling from the start; the event names the profile
    world.truth("b", oom_above)
    world.stack.cluster.apply([isvc("b", world.ns)])
    b = world.wait("b", applied, timeout=120, what="planned and applied")
    assert applied(b)["gpuMemoryUtilization"] == ceiling <= oom_above < u, applied(b)
    assert (b["status"].get("profile") or {}).get("name") == name, b["status"].get("profile")
    message = planned_message(world, "b")
    assert f"TuningProfile {name}" in message and f"at most {ceiling:.2f}" in message, message
    assert deployment_args(world.kubectl, world.ns, "b").gpu_memory_utilization == ceiling
    b = world.wait("b", settled, timeout=120, what="Ready")
    # D, another tenant's: the same model and pool, planned by the memory model alone
    world.stack.cluster.apply([isvc("d", world.other)])
    d = world.stack.wait_isvc(world.other, "d", applied, timeout=120, what="d: planned and applied")
    assert applied(d)["gpuMemoryUtilization"] == u and not d["status"].get("profile"), d["status"]
    time.sleep(L4_8B.oom_after_s + 8)  # past the time the OOM struck A: B never OOMs, nothing changes
    later = world.get("b")
    assert not history(later, "Retuned") and applied(later) == applied(b), later["status"].get("history")
    # an administrator freezes the profile: still used, no longer written
    world.kubectl("patch", PROFILES, name, "--type=merge", "-p", json.dumps({"spec": {"frozen": True}}))
    rows = world.kubectl("get", PROFILES).stdout.splitlines()
    frozen = next(line for line in rows if line.startswith(name))
    assert " true " in f"{frozen} ", frozen

    # 3. the profile deleted: the next plans are the memory model's again
    world.truth("a", None)
    world.truth("b", None)
    world.truth("c", None)
    world.kubectl("delete", PROFILES, name)
    time.sleep(LIST_TTL_S + 2)  # the operator's cached list of profiles expires
    world.stack.cluster.apply([isvc("c", world.ns)])
    changed = {**SERVING, "concurrency": SERVING["concurrency"] - 1}  # a plan input: B is re-planned
    world.kubectl(
        "patch",
        "inferenceservices.kvpilot.io",
        "b",
        "-n",
        world.ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"serving": changed}}),
    )
    c = world.wait("c", applied, timeout=120, what="planned and applied")
    assert applied(c)["gpuMemoryUtilization"] == u and not c["status"].get("profile"), c["status"]
    assert "from TuningProfile" not in planned_message(world, "c")

    def replanned(o: dict[str, Any]) -> bool:
        observed = o["status"].get("observedGeneration") == o["metadata"]["generation"]
        return observed and applied(o)["gpuMemoryUtilization"] == u

    b = world.wait("b", replanned, timeout=120, what=f"re-planned at the memory model's {u}")
    assert not b["status"].get("profile"), b["status"].get("profile")
    assert f"from TuningProfile {name}" not in planned_message(world, "b")
