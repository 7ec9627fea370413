"""Workloads someone else owns, for the EngineTuner e2e suites (test_enginetuner, test_enginetuner_webhook).

* :data:`PRODUCTION_STACK` and :data:`KSERVE`: the ``command``/``args`` layouts of vLLM production-stack's
  ``helm/templates/deployment-vllm-multi.yaml`` (everything in ``command``) and of KServe's vLLM runtime
  (a ``bash -c`` script passing ``"$@"``, the flags in ``args``, the model from ``MODEL_DIR``);
  :func:`foreign_deployment` puts one in a Deployment on the L4 KWOK nodes.
* :class:`ForeignController`: a stand-in for the controller that owns such a Deployment (Helm, KServe's
  controller): a thread that server-side-applies the original spec every few seconds, as a reconciler
  does, and records the generations it saw, so a test can tell that nothing fought it.
* :func:`make_webhook_pki` and :func:`webhook_configuration`: a CA and a serving certificate for
  127.0.0.1 (openssl), and the MutatingWebhookConfiguration the real API server calls the host operator's
  webhook through (``failurePolicy: Ignore``, a short timeout, the exclude label left out).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from e2e.cluster import free_port
from e2e.waits import wait_established

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "crds" / "inferenceservices.kvpilot.io.yaml", ROOT / "crds" / "enginetuners.kvpilot.io.yaml"]
RESOURCE = "enginetuners.kvpilot.io"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FOREIGN_MANAGER = "foreign-controller"
"""The field manager of :class:`ForeignController`'s applies."""
WEBHOOK_PATH = "/enginetuner-pods"
"""Where kopf serves the handler (its id: kvpilot.operator.enginetuner.target_main.WEBHOOK_ID)."""

# production-stack's helm/templates/deployment-vllm-multi.yaml: everything in command
PRODUCTION_STACK = (
    [
        "vllm",
        "serve",
        LLAMA,
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "131072",
        "--max-num-seqs",
        "256",
        "--gpu_memory_utilization",
        "0.95",
    ],
    None,
)
# KServe's vLLM runtime: a bash script passing "$@", the flags in args, the model from MODEL_DIR
KSERVE = (
    ["bash", "-c", "export MODEL=${MODEL_DIR}\nvllm serve ${MODEL} --host 0.0.0.0 --port 8000 $@\n", "bash"],
    ["--max-model-len=131072", "--max-num-seqs", "128"],
)
LAYOUTS = {"production-stack": PRODUCTION_STACK, "kserve": KSERVE}


def get(cluster: Any, *args: str) -> Any:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def install_crds(cluster: Any) -> None:
    for crd in CRDS:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    wait_established(cluster.kubectl, f"crd/{RESOURCE}")  # kubectl wait fails at once on a CRD this new


def foreign_deployment(name: str, command: list[str], args: list[str] | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.33.0",
        "command": command,
        "env": [{"name": "MODEL_DIR", "value": LLAMA}],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    if args is not None:
        container["args"] = args
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"model": name}},
            "template": {
                "metadata": {"labels": {"model": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [container],
                },
            },
        },
    }


def engine_tuner(name: str, mode: str) -> dict[str, Any]:
    """The EngineTuner of the Deployment ``name``, with the model and GPU given (KServe's ``$MODEL`` is
    read from the environment; the spec makes both layouts plan alike)."""
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "EngineTuner",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"kind": "Deployment", "name": name},
            "updateMode": mode,
            "model": {"id": LLAMA, "source": "Catalogue"},
            "gpu": {"product": "NVIDIA-L4", "count": 1},
        },
    }


class ForeignController(threading.Thread):
    """Re-applies ``manifest`` in ``namespace`` every ``period_s`` seconds (server-side apply, field manager
    :data:`FOREIGN_MANAGER`, taking conflicts as a reconciler does) until :meth:`stop`.

    ``generations`` holds the Deployment's ``metadata.generation`` after each apply, ``failures`` the
    stderr of any apply that failed: a controller fighting kvpilot would see its generation climb."""

    def __init__(self, cluster: Any, namespace: str, manifest: dict[str, Any], period_s: float = 2.0):
        super().__init__(daemon=True, name=f"foreign-{namespace}")
        self.cluster, self.namespace, self.manifest, self.period_s = cluster, namespace, manifest, period_s
        self.generations: list[int] = []
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def apply_once(self) -> None:
        proc = self.cluster.kubectl(
            "apply",
            "--server-side",
            f"--field-manager={FOREIGN_MANAGER}",
            "--force-conflicts",
            "-n",
            self.namespace,
            "-f",
            "-",
            "-o",
            "json",
            input=json.dumps(self.manifest),
            check=False,
        )
        if proc.returncode != 0:
            self.failures.append(proc.stderr)
            return
        self.generations.append(int(json.loads(proc.stdout)["metadata"]["generation"]))

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            self.apply_once()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"openssl {' '.join(args)} failed:\n{proc.stderr}"


def make_webhook_pki(directory: Path) -> bytes:
    """A CA and a serving certificate signed by it for IP 127.0.0.1, as ``tls.crt``/``tls.key`` (the keys of
    a kubernetes.io/tls Secret, which the operator reads from ``KVPILOT_WEBHOOK_CERT_DIR``) in
    ``directory``; returns the CA certificate (the caBundle)."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kvpilot-webhook-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    (directory / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kvpilot-webhook",
        "-keyout",
        "tls.key",
        "-out",
        "server.csr",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "tls.crt",
        cwd=directory,
    )
    return (directory / "ca.crt").read_bytes()


@dataclasses.dataclass(frozen=True)
class Webhook:
    """A host operator's admission webhook: its port on 127.0.0.1, its CA (the caBundle), the directory of
    its serving certificate, and where its logs go."""

    port: int
    ca: bytes
    cert_dir: Path
    log_dir: Path

    @classmethod
    def make(cls, directory: Path) -> Webhook:
        """A free port and a fresh certificate under ``directory/tls``; logs in ``directory``."""
        return cls(free_port(), make_webhook_pki(directory / "tls"), directory / "tls", directory)

    def env(self) -> dict[str, str]:
        """The host operator's environment: serve the webhook here, and tick the EngineTuners every 2 s."""
        return {
            "KVPILOT_WEBHOOK_PORT": str(self.port),
            "KVPILOT_WEBHOOK_CERT_DIR": str(self.cert_dir),
            "KVPILOT_WEBHOOK_ADDR": "127.0.0.1",
            "KVPILOT_TARGET_INTERVAL": "2",
        }


def webhook_configuration(name: str, port: int, ca: bytes, namespace: str) -> dict[str, Any]:
    """What the chart renders (templates/enginetuner-mutatingwebhook.yaml), pointed at the host operator by
    URL and limited to ``namespace`` (the suite's other tests create pods too)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "enginetuner-pods.kvpilot.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}{WEBHOOK_PATH}",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "timeoutSeconds": 3,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "Never",
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {
                    "matchExpressions": [
                        {"key": "kvpilot.io/exclude", "operator": "NotIn", "values": ["true"]}
                    ]
                },
            }
        ],
    }
