"""EngineTuner modes Initial and Auto on the real local control plane: the real API server calls the
operator's mutating webhook over TLS on the host.

The operator runs on the host (``kopf run``, as in test_enginetuner.py) with ``KVPILOT_WEBHOOK_PORT``,
``KVPILOT_WEBHOOK_CERT_DIR`` (a CA and a 127.0.0.1 serving certificate made here with openssl) and
``KVPILOT_WEBHOOK_ADDR``; a MutatingWebhookConfiguration like the chart's (``failurePolicy: Ignore``,
``timeoutSeconds: 3``, the ``kvpilot.io/exclude`` label left out) points the API server at it by URL. Each
target is a Deployment shaped like production-stack's or KServe's vLLM runtime (e2e/targets.py), owned
by a stand-in foreign controller that server-side-applies its original spec every 2 s. Pods are KWOK's
on the L4 nodes; a crash is written to the pod's status as kubelet reports it (e2e/pods.py).

* Initial: a new pod (one deleted and replaced by the ReplicaSet) carries the recommendation, running
  pods are left alone, and the Deployment stays at generation 1 with the foreign controller its only
  writer.
* Auto: a target crash-looping with CUDA OOM is replaced by a pod with the recommendation; when that pod
  hits CUDA OOM too (said only in its previous log, which the operator reads through the API server), the
  closed loop lowers the recommendation (status.history, failedSettings) and the next pod carries the lower
  settings; the Deployment is never written.
* Operator stopped: pods are created untouched (failurePolicy Ignore), and promptly.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.pods import CUDA_OOM_MESSAGE, serve_previous_log, simulate_container_crash
from e2e.targets import (
    FOREIGN_MANAGER,
    LAYOUTS,
    RESOURCE,
    ForeignController,
    Webhook,
    engine_tuner,
    foreign_deployment,
    get,
    install_crds,
    webhook_configuration,
)
from e2e.waits import spawn_host_operator, stop_host_operator, wait_for

WAIT_S = 120.0
TUNED = "kvpilot.io/tuned"
# the same failure as vLLM prints it on an L4 (22 GiB) rather than an H100
L4_OOM_MESSAGE = (
    CUDA_OOM_MESSAGE.replace("79.11 GiB", "22.03 GiB")
    .replace("78.96 GiB", "21.88 GiB")
    .replace("68.83 GiB", "19.71 GiB")
)

ENGINE_CORE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
)
"""The last line of a real vLLM's log after its engine core died (the termination message's tail)."""


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Webhook:
    install_crds(cluster)
    return Webhook.make(tmp_path_factory.mktemp("enginetuner-webhook"))


@contextlib.contextmanager
def operator(cluster: LocalCluster, webhook: Webhook, name: str) -> Iterator[Any]:
    log = webhook.log_dir / f"{name}.log"
    proc = spawn_host_operator(cluster, log, "kvtwh-*", webhook.env())
    try:
        wait_for(
            lambda: "Listening for webhooks at" in log.read_text() or proc.poll() is not None,
            30,
            "the webhook server to listen",
        )
        yield proc
    finally:
        stop_host_operator(proc, log)


@dataclass
class Target:
    cluster: LocalCluster
    ns: str
    manifest: dict[str, Any]
    foreign: ForeignController

    def pods(self) -> list[dict[str, Any]]:
        items = (get(self.cluster, "pods", "-n", self.ns, "-l", "model=llama") or {}).get("items") or []
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def tuner(self) -> dict[str, Any]:
        return get(self.cluster, RESOURCE, "llama", "-n", self.ns) or {}

    def one_pod(self, other_than: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
        def found() -> Any:
            pods = [
                p
                for p in self.pods()
                if p["metadata"]["name"] not in other_than and p["spec"].get("nodeName")
            ]
            return pods[0] if len(pods) == 1 else None

        return wait_for(found, WAIT_S, f"{self.ns}: one new pod of the target")

    def recommendation(self, unlike: dict[str, Any] | None = None) -> dict[str, Any]:
        def ready() -> Any:
            status = self.tuner().get("status") or {}
            rec = (status.get("recommendation") or {}).get("settings")
            ready = [
                c for c in status.get("conditions") or () if c["type"] == "Ready" and c["status"] == "True"
            ]
            return rec if rec and ready and rec != unlike else None

        return wait_for(ready, WAIT_S, f"{self.ns}/llama: a recommendation (other than {unlike})")

    def assert_untouched(self) -> None:
        """The Deployment as its owner wrote it: generation 1 throughout, the original containers, and no
        writer of its spec but the foreign controller."""
        assert self.foreign.failures == []
        assert self.foreign.generations and set(self.foreign.generations) == {1}, self.foreign.generations
        deploy = get(self.cluster, "deployment", "llama", "-n", self.ns, "--show-managed-fields")
        assert deploy["metadata"]["generation"] == 1
        want = self.manifest["spec"]["template"]["spec"]["containers"][0]
        (c,) = deploy["spec"]["template"]["spec"]["containers"]
        assert (c["command"], c.get("args")) == (want["command"], want.get("args"))
        writers = {
            m["manager"] for m in deploy["metadata"]["managedFields"] if m.get("subresource") != "status"
        }
        assert writers == {FOREIGN_MANAGER}, deploy["metadata"]["managedFields"]


@contextlib.contextmanager
def target(cluster: LocalCluster, webhook: Webhook, layout: str) -> Iterator[Target]:
    ns = f"kvtwh-{uuid.uuid4().hex[:8]}"
    manifest = foreign_deployment("llama", *LAYOUTS[layout])
    mwc = webhook_configuration(f"kvpilot-e2e-{ns}", webhook.port, webhook.ca, ns)
    with cluster.temporary_namespace(ns):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(mwc))
        foreign = ForeignController(cluster, ns, manifest)
        foreign.apply_once()
        foreign.start()
        try:
            t = Target(cluster, ns, manifest, foreign)
            yield t
        finally:
            foreign.stop()
            cluster.kubectl("delete", "mutatingwebhookconfiguration", mwc["metadata"]["name"], check=False)


def vllm_container(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    return c


def tokens(pod: dict[str, Any]) -> list[str]:
    c = vllm_container(pod)
    return [*(c.get("command") or ()), *(c.get("args") or ())]


def carries(pod: dict[str, Any], rec: dict[str, Any]) -> bool:
    """The pod's command line sets the recommendation's context and sequences (both layouts spell them
    ``--max-model-len N`` / ``--max-num-seqs N`` after the rewrite) and utilisation when set."""
    words = " ".join(tokens(pod)).replace("=", " ")
    want = [f"--max-model-len {rec['maxModelLen']}", f"--max-num-seqs {rec['maxNumSeqs']}"]
    if rec.get("gpuMemoryUtilization") is not None:
        want.append(f"--gpu-memory-utilization {rec['gpuMemoryUtilization']}")
    return all(w in words for w in want) and TUNED in (pod["metadata"].get("annotations") or {})


def replace_pod(t: Target, pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    t.cluster.kubectl("delete", "pod", name, "-n", t.ns, "--wait=false")
    return t.one_pod(other_than={name})


@pytest.mark.e2e
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_initial_tunes_new_pods_only_and_never_the_deployment(
    cluster: LocalCluster, webhook: Webhook, layout: str
) -> None:
    with operator(cluster, webhook, f"initial-{layout}"), target(cluster, webhook, layout) as t:
        first = t.one_pod()
        original = tokens(first)
        cluster.kubectl("apply", "-n", t.ns, "-f", "-", input=json.dumps(engine_tuner("llama", "Initial")))
        rec = t.recommendation()
        assert rec["maxModelLen"] < 131072  # an L4 cannot hold that context next to 15 GiB of weights
        time.sleep(3)  # a few timer ticks: Initial leaves the running pod alone
        assert [p["metadata"]["name"] for p in t.pods()] == [first["metadata"]["name"]]
        assert tokens(t.pods()[0]) == original

        fresh = replace_pod(t, first)
        assert carries(fresh, rec), (tokens(fresh), rec)
        assert fresh["metadata"]["annotations"][TUNED].startswith("llama: ")
        # only the tuned flags changed: the rest of the command line is the owner's
        assert [w for w in tokens(fresh) if w in ("--host", "0.0.0.0", "--port", "8000")] == [
            w for w in original if w in ("--host", "0.0.0.0", "--port", "8000")
        ]
        status = wait_for(
            lambda: (s := t.tuner()["status"])["discovered"]["podsTuned"] == 1 and s,
            30,
            "status.discovered.podsTuned",
        )
        assert status["discovered"]["pods"] == 1
        time.sleep(5)  # the foreign controller re-applies twice more
        t.assert_untouched()


@pytest.mark.e2e
def test_auto_fixes_an_oom_loop_without_editing_the_deployment(
    cluster: LocalCluster, webhook: Webhook, tmp_path: Path
) -> None:
    with operator(cluster, webhook, "auto"), target(cluster, webhook, "production-stack") as t:
        first = t.one_pod()
        simulate_container_crash(
            cluster.kubeconfig,
            t.ns,
            first["metadata"]["name"],
            container="vllm",
            message=L4_OOM_MESSAGE,
            kubectl=cluster.kubectl_bin,
        )
        cluster.kubectl("apply", "-n", t.ns, "-f", "-", input=json.dumps(engine_tuner("llama", "Auto")))
        planned = t.recommendation()
        # the crash-looping pod runs the owner's settings: evicted at once, its replacement tuned
        second = t.one_pod(other_than={first["metadata"]["name"]})
        assert carries(second, planned), (tokens(second), planned)

        # the recommendation itself hits CUDA OOM: the closed loop lowers it, Auto replaces the pod. The
        # termination message explains nothing (a real vLLM's start-up failure leaves its cause further up):
        # the EngineTuner reads the previous log through the API server (KWOK serves it), as an
        # InferenceService does
        serve_previous_log(
            cluster.kubeconfig,
            t.ns,
            second["metadata"]["name"],
            "vllm",
            L4_OOM_MESSAGE,
            tmp_path,
            kubectl=cluster.kubectl_bin,
        )
        simulate_container_crash(
            cluster.kubeconfig,
            t.ns,
            second["metadata"]["name"],
            container="vllm",
            message=ENGINE_CORE_FAILED,
            kubectl=cluster.kubectl_bin,
        )
        lowered = t.recommendation(unlike=planned)
        third = t.one_pod(other_than={first["metadata"]["name"], second["metadata"]["name"]})
        assert carries(third, lowered), (tokens(third), lowered)
        status = t.tuner()["status"]
        retuned = [h for h in status["history"] if h["action"] == "Retuned"]
        assert retuned and retuned[-1]["trigger"] == "CudaOOM", status["history"]
        assert {k: v for k, v in retuned[-1]["from"].items() if v is not None} == {
            k: v for k, v in planned.items() if v is not None
        }
        assert any(
            {k: v for k, v in f.items() if v is not None}
            == {k: v for k, v in planned.items() if v is not None}
            for f in status["failedSettings"]
        )
        lower = (lowered.get("gpuMemoryUtilization") or 1) < (planned.get("gpuMemoryUtilization") or 1)
        assert lower or lowered["maxNumSeqs"] < planned["maxNumSeqs"], (planned, lowered)
        assert status["evictions"] == 2
        time.sleep(6)  # three more foreign applies and timer ticks: nothing fights, nothing more is evicted
        assert [p["metadata"]["name"] for p in t.pods()] == [third["metadata"]["name"]]
        t.assert_untouched()


@pytest.mark.e2e
def test_pods_are_created_untouched_while_the_operator_is_down(
    cluster: LocalCluster, webhook: Webhook
) -> None:
    with target(cluster, webhook, "kserve") as t:
        first = t.one_pod()
        with operator(cluster, webhook, "stopped"):
            cluster.kubectl(
                "apply", "-n", t.ns, "-f", "-", input=json.dumps(engine_tuner("llama", "Initial"))
            )
            rec = t.recommendation()
            tuned = replace_pod(t, first)
            assert carries(tuned, rec)
        # the operator is gone: the API server cannot reach the webhook and, with Ignore, admits the pod
        started = time.monotonic()
        untouched = replace_pod(t, tuned)
        elapsed = time.monotonic() - started
        assert tokens(untouched) == tokens(first)
        assert TUNED not in (untouched["metadata"].get("annotations") or {})
        assert elapsed < 30, elapsed
        t.assert_untouched()
