"""The chart's ``prometheus.*`` values reach the operator as its prometheus_settings module reads them.

Each rendered Deployment's environment is parsed by the operator's own :func:`settings_from_env`, and each
file it names is traced through the container's volume mounts to the Secret or ConfigMap key it comes
from, so a renamed variable, a wrong mount path or a wrong key fails here, not at start-up in a cluster.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import pytest
from helmchart import CHART, RELEASE, one, run_helm, values_args

from kvpilot.operator.clients import prometheus_settings as ps

AUTH_VALUES = CHART / "ci" / "prometheus-auth-values.yaml"


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(objs, "Deployment")["spec"]["template"]["spec"]
    return pod


def _settings(pod: dict[str, Any]) -> ps.PrometheusSettings:
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    return ps.settings_from_env(env)


def _source(pod: dict[str, Any], path: str | None) -> tuple[str, str, str]:
    """(``secret`` or ``configMap``, its name, the key) that the file at ``path`` is mounted from."""
    assert path, "no file"
    (c,) = pod["containers"]
    directory, base = posixpath.split(path)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    kind = "secret" if "secret" in volume else "configMap"
    src = volume[kind]
    (item,) = [i for i in src["items"] if i["path"] == base]
    return kind, src["secretName"] if kind == "secret" else src["name"], item["key"]


def _file(secret: ps.Secret | None) -> str | None:
    assert secret is not None and secret.value is None  # a file, never the credential in the pod spec
    return secret.file


def test_defaults_have_no_credentials_and_verify_with_the_system_cas(rendered: Any) -> None:
    pod = _pod(rendered())
    s = _settings(pod)
    assert (s.bearer_token, s.username, s.password, s.headers) == (None, None, None, ())
    assert s.verify is True  # verification on by default
    assert (s.pod_label, s.namespace_label) == ("pod", "namespace")
    assert not [v for v in pod["volumes"] if v["name"].startswith("prometheus")]


def test_basic_auth_ca_bundle_tenant_header_and_label_names_reach_the_operator(rendered: Any) -> None:
    pod = _pod(rendered(AUTH_VALUES))
    s = _settings(pod)
    assert s.url == "https://mimir-gateway.monitoring:443/prometheus"
    assert _source(pod, _file(s.username)) == ("secret", "prometheus-basic-auth", "username")
    assert _source(pod, _file(s.password)) == ("secret", "prometheus-basic-auth", "password")
    assert s.bearer_token is None
    assert isinstance(s.verify, str) and _source(pod, s.verify) == (
        "configMap",
        "monitoring-ca",
        "ca-bundle.pem",
    )
    assert s.headers == (("X-Scope-OrgID", "team-a"),)
    assert (s.pod_label, s.namespace_label) == ("kubernetes_pod_name", "kubernetes_namespace")
    secret = next(v for v in pod["volumes"] if v["name"] == "prometheus-basic-auth")["secret"]
    assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"]  # group-readable: fsGroup


def test_a_bearer_token_and_a_ca_from_a_secret(rendered: Any) -> None:
    pod = _pod(
        rendered(
            sets=[
                "prometheus.url=https://thanos-query.monitoring:9091",
                "prometheus.auth.bearerToken.secretName=prom-token",
                "prometheus.auth.bearerToken.key=tok",
                "prometheus.tls.ca.secretName=prom-tls",
            ]
        )
    )
    s = _settings(pod)
    assert _source(pod, _file(s.bearer_token)) == ("secret", "prom-token", "tok")
    assert s.username is None and s.password is None
    assert isinstance(s.verify, str) and _source(pod, s.verify) == ("secret", "prom-tls", "ca.crt")


def test_insecure_skip_verify_turns_verification_off(rendered: Any) -> None:
    s = _settings(
        _pod(rendered(sets=["prometheus.url=https://p:9090", "prometheus.tls.insecureSkipVerify=true"]))
    )
    assert s.verify is False


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["prometheus.auth.bearerToken.secretName=a", "prometheus.auth.basic.secretName=b"], "not both"),
        (["prometheus.tls.ca.configMapName=a", "prometheus.tls.ca.secretName=b"], "not both"),
        (["prometheus.tls.ca.configMapName=a", "prometheus.tls.insecureSkipVerify=true"], "contradict"),
        (["prometheus.headers.Authorization=Bearer x"], "invalid propertyName 'Authorization'"),
        (["prometheus.headers.X-Scope-OrgID=1"], "/prometheus/headers"),  # --set makes 1 a number
        (["prometheus.podLabel=pod-name"], "/prometheus/podLabel"),
        (["prometheus.auth.basic.secretName=Prom_Basic"], "/prometheus/auth/basic/secretName"),
        (["prometheus.tls.ca.key=a/b"], "/prometheus/tls/ca/key"),
        (["prometheus.tls.insecureSkipVerify=yes"], "/prometheus/tls/insecureSkipVerify"),
    ],
)
def test_contradictory_or_invalid_prometheus_values_fail(helm: Path, sets: list[str], complaint: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0, f"--set {sets} was accepted"
    assert complaint in proc.stderr, proc.stderr
