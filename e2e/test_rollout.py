"""Retunes on a full GPU pool: the real control plane, the real scheduler, the operator on the host.

Each test gets its own pool of KWOK L4 nodes (one ``nvidia.com/gpu`` each, labelled and tainted for the
test alone, so no other test's pod lands there) and fills every GPU: the service's own replicas plus
"another app" (plain pods holding a GPU). A retune is set off without Prometheus: a crash of the running
settings (a CUDA OOM the pod recovered from, or a crash loop) is a crash remedy the loop acts on within
seconds. The tests assert what the scheduler and the Deployment controller did, not only the status.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet.kopf_process import OperatorProcess
from e2e.fleet.stack import ISVC, closed_loop_env, install_crd
from e2e.nodes import L4, NodePool
from e2e.pods import CUDA_OOM_MESSAGE, _now, simulate_container_crash, wait_pod_running
from e2e.waits import wait_for
from kvpilot.operator.pods.rollout_strategy import HELD_MESSAGE

NS_PREFIX = "e2e-ro-"
POOL_LABEL, TAINT = "kvpilot.dev/e2e-rollout-pool", "kvpilot.dev/e2e-rollout"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}
TOLERATIONS = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]


def run_pool_operator(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, name: str, ns_prefix: str
) -> Iterator[OperatorProcess]:
    """The operator with the e2e pace and no Prometheus (crash remedies need none), watching the namespaces
    that start with ``ns_prefix``; its log's path printed when it stops."""
    install_crd(cluster.kubectl)
    op = OperatorProcess(
        cluster.kubeconfig,
        tmp_path_factory.mktemp(name),
        env=closed_loop_env(""),
        namespaces=[f"{ns_prefix}*"],
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(f"operator log: {op.log_file}")


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    yield from run_pool_operator(cluster, tmp_path_factory, "rollout-operator", NS_PREFIX)


@dataclass
class Pool:
    cluster: LocalCluster
    ns: str
    operator: OperatorProcess

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def isvc(self, name: str = "llm") -> dict[str, Any]:
        return dict(self.get(ISVC, name, "-n", self.ns))

    def pods(self, name: str = "llm") -> list[dict[str, Any]]:
        items = self.get("pods", "-n", self.ns, "-l", f"app.kubernetes.io/instance={name}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def events(self, reason: str) -> list[str]:
        items = self.get("events", "-n", self.ns, "--field-selector", f"reason={reason}")["items"]
        return [str(e.get("message") or "") for e in items]

    def placement(self) -> dict[str, Any]:
        """What the service and the other app need to land on this pool (and only there)."""
        return {
            "nodeSelector": {POOL_LABEL: self.ns},
            "tolerations": TOLERATIONS,
        }

    def hold_gpus(self, count: int) -> None:
        """``count`` pods of another app, each holding one GPU of the pool; wait until they run."""
        names = [f"other-app-{i}" for i in range(count)]
        self.cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": n, "namespace": self.ns},
                    "spec": {
                        **self.placement(),
                        "containers": [
                            {
                                "name": "app",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {"nvidia.com/gpu": 1}},
                            }
                        ],
                    },
                }
                for n in names
            ]
        )
        for n in names:
            wait_pod_running(
                self.cluster.kubeconfig, self.ns, n, timeout=90, kubectl=self.cluster.kubectl_bin
            )

    def create(self, replicas: int, **spec: Any) -> dict[str, Any]:
        p = self.placement()
        body = {
            "apiVersion": "kvpilot.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "llm", "namespace": self.ns},
            "spec": {
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                "gpu": {"count": 1, "product": "L4"},
                "replicas": replicas,
                "nodeSelector": p["nodeSelector"],
                "serving": {"maxContextLength": 8192},
                "engine": {"tolerations": p["tolerations"]},
                "tuning": dict(FAST),
                **spec,
            },
        }
        self.cluster.apply(body)
        return self.wait(lambda o: ready_replicas(o) == replicas, 120, f"{replicas} replica(s) Ready")

    def wait(self, cond: Any, timeout: float, what: str) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> bool:
            nonlocal last
            last = self.isvc()
            return bool(cond(last))

        try:
            wait_for(check, timeout, what)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\nstatus: {json.dumps(last.get('status'), indent=1)[:3000]}\n"
                f"operator log tail:\n{self.operator.log_tail()}"
            ) from None
        return last

    def recovered_oom(self, pod: str, message: str = CUDA_OOM_MESSAGE) -> None:
        """The pod's engine hit a CUDA OOM (``message``: vLLM's) and restarted, and serves again: a crash of
        the running settings (a crash remedy lowers the memory share) while the pod is Ready (a rollout would
        lose serving)."""
        p = wait_pod_running(self.cluster.kubeconfig, self.ns, pod, kubectl=self.cluster.kubectl_bin)
        status = dict(p["status"]["containerStatuses"][0])
        status.update(
            restartCount=1,
            ready=True,
            started=True,
            state={"running": {"startedAt": _now()}},
            lastState={
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": message,
                    "startedAt": _now(-30),
                    "finishedAt": _now(-1),
                }
            },
        )
        patch = json.dumps({"status": {"containerStatuses": [status]}})
        self.kubectl("patch", "pod", pod, "-n", self.ns, "--subresource=status", "--type=merge", "-p", patch)


