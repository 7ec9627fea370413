"""helm lint / helm template of charts/kvpilot, its schema, its documentation and its pod security."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import CHART, CI_VALUES, NAMESPACE, RELEASE, ROOT, by_kind, one, run_helm, values_args

from kvpilot.observability import series
from kvpilot.operator import api
from kvpilot.operator.clients import metrics, prometheus
from kvpilot.operator.inferenceservice import render as render_operator
from kvpilot.operator.loop import loop_settings
from kvpilot.tuner.vllm import serving

VARIANTS = [None, *CI_VALUES]
VARIANT_IDS = ["defaults", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)]


@pytest.mark.parametrize("values_file", VARIANTS, ids=VARIANT_IDS)
def test_helm_lint_strict(helm: Path, values_file: Path | None) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values_args(values_file))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values_file", VARIANTS, ids=VARIANT_IDS)
def test_every_object_carries_the_standard_labels(
    rendered: Callable[..., list[dict[str, Any]]], values_file: Path | None
) -> None:
    for obj in rendered(values_file):
        if obj["kind"] == "CustomResourceDefinition" and obj["metadata"]["name"].endswith("kopf.dev"):
            continue  # kopf's shared peering CRDs (crds/): not ours to label
        labels = obj["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ):
            assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks label {key}"


def test_template_file_names_follow_component_kind() -> None:
    kinds = "deployment|serviceaccount|rbac|service|servicemonitor|podmonitor|peering|inferenceservices"
    kinds += "|admissionpolicy|tuningprofiles|enginetuners|mutatingwebhook|configmap|prometheusrule"
    pattern = re.compile(rf"^[a-z]+(-[a-z]+)*-({kinds})\.yaml$")
    names = [p.name for p in (CHART / "templates").glob("*.yaml")]
    assert names
    assert [n for n in names if not pattern.match(n)] == []


def test_default_install_objects(rendered: Callable[..., list[dict[str, Any]]]) -> None:
    objs = rendered()
    kinds = sorted({o["kind"] for o in objs})
    assert kinds == [
        "ClusterKopfPeering",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "MutatingWebhookConfiguration",
        "Secret",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "PodMonitor")  # CRDs may not exist
    crds = {o["metadata"]["name"] for o in by_kind(objs, "CustomResourceDefinition")}
    assert crds == {
        "inferenceservices.kvpilot.io",
        "tuningprofiles.kvpilot.io",
        "enginetuners.kvpilot.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for o in objs:
        if o["kind"] in ("Deployment", "Secret", "Service", "ServiceAccount"):
            assert o["metadata"]["namespace"] == NAMESPACE


def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


Render = Callable[..., list[dict[str, Any]]]


def test_deployment_runs_kopf_with_peering_and_liveness(rendered: Render) -> None:
    objs = rendered()
    c = _container(objs)
    assert c["command"][:2] == ["/bin/sh", "-c"] and "exec kopf" in c["command"][2]
    assert '--priority="-$(shuf -i 1-1000000000 -n 1)"' in c["command"][2]  # negative: kopf freeze/--dev win
    peering = one(objs, "ClusterKopfPeering")["metadata"]["name"]
    assert c["args"][:2] == ["run", "--module=kvpilot.operator.main"]
    assert "--all-namespaces" in c["args"]
    assert f"--peering={peering}" in c["args"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[probe["port"]] == 8080
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # the variables kvpilot/operator reads, by the names its modules define
    assert env[metrics.METRICS_PORT_ENV]["value"] == "9102"
    assert env[prometheus.PROMETHEUS_URL_ENV]["value"] == ""
    assert env[loop_settings.INTERVAL_ENV]["value"] == "30"
    assert c["image"] == "ghcr.io/kvpilot/kvpilot:0.1.0"


def test_namespaced_mode_watches_only_listed_namespaces(rendered: Render) -> None:
    objs = rendered(CHART / "ci" / "namespaced-values.yaml")
    args = _container(objs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]
    peerings = by_kind(objs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(objs, "ClusterKopfPeering")
    assert one(objs, "Deployment")["spec"]["replicas"] == 2


def test_standalone_mode(rendered: Callable[..., list[dict[str, Any]]]) -> None:
    objs = rendered(CHART / "ci" / "standalone-values.yaml")
    c = _container(objs)
    assert c["command"] == ["kopf"]
    assert "--standalone" in c["args"] and not any(a.startswith("--peering") for a in c["args"])
    assert one(objs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not by_kind(objs, "ClusterKopfPeering") and not by_kind(objs, "KopfPeering")
    assert "inferenceservices.kvpilot.io" not in {o["metadata"]["name"] for o in objs}


def test_standalone_refuses_two_replicas(helm: Path) -> None:
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--set",
        "peering.enabled=false",
        "--set",
        "replicaCount=2",
        check=False,
    )
    assert proc.returncode != 0
    assert "needs peering.enabled=true" in proc.stderr


def test_monitoring_objects(rendered: Callable[..., list[dict[str, Any]]]) -> None:
    objs = rendered(CHART / "ci" / "monitoring-values.yaml")
    sm = one(objs, "ServiceMonitor")
    (svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    wanted = sm["spec"]["selector"]["matchLabels"].items()
    selected = [s for s in by_kind(objs, "Service") if wanted <= s["metadata"]["labels"].items()]
    assert selected == [svc]  # not the webhook's Service
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    pm = one(objs, "PodMonitor")
    # the labels every vLLM pod kvpilot owns carries (docs/api-contract.md, "Objects owned")
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/managed-by": "kvpilot",
    }
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    # ...and the Deployment the operator renders for an example really matches it, port name included
    example = yaml.safe_load((ROOT / "examples" / "llama-3.1-8b-on-l4.yaml").read_text())
    (vllm,) = [m for m in render_operator.build_manifests(example) if m["kind"] == "Deployment"]
    pod = vllm["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in ports
    # the chart's path and the port behind that name are vLLM's own (one home: kvpilot.tuner.vllm.serving)
    assert pm["spec"]["podMetricsEndpoints"][0]["path"] == serving.METRICS_PATH
    named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert named[pm["spec"]["podMetricsEndpoints"][0]["port"]] == serving.PORT
    # each series names its InferenceService, from the label the rendered pod carries, under the label the
    # dashboard and the alert rules select on (a LeaderWorkerSet leader's name matches no name pattern)
    (relabel,) = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert relabel == series.RELABELING
    pod_label = api.SERVICE_LABEL.replace(".", "_").replace("/", "_")
    assert relabel["sourceLabels"] == [f"__meta_kubernetes_pod_label_{pod_label}"]
    assert pod["metadata"]["labels"][api.SERVICE_LABEL] == example["metadata"]["name"]
    c = _container(objs)
    assert c["image"].startswith("ghcr.io/kvpilot/kvpilot@sha256:")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "http://prometheus-operated.monitoring:9090" in env.values()


# --------------------------------------------------------------------------- pod security (restricted)


@pytest.mark.parametrize("values_file", VARIANTS, ids=VARIANT_IDS)
def test_pod_meets_restricted_pod_security(
    rendered: Callable[..., list[dict[str, Any]]], values_file: Path | None
) -> None:
    pod = one(rendered(values_file), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    assert all("hostPath" not in v for v in pod["volumes"])
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not sc.get("privileged")
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    # huggingface_hub writes its cache under HF_HOME: with HOME=/nonexistent and a read-only root filesystem
    # that must be a mounted, writable emptyDir, or `source: Hub` models cannot be resolved
    (operator,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    mount = next(m for m in operator["volumeMounts"] if m["mountPath"] == env["HF_HOME"])
    assert not mount.get("readOnly")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["sizeLimit"] == "256Mi"


# --------------------------------------------------------------------------- values.schema.json


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["replicaCount=two"], "/replicaCount"),
        (["replicaCount=-1"], "/replicaCount"),
        (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["image.digest=latest"], "/image/digest"),
        (["metrics.port=70000"], "/metrics/port"),
        (["metrics.enabled=maybe"], "/metrics/enabled"),
        (["operator.logFormat=xml"], "/operator/logFormat"),
        (["operator.livenessPort=http"], "/operator/livenessPort"),
        (["watchNamespaces={Team_A}"], "/watchNamespaces/0"),
        (["watchNamespaces=team-a"], "/watchNamespaces"),
        (["prometheus.url=prometheus:9090"], "/prometheus/url"),
        (["crds.keep=1"], "/crds/keep"),
        (["rbac.secrets.resourceNames=hf-token"], "/rbac/secrets/resourceNames"),
        (["metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
        (["nodeSelector=gpu"], "/nodeSelector"),
        (["tolerations=none"], "/tolerations"),
        (["tuning.intervalSeconds=0"], "/tuning/intervalSeconds"),
        (["tuning.intervalSeconds=soon"], "/tuning/intervalSeconds"),
        (["bogus=1"], "bogus"),
        (["image.registry=docker.io"], "registry"),
        (["rbac.secrets.list=true"], "list"),
    ],
)
def test_schema_rejects_wrong_values(helm: Path, sets: list[str], complaint: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0, f"--set {sets} was accepted"
    assert complaint in proc.stderr, proc.stderr


def _yaml_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from _yaml_paths(value, path)


def _schema_node(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node = schema
    for part in path.split("."):
        props = node.get("properties")
        if props is None:
            return None  # a free-form Kubernetes object (securityContext, resources...): schema ends here
        assert part in props, f"values.yaml key {path} is missing from values.schema.json"
        node = props[part]
    return node


def test_schema_covers_every_value_and_only_them() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for path in _yaml_paths(values):
        _schema_node(schema, path)
    for key in schema["properties"]:
        assert key in values or key == "global", f"schema key {key} has no default in values.yaml"


def test_every_value_is_documented() -> None:
    """helm-docs style: a `# --` comment right above each key. Parents of documented keys (image:, rbac:)
    need none; children of a documented free-form object (podSecurityContext:) need none either."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    lines = text.splitlines()
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented) of the current ancestry
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z]\w*):", line)
        if not m:
            continue
        indent, key = len(m.group(1)), m.group(2)
        stack = [entry for entry in stack if entry[0] < indent]
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#") and not lines[j].lstrip().startswith("# --"):
            j -= 1
        has_doc = j >= 0 and lines[j].lstrip().startswith("# --")
        node: Any = values
        for _, k, _ in stack:
            node = node[k]
        is_parent = isinstance(node.get(key), dict) and bool(node[key])
        if not (has_doc or is_parent or any(doc for _, _, doc in stack)):
            undocumented.append(".".join([*(k for _, k, _ in stack), key]))
        stack.append((indent, key, has_doc))
    assert undocumented == []


