"""Kubernetes label and toleration syntax, checked before anything reaches the API server.

The CRD refuses the same with CEL (``spec.nodeSelector``, ``spec.engine.tolerations``; its rules embed
:data:`LABEL_KEY_PATTERN` and :data:`LABEL_VALUE_PATTERN` and say the messages here, and
tests/operator/test_labels.py checks they agree); here they become ``InvalidSpec`` for ``kvpilot render``
and for objects stored before the rules existed. Without them, a node selector the API server refuses in
the Deployment came back as a 422 on every apply. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^({_DNS_LABEL}([.]{_DNS_LABEL})*/)?{_NAME}$"
"""A qualified label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters
(``k8s.io/apimachinery/pkg/util/validation``: ``IsQualifiedName``). No backslash: it sits in CEL strings."""
LABEL_VALUE_PATTERN = rf"^({_NAME})?$"
"""A label value: empty, or at most 63 alphanumerics, ``-``, ``_`` or ``.``, starting and ending with an
alphanumeric."""
MAX_PREFIX = 253

SELECTOR_KEY = "nodeSelector keys must be label keys"
SELECTOR_VALUE = "nodeSelector values must be label values"
TOLERATION_KEY = "a toleration key must be a label key"
TOLERATION_VALUE = "a toleration value must be a label value"
EXISTS_WITH_VALUE = "a toleration with operator Exists takes no value"
NO_KEY_NOT_EXISTS = "a toleration without a key must use operator Exists (it matches every taint)"
SECONDS_NOT_NOEXECUTE = "tolerationSeconds is only for effect NoExecute"
KEY_SYNTAX = "an optional DNS-subdomain prefix and '/', then at most 63 alphanumerics, '-', '_' or '.'"
VALUE_SYNTAX = "empty, or at most 63 alphanumerics, '-', '_' or '.'"


def is_label_key(key: str) -> bool:
    return bool(re.match(LABEL_KEY_PATTERN, key)) and len(key.rpartition("/")[0]) <= MAX_PREFIX


def is_label_value(value: str) -> bool:
    return bool(re.match(LABEL_VALUE_PATTERN, value))


def node_selector_problems(selector: Mapping[str, str]) -> list[str]:
    out = []
    for key, value in selector.items():
        if not is_label_key(key):
            out.append(f"spec.nodeSelector: {SELECTOR_KEY} ({KEY_SYNTAX}): {key!r}")
        if not is_label_value(value):
            out.append(f"spec.nodeSelector: {SELECTOR_VALUE} ({VALUE_SYNTAX}): {value!r} of {key!r}")
    return out


def toleration_problems(tolerations: Sequence[Any]) -> list[str]:
    """What the API server would refuse in the pods' tolerations (``ValidateTolerations``)."""
    out = []
    for i, t in enumerate(tolerations):
        where = f"spec.engine.tolerations[{i}]"
        if t.key and not is_label_key(t.key):
            out.append(f"{where}: {TOLERATION_KEY} ({KEY_SYNTAX}): {t.key!r}")
        if t.value and not is_label_value(t.value):
            out.append(f"{where}: {TOLERATION_VALUE} ({VALUE_SYNTAX}): {t.value!r}")
        if t.operator == "Exists" and t.value:
            out.append(f"{where}: {EXISTS_WITH_VALUE}")
        if not t.key and t.operator != "Exists":
            out.append(f"{where}: {NO_KEY_NOT_EXISTS}")
        if t.toleration_seconds is not None and t.effect != "NoExecute":
            out.append(f"{where}: {SECONDS_NOT_NOEXECUTE}")
    return out
