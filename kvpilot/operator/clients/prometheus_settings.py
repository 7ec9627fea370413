"""How the operator reaches the team's Prometheus: URL, credentials, TLS, tenant headers, label names.

Read once, at start-up (:func:`settings_from_env`, from :func:`kvpilot.operator.main.configure`); an
invalid value stops the operator there with :class:`PrometheusConfigError`. The chart sets these from
``prometheus.*`` (charts/kvpilot/values.yaml), mounting the Secret and CA bundle as files::

    KVPILOT_PROMETHEUS_URL                     http(s)://host:port[/prefix] (no user:password@: refused)
    KVPILOT_PROMETHEUS_BEARER_TOKEN_FILE       a file holding the token (a mounted Secret key), or
    KVPILOT_PROMETHEUS_BEARER_TOKEN            the token itself (an env ``valueFrom.secretKeyRef``)
    KVPILOT_PROMETHEUS_USERNAME[_FILE]         basic auth user, and
    KVPILOT_PROMETHEUS_PASSWORD[_FILE]         its password
    KVPILOT_PROMETHEUS_CA_FILE                 PEM CA bundle that verifies the server (default: the system's)
    KVPILOT_PROMETHEUS_INSECURE_SKIP_VERIFY    "true": no certificate check (verification is on by default)
    KVPILOT_PROMETHEUS_HEADERS                 JSON object of extra headers, e.g. {"X-Scope-OrgID": "team-a"}
    KVPILOT_PROMETHEUS_POD_LABEL               label naming the pod of a series (default ``pod``)
    KVPILOT_PROMETHEUS_NAMESPACE_LABEL         label naming its namespace (default ``namespace``)

Credentials given as files are read again on every request (:class:`FileAuth`), so a rotated Secret
(the kubelet updates mounted files in place) is used without a restart.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from requests.auth import AuthBase, HTTPBasicAuth

URL_ENV = "KVPILOT_PROMETHEUS_URL"
BEARER_TOKEN_FILE_ENV = "KVPILOT_PROMETHEUS_BEARER_TOKEN_FILE"
BEARER_TOKEN_ENV = "KVPILOT_PROMETHEUS_BEARER_TOKEN"
USERNAME_ENV = "KVPILOT_PROMETHEUS_USERNAME"
USERNAME_FILE_ENV = "KVPILOT_PROMETHEUS_USERNAME_FILE"
PASSWORD_ENV = "KVPILOT_PROMETHEUS_PASSWORD"
PASSWORD_FILE_ENV = "KVPILOT_PROMETHEUS_PASSWORD_FILE"
CA_FILE_ENV = "KVPILOT_PROMETHEUS_CA_FILE"
INSECURE_ENV = "KVPILOT_PROMETHEUS_INSECURE_SKIP_VERIFY"
HEADERS_ENV = "KVPILOT_PROMETHEUS_HEADERS"
POD_LABEL_ENV = "KVPILOT_PROMETHEUS_POD_LABEL"
NAMESPACE_LABEL_ENV = "KVPILOT_PROMETHEUS_NAMESPACE_LABEL"

_USERINFO = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s]*@")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class PrometheusConfigError(ValueError):
    """An operator environment variable for Prometheus access is invalid (raised at start-up)."""


@dataclass(frozen=True, slots=True)
class Secret:
    """A credential given inline (env from a ``secretKeyRef``) or as a file read on every use."""

    value: str | None = None
    file: str | None = None

    def read(self) -> str:
        if self.file:
            return Path(self.file).read_text().strip()
        return self.value or ""

    def __repr__(self) -> str:  # never log a credential
        return f"Secret(file={self.file!r})" if self.file else "Secret(<inline>)"


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    url: str = ""
    bearer_token: Secret | None = None
    username: Secret | None = None
    password: Secret | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    pod_label: str = "pod"
    namespace_label: str = "namespace"

    @property
    def verify(self) -> bool | str:
        """``requests``' ``verify``: the CA bundle, the system's (True), or off."""
        if self.insecure_skip_verify:
            return False
        return self.ca_file or True

    def build_auth(self) -> AuthBase | None:
        """``requests``' auth: the bearer token or basic credentials, read per request."""
        return FileAuth(self) if self.bearer_token is not None or self.username is not None else None


