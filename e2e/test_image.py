"""The operator image, built for real and run against the local control plane (e2e/image.py says how).

* The repository's Dockerfile is built with buildah on a base made by debootstrap (no registry, no Docker
  engine); its size and build time are printed. A missing buildah, podman, runc or debootstrap is an error
  (``make image-apt`` installs them), never a skip.
* The final stage runs as UID 10001 and holds no compiler and no package manager (pip, setuptools, wheel,
  ensurepip, apt, dpkg), checked inside the running image.
* The chart's ServiceAccount and RBAC (``helm template``, namespace-scoped mode) are applied to the shared
  e2e cluster; the operator runs from the image under podman with the chart's container command, arguments
  and environment, authenticated as in a pod: ``KUBERNETES_SERVICE_HOST``/``PORT`` and a TokenRequest token
  of that ServiceAccount with the cluster's ``ca.crt`` at ``/var/run/secrets/kubernetes.io/serviceaccount``.
  Like the chart's pod, it gets a read-only root filesystem, a writable ``/tmp``, no capabilities and
  ``no-new-privileges``; its emptyDir volumes (``/tmp``, the Hub cache under ``HF_HOME``) are tmpfs mounts. It
  must reconcile the example InferenceService (Deployment and status) without a 403, resolve a ``source: Hub``
  model from a stand-in Hub (``e2e/hub_standin.py``, reached through ``HF_ENDPOINT``) into the chart's Hub
  cache, and answer its liveness and metrics endpoints.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import image
from e2e.cluster import LocalCluster, free_port, versions
from e2e.hub_standin import StandInHub
from e2e.waits import wait_established, wait_for

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-on-l4.yaml"
HUB_MODEL = "acme/llama-1b"
HUB_CONFIG = ROOT / "tests" / "data" / "hf_configs" / "meta-llama__Llama-3.2-1B-Instruct.json"
RELEASE = "kvpilot-image"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# What a final stage must not carry: compilers and package managers (programs and Python modules).
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "cpp", "as", "ld", "make")
PACKAGE_MANAGERS = ("apt", "apt-get", "dpkg", "dpkg-deb", "dpkg-query", "pip", "pip3", "easy_install")
FORBIDDEN_PROGRAMS = COMPILERS + PACKAGE_MANAGERS
FORBIDDEN_MODULES = ("pip", "setuptools", "wheel", "ensurepip")


@pytest.fixture(scope="module")
def built() -> image.Built:
    result = image.build()
    print(f"\n{result.ref}: built in {result.seconds:.1f} s; image size {result.size_bytes / 1e6:.1f} MB")
    return result


def test_the_store_keeps_only_the_last_builds_layers(built: image.Built) -> None:
    """vfs copies the root filesystem into every layer: a CI cache that kept each build's layers filled its
    disk within a few dozen runs. After a build the store holds the tagged images and this build's steps."""
    kept = image.read_kept_layers()
    image_id = str(image.inspect(built.ref)["Id"])
    assert any(image_id.startswith(k) for k in kept)
    assert image.stale_images(kept) == []


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*image.podman_args(), *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def test_the_image_runs_as_non_root_without_compiler_or_package_manager(built: image.Built) -> None:
    config = image.inspect(built.ref)["Config"]
    assert isinstance(config, dict)
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["kopf"]
    probe = (
        "import importlib.util, json, os, shutil, sys\n"
        f"progs = {list(FORBIDDEN_PROGRAMS)!r}\n"
        f"mods = {list(FORBIDDEN_MODULES)!r}\n"
        "import kvpilot.operator.main\n"  # the module the entrypoint loads imports (handlers register)
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'python': sys.executable,\n"
        "  'programs': [p for p in progs if shutil.which(p)],\n"
        "  'modules': [m for m in mods if importlib.util.find_spec(m)]}))\n"
    )
    proc = subprocess.run(
        image.run_argv(built.ref, options=["--rm", "--entrypoint", "python"], command=["-c", probe]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["uid"], found["gid"]) == (10001, 10001)
    assert found["python"] == "/opt/kvpilot/bin/python"
    assert found["programs"] == [] and found["modules"] == [], found
    assert built.size_bytes > 0


# --------------------------------------------------------------------------- the operator from the image


def render_chart(cluster: LocalCluster, namespace: str, home: Path) -> list[dict[str, Any]]:
    """The chart in namespace-scoped mode for ``namespace`` (no InferenceService CRD: the suite applies it,
    no admission policy: it would bind cluster-wide); kopf's peering CRDs included."""
    env = {
        "HELM_CACHE_HOME": str(home / "helm-cache"),
        "HELM_CONFIG_HOME": str(home / "helm-config"),
        "HELM_DATA_HOME": str(home / "helm-data"),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [
            str(cluster.helm_bin),
            "template",
            RELEASE,
            str(ROOT / "charts" / "kvpilot"),
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            versions()["K8S_VERSION"],  # helm's default (v1.20) is refused by the chart
            "--set",
            f"watchNamespaces={{{namespace}}}",
            "--set",
            "crds.enabled=false",
            "--set",
            "admissionPolicy.enabled=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def chart_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def chart_scratch_mounts(docs: list[dict[str, Any]]) -> list[str]:
    """Where the chart's container mounts an emptyDir (its /tmp and the Hub cache): a tmpfs under podman."""
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    scratch = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounts = [m["mountPath"] for m in chart_container(docs)["volumeMounts"] if m["name"] in scratch]
    assert "/tmp" in mounts, mounts
    return mounts


@pytest.fixture
def chart_rbac(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """Apply the rendered chart minus its Deployment (the operator runs under podman instead)."""
    cluster.kubectl("apply", "-f", str(CRD))
    docs = render_chart(cluster, namespace, tmp_path)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Deployment")]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
    for crd in crds:
        wait_established(cluster.kubectl, f"crd/{crd['metadata']['name']}")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rest))
    try:
        yield docs
    finally:
        scoped = [d for d in rest if "namespace" not in d["metadata"]]  # the namespace's go with it
        cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-f",
            "-",
            input=yaml.safe_dump_all(scoped),
            check=False,
        )


def service_account_dir(cluster: LocalCluster, namespace: str, sa: str, into: Path) -> Path:
    """What the kubelet projects into a pod: a TokenRequest token, the cluster CA, the namespace."""
    into.mkdir(mode=0o755)
    token = cluster.kubectl("--namespace", namespace, "create", "token", sa, "--duration=1h").stdout.strip()
    (into / "token").write_text(token)
    (into / "ca.crt").write_bytes((cluster.pki / "ca.crt").read_bytes())
    (into / "namespace").write_text(namespace)
    for f in into.iterdir():
        f.chmod(0o644)  # readable by the image's UID 10001 (the kubelet's projected volume is 0644 too)
    return into


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    """A stand-in Hub serving Llama-3.2-1B-Instruct's real config.json as ``acme/llama-1b``."""
    config = HUB_CONFIG.read_bytes()
    with StandInHub(lambda repo, name: config if (repo, name) == (HUB_MODEL, "config.json") else None) as h:
        yield h


def resolve_from_hub(cluster: LocalCluster, namespace: str, running: Any) -> dict[str, Any]:
    """An InferenceService with ``source: Hub``: the operator in the image downloads its config.json into the
    chart's Hub cache (HF_HOME on an emptyDir, the root filesystem read-only): its ConfigResolved condition.
    """
    body = {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "hub-model", "namespace": namespace},
        "spec": {"model": {"id": HUB_MODEL, "source": "Hub"}, "gpu": {"count": 1, "product": "L4"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))

    last: dict[str, Any] = {}

    def resolved() -> bool:
        nonlocal last
        running()
        obj = get(cluster, "inferenceservices.kvpilot.io", "hub-model", "-n", namespace) or {}
        conds = (obj.get("status") or {}).get("conditions") or ()
        last = next((c for c in conds if c["type"] == "ConfigResolved"), {})
        return last.get("status") == "True"

    try:
        wait_for(resolved, 120, "ConfigResolved=True for the Hub model from the operator in the image")
    except AssertionError as e:
        raise AssertionError(f"{e}; last ConfigResolved: {last}") from None
    return last


def get(cluster: LocalCluster, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def http_ok(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as rsp:
            return str(rsp.read().decode()) if rsp.status == 200 else None
    except OSError:
        return None


def test_the_operator_from_the_image_reconciles_with_the_chart_service_account(
    cluster: LocalCluster,
    namespace: str,
    built: image.Built,
    chart_rbac: list[dict[str, Any]],
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    (sa,) = [d["metadata"]["name"] for d in chart_rbac if d["kind"] == "ServiceAccount"]
    secrets = service_account_dir(cluster, namespace, sa, tmp_path / "serviceaccount")
    container = chart_container(chart_rbac)
    liveness, metrics = free_port(), free_port()  # host network: the chart's fixed ports may be taken here
    argv = [
        re.sub(r"^--liveness=http://0\.0\.0\.0:\d+/", f"--liveness=http://127.0.0.1:{liveness}/", a)
        for a in container["command"] + container["args"]
    ]
    pod_name = f"kvpilot-image-{uuid.uuid4().hex[:6]}"
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cluster.ports["apiserver"])}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
    env["KVPILOT_METRICS_PORT"] = str(metrics)
    env["HF_ENDPOINT"] = hub.url  # the chart leaves the Hub's address to huggingface_hub: the real one
    options = [
        "--detach",
        "--name",
        pod_name,
        "--read-only",
        *[f"--tmpfs={path}" for path in chart_scratch_mounts(chart_rbac)],
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--volume",
        f"{secrets}:{SA_DIR}:ro",
        "--entrypoint",
        argv[0],
    ]
    if "KVPILOT_WEBHOOK_CERT_DIR" in env:  # the chart's webhook Secret, mounted where the pod mounts it
        (tls_secret,) = [d for d in chart_rbac if d["kind"] == "Secret" and d["type"] == "kubernetes.io/tls"]
        tls = tmp_path / "webhook-tls"
        tls.mkdir()
        for key in ("tls.crt", "tls.key"):
            (tls / key).write_bytes(base64.b64decode(tls_secret["data"][key]))
            (tls / key).chmod(0o644)
        env["KVPILOT_WEBHOOK_PORT"] = str(free_port())
        options += ["--volume", f"{tls}:{env['KVPILOT_WEBHOOK_CERT_DIR']}:ro"]
    for k, v in env.items():
        options += ["--env", f"{k}={v}"]
    started = subprocess.run(
        image.run_argv(built.ref, options=options, command=argv[1:]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    log = tmp_path / "operator.log"

    def logs() -> str:
        proc = podman("logs", pod_name, check=False)
        log.write_text(proc.stdout + proc.stderr)
        return proc.stdout + proc.stderr

    def running() -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", pod_name, check=False).stdout.strip()
        assert state == "true", f"the operator container exited:\n{logs()[-4000:]}"
        return True

    try:
        wait_for(
            lambda: running() and "Initial authentication has finished" in logs(),
            120,
            "the operator in the image to authenticate",
        )
        cluster.kubectl("--namespace", namespace, "apply", "-f", str(EXAMPLE))
        name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
        deploy = wait_for(
            lambda: running() and get(cluster, "deployment", name, "-n", namespace),
            180,
            f"Deployment {namespace}/{name} from the operator in the image",
        )
        (owner,) = deploy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("InferenceService", name)
        status = wait_for(
            lambda: (
                running()
                and (get(cluster, "inferenceservices.kvpilot.io", name, "-n", namespace) or {})
                .get("status", {})
                .get("conditions")
            ),
            120,
            "status conditions from the operator in the image",
        )
        assert {c["type"] for c in status} >= {"Ready"}, status
        resolved = resolve_from_hub(cluster, namespace, running)
        assert HUB_MODEL in resolved["message"] or "Hub" in resolved["message"], resolved
        assert hub.requests >= 2, (
            hub.requests
        )  # config.json fetched (HEAD and GET) by the operator in the image
        assert http_ok(f"http://127.0.0.1:{liveness}/healthz") is not None
        assert "kvpilot_reconciles_total" in (http_ok(f"http://127.0.0.1:{metrics}/metrics") or "")
        text = logs()
        denied = [
            ln
            for ln in text.splitlines()
            if re.search(r"\b403\b|[Ff]orbidden", re.sub(r"^\[[^\]]*\]", "", ln))
        ]
        assert denied == [], "the operator in the image hit RBAC denials:\n" + "\n".join(denied[:20])
        assert "Traceback" not in text, text[-4000:]
    finally:
        podman("stop", "--time", "20", pod_name, check=False, timeout=60)
        logs()
        podman("rm", "--force", pod_name, check=False)
        print(f"operator log: {log}")
