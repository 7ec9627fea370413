"""What a failed Prometheus query tells a tenant: a class, a fixed text, the HTTP status; no upstream words.

``MetricsAvailable`` and its Warning events go to every tenant's InferenceService, so the reason and message
(:func:`classify_error`) carry only a fixed text per class, the HTTP status and the URL without userinfo
(:func:`redact_url`). Upstream bodies can echo what the operator sent (an auth gateway that quotes the
``Authorization`` header): they reach only the operator's own log, redacted and truncated
(:func:`redact_text`, at most :data:`LOG_BODY_CHARS`; the Hub's errors are logged through it too).

=======================================  =======================================================
class                                    cause
=======================================  =======================================================
``PrometheusTLSError``                   the certificate does not verify (the verifier's words kept)
``PrometheusUnauthorized``               HTTP 401
``PrometheusForbidden``                  HTTP 403
``PrometheusNotFound``                   HTTP 404: a wrong URL path prefix
``PrometheusUnavailable``                HTTP 5xx (also after the client's one retry)
``PrometheusUnreachable``                connection refused, DNS, timeout
``PrometheusBadResponse``                an answer that is not Prometheus' JSON
``PrometheusCredentialsUnreadable``      a mounted credentials file cannot be read
``PrometheusQueryFailed``                any other HTTP error (a 400: a query Prometheus refused)
=======================================  =======================================================
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import urllib.parse
from typing import Any

import requests

from kvpilot.operator import conditions

logger = logging.getLogger(__name__)

LOG_BODY_CHARS = 500
"""The most characters of an upstream error text the operator's log keeps."""

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_CREDENTIAL = re.compile(
    r"(?P<key>authorization|proxy-authorization|bearer|basic|token|access_token|api[_-]?key|password|"
    r"secret|x-api-key)(?P<sep>[\"']?\s*[:=]?\s*[\"']?\s*(?:bearer\s+|basic\s+)?)(?P<value>[^\s\"',;&}]+)",
    re.IGNORECASE,
)
_STATUS = re.compile(
    r"HTTP Status Code (\d{3})|too many (\d{3}) error responses|\b(\d{3}) (?:Client|Server) Error"
)

_TEXT = {
    conditions.PROMETHEUS_UNAUTHORIZED: "unauthorized (check the credentials Secret)",
    conditions.PROMETHEUS_FORBIDDEN: "forbidden (the credentials may not read this tenant)",
    conditions.PROMETHEUS_NOT_FOUND: "not found (check the path in prometheus.url)",
    conditions.PROMETHEUS_UNAVAILABLE: "Prometheus is unavailable (server error)",
    conditions.PROMETHEUS_UNREACHABLE: "unreachable (connection failed or timed out)",
    conditions.PROMETHEUS_BAD_RESPONSE: "the answer is not Prometheus' JSON (check prometheus.url)",
    conditions.PROMETHEUS_CREDENTIALS_UNREADABLE: "cannot read the credentials file",
    conditions.PROMETHEUS_QUERY_FAILED: "error answer",
}


def redact_url(url: str) -> str:
    """``url`` without userinfo (``https://user:pass@prom/`` -> ``https://***@prom/``) and without a query."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return _USERINFO.sub(r"\g<scheme>***@", url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_text(text: str, limit: int = LOG_BODY_CHARS) -> str:
    """``text`` on one line, userinfo and every credential-like value replaced, at most ``limit`` chars."""
    flat = " ".join(text.split())
    flat = _USERINFO.sub(r"\g<scheme>***@", flat)
    flat = _CREDENTIAL.sub(lambda m: f"{m['key']}{m['sep']}***", flat)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed query: from ``requests``' response, or prometheus-api-client's and
    urllib3's retry texts (``HTTP Status Code 404``, ``too many 503 error responses``)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return status
    match = _STATUS.search(str(exc))
    if match is None:
        return None
    return int(next(g for g in match.groups() if g))


def _tls_detail(exc: BaseException) -> str | None:
    """The verifier's words (``certificate verify failed: unable to get local issuer certificate``): local
    text from OpenSSL, never upstream's."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
            return f"certificate verify failed: {e.verify_message}"
        if isinstance(e, ssl.SSLError) and e.reason:
            return f"TLS error: {e.reason}"
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
    return None


def compute_error_class(exc: BaseException) -> tuple[str, int | None]:
    """(the ``MetricsAvailable`` reason, the HTTP status if any) of a failed query."""
    if isinstance(exc, requests.exceptions.SSLError):
        return conditions.PROMETHEUS_TLS_ERROR, None
    status = http_status(exc)
    if status == 401:
        return conditions.PROMETHEUS_UNAUTHORIZED, status
    if status == 403:
        return conditions.PROMETHEUS_FORBIDDEN, status
    if status == 404:
        return conditions.PROMETHEUS_NOT_FOUND, status
    if status is not None and status >= 500:
        return conditions.PROMETHEUS_UNAVAILABLE, status
    if status is not None:
        return conditions.PROMETHEUS_QUERY_FAILED, status
    # requests' JSONDecodeError is a RequestException (an OSError): check it before the OSError below
    if isinstance(exc, json.JSONDecodeError | requests.exceptions.InvalidJSONError | KeyError | TypeError):
        return conditions.PROMETHEUS_BAD_RESPONSE, None
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return conditions.PROMETHEUS_UNREACHABLE, None
    if isinstance(exc, requests.exceptions.RequestException):
        return conditions.PROMETHEUS_UNREACHABLE, None
    if isinstance(exc, OSError):  # a credentials file that cannot be read (FileAuth reads it per request)
        return conditions.PROMETHEUS_CREDENTIALS_UNREADABLE, None
    if isinstance(exc, ValueError):  # a value that is not a number, an answer of the wrong shape
        return conditions.PROMETHEUS_BAD_RESPONSE, None
    return conditions.PROMETHEUS_QUERY_FAILED, None


def classify_error(exc: BaseException, url: str) -> tuple[str, str]:
    """(the ``MetricsAvailable`` reason, a tenant-safe message) for a failed query; logs the redacted,
    truncated upstream text for the operator's owner."""
    code, status = compute_error_class(exc)
    where = redact_url(url)
    if code == conditions.PROMETHEUS_TLS_ERROR:
        what = f"TLS verification failed (check prometheus.tls.ca): {_tls_detail(exc) or 'handshake failed'}"
    else:
        what = _TEXT[code] + (f" (HTTP {status})" if status is not None else "")
    logger.warning(
        "Prometheus query to %s failed: %s: %s: %s", where, code, type(exc).__name__, redact_text(str(exc))
    )
    return code, f"Prometheus query failed ({where}): {what}"