class FileAuth(AuthBase):
    """Bearer or basic auth whose credentials are read when each request is sent (Secret rotation)."""

    def __init__(self, settings: PrometheusSettings) -> None:
        self.settings = settings

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        s = self.settings
        if s.bearer_token is not None:
            request.headers["Authorization"] = f"Bearer {s.bearer_token.read()}"
            return request
        user = s.username.read() if s.username is not None else ""
        password = s.password.read() if s.password is not None else ""
        result: requests.PreparedRequest = HTTPBasicAuth(user, password)(request)
        return result


def _secret(env: Mapping[str, str], value_name: str, file_name: str) -> Secret | None:
    file, value = env.get(file_name, "").strip(), env.get(value_name, "")
    if file and value:
        raise PrometheusConfigError(f"set {value_name} or {file_name}, not both")
    if file:
        return Secret(file=file)
    return Secret(value=value) if value else None


def _headers(raw: str) -> tuple[tuple[str, str], ...]:
    if not raw.strip():
        return ()
    try:
        parsed: Any = json.loads(raw)
    except ValueError as exc:
        raise PrometheusConfigError(f"{HEADERS_ENV}: not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise PrometheusConfigError(f'{HEADERS_ENV}: expected a JSON object like {{"X-Scope-OrgID": "a"}}')
    out: list[tuple[str, str]] = []
    for name, value in parsed.items():
        if not _HEADER.fullmatch(str(name)) or not isinstance(value, str) or "\n" in value or "\r" in value:
            raise PrometheusConfigError(f"{HEADERS_ENV}: invalid header {name!r}")
        if str(name).lower() == "authorization":
            raise PrometheusConfigError(f"{HEADERS_ENV}: put credentials in a Secret, not in headers")
        out.append((str(name), value))
    return tuple(sorted(out))


def settings_from_env(environ: Mapping[str, str] | None = None) -> PrometheusSettings:
    """:class:`PrometheusSettings` from the environment (see the module docstring); or
    :class:`PrometheusConfigError`."""
    env = environ if environ is not None else os.environ
    url = env.get(URL_ENV, "").strip().rstrip("/")
    if url and _USERINFO.match(url):  # never echo it: the error is logged
        raise PrometheusConfigError(
            f"{URL_ENV}: credentials in the URL (user:password@) are refused: they would be shown wherever "
            f"the URL is (conditions, events, logs). Put them in a Secret: {USERNAME_FILE_ENV} and "
            f"{PASSWORD_FILE_ENV} (chart: prometheus.auth.basic.secretName) or {BEARER_TOKEN_FILE_ENV} "
            "(prometheus.auth.bearerToken.secretName)"
        )
    if url and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise PrometheusConfigError(f"{URL_ENV}={url!r}: expected http(s)://host[:port][/path]")
    token = _secret(env, BEARER_TOKEN_ENV, BEARER_TOKEN_FILE_ENV)
    username = _secret(env, USERNAME_ENV, USERNAME_FILE_ENV)
    password = _secret(env, PASSWORD_ENV, PASSWORD_FILE_ENV)
    if token is not None and (username is not None or password is not None):
        raise PrometheusConfigError("Prometheus auth: a bearer token or basic auth, not both")
    if password is not None and username is None:
        raise PrometheusConfigError(f"{PASSWORD_ENV}: basic auth needs {USERNAME_ENV} too")
    insecure_raw = env.get(INSECURE_ENV, "").strip().lower()
    if insecure_raw not in ("", "true", "false"):
        raise PrometheusConfigError(f"{INSECURE_ENV}={insecure_raw!r}: expected true or false")
    ca_file = env.get(CA_FILE_ENV, "").strip() or None
    if ca_file and insecure_raw == "true":
        raise PrometheusConfigError(f"{CA_FILE_ENV} and {INSECURE_ENV}=true contradict each other")
    labels = {}
    for name, default in ((POD_LABEL_ENV, "pod"), (NAMESPACE_LABEL_ENV, "namespace")):
        value = env.get(name, "").strip() or default
        if not _LABEL.fullmatch(value):
            raise PrometheusConfigError(f"{name}={value!r}: not a Prometheus label name")
        labels[name] = value
    if labels[POD_LABEL_ENV] == labels[NAMESPACE_LABEL_ENV]:
        raise PrometheusConfigError("the pod and namespace label names must differ")
    return PrometheusSettings(
        url=url,
        bearer_token=token,
        username=username,
        password=password,
        ca_file=ca_file,
        insecure_skip_verify=insecure_raw == "true",
        headers=_headers(env.get(HEADERS_ENV, "")),
        pod_label=labels[POD_LABEL_ENV],
        namespace_label=labels[NAMESPACE_LABEL_ENV],
    )
