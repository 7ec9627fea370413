"""kvpilot's LeaderWorkerSet on the real API server with the real LWS controller (issue 28).

LWS v0.10.0's controller manager (``sigs.k8s.io/lws``, built from its pinned commit by e2e/build-lws.sh,
run by :mod:`e2e.lws_local` with its webhooks) serves the kind for this module only. Checked:

* the operator's client discovers the kind only once its CRD is installed (``ClusterKube.serves_kind``: an
  InferenceService of several nodes is ``LeaderWorkerSetNotInstalled`` before);
* the LeaderWorkerSet ``kvpilot render`` builds is accepted by the CRD's validation and LWS's webhook and
  comes back unpruned after kvpilot's server-side apply;
* an LWS of the same name that is not kvpilot's is a NameConflict through the operator's own apply path;
* the operator itself, given an InferenceService of two nodes per replica, applies the group and no
  Deployment;
* on a pool of KWOK 8-GPU nodes, the controller makes the group's leader and worker pods on two nodes, the
  service is Ready, new arguments roll the group, and a hand edit of the set is put back (drift repair);
* the closed loop tunes a group: the fleet plays the leader (its ``/metrics`` scraped by a real Prometheus)
  and the ``--headless`` worker (no API server, no series, as in vLLM); KV pressure on the leader gets a
  ``KvPressure`` cut of ``--max-num-seqs`` that LWS rolls to leader and worker alike.

The CRDs are removed again after the module, so the other modules see a cluster without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from e2e.cluster import LocalCluster
from e2e.fleet import EngineArgs, Fleet, Scenario, Workload
from e2e.fleet.kopf_process import OperatorProcess
from e2e.fleet.stack import ISVC, closed_loop_env
from e2e.fleet.testing import H100_8B
from e2e.lws_local import LwsController
from e2e.nodes import H100_80GB_HBM3, NodePool
from e2e.pods import CUDA_OOM_MESSAGE, simulate_container_crash
from e2e.prometheus import PrometheusServer
from e2e.targets import RESOURCE, Webhook, get, install_crds, webhook_configuration
from e2e.waits import host_operator, wait_established, wait_for
from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import ClusterKube
from kvpilot.operator.enginetuner import target
from kvpilot.operator.enginetuner.target_engines import EngineArgs as TargetEngineArgs
from kvpilot.operator.inferenceservice import render
from kvpilot.operator.pods import leader_worker_set as lws
from kvpilot.operator.pods import ownership, workloads
from kvpilot.tuner import vllm

ROOT = Path(__file__).resolve().parents[1]
LWS_CRD = ROOT / "tests" / "data" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
ISVC_CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"
DEEPSEEK: dict[str, Any] = {
    "apiVersion": "kvpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "dsv3"},
    "spec": {
        "model": {"id": "deepseek-ai/DeepSeek-V3"},
        "serving": {"maxContextLength": 32768},
        "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
    },
}


@pytest.fixture(scope="module")
def controller(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LwsController]:
    """LWS's controller with its CRDs and webhooks, for this module; the CRDs are removed after it."""
    client = ClusterKube(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    assert not client.serves_kind(lws.KIND), "the LWS CRD is installed before this module installed it"
    ctl = LwsController(cluster, tmp_path_factory.mktemp("lws"))
    try:
        yield ctl.start()
    finally:
        ctl.stop()
        ctl.uninstall()
        print(f"LWS controller log: {ctl.dir / 'lws.log'}")


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster, controller: LwsController) -> ClusterKube:
    """The operator's client on the cluster, once the controller's CRDs are served (they were not before)."""
    client = ClusterKube(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    wait_established(cluster.kubectl, f"crd/{CRD_NAME}")
    wait_for(lambda: client.serves_kind(lws.KIND), 60, "discovery serves leaderworkerset.x-k8s.io/v1")
    return client


def test_the_built_crd_is_the_one_the_unit_tests_validate_against(controller: LwsController) -> None:
    """tests/data/lws's copy (what the unit tests check the rendered group against) is the built release's."""
    built = yaml.safe_load((controller.bin / "crds" / LWS_CRD.name.removesuffix(".gz")).read_text())
    assert built == yaml.safe_load(gzip.decompress(LWS_CRD.read_bytes()))


def rendered(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    service, group = render.build_manifests(DEEPSEEK)
    for m in (service, group):
        m["metadata"]["namespace"] = namespace
    return service, group


def is_subset(wanted: Any, have: Any, where: str = "") -> list[str]:
    """Where ``have`` lacks or differs from what ``wanted`` sets (the API server adds defaults, and must not
    prune or change what kvpilot set)."""
    if isinstance(wanted, dict):
        if not isinstance(have, dict):
            return [where or "."]
        return [p for k, v in wanted.items() for p in is_subset(v, have.get(k), f"{where}.{k}")]
    if isinstance(wanted, list):
        if not isinstance(have, list) or len(have) != len(wanted):
            return [where]
        pairs = enumerate(zip(wanted, have, strict=True))
        return [p for i, (w, h) in pairs for p in is_subset(w, h, f"{where}[{i}]")]
    if isinstance(wanted, int) and isinstance(have, str) and ".resources." in where:
        return [] if str(wanted) == have else [where]  # LWS's webhook writes a quantity back as a string
    return [] if wanted == have else [where]


def test_the_groups_disruption_budget_is_kept_whole(kube: ClusterKube, namespace: str) -> None:
    """Two groups get a budget over all their pods with unhealthyPodEvictionPolicy (policy/v1, GA in 1.31):
    the API server keeps every field kvpilot set."""
    two = {**DEEPSEEK, "spec": {**DEEPSEEK["spec"], "replicas": 2}}
    (budget,) = [m for m in render.build_manifests(two) if m["kind"] == "PodDisruptionBudget"]
    budget["metadata"]["namespace"] = namespace
    kube.apply(budget)
    back = kube.read_object("PodDisruptionBudget", namespace, budget["metadata"]["name"])
    assert back is not None and is_subset(budget["spec"], back["spec"]) == []
    assert back["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_rendered_group_is_accepted_and_kept_whole(kube: ClusterKube, namespace: str) -> None:
    service, group = rendered(namespace)
    kube.apply(service)
    kube.apply(group)
    back = kube.read_object(lws.KIND, namespace, "dsv3")
    assert back is not None
    assert is_subset(group["spec"], back["spec"]) == []  # nothing pruned, nothing rewritten
    managers = {(f["manager"], f["operation"]) for f in back["metadata"]["managedFields"]}
    assert ("kvpilot", "Apply") in managers
    leader = back["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert "--master-addr" in leader and lws.LEADER_ADDRESS in leader
    kube.apply(group)  # re-applying the same object is a no-op, not a conflict
    again = kube.read_object(lws.KIND, namespace, "dsv3")
    assert again is not None
    assert again["metadata"]["generation"] == back["metadata"]["generation"], (
        is_subset(back["spec"], again["spec"]),
        is_subset(again["spec"], back["spec"]),
    )


def test_a_group_the_api_server_refuses_is_apply_rejected(kube: ClusterKube, namespace: str) -> None:
    _, group = rendered(namespace)
    group["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"  # not in the CRD's enum
    with pytest.raises(errors.ApplyRejected, match="LeaderWorkerSet dsv3"):
        kube.apply(group)


def test_another_teams_group_of_that_name_is_a_name_conflict(
    kube: ClusterKube, namespace: str, cluster: LocalCluster
) -> None:
    _, group = rendered(namespace)
    theirs = {**group, "metadata": {"name": "dsv3", "namespace": namespace}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(theirs))
    ours = {
        **group,
        "metadata": {
            **group["metadata"],
            "ownerReferences": [
                {
                    "apiVersion": "kvpilot.io/v1alpha1",
                    "kind": "InferenceService",
                    "name": "dsv3",
                    "uid": "u-dsv3",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    with pytest.raises(errors.NameConflict, match=f"LeaderWorkerSet {namespace}/dsv3 already exists"):
        asyncio.run(workloads.apply_workloads([ours], kube, ownership.VerifiedOwners()))
    kept = kube.read_object(lws.KIND, namespace, "dsv3")
    assert kept is not None and not kept["metadata"].get("ownerReferences")


def test_the_operator_applies_the_group_for_an_inference_service_of_two_nodes(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The whole path: the operator (on the host, watching one namespace) applies the LeaderWorkerSet and the
    Service selecting its leaders, owned by the InferenceService, and no Deployment."""
    cluster.kubectl("apply", "-f", str(ISVC_CRD))
    wait_established(cluster.kubectl, "crd/inferenceservices.kvpilot.io")
    ns = f"kvlws-{uuid.uuid4().hex[:6]}"
    with cluster.temporary_namespace(ns), host_operator(cluster, tmp_path / "kopf.log", ns):
        doc = {**DEEPSEEK, "metadata": {"name": "dsv3", "namespace": ns}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

        def ready() -> dict[str, Any] | None:
            obj = json.loads(
                cluster.kubectl("get", "inferenceservices.kvpilot.io", "dsv3", "-n", ns, "-o", "json").stdout
            )
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
            return obj if "Ready" in conds else None

        obj = wait_for(ready, 120, f"{ns}/dsv3 Ready set")
        ready_cond = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert ready_cond["status"] == "True", ready_cond
        group = kube.read_object(lws.KIND, ns, "dsv3")
        assert group is not None and group["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert group["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        service = kube.read_object("Service", ns, "dsv3")
        assert service is not None and service["spec"]["selector"][lws.WORKER_INDEX_LABEL] == "0"
        assert kube.read_object("Deployment", ns, "dsv3") is None


# ------------------------------------------------------------------- the group, made by the real controller

POOL_LABEL, TAINT = "kvpilot.dev/e2e-lws-pool", "kvpilot.dev/e2e-lws"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 60}


@dataclass
class GroupPool:
    """Four KWOK 8 x H100 nodes for one test (two groups of two: one serving, one spare for a surge), labelled
    and tainted for it alone, a namespace of its own and the operator on the host watching it."""

    cluster: LocalCluster
    ns: str
    operator: OperatorProcess
    fleet: Fleet | None = None

    def get(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl("get", *args, "-o", "json").stdout)

    def isvc(self) -> dict[str, Any]:
        return dict(self.get(ISVC, "dsv3", "-n", self.ns))

    def pods(self) -> list[dict[str, Any]]:
        items = self.get("pods", "-n", self.ns, "-l", f"{lws.NAME_LABEL}=dsv3")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def wait(self, cond: Callable[[dict[str, Any]], Any], timeout: float, what: str) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> bool:
            nonlocal last
            last = self.isvc()
            return bool(cond(last))

        try:
            wait_for(check, timeout, what)
        except AssertionError as e:
            pods = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in self.pods()}
            raise AssertionError(
                f"{e}\nstatus: {json.dumps(last.get('status'), indent=1)[:3000]}\npods: {pods}\n"
                f"operator log tail:\n{self.operator.log_tail()}"
            ) from None
        return last

    def wait_played(self, *pods: dict[str, Any], what: str) -> dict[str, dict[str, Any]]:
        """The fleet's view of ``pods`` once it plays every one of them as serving, by pod name."""
        fleet = self.fleet
        assert fleet is not None, "a pool without a scenario has no fleet"
        names = {p["metadata"]["name"] for p in pods}

        def serving() -> dict[str, dict[str, Any]]:
            played = {p["pod"]: p for p in fleet.pods(self.ns)}
            ok = names <= set(played) and all(played[n]["state"] == "Serving" for n in names)
            return played if ok else {}

        return dict(fleet.wait_for(serving, timeout=60, what=what))

    def create(self, **spec: Any) -> dict[str, Any]:
        body = {
            **DEEPSEEK,
            "metadata": {"name": "dsv3", "namespace": self.ns},
            "spec": {
                **DEEPSEEK["spec"],
                **spec,
                "nodeSelector": {POOL_LABEL: self.ns},
                "engine": {"tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]},
                "tuning": dict(FAST),
            },
        }
        self.cluster.apply(body)
        return self.wait(lambda o: ready_replicas(o) == 1, 180, "the group Ready")


@contextlib.contextmanager
def group_pool(
    cluster: LocalCluster, tmp_path: Path, prefix: str, scenario: Scenario | None = None
) -> Iterator[GroupPool]:
    """Four tainted KWOK 8 x H100 nodes, a namespace and the operator on the host watching it. With a
    ``scenario``, the fleet plays the group's pods (the leader serves ``/metrics`` to a real Prometheus,
    the ``--headless`` worker none) and the operator's closed loop reads that Prometheus."""
    cluster.kubectl("apply", "-f", str(ISVC_CRD))
    wait_established(cluster.kubectl, "crd/inferenceservices.kvpilot.io")
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    nodes = NodePool(
        f"lws-{ns[-6:]}", 4, H100_80GB_HBM3, 8, cpu="192", memory="2048Gi", machine="p5.48xlarge"
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(cluster.tainted_nodes(nodes, POOL_LABEL, ns, TAINT))
        prometheus_url, fleet = "", None
        if scenario is not None:
            prom = stack.enter_context(PrometheusServer(tmp_path / "prometheus"))
            fleet = Fleet(cluster.kubeconfig, prom.targets_file, namespaces=[ns], kubectl=cluster.kubectl_bin)
            fleet.set_scenario(ns, "dsv3", scenario)
            stack.enter_context(fleet)
            prometheus_url = prom.url
        op = OperatorProcess(
            cluster.kubeconfig, tmp_path / "operator", env=closed_loop_env(prometheus_url), namespaces=[ns]
        )
        try:
            with cluster.temporary_namespace(ns), op:
                yield GroupPool(cluster, ns, op, fleet)
        finally:
            print(f"operator log: {op.log_file}")
        assert fleet is None or not fleet.errors, fleet.errors


@pytest.fixture
def pool(kube: ClusterKube, cluster: LocalCluster, tmp_path: Path) -> Iterator[GroupPool]:
    with group_pool(cluster, tmp_path, "kvlwsg") as p:
        yield p


def ready_replicas(obj: dict[str, Any]) -> int:
    return int(obj.get("status", {}).get("readyReplicas") or 0)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")


def by_role(pods: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The group's leader and its one worker, by the index label LWS's pod webhook gives them."""
    index = {p["metadata"]["labels"].get(lws.WORKER_INDEX_LABEL): p for p in pods}
    assert set(index) == {"0", "1"}, sorted(p["metadata"]["name"] for p in pods)
    return index["0"], index["1"]


def test_the_controller_makes_the_group_and_new_arguments_roll_it(pool: GroupPool) -> None:
    """The real LWS controller makes the leader (a StatefulSet's pod) and the worker (the group's own
    StatefulSet's) on two 8-GPU nodes, its webhook gives them their index and the leader's address, the
    service is Ready, new engine arguments roll the group (LWS's rolling update, a spare group free), and
    a hand edit of the set is drift the operator puts back."""
    before = pool.create()
    leader, worker = by_role(pool.pods())
    assert leader["spec"]["nodeName"] != worker["spec"]["nodeName"]
    for pod in (leader, worker):
        assert pod["spec"]["nodeName"].startswith("lws-")
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "8"
        env = {e["name"]: e.get("value") for e in container(pod).get("env") or ()}
        assert env.get("LWS_LEADER_ADDRESS", "").startswith(f"{leader['metadata']['name']}.dsv3.{pool.ns}")
        assert "--master-addr" in container(pod)["args"]
    assert env.get("LWS_WORKER_INDEX") == "1"  # the worker's
    assert "--headless" in container(worker)["args"] and "--headless" not in container(leader)["args"]
    group = pool.get("leaderworkerset", "dsv3", "-n", pool.ns)
    assert group["status"].get("readyReplicas") == 1, group["status"]

    # a new plan: a shorter context gives the group new engine arguments, which LWS rolls group by group
    patch = json.dumps({"spec": {"serving": {"maxContextLength": 16384}}})
    pool.cluster.kubectl("patch", ISVC, "dsv3", "-n", pool.ns, "--type=merge", "-p", patch)
    done = pool.wait(
        lambda o: (
            (o["status"].get("applied") or {}).get("maxModelLen") == 16384
            and o["status"].get("observedGeneration") == o["metadata"]["generation"]
            and ready_replicas(o) == 1
            and {p["metadata"]["uid"] for p in pool.pods()}.isdisjoint(
                {leader["metadata"]["uid"], worker["metadata"]["uid"]}
            )
        ),
        300,
        "the new arguments rolled the group and it is Ready again",
    )
    assert done["status"]["applied"] != before["status"]["applied"]
    new_leader, new_worker = by_role(pool.pods())
    assert new_leader["metadata"]["uid"] != leader["metadata"]["uid"]
    assert new_worker["metadata"]["uid"] != worker["metadata"]["uid"]
    old_args, new_args = container(leader)["args"], container(new_leader)["args"]
    assert old_args != new_args
    engine = len(new_args) - 6  # the leader's role flags are its last six
    assert container(new_worker)["args"][:engine] == new_args[:engine]
    assert new_args[new_args.index("--max-model-len") + 1] == "16384"
    group = pool.get("leaderworkerset", "dsv3", "-n", pool.ns)
    assert group["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] == 1

    # a hand edit of the workers' arguments is drift: the operator, watching the set, puts them back
    wanted = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    path = "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/args/-"
    edit = json.dumps([{"op": "add", "path": path, "value": "--enforce-eager"}])
    pool.cluster.kubectl("patch", "leaderworkerset", "dsv3", "-n", pool.ns, "--type=json", "-p", edit)

    def repaired() -> bool:
        live = pool.get("leaderworkerset", "dsv3", "-n", pool.ns)
        return bool(
            live["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"] == wanted
        )

    wait_for(repaired, 60, "the hand-edited worker args put back")
    events = pool.get("events", "-n", pool.ns, "--field-selector", "reason=DriftDetected")["items"]
    assert any("workerTemplate" in e["message"] and "--enforce-eager" in e["message"] for e in events), events


# ------------------------------------------------------------------- the group, tuned by the closed loop

STORM = Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500, time_scale=4.0)
"""More than the group's KV cache holds at the planned sequences: preemptions, which the loop answers."""


def planned_leader_args(spec: dict[str, Any]) -> EngineArgs:
    """The leader's engine arguments as ``kvpilot render`` plans them for DeepSeek-V3 with ``spec``."""
    doc = {**DEEPSEEK, "spec": {**DEEPSEEK["spec"], **spec}}
    group = next(m for m in render.build_manifests(doc) if m["kind"] == lws.KIND)
    c = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    return EngineArgs.parse([*(c.get("command") or ()), *(c.get("args") or ())])


def retuned(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in obj.get("status", {}).get("history") or () if h.get("action") == "Retuned"]


def test_kv_pressure_on_the_leader_retunes_the_whole_group(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The closed loop on a group: the leader's ``/metrics`` (the fleet plays it; the ``--headless`` worker
    serves none, as in vLLM) shows KV pressure, the loop cuts ``--max-num-seqs``, and LWS rolls the new
    arguments to leader and worker alike."""
    spec = {"serving": {"maxContextLength": 8192}}
    planned = planned_leader_args(spec)
    assert planned.gpu_memory_utilization is not None and not planned.headless
    pool_tokens = 24576  # three contexts of 8192: the planned sequences cannot all run
    truth = dataclasses.replace(
        H100_8B,
        non_kv_gib=round(
            planned.gpu_memory_utilization * H100_8B.gpu_memory_gib
            - pool_tokens * H100_8B.kv_bytes_per_token / (1 << 30),
            4,
        ),
    )
    with group_pool(
        cluster, tmp_path, "kvlwst", Scenario(name="group-storm", truth=truth, workload=STORM)
    ) as pool:
        pool.create(**spec)
        leader, worker = by_role(pool.pods())
        played = pool.wait_played(leader, worker, what="the fleet plays the leader and the worker")
        assert played[worker["metadata"]["name"]]["kv_usage"] is None  # headless: no engine of its own
        assert played[leader["metadata"]["name"]]["num_gpu_blocks"] is not None

        def settled(o: dict[str, Any]) -> bool:
            changes = retuned(o)
            status = o.get("status", {})
            return bool(
                changes
                and (status.get("applied") or {}).get("maxNumSeqs") == changes[-1]["to"]["maxNumSeqs"]
                and not status.get("rollout")
                and ready_replicas(o) == 1
                and {p["metadata"]["uid"] for p in pool.pods()}.isdisjoint(
                    {leader["metadata"]["uid"], worker["metadata"]["uid"]}
                )
            )

        done = pool.wait(settled, 480, "a KV-pressure retune rolled over the group")
        change = retuned(done)[0]
        assert change["trigger"] == "KvPressure", change
        assert change["to"]["maxNumSeqs"] < change["from"]["maxNumSeqs"] == planned.max_num_seqs
        new_leader, new_worker = by_role(pool.pods())
        leader_args, worker_args = container(new_leader)["args"], container(new_worker)["args"]
        wanted = str(done["status"]["applied"]["maxNumSeqs"])
        assert leader_args[leader_args.index("--max-num-seqs") + 1] == wanted
        engine = len(leader_args) - 6  # the leader's role flags are its last six
        assert worker_args[:engine] == leader_args[:engine]
        assert "--headless" in worker_args


def test_a_cuda_oom_in_the_worker_lowers_the_groups_utilisation(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """A group is one engine over its pods: a CUDA OOM in the worker's ranks is the engine's crash. The
    worker reports vLLM's CUDA OOM text, and the real LWS controller recreates the whole group at once
    (``RecreateGroupOnPodRestart``), so no tick sees the crashed pods: the operator's pod index filed the
    crash as it was watched (``kvpilot.operator.pods.group_crashes``). The loop lowers
    ``--gpu-memory-utilization`` (a crash remedy, no metrics needed), and LWS rolls the new arguments to a
    new leader and worker. Without the filed crash every new group would crash the same way, forever."""
    spec = {"serving": {"maxContextLength": 8192}}
    planned = planned_leader_args(spec)
    assert planned.gpu_memory_utilization is not None
    with group_pool(cluster, tmp_path, "kvlwso") as pool:
        pool.create(**spec)
        leader, worker = by_role(pool.pods())
        simulate_container_crash(
            cluster.kubeconfig,
            pool.ns,
            worker["metadata"]["name"],
            restart_count=3,
            kubectl=cluster.kubectl_bin,
        )
        old = {leader["metadata"]["uid"], worker["metadata"]["uid"]}

        def remedied(o: dict[str, Any]) -> bool:
            changes = retuned(o)
            pods = pool.pods()
            return bool(
                changes
                and not o.get("status", {}).get("rollout")
                and len(pods) == 2
                and {p["metadata"]["uid"] for p in pods}.isdisjoint(old)
                and ready_replicas(o) == 1
            )

        done = pool.wait(remedied, 300, "a crash remedy rolled over the group")
        change = retuned(done)[0]
        assert change["trigger"] == "CudaOOM", change
        lowered = float(change["to"]["gpuMemoryUtilization"])
        assert lowered < float(change["from"]["gpuMemoryUtilization"]) == planned.gpu_memory_utilization
        new_leader, new_worker = by_role(pool.pods())
        for pod in (new_leader, new_worker):
            args = container(pod)["args"]
            assert float(args[args.index("--gpu-memory-utilization") + 1]) == lowered, pod["metadata"]["name"]


# ----------------------------------------------------------------------------- an SGLang group (issue 29)

SGLANG_70B = "meta-llama/Llama-3.1-70B-Instruct"
SGLANG_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def sglang_group_doc(ns: str, serving: dict[str, Any]) -> dict[str, Any]:
    """An SGLang InferenceService of Llama-3.1-70B over two 8 x H100 nodes of the pool, in mode Auto."""
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "dsv3", "namespace": ns},  # the pool's fixtures select this name
        "spec": {
            "model": {"id": SGLANG_70B},
            "serving": serving,
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
            "nodeSelector": {POOL_LABEL: ns},
            "engine": {
                "kind": "SGLang",
                "image": "lmsysorg/sglang:v0.5.23",
                "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            },
            "tuning": dict(FAST),
        },
    }


def sglang_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "sglang")


def test_an_sglang_group_serves_from_its_leader_and_a_retune_rolls_the_whole_group(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """SGLang over two nodes: the operator applies a LeaderWorkerSet whose pods carry SGLang's node flags
    (``--nnodes 2``, ``--node-rank $(LWS_WORKER_INDEX)``, ``--dist-init-addr``) and one ``--tp-size 16``; the
    real LWS controller makes the leader and the worker, the fleet plays them as SGLang does (rank 0 serves
    the API and ``/metrics``, rank 1 its schedulers only), and the service is Ready. Four running requests
    (``serving.concurrency``) under a queue: the SGLang loop raises ``--max-running-requests``
    (``IdleCapacity``) and LWS rolls the new flags to a new leader and worker alike."""
    truth = dataclasses.replace(H100_8B, sglang_weights_gib=8.5, kv_bytes_per_token=40960)
    busy = Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200)
    with group_pool(
        cluster, tmp_path, "kvlwsg", Scenario(name="sglang-group", truth=truth, workload=busy)
    ) as pool:
        pool.cluster.apply(sglang_group_doc(pool.ns, {"maxContextLength": 8192, "concurrency": 4}))
        first = pool.wait(lambda o: ready_replicas(o) == 1, 180, "the SGLang group Ready")
        assert first["status"]["appliedEngineArgs"][-2:] == ["--tp-size", "16"]
        leader, worker = by_role(pool.pods())
        lead, work = sglang_container(leader)["args"], sglang_container(worker)["args"]
        assert lead[lead.index("--node-rank") + 1] == "0"
        assert work[work.index("--node-rank") + 1] == lws.WORKER_INDEX
        assert "ports" in sglang_container(leader) and "ports" not in sglang_container(worker)
        played = pool.wait_played(leader, worker, what="the fleet plays the SGLang leader and worker")
        assert played[worker["metadata"]["name"]]["kv_usage"] is None  # rank 1: no HTTP server, no series
        old = {leader["metadata"]["uid"], worker["metadata"]["uid"]}

        def raised(o: dict[str, Any]) -> bool:
            status = o.get("status", {})
            return bool(
                retuned(o)
                and not status.get("rollout")
                and ready_replicas(o) == 1
                and {p["metadata"]["uid"] for p in pool.pods()}.isdisjoint(old)
            )

        done = pool.wait(raised, 300, "an IdleCapacity raise rolled over the SGLang group")
        change = retuned(done)[0]
        assert change["trigger"] == "IdleCapacity", change
        applied = done["status"]["appliedEngineArgs"]
        wanted = applied[applied.index("--max-running-requests") + 1]
        assert int(wanted) > 4
        new_leader, new_worker = by_role(pool.pods())
        for pod in (new_leader, new_worker):
            args = sglang_container(pod)["args"]
            assert args[args.index("--max-running-requests") + 1] == wanted, pod["metadata"]["name"]
            assert args[args.index("--nnodes") + 1] == "2"


def test_a_cuda_oom_in_an_sglang_groups_worker_lowers_its_fraction(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """SGLang's ranks cannot rejoin a running group either: the worker's CUDA OOM (SGLang's scheduler text)
    makes LWS recreate the group at once, so the SGLang loop sees the crash only as the pod index filed it
    (:mod:`kvpilot.operator.pods.group_crashes`; the filed pod is evidence, no replica). The loop lowers
    ``--mem-fraction-static`` (``RuntimeOOM``, no metrics needed) and LWS rolls the new flags to a new
    leader and worker."""
    with group_pool(cluster, tmp_path, "kvlwsso") as pool:
        pool.cluster.apply(sglang_group_doc(pool.ns, {"maxContextLength": 8192}))
        first = pool.wait(lambda o: ready_replicas(o) == 1, 180, "the SGLang group Ready")
        planned = first["status"]["appliedEngineArgs"]
        fraction = float(planned[planned.index("--mem-fraction-static") + 1])
        leader, worker = by_role(pool.pods())
        simulate_container_crash(
            cluster.kubeconfig,
            pool.ns,
            worker["metadata"]["name"],
            message=f"Scheduler hit an exception: {SGLANG_OOM}",
            restart_count=1,
            kubectl=cluster.kubectl_bin,
        )
        old = {leader["metadata"]["uid"], worker["metadata"]["uid"]}

        def remedied(o: dict[str, Any]) -> bool:
            pods = pool.pods()
            return bool(
                retuned(o)
                and not o.get("status", {}).get("rollout")
                and len(pods) == 2
                and {p["metadata"]["uid"] for p in pods}.isdisjoint(old)
                and ready_replicas(o) == 1
            )

        done = pool.wait(remedied, 300, "an OOM remedy rolled over the SGLang group")
        change = retuned(done)[0]
        assert change["trigger"] == "RuntimeOOM", change
        applied = done["status"]["appliedEngineArgs"]
        lowered = float(applied[applied.index("--mem-fraction-static") + 1])
        assert lowered < fraction
        assert done["status"]["failedEngineArgs"][0]["failure"] == "runtime_oom"
        for pod in by_role(pool.pods()):
            args = sglang_container(pod)["args"]
            assert float(args[args.index("--mem-fraction-static") + 1]) == lowered, pod["metadata"]["name"]


# ------------------------------------------------------------ an EngineTuner on a group another stack made

FOREIGN_MODEL = "meta-llama/Llama-3.1-70B-Instruct"
LWS_RESOURCE = CRD_NAME  # leaderworkersets.leaderworkerset.x-k8s.io


def foreign_set(
    name: str, ns: str, container: str, image: str, leader: list[str], worker: list[str]
) -> dict[str, Any]:
    """A LeaderWorkerSet as another stack writes one (llm-d's or a hand-made manifest): one group of a
    leader and a worker on the namespace's tainted pool, 8 GPUs each, running ``leader`` and ``worker``."""

    def template(command: list[str]) -> dict[str, Any]:
        return {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "nodeSelector": {POOL_LABEL: ns},
                "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": container,
                        "image": image,
                        "command": command,
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }

    return {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": template(leader),
                "workerTemplate": template(worker),
            },
        },
    }


def foreign_group(name: str, ns: str) -> dict[str, Any]:
    """vLLM's own multi-node flags: tensor x pipeline parallel 8 x 2 over a leader and a headless worker."""
    common = ["vllm", "serve", FOREIGN_MODEL, "--tensor-parallel-size", "8", vllm.PIPELINE_PARALLEL_FLAG, "2"]
    common += [vllm.NNODES_FLAG, "2", vllm.MASTER_ADDR_FLAG, lws.LEADER_ADDRESS]
    leader = [*common, vllm.NODE_RANK_FLAG, "0"]
    worker = [*common, vllm.NODE_RANK_FLAG, lws.WORKER_INDEX, vllm.HEADLESS_FLAG]
    return foreign_set(name, ns, "vllm", "vllm/vllm-openai:v0.33.0", leader, worker)


@dataclass
class TargetGroup:
    """A LeaderWorkerSet another stack made, in a namespace of its own with two tainted 8 x H100 nodes, the
    operator on the host and its EngineTuner webhook registered: what both engines' tests do to it."""

    cluster: LocalCluster
    ns: str
    name: str
    log: Path

    def apply_tuner(self) -> None:
        """An EngineTuner in mode Initial on the set."""
        self.cluster.apply(
            {
                "apiVersion": "kvpilot.io/v1alpha1",
                "kind": "EngineTuner",
                "metadata": {"name": self.name, "namespace": self.ns},
                "spec": {"targetRef": {"kind": lws.KIND, "name": self.name}, "updateMode": "Initial"},
            }
        )

    def pods(self) -> list[dict[str, Any]]:
        items = get(self.cluster, "pods", "-n", self.ns, "-l", f"{lws.NAME_LABEL}={self.name}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def generation(self) -> int:
        return int(get(self.cluster, LWS_RESOURCE, self.name, "-n", self.ns)["metadata"]["generation"])

    def wait_status(self, has: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """The EngineTuner's status once ``has`` holds of it; the operator's log in the failure."""

        def status() -> dict[str, Any] | None:
            st = (get(self.cluster, RESOURCE, self.name, "-n", self.ns) or {}).get("status") or {}
            return st if has(st) else None

        try:
            found: dict[str, Any] = wait_for(status, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.log.read_text()[-4000:]}") from None
        return found

    def wait_recommended(self, key: str) -> dict[str, Any]:
        """The status once Ready with a recommendation (``key``: ``settings`` for vLLM, ``engineArgs``)."""

        def ready(st: dict[str, Any]) -> bool:
            up = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or ())
            return up and bool((st.get("recommendation") or {}).get(key))

        return self.wait_status(ready, 120, f"the EngineTuner's recommendation for group {self.name}")

    def recreate(self) -> list[dict[str, Any]]:
        """Delete the leader; LWS's new leader and worker, once both exist."""
        old = {p["metadata"]["uid"] for p in self.pods()}
        self.cluster.kubectl("delete", "pod", f"{self.name}-0", "-n", self.ns, "--wait=false")

        def new_group() -> list[dict[str, Any]] | None:
            pods = self.pods()
            fresh = [p for p in pods if p["metadata"]["uid"] not in old]
            return fresh if len(fresh) == 2 and len(pods) == 2 else None

        fresh: list[dict[str, Any]] = wait_for(new_group, 120, "LWS's new leader and worker")
        return fresh

    def crash(self, pod: dict[str, Any], message: str) -> dict[str, Any]:
        """``pod``'s engine crashes with ``message``; the status once the loop has retuned for it. LWS deletes
        the group at once and makes a new one: the operator's watch filed the crash on its way."""
        simulate_container_crash(
            self.cluster.kubeconfig,
            self.ns,
            pod["metadata"]["name"],
            message=message,
            restart_count=1,
            kubectl=self.cluster.kubectl_bin,
        )

        def retuned(st: dict[str, Any]) -> bool:
            return any(h.get("action") == "Retuned" for h in st.get("history") or ())

        return self.wait_status(retuned, 120, "the EngineTuner's crash remedy")


@contextlib.contextmanager
def target_group(
    cluster: LocalCluster, tmp_path: Path, prefix: str, make: Callable[[str, str], dict[str, Any]], name: str
) -> Iterator[TargetGroup]:
    """The set ``make(name, namespace)`` applied in a fresh :class:`TargetGroup`'s namespace."""
    install_crds(cluster)
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    nodes = NodePool(
        f"lws-{ns[-6:]}", 2, H100_80GB_HBM3, 8, cpu="192", memory="2048Gi", machine="p5.48xlarge"
    )
    webhook = Webhook.make(tmp_path)
    hook = webhook_configuration(f"kvpilot-{ns}", webhook.port, webhook.ca, ns)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cluster.tainted_nodes(nodes, POOL_LABEL, ns, TAINT))
        stack.enter_context(cluster.temporary_namespace(ns))
        log = stack.enter_context(host_operator(cluster, tmp_path / "operator.log", ns, webhook.env()))
        wait_for(lambda: "Listening for webhooks at" in log.read_text(), 30, "the webhook server to listen")
        cluster.apply(hook)
        stack.callback(cluster.kubectl, "delete", "mutatingwebhookconfiguration", hook["metadata"]["name"])
        cluster.apply(make(name, ns))
        yield TargetGroup(cluster, ns, name, log)


def test_an_engine_tuner_tunes_a_group_another_stack_made(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The last gap of the target mode: an EngineTuner (Initial) on a LeaderWorkerSet kvpilot did not make.
    It reads the leader's flags and the group's size from the set, plans the owner's 8 x 2 layout over the
    group's 16 GPUs, and its admission webhook gives the recommendation to the leader and the worker the
    real LWS controller makes after the leader is deleted. A CUDA OOM of that worker, whose group LWS
    recreates at once, lowers the recommendation; the set itself is never written."""
    with target_group(cluster, tmp_path, "kvtlws", foreign_group, "big") as group:
        group.apply_tuner()
        status = group.wait_recommended("settings")
        found = status["discovered"]
        assert found["model"] == FOREIGN_MODEL and found["gpuCount"] == 8, found
        assert found["gpuProduct"] == "NVIDIA-H100-80GB-HBM3" and found["pods"] == 2, found
        assert 7 < status["budget"]["weightsGiB"] < 10, status["budget"]  # ~131 GiB over 16 GPUs
        rec = api.Settings.model_validate(status["recommendation"]["settings"]).to_engine()
        generation = group.generation()
        fresh = group.recreate()
        for pod in fresh:
            assert target.pod_carries(pod, "vllm", rec), (pod["metadata"]["name"], container(pod)["command"])
            assert "kvpilot.io/tuned" in pod["metadata"].get("annotations", {}), pod["metadata"]
        leader, worker = by_role(fresh)
        assert vllm.HEADLESS_FLAG in container(worker)["command"]  # the owner's flags stay
        assert vllm.HEADLESS_FLAG not in container(leader)["command"]
        st = group.crash(worker, CUDA_OOM_MESSAGE)  # a CUDA OOM in the tuned worker
        *_, last = [h for h in st["history"] if h["action"] == "Retuned"]
        assert last["trigger"] == "CudaOOM", last
        lowered = float(st["recommendation"]["settings"]["gpuMemoryUtilization"])
        assert lowered < float(rec.gpu_memory_utilization or 1.0), st["recommendation"]
        assert group.generation() == generation  # the set was never written


def foreign_sglang_group(name: str, ns: str) -> dict[str, Any]:
    """SGLang over two nodes as another stack writes it (SGLang's multi-node launch: one ``--tp-size 16``
    across ``--nnodes 2``, each node's ``--node-rank``, node 0's address in ``--dist-init-addr``)."""
    common = ["python3", "-m", "sglang.launch_server", "--model-path", FOREIGN_MODEL, "--tp-size", "16"]
    common += ["--nnodes", "2", "--dist-init-addr", f"{lws.LEADER_ADDRESS}:20000", "--enable-metrics"]
    leader = [*common, "--node-rank", "0", "--host", "0.0.0.0", "--port", "30000"]
    worker = [*common, "--node-rank", lws.WORKER_INDEX]
    return foreign_set(name, ns, "sglang", "lmsysorg/sglang:v0.5.23", leader, worker)


def test_an_engine_tuner_tunes_an_sglang_group_another_stack_made(
    kube: ClusterKube, cluster: LocalCluster, tmp_path: Path
) -> None:
    """SGLang in a LeaderWorkerSet kvpilot did not make: the EngineTuner (Initial) plans the owner's
    ``--tp-size 16`` over the group's two 8-GPU nodes, its webhook gives SGLang's tuned flags to the leader
    and the worker the real LWS controller makes after the leader is deleted (their node flags kept), and
    the worker's CUDA OOM (SGLang's scheduler text), gone with its group at once, lowers
    ``--mem-fraction-static``; the set is never written."""
    with target_group(cluster, tmp_path, "kvtsglws", foreign_sglang_group, "sg") as group:
        group.apply_tuner()
        status = group.wait_recommended("engineArgs")
        found = status["discovered"]
        assert found["engine"] == "SGLang" and found["gpuCount"] == 8 and found["pods"] == 2, found
        args = status["recommendation"]["engineArgs"]
        fraction = float(args[args.index("--mem-fraction-static") + 1])
        assert args[args.index("--tp-size") + 1] == "16", args
        rec = TargetEngineArgs("SGLang", tuple(args))
        generation = group.generation()
        fresh = group.recreate()
        for pod in fresh:
            assert target.pod_carries(pod, "sglang", rec), (pod["metadata"]["name"], sglang_container(pod))
        _, worker = by_role(fresh)
        command = sglang_container(worker)["command"]
        assert command[command.index("--node-rank") + 1] == lws.WORKER_INDEX  # the owner's flags stay
        st = group.crash(worker, f"Scheduler hit an exception: {SGLANG_OOM}")
        *_, last = [h for h in st["history"] if h["action"] == "Retuned"]
        assert last["trigger"] == "RuntimeOOM", last
        lowered = st["recommendation"]["engineArgs"]
        assert float(lowered[lowered.index("--mem-fraction-static") + 1]) < fraction, lowered
        assert group.generation() == generation  # the set was never written