def ready_replicas(obj: dict[str, Any]) -> int:
    return int(obj.get("status", {}).get("readyReplicas") or 0)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions") or () if c["type"] == type_), {})


def history(obj: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [h for h in obj.get("status", {}).get("history") or () if h.get("action") == action]


def compact(settings: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (settings or {}).items() if v is not None}


def rolled_out(obj: dict[str, Any]) -> bool:
    """The retune ran, passed probation and every replica is Ready with it."""
    st = obj.get("status", {})
    good = compact(st.get("lastGoodSettings")) == compact(st.get("applied"))
    return bool(history(obj, "Retuned")) and not st.get("rollout") and good


@pytest.fixture
def pool(cluster: LocalCluster, operator: OperatorProcess) -> Iterator[Pool]:
    """Three KWOK L4 nodes (one GPU each) for this test alone, in a namespace of its own."""
    ns = f"{NS_PREFIX}{uuid.uuid4().hex[:6]}"
    base = NodePool(f"ro-{ns.removeprefix(NS_PREFIX)}", 3, L4, 1, cpu="8", memory="32Gi", machine="g6.xlarge")
    with cluster.tainted_nodes(base, POOL_LABEL, ns, TAINT), cluster.temporary_namespace(ns):
        yield Pool(cluster, ns, operator)


# ------------------------------------------------------------------------------------------------ tests


def test_two_replicas_on_a_full_pool_retune_one_at_a_time(pool: Pool) -> None:
    pool.hold_gpus(1)
    before = pool.create(2)
    assert pool.get("pdb", "llm", "-n", pool.ns)["spec"]["maxUnavailable"] == 1  # replicas >= 2: a budget
    pool.recovered_oom(pool.pods()[0]["metadata"]["name"])
    ready_seen, strategies = [], set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pods = pool.pods()
        ready_seen.append(sum(1 for p in pods if condition(p, "Ready").get("status") == "True"))
        obj = pool.isvc()
        strategies.add((obj["status"].get("rollout") or {}).get("strategy"))
        if rolled_out(obj):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"not rolled out: {json.dumps(pool.isvc().get('status'), indent=1)[:3000]}")
    assert min(ready_seen) >= 1, ready_seen  # someone served at every sample
    assert "Replace" in strategies, strategies
    assert compact(obj["status"]["applied"]) != compact(before["status"]["applied"])
    strategy = pool.get("deployment", "llm", "-n", pool.ns)["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert any("[rollout Replace: Auto: no spare GPU" in m for m in pool.events("Retuned"))


def test_one_replica_holds_then_recreates_with_downtime_allowed(pool: Pool) -> None:
    pool.hold_gpus(2)
    pool.create(1)
    pool.recovered_oom(pool.pods()[0]["metadata"]["name"])
    held = pool.wait(lambda o: condition(o, "RolloutInProgress").get("reason") == "Held", 90, "held")
    assert HELD_MESSAGE in condition(held, "RolloutInProgress")["message"]
    assert HELD_MESSAGE in held["status"]["recommendation"]["reason"]
    assert any(HELD_MESSAGE in m for m in pool.events("Held"))
    assert not history(held, "Retuned")  # nothing rolled: the pod still serves
    pool.kubectl(
        "patch",
        ISVC,
        "llm",
        "-n",
        pool.ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"rollout": {"allowDowntime": True}}}),
    )
    done = pool.wait(rolled_out, 180, "the Recreate rolled out and passed probation")
    assert pool.get("deployment", "llm", "-n", pool.ns)["spec"]["strategy"] == {"type": "Recreate"}
    assert any("[rollout Recreate: " in m for m in pool.events("Retuned"))
    assert ready_replicas(done) == 1


SGLANG_OOM = "\n".join(
    [
        "[2026-12-07 10:31:04 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.",
        "[2026-12-07 10:31:04] Received sigquit from a child process. It usually means the child failed.",
    ]
)


