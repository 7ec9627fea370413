"""The Helm chart on the real local control plane: install, upgrade, namespace-scoped mode, uninstall, and the
chart's RBAC proven both ways.

* The install / upgrade / namespaced / uninstall steps are the ``<!-- e2e: NAME -->`` command blocks of
  docs/install.md, run verbatim with bash from the repository root: the documentation is what is tested.
* "Allowed": the operator runs on the host with the chart's exact container command and environment, but
  authenticated only by a TokenRequest token of the chart's ServiceAccount (``kubectl create token``); it must
  reconcile an example InferenceService into its Deployment and Service without a single 403.
* "Denied": ``kubectl auth can-i`` with that token, for what the operator does not need.

The module starts its own cluster: Helm must own the InferenceService CRD from the first install, and other
e2e modules may already have applied it with kubectl to the shared one.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.chart_harness import NS, ROOT, SA, SA_USER, ChartHarness, module_cluster
from e2e.cluster import LocalCluster, free_port
from e2e.waits import wait_for

DOCS = ROOT / "docs" / "install.md"
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-on-l4.yaml"
OPERATOR_ROLES = (
    "discovery",
    "gpu-discovery",
    "capacity",
    "framework",
    "inferenceservices",
    "workloads",
    "model-config",
    "disruption",
    "tuningprofiles",
    "enginetuners",
)


# --------------------------------------------------------------------------- helpers


def doc_blocks() -> dict[str, str]:
    """The ``<!-- e2e: NAME -->`` fenced bash blocks of docs/install.md, by name."""
    found = re.findall(r"<!-- e2e: ([\w-]+) -->\n```bash\n(.*?)```", DOCS.read_text(), flags=re.S)
    return dict(found)


class Chart(ChartHarness):
    """The module's cluster (:class:`ChartHarness`) plus the doc commands of docs/install.md."""

    def __init__(self, cluster: LocalCluster, home: Path) -> None:
        super().__init__(cluster, home)
        self.blocks = doc_blocks()

    def run_doc(self, name: str) -> None:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", self.blocks[name]],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"docs/install.md block {name!r} failed:\n{proc.stdout}\n{proc.stderr}"


class HostOperator:
    """The chart's container (command, args, env) run as a host process with a ServiceAccount kubeconfig."""

    def __init__(self, chart: Chart, kubeconfig: Path, identity: str) -> None:
        deploy = chart.get("deployment", "kvpilot", "--namespace", NS)
        (container,) = deploy["spec"]["template"]["spec"]["containers"]
        self.liveness_port, self.metrics_port = free_port(), free_port()
        argv = [
            re.sub(
                r"^--liveness=http://0\.0\.0\.0:\d+/", f"--liveness=http://127.0.0.1:{self.liveness_port}/", a
            )
            for a in container["command"] + container["args"]
        ]
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(chart.home),
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": str(ROOT),  # this checkout's kvpilot, not whichever the venv installed
        }
        for e in container["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = identity
        env["KVPILOT_METRICS_PORT"] = str(self.metrics_port)
        if "KVPILOT_WEBHOOK_CERT_DIR" in env:  # the pod's mount of the chart's webhook Secret, on the host
            secret = chart.get("secret", "kvpilot-webhook-tls", "--namespace", NS)
            tls = chart.home / f"webhook-tls-{identity}"
            tls.mkdir(exist_ok=True)
            for key in ("tls.crt", "tls.key"):
                (tls / key).write_bytes(base64.b64decode(secret["data"][key]))
            env.update(
                KVPILOT_WEBHOOK_CERT_DIR=str(tls),
                KVPILOT_WEBHOOK_PORT=str(free_port()),
                KVPILOT_WEBHOOK_ADDR="127.0.0.1",
            )
        self.identity = identity
        self.log_path = chart.home / f"operator-{identity}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=chart.home,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the shell exec'd kopf, nothing else
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as rsp:
            return rsp.read().decode()


def assert_no_forbidden(op: HostOperator) -> None:
    # The leading "[2026-11-30 12:39:35,403]" stamp is cut first: its milliseconds can read 403.
    denied = [
        ln for ln in op.log.splitlines() if re.search(r"\b403\b|[Ff]orbidden", re.sub(r"^\[[^\]]*\]", "", ln))
    ]
    assert denied == [], "the operator hit RBAC denials:\n" + "\n".join(denied[:20])


def reconcile_example(chart: Chart, op: HostOperator, namespace: str) -> dict[str, Any]:
    """Apply the example InferenceService in ``namespace`` (as admin); return the operator's Deployment."""
    if chart.get("namespace", namespace) is None:
        chart.kubectl("create", "namespace", namespace)
    chart.kubectl("--namespace", namespace, "apply", "-f", str(EXAMPLE))
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]

    def made() -> Any:
        assert op.alive(), f"the operator exited ({op.proc.returncode}):\n{op.log[-4000:]}"
        return chart.get("deployment", name, "--namespace", namespace)

    deploy = wait_for(made, 120, f"Deployment {namespace}/{name} from the operator")
    (owner,) = deploy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("InferenceService", name)
    wait_for(lambda: chart.get("service", name, "--namespace", namespace), 60, f"Service {namespace}/{name}")
    return deploy


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chart]:
    with module_cluster(tmp_path_factory, "chart") as (cluster, home):
        yield Chart(cluster, home)