def test_packaged_chart_renders_the_same(helm: Path, rendered: Render, tmp_path: Path) -> None:
    """What users get from a registry: `helm package` keeps files/crds/ (read by .Files.Get) and crds/."""
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("kvpilot-*.tgz")
    with tarfile.open(package) as tar:
        members = set(tar.getnames())
    assert {
        "kvpilot/files/crds/inferenceservices.kvpilot.io.yaml",
        "kvpilot/crds/kopf-peering.yaml",
        "kvpilot/values.schema.json",
    } <= members
    assert not [m for m in members if m.startswith("kvpilot/ci/")]
    out = run_helm(helm, "template", RELEASE, str(package), "--namespace", NAMESPACE, "--include-crds").stdout
    packaged = [d for d in yaml.safe_load_all(out) if d]
    assert _without_generated_tls(packaged) == _without_generated_tls(rendered())


def _without_generated_tls(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects less the webhook's certificate and CA, which each render generates anew."""
    out = json.loads(json.dumps(objs))
    for o in out:
        if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-webhook-tls"):
            o["data"] = sorted(o["data"])
        for hook in o.get("webhooks") or () if o["kind"] == "MutatingWebhookConfiguration" else ():
            hook["clientConfig"].pop("caBundle", None)
    return out


@pytest.mark.parametrize("values_file", VARIANTS, ids=VARIANT_IDS)
def test_kopf_accepts_the_rendered_arguments(rendered: Render, values_file: Path | None) -> None:
    """Every flag the chart passes exists in the pinned kopf (click rejects unknown options before --help)."""
    c = _container(rendered(values_file))
    kopf = Path(sys.executable).parent / "kopf"
    proc = subprocess.run([str(kopf), *c["args"], "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert c["command"][-1] == "kopf"  # the shell wrapper (or the plain command) execs kopf itself
