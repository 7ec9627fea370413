"""The operator's own tenant guard: its mode and the allow-lists, from the chart's ``admissionPolicy`` values.

Read once, at start-up (:func:`settings_from_env`, from :func:`kvpilot.operator.main.configure`); an invalid
value stops the operator there with :class:`TenantConfigError`. The chart sets
(templates/operator-deployment.yaml)::

    KVPILOT_OPERATOR_ENFORCEMENT   Strict | TrustNamespace | Off  (admissionPolicy.operatorEnforcement; empty
                                   there: Strict when the chart renders no admission policy, Off when it does)
    KVPILOT_TENANT_POLICY          JSON: the admissionPolicy allow-lists, the very values the
                                   ValidatingAdmissionPolicy is rendered from (allowedImages,
                                   allowedTolerations, allowedServiceAccounts, allowedPriorityClasses,
                                   allowedRuntimeClasses, allowedSchedulers, allowedPodAnnotations,
                                   allowedEngineArgs, allowedEngineEnv, claimTemplate)

The modes (:mod:`kvpilot.operator.pods.tenant_guard` applies them; docs/operator.md, "Operator enforcement"):

* ``Strict``: every check the policy makes that needs no requester identity, on every InferenceService and
  EngineTuner; and, since the operator cannot ask whether the requester may read them, no Secret, ConfigMap
  or claim in ``spec.template`` and no EngineTuner ``updateMode`` Initial or Auto.
* ``TrustNamespace``: the same checks, but ``spec.template`` may name the namespace's Secrets, ConfigMaps and
  claims and an EngineTuner may rewrite its target: for clusters where whoever may create these objects may
  read and change the namespace anyway.
* ``Off``: nothing (the admission policy guards, or the administrator accepts the escalation). The default
  when ``KVPILOT_OPERATOR_ENFORCEMENT`` is unset (the operator run outside the chart).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kvpilot.operator import api
from kvpilot.operator.quantities import parse_quantity

ENFORCEMENT_ENV = "KVPILOT_OPERATOR_ENFORCEMENT"
POLICY_ENV = "KVPILOT_TENANT_POLICY"
Mode = Literal["Strict", "TrustNamespace", "Off"]
MODES: tuple[Mode, ...] = ("Strict", "TrustNamespace", "Off")
_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class TenantConfigError(ValueError):
    """``$KVPILOT_OPERATOR_ENFORCEMENT`` or ``$KVPILOT_TENANT_POLICY`` is invalid (raised at start-up)."""


class _Values(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class AllowedToleration(_Values):
    key: str = Field("", max_length=317)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field("", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class ClaimBounds(_Values):
    max_size: str = Field("1Ti", pattern=r"^$|^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
    """Empty: no bound."""
    allowed_access_modes: tuple[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"], ...] = (
        "ReadWriteOnce",
        "ReadWriteOncePod",
    )
    allowed_storage_classes: tuple[str, ...] = ()

    @property
    def max_bytes(self) -> int | None:
        return parse_quantity(self.max_size) if self.max_size else None


class TenantSettings(_Values):
    """The allow-lists (the chart's ``admissionPolicy`` values, defaults as there) and the mode."""

    mode: Mode = "Off"
    allowed_images: tuple[str, ...] = ()
    """Besides the CRD's default image (always allowed: :attr:`images`); ``*`` at the end: a prefix."""
    allowed_tolerations: tuple[AllowedToleration, ...] = (
        AllowedToleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    )
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_priority_classes: tuple[str, ...] = ()
    allowed_runtime_classes: tuple[str, ...] = ("nvidia",)
    allowed_schedulers: tuple[str, ...] = ()
    allowed_pod_annotations: tuple[str, ...] = (
        "kubectl.kubernetes.io/default-container",
        "kubectl.kubernetes.io/default-logs-container",
    )
    allowed_engine_args: tuple[str, ...] = ()
    allowed_engine_env: tuple[str, ...] = ()
    claim_template: ClaimBounds = Field(default_factory=ClaimBounds)

    @pydantic.field_validator("allowed_images")
    @classmethod
    def _images(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not re.fullmatch(r"[^\s'\"\\]{1,512}", v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an image reference")
        return value

    @pydantic.field_validator(
        "allowed_service_accounts",
        "allowed_priority_classes",
        "allowed_runtime_classes",
        "allowed_schedulers",
    )
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if len(v) > 253 or not re.fullmatch(_NAME, v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an object name")
        return value

    @pydantic.field_validator("allowed_engine_args")
    @classmethod
    def _flags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not re.fullmatch(r"--[a-z0-9][-a-z0-9]*", v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a long flag like --trust-remote-code")
        return value

    @pydantic.field_validator("allowed_engine_env")
    @classmethod
    def _env(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,255}", v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an environment variable name")
        return value

    @property
    def images(self) -> tuple[str, ...]:
        """The allowed images, the CRD's default first (as the policy lists them)."""
        return (api.DEFAULT_IMAGE, *(i for i in self.allowed_images if i != api.DEFAULT_IMAGE))

    @property
    def enforced(self) -> bool:
        return self.mode != "Off"


def settings_from_env(environ: Mapping[str, str] | None = None) -> TenantSettings:
    """:class:`TenantSettings` from the environment (see the module docstring); or
    :class:`TenantConfigError`."""
    env = os.environ if environ is None else environ
    mode = env.get(ENFORCEMENT_ENV, "").strip() or "Off"
    if mode not in MODES:
        raise TenantConfigError(f"{ENFORCEMENT_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    raw = env.get(POLICY_ENV, "").strip()
    values: Any = {}
    if raw:
        try:
            values = json.loads(raw)
        except ValueError as exc:
            raise TenantConfigError(f"{POLICY_ENV}: not JSON ({exc})") from None
        if not isinstance(values, dict):
            raise TenantConfigError(f"{POLICY_ENV}: expected a JSON object of the admissionPolicy values")
    try:
        return TenantSettings.model_validate({**values, "mode": mode})
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise TenantConfigError(f"{POLICY_ENV}: {problems}") from None


_settings = TenantSettings()


def configure(settings: TenantSettings) -> None:
    """Set the process-wide settings (the operator's start-up; tests)."""
    global _settings
    _settings = settings


def current() -> TenantSettings:
    """The settings :func:`configure` set (``Off`` before it runs: ``kvpilot render``, unit tests)."""
    return _settings