TGI_OOM = "\n".join(
    [
        "2026-12-07T10:31:04.118204Z ERROR text_generation_launcher: Method Decode encountered an error.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB.",
        "2026-12-07T10:31:04.118204Z ERROR text_generation_launcher: Shard 0 crashed",
        "Error: ShardFailed",
    ]
)


@pytest.mark.parametrize(
    ("kind", "image", "oom"),
    [
        ("SGLang", "lmsysorg/sglang:v0.5.23", SGLANG_OOM),
        ("TGI", "ghcr.io/huggingface/text-generation-inference:3.3.7", TGI_OOM),
    ],
    ids=["sglang", "tgi"],
)
def test_an_engine_replica_on_a_full_pool_holds_then_recreates_with_downtime_allowed(
    pool: Pool, kind: str, image: str, oom: str
) -> None:
    """SGLang's and TGI's loops weigh the same rollout as vLLM's: the OOM remedy (a smaller memory share) is
    held while no GPU can take a surge pod, and rolls out as a Recreate once downtime is allowed."""
    pool.hold_gpus(2)
    before = pool.create(1, engine={"kind": kind, "image": image, "tolerations": TOLERATIONS})
    pool.recovered_oom(pool.pods()[0]["metadata"]["name"], oom)
    held = pool.wait(lambda o: condition(o, "RolloutInProgress").get("reason") == "Held", 90, "held")
    assert HELD_MESSAGE in condition(held, "RolloutInProgress")["message"]
    assert any(HELD_MESSAGE in m for m in pool.events("Held"))
    assert not history(held, "Retuned")  # nothing rolled: the pod still serves
    assert held["status"].get("appliedEngineArgs") == before["status"].get("appliedEngineArgs")
    patch = json.dumps({"spec": {"rollout": {"allowDowntime": True}}})
    pool.kubectl("patch", ISVC, "llm", "-n", pool.ns, "--type=merge", "-p", patch)

    def sglang_rolled_out(o: dict[str, Any]) -> bool:
        st = o.get("status", {})
        applied = st.get("appliedEngineArgs")
        return (
            bool(history(o, "Retuned")) and not st.get("rollout") and st.get("lastGoodEngineArgs") == applied
        )

    done = pool.wait(sglang_rolled_out, 180, "the Recreate rolled out and passed probation")
    assert pool.get("deployment", "llm", "-n", pool.ns)["spec"]["strategy"] == {"type": "Recreate"}
    assert history(done, "Retuned")[0]["trigger"] == "RuntimeOOM"
    assert done["status"]["appliedEngineArgs"] != before["status"]["appliedEngineArgs"]
    assert ready_replicas(done) == 1


def test_an_unschedulable_surge_pod_never_fails_its_settings(pool: Pool) -> None:
    pool.hold_gpus(2)
    pool.create(1, rollout={"strategy": "Surge"})
    pool.recovered_oom(pool.pods()[0]["metadata"]["name"])
    # the deadline is the pool's, pushed out to 1.5x the start expected of a new pod: the 8B's ~15 GiB
    # downloaded (30 s), then the start this service was seen to take (seconds here), not the assumed 180 s
    pending = pool.wait(
        lambda o: any(h.get("trigger") == "RolloutPending" for h in history(o, "Held")),
        480,
        "the surge pod Pending past its deadline: held, not failed",
    )
    new = compact(pending["status"]["applied"])
    assert new not in [compact(f) for f in pending["status"].get("failedSettings") or ()]
    unscheduled = [p for p in pool.pods() if not p["spec"].get("nodeName")]
    assert unscheduled and condition(unscheduled[0], "PodScheduled").get("reason") == "Unschedulable"
    pool.kubectl("delete", "pod", "other-app-0", "-n", pool.ns, "--wait=false")  # a GPU frees up
    done = pool.wait(rolled_out, 150, "the surge pod scheduled, the rollout passed probation")
    assert compact(done["status"]["lastGoodSettings"]) == new
    assert new not in [compact(f) for f in done["status"].get("failedSettings") or ()]


def test_a_crash_looping_pod_is_fixed_without_a_spare_gpu(pool: Pool) -> None:
    pool.hold_gpus(2)
    pool.create(1)
    simulate_container_crash(
        pool.cluster.kubeconfig,
        pool.ns,
        pool.pods()[0]["metadata"]["name"],
        restart_count=3,
        kubectl=pool.cluster.kubectl_bin,
    )
    done = pool.wait(rolled_out, 180, "the fix rolled out onto the crashing pod's GPU")
    assert history(done, "Retuned")[0]["trigger"] == "CudaOOM"
    assert any("no replica serves (CrashLoopBackOff)" in m for m in pool.events("Retuned"))
    assert ready_replicas(done) == 1