@pytest.fixture
def operators() -> Iterator[list[HostOperator]]:
    started: list[HostOperator] = []
    yield started
    for op in started:
        op.stop()


# --------------------------------------------------------------------------- tests, in order


def test_install_creates_everything(chart: Chart) -> None:
    assert list(doc_blocks()) == ["install", "try", "upgrade", "namespaced", "uninstall"]
    chart.run_doc("install")
    for crd in (
        "inferenceservices.kvpilot.io",
        "tuningprofiles.kvpilot.io",
        "enginetuners.kvpilot.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ):
        conditions = {c["type"]: c["status"] for c in chart.get("crd", crd)["status"]["conditions"]}
        assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert (
        chart.get("crd", "inferenceservices.kvpilot.io")["metadata"]["annotations"]["helm.sh/resource-policy"]
        == "keep"
    )
    for kind, name in (("deployment", "kvpilot"), ("serviceaccount", SA), ("service", "kvpilot-metrics")):
        assert chart.get(kind, name, "--namespace", NS), f"{kind}/{name} missing"
    for role in (*OPERATOR_ROLES, "view", "edit"):
        assert chart.get("clusterrole", f"kvpilot-{role}"), role
    for role in OPERATOR_ROLES:
        binding = chart.get("clusterrolebinding", f"kvpilot-{role}")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    assert chart.get("clusterkopfpeering", "kvpilot") is not None
    # the pod passed the namespace's `restricted` Pod Security admission and is Ready (KWOK plays kubelet)
    bad = chart.kubectl(
        "--namespace",
        NS,
        "run",
        "privileged",
        "--image=busybox",
        "--privileged",
        "--dry-run=server",
        check=False,
    )
    assert bad.returncode != 0 and "violates PodSecurity" in bad.stderr, "restricted is not enforced here"
    pods = chart.get("pods", "--namespace", NS, "-l", "app.kubernetes.io/name=kvpilot")["items"]
    assert len(pods) == 1
    assert {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}["Ready"] == "True"
    releases = json.loads(
        subprocess.run(
            [str(chart.cluster.helm_bin), "list", "-n", NS, "-o", "json"],
            env=chart.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert [(r["name"], r["status"]) for r in releases] == [("kvpilot", "deployed")]


def test_operator_reconciles_with_only_the_service_account_token(
    chart: Chart, operators: list[HostOperator]
) -> None:
    kubeconfig = chart.sa_kubeconfig()
    whoami = subprocess.run(
        [str(chart.cluster.kubectl_bin), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == SA_USER
    op = HostOperator(chart, kubeconfig, "host-operator-a")
    operators.append(op)
    chart.run_doc("try")  # docs/install.md "Try it": apply an example, wait for its Deployment and Service
    deploy = chart.get("deployment", "llama-8b-l4", "--namespace", "demo")
    (owner,) = deploy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("InferenceService", "llama-8b-l4")
    assert deploy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvpilot"
    isvc = wait_for(
        lambda: (
            (chart.get("inferenceservices.kvpilot.io", "llama-8b-l4", "-n", "demo") or {})
            .get("status", {})
            .get("conditions")
        ),
        60,
        "status conditions written",
    )
    assert {c["type"] for c in isvc} >= {"Ready"}
    # it keeps itself alive in the chart's peering object, and serves its own metrics
    peers = wait_for(lambda: (chart.get("clusterkopfpeering", "kvpilot") or {}).get("status"), 60, "peering")
    assert "host-operator-a" in peers
    assert "kvpilot_reconciles_total" in op.metrics()
    assert_no_forbidden(op)
    op.stop()
    assert "host-operator-a" not in ((chart.get("clusterkopfpeering", "kvpilot") or {}).get("status") or {})


def _active(op: HostOperator) -> bool:
    """kopf starts paused and logs each peering transition; the last one says whether it acts now."""
    states = re.findall(r"(Resuming|Pausing) operations", op.log)
    return bool(states) and states[-1] == "Resuming"


def test_second_replica_waits(chart: Chart, operators: list[HostOperator]) -> None:
    """Two copies of the chart's command draw random peering priorities: exactly one acts, the other waits."""
    kubeconfig = chart.sa_kubeconfig()
    a = HostOperator(chart, kubeconfig, "host-operator-a")
    operators.append(a)
    wait_for(lambda: _active(a), 60, "replica a to start acting")
    b = HostOperator(chart, kubeconfig, "host-operator-b")
    operators.append(b)

    def peers() -> set[str]:
        return set((chart.get("clusterkopfpeering", "kvpilot") or {}).get("status") or {})

    wait_for(
        lambda: {"host-operator-a", "host-operator-b"} <= peers(), 60, "both replicas in the peering object"
    )
    wait_for(lambda: [_active(a), _active(b)].count(True) == 1, 60, "exactly one active replica")
    time.sleep(5)  # and it stays that way
    assert [_active(a), _active(b)].count(True) == 1, (a.log[-2000:], b.log[-2000:])
    # only the active one handles a new InferenceService; the paused one does not even see it
    reconcile_example(chart, a if _active(a) else b, "peering")
    handled = [op.identity for op in (a, b) if "[peering/llama-8b-l4]" in op.log]
    assert handled == [(a if _active(a) else b).identity]
    assert a.alive() and b.alive()
    # `kopf freeze` (priority 100) outranks the replicas' negative priorities: both pause; resume undoes it
    kopf = [str(Path(sys.executable).parent / "kopf")]
    peering = ["--all-namespaces", "--peering=kvpilot"]
    subprocess.run([*kopf, "freeze", *peering, "--lifetime=300"], env=chart.env, check=True, timeout=60)
    wait_for(lambda: not _active(a) and not _active(b), 60, "both replicas to pause for kopf freeze")
    subprocess.run([*kopf, "resume", *peering], env=chart.env, check=True, timeout=60)
    wait_for(lambda: [_active(a), _active(b)].count(True) == 1, 60, "one replica to resume")
    assert_no_forbidden(a)
    assert_no_forbidden(b)


DENIED = [
    ("list", "secrets", "--all-namespaces"),
    ("list", "secrets", "--namespace", "demo"),
    ("watch", "secrets", "--namespace", "demo"),
    ("create", "secrets", "--namespace", "demo"),
    ("delete", "secrets", "--namespace", "demo"),
    ("create", "inferenceservices.kvpilot.io", "--namespace", "demo"),
    ("delete", "inferenceservices.kvpilot.io", "--namespace", "demo"),
    ("list", "configmaps", "--namespace", "demo"),
    ("update", "configmaps", "--namespace", "demo"),
    ("delete", "deployments.apps", "--namespace", "demo"),
    ("update", "deployments.apps", "--namespace", "demo"),
    ("delete", "services", "--namespace", "demo"),
    ("update", "services", "--namespace", "demo"),
    ("create", "pods", "--namespace", "demo"),
    ("delete", "pods", "--namespace", "demo"),
    ("create", "pods", "--subresource=exec", "--namespace", "demo"),
    ("create", "statefulsets.apps", "--namespace", "demo"),
    ("patch", "statefulsets.apps", "--namespace", "demo"),
    ("create", "enginetuners.kvpilot.io", "--namespace", "demo"),
    ("create", "daemonsets.apps", "--namespace", "demo"),
    ("create", "jobs.batch", "--namespace", "demo"),
    ("patch", "nodes"),
    ("delete", "nodes"),
    ("create", "namespaces"),
    ("delete", "namespaces"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io", "--namespace", "demo"),
    ("impersonate", "serviceaccounts", "--namespace", "demo"),
    ("delete", "clusterkopfpeerings.kopf.dev/kvpilot"),
    ("patch", "clusterkopfpeerings.kopf.dev/someone-else"),
    ("create", "serviceaccounts", "--subresource=token", "--namespace", NS),
    ("update", "tuningprofiles.kvpilot.io"),
    ("delete", "tuningprofiles.kvpilot.io"),
    ("watch", "tuningprofiles.kvpilot.io"),
]
ALLOWED = [
    ("watch", "inferenceservices.kvpilot.io", "--all-namespaces"),
    ("patch", "inferenceservices.kvpilot.io", "--subresource=status", "--namespace", "demo"),
    ("create", "deployments.apps", "--namespace", "demo"),
    ("patch", "services", "--namespace", "demo"),
    ("watch", "pods", "--all-namespaces"),
    ("list", "nodes"),
    ("get", "secrets/hf-token", "--namespace", "demo"),
    ("get", "configmaps/model-config", "--namespace", "demo"),
    ("create", "events", "--namespace", "demo"),
    ("patch", "clusterkopfpeerings.kopf.dev/kvpilot"),
    ("list", "tuningprofiles.kvpilot.io"),
    ("create", "tuningprofiles.kvpilot.io"),
    ("patch", "tuningprofiles.kvpilot.io", "--subresource=status"),
    ("patch", "enginetuners.kvpilot.io", "--subresource=status", "--namespace", "demo"),
    ("get", "statefulsets.apps", "--namespace", "demo"),
    ("create", "pods", "--subresource=eviction", "--namespace", "demo"),
    ("get", "pods", "--subresource=log", "--namespace", "demo"),
]


def test_rbac_denies_what_the_operator_does_not_need(chart: Chart) -> None:
    kubeconfig = chart.sa_kubeconfig()
    wrongly_allowed = [" ".join(args) for args in DENIED if chart.can_i(kubeconfig, *args)]
    wrongly_denied = [" ".join(args) for args in ALLOWED if not chart.can_i(kubeconfig, *args)]
    assert (wrongly_allowed, wrongly_denied) == ([], [])


def test_the_service_account_reads_a_crashed_pods_previous_log(chart: Chart, tmp_path: Path) -> None:
    """The operator's previous-log read (``ClusterPods.read_previous_log``: ``pods/log?previous=true``, the
    last 400 lines) with only the chart's ServiceAccount token: the API server proxies it to the node's
    kubelet (KWOK), which serves the log a crashed vLLM left (the real engine's shape: the ValueError is not
    in the termination message). The restart is then classified from it, as in the closed loop."""
    from kubernetes import config

    from e2e import pods
    from e2e.fleet.truth import EngineArgs, GroundTruth
    from kvpilot.operator.clients.pod_logs import POD_GONE, UnreadLog
    from kvpilot.operator.pods.pod_reading import LOG_TAIL_LINES, ClusterPods
    from kvpilot.operator.pods.pod_view import build_pod_view
    from kvpilot.tuner.loop.observations import RestartKind

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "crashed-vllm", "namespace": "demo"},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.33.0",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ]
        },
    }
    chart.kubectl("create", "namespace", "demo", check=False)  # the install doc's step makes it too
    chart.kubectl("apply", "-f", "-", input=json.dumps(pod))
    truth, args = GroundTruth(non_kv_gib=60.0), EngineArgs(max_model_len=131072)
    error = truth.startup_error(args)
    assert error is not None
    log = truth.startup_failure_log(args, error)
    kubeconfig, kubectl = chart.cluster.kubeconfig, chart.cluster.kubectl_bin
    pods.serve_previous_log(kubeconfig, "demo", "crashed-vllm", "vllm", log, tmp_path, kubectl=kubectl)
    message = truth.startup_failure_message(args, error)
    crashed = pods.simulate_container_crash(
        kubeconfig, "demo", "crashed-vllm", message=message, kubectl=kubectl
    )
    reader = ClusterPods(config.new_client_from_config(config_file=str(chart.sa_kubeconfig())))
    tail = reader.read_previous_log("demo", "crashed-vllm", "vllm", LOG_TAIL_LINES)
    assert isinstance(tail, str) and tail.splitlines() == log.splitlines()
    # a read that fails says why, from the API server's own answer (here: the pod is gone)
    gone = reader.read_previous_log("demo", "no-such-vllm", "vllm", LOG_TAIL_LINES)
    assert isinstance(gone, UnreadLog) and gone.reason == POD_GONE, gone
    assert build_pod_view(crashed).needs_log  # the termination message alone says nothing
    view = build_pod_view(crashed, log_tail=tail)
    assert view.restart is not None and view.restart.cause.kind == RestartKind.KV_CACHE_TOO_SMALL
    chart.kubectl("delete", "pod", "crashed-vllm", "-n", "demo", "--wait=false")


def test_upgrade_upgrades_the_templated_crd(chart: Chart) -> None:
    """A chart whose CRD gained a printer column: `helm upgrade` applies it; the doc's upgrade restores."""
    changed = chart.home / "chart-next"
    shutil.copytree(ROOT / "charts" / "kvpilot", changed, dirs_exist_ok=True)
    crd_copy = changed / "files" / "crds" / "inferenceservices.kvpilot.io.yaml"
    text = crd_copy.read_text()
    marker = "        - name: Age\n"
    assert marker in text
    crd_copy.write_text(
        text.replace(
            marker,
            "        - name: Upgraded\n          type: string\n          jsonPath: .spec.model.id\n" + marker,
            1,
        )
    )
    subprocess.run(
        [
            str(chart.cluster.helm_bin),
            "upgrade",
            "kvpilot",
            str(changed),
            "--namespace",
            NS,
            "--reuse-values",
            "--wait",
        ],
        env=chart.env,
        check=True,
        capture_output=True,
        text=True,
    )

    def columns() -> list[str]:
        crd = chart.get("crd", "inferenceservices.kvpilot.io")
        return [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]

    assert "Upgraded" in columns()
    chart.run_doc("upgrade")
    assert "Upgraded" not in columns()
    assert chart.get("inferenceservices.kvpilot.io", "llama-8b-l4", "-n", "demo"), "upgrade lost an object"


def test_namespaced_mode_confines_the_operator(chart: Chart, operators: list[HostOperator]) -> None:
    chart.run_doc("namespaced")
    for role in ("framework", "inferenceservices", "workloads", "model-config", "disruption"):
        assert chart.get("clusterrole", f"kvpilot-{role}") is None, f"ClusterRole kvpilot-{role} left behind"
        assert chart.get("role", f"kvpilot-{role}", "--namespace", "team-a"), role
    assert chart.get("clusterkopfpeering", "kvpilot") is None
    assert chart.get("kopfpeering", "kvpilot", "--namespace", "team-a")
    kubeconfig = chart.sa_kubeconfig()
    can = lambda *args: chart.can_i(kubeconfig, *args)  # noqa: E731
    assert can("patch", "deployments.apps", "--namespace", "team-a")
    assert not can("patch", "deployments.apps", "--namespace", "demo")
    assert not can("list", "deployments.apps", "--all-namespaces")
    assert not can("watch", "inferenceservices.kvpilot.io", "--all-namespaces")
    assert can("get", "secrets/hf-token", "--namespace", "team-a")
    assert not can("get", "secrets/other", "--namespace", "team-a")
    assert not can("get", "secrets/hf-token", "--namespace", "demo")
    assert can("create", "pods", "--subresource=eviction", "--namespace", "team-a")
    assert can("patch", "poddisruptionbudgets.policy", "--namespace", "team-a")
    for elsewhere in ("demo", "kube-system"):
        assert not can("create", "pods", "--subresource=eviction", "--namespace", elsewhere)
        assert not can("patch", "poddisruptionbudgets.policy", "--namespace", elsewhere)
    assert can("list", "nodes")
    # the operator, confined, still runs the scenario in its namespace
    op = HostOperator(chart, kubeconfig, "host-operator-ns")
    operators.append(op)
    reconcile_example(chart, op, "team-a")
    assert_no_forbidden(op)


def test_uninstall_keeps_the_crd_and_the_services(chart: Chart) -> None:
    chart.run_doc("uninstall")
    assert chart.get("deployment", "kvpilot", "--namespace", NS) is None
    for role in (*OPERATOR_ROLES, "view", "edit"):
        assert chart.get("clusterrole", f"kvpilot-{role}") is None
    assert chart.get("role", "kvpilot-workloads", "--namespace", "team-a") is None
    assert chart.get("kopfpeering", "kvpilot", "--namespace", "team-a") is None
    for crd in (
        "inferenceservices.kvpilot.io",
        "tuningprofiles.kvpilot.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ):
        assert chart.get("crd", crd), f"{crd} was deleted"
    assert chart.get("inferenceservices.kvpilot.io", "llama-8b-l4", "-n", "demo")
    assert chart.get("deployment", "llama-8b-l4", "--namespace", "demo")
