"""The operator's start-up: every setting read from the environment at once, then the process-wide parts set.

:func:`kvpilot.operator.main.configure` (kopf's start-up handler) calls :func:`read_config` (a bad setting
stops the operator there, with a ``kopf.PermanentError`` that names it, not mid-loop) and
:func:`apply_config`: which namespaces' TuningProfiles teach each other, the tenant guard, the metrics
server, and the closed loop's dependencies (:func:`kvpilot.operator.loop.loop_deps.configure`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import kopf

from kvpilot.operator import fairness
from kvpilot.operator.clients import metrics, prometheus_settings
from kvpilot.operator.clients.prometheus_settings import PrometheusSettings
from kvpilot.operator.loop import loop_deps, loop_settings
from kvpilot.operator.loop.loop_settings import LoopPace
from kvpilot.operator.planning import profile_scope
from kvpilot.operator.pods import tenant_settings
from kvpilot.operator.pods.ownership import VerifiedOwners

PEERING_LIFETIME_ENV = "KVPILOT_PEERING_LIFETIME_SECONDS"
"""How long a replica's kopf peering record stays alive without a keep-alive (kopf's default: 60 s). A
replica that dies without leaving the peering (SIGKILL, a lost node) blocks the others this long: it
bounds the failover time (docs/operator.md, "High availability"). kopf renews it every lifetime minus
5-10 s."""
PEERING_LIFETIME_MIN_S = 10


def peering_lifetime_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``$KVPILOT_PEERING_LIFETIME_SECONDS`` as an integer >= 10, or None (unset: kopf's default)."""
    raw = (os.environ if environ is None else environ).get(PEERING_LIFETIME_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < PEERING_LIFETIME_MIN_S:
        raise loop_settings.LoopConfigError(
            f"{PEERING_LIFETIME_ENV}={raw!r}: expected an integer number of seconds "
            f">= {PEERING_LIFETIME_MIN_S}"
        )
    return value


CONFIG_ERRORS = (
    fairness.FairnessConfigError,
    loop_settings.LoopConfigError,
    prometheus_settings.PrometheusConfigError,
    profile_scope.SharingConfigError,
    tenant_settings.TenantConfigError,
)
"""What a malformed setting raises."""


@dataclass(frozen=True)
class OperatorConfig:
    """Every setting the operator reads at start-up."""

    pace: LoopPace
    prom: PrometheusSettings
    lifetime: int | None
    """kopf's peering lifetime (``None``: kopf's default)."""
    shared: frozenset[str]
    """The namespaces whose TuningProfiles teach each other."""
    tenants: tenant_settings.TenantSettings
    """The tenant guard when no admission policy runs."""
    fair: fairness.FairnessSettings
    """Reconciles and ticks at once, and one namespace's share (:mod:`kvpilot.operator.fairness`)."""


def read_config() -> OperatorConfig:
    """The settings from the environment; a malformed one is a ``kopf.PermanentError`` naming it."""
    try:
        return OperatorConfig(
            pace=loop_settings.pace_from_env(),
            prom=prometheus_settings.settings_from_env(),
            lifetime=peering_lifetime_from_env(),
            shared=profile_scope.sharing_from_env(),
            tenants=tenant_settings.settings_from_env(),
            fair=fairness.settings_from_env(),
        )
    except CONFIG_ERRORS as exc:
        raise kopf.PermanentError(str(exc)) from exc


def apply_config(config: OperatorConfig) -> VerifiedOwners:
    """Set the process-wide parts from ``config`` and start the metrics server; the operator's memory of its
    objects (:mod:`kvpilot.operator.pods.ownership`), made here for the closed loop and handed to the
    reconciler and drift repair (one memory: a deletion drift repair sees is forgotten by every writer)."""
    owners = VerifiedOwners()
    profile_scope.configure_sharing(config.shared)
    tenant_settings.configure(config.tenants)
    fairness.configure(config.fair)
    logging.getLogger(__name__).info(f"tenant guard: operatorEnforcement={config.tenants.mode}")
    metrics.start_metrics_server()
    loop_deps.configure(config.pace, config.prom, owners)
    return owners
