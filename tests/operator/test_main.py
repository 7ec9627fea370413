"""Registrations and start-up settings of the kopf operator."""

from __future__ import annotations

import kopf
import pytest

from kvpilot.operator import main
from kvpilot.operator.clients import metrics
from kvpilot.operator.inferenceservice import handlers, reconcile_deps, service_main
from kvpilot.operator.loop import loop_deps, loop_settings, startup


def test_startup_settings(monkeypatch) -> None:
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    monkeypatch.setattr(reconcile_deps, "configure", lambda owners: reconcile_deps.Deps(None, owners=owners))
    monkeypatch.setattr(loop_deps, "configure", lambda pace, prom, owners: None)
    settings = kopf.OperatorSettings()
    main.configure(settings=settings)
    # kopf's bookkeeping rides in the status PATCH: nothing in annotations
    assert isinstance(settings.persistence.progress_storage, kopf.StatusProgressStorage)
    assert settings.persistence.progress_storage.field == ("status", "kopf", "progress")
    assert settings.persistence.progress_storage.touch_field == ("status", "kopf", "dummy")
    assert isinstance(settings.persistence.diffbase_storage, kopf.StatusDiffBaseStorage)
    assert settings.persistence.diffbase_storage.field == ("status", "kopf", "lastHandledConfiguration")
    assert settings.persistence.finalizer == "kvpilot.io/finalizer"


def test_handlers_registered_for_our_resource() -> None:
    registry = kopf.get_default_registry()
    changing = registry._changing.get_all_handlers()
    mine = (service_main.created, service_main.spec_changed, service_main.resumed)
    ours = [h for h in changing if h.fn in mine]
    assert len(ours) == 3
    for h in ours:
        assert h.selector.group == "kvpilot.io" and h.selector.plural == "inferenceservices"
    update = next(h for h in ours if h.fn is service_main.spec_changed)
    assert update.field == ("spec",)
    assert not [h for h in changing if h.fn.__module__ == main.__name__ and h.reason == "delete"]


async def test_handler_forwards_kwargs(monkeypatch) -> None:
    seen = {}

    async def fake(**kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(handlers, "reconcile", fake)
    monkeypatch.setattr(reconcile_deps, "_deps", reconcile_deps.Deps(kube=None))
    await service_main.spec_changed(
        body={},
        spec={},
        meta={},
        status={},
        patch=kopf.Patch(),
        retry=2,
        logger=None,
        diff=(),
        old=None,
        new=None,
    )
    assert seen["trigger"] == "SpecChanged" and seen["retry"] == 2 and seen["diff"] == ()
    assert "old" not in seen and "new" not in seen


def test_peering_lifetime_from_the_environment(monkeypatch) -> None:
    assert startup.peering_lifetime_from_env({}) is None
    assert startup.peering_lifetime_from_env({startup.PEERING_LIFETIME_ENV: " 15 "}) == 15
    for bad in ("9", "abc", "15.5", "-1"):
        with pytest.raises(loop_settings.LoopConfigError, match=startup.PEERING_LIFETIME_ENV):
            startup.peering_lifetime_from_env({startup.PEERING_LIFETIME_ENV: bad})
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    monkeypatch.setattr(reconcile_deps, "configure", lambda owners: reconcile_deps.Deps(None, owners=owners))
    monkeypatch.setattr(loop_deps, "configure", lambda pace, prom, owners: None)
    settings = kopf.OperatorSettings()
    default = settings.peering.lifetime
    main.configure(settings=settings)
    assert settings.peering.lifetime == default  # unset: kopf's own
    monkeypatch.setenv(startup.PEERING_LIFETIME_ENV, "20")
    main.configure(settings=settings)
    assert settings.peering.lifetime == 20
    monkeypatch.setenv(startup.PEERING_LIFETIME_ENV, "2")
    with pytest.raises(kopf.PermanentError, match="expected an integer"):
        main.configure(settings=settings)


def test_every_status_field_kopf_writes_is_in_the_crd_schema() -> None:
    """A field the schema does not declare is pruned by the API server: kopf's touch would then never wake a
    handler for its retry (a temporary error would stick), and its progress would be lost."""
    import pathlib

    import yaml

    crd = yaml.safe_load(
        (pathlib.Path(__file__).parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml").read_text()
    )
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for spec in (main.DIFF_BASE_FIELD, main.PROGRESS_FIELD, main.TOUCH_FIELD):
        node = schema
        for part in spec.split("."):
            assert part in node.get("properties", {}), f"{spec}: {part} is not in the CRD's schema"
            node = node["properties"][part]


def test_the_tenant_guard_is_configured_at_startup(monkeypatch) -> None:
    from kvpilot.operator.pods import tenant_settings

    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    monkeypatch.setattr(reconcile_deps, "configure", lambda owners: reconcile_deps.Deps(None, owners=owners))
    monkeypatch.setattr(loop_deps, "configure", lambda pace, prom, owners: None)
    monkeypatch.setattr(tenant_settings, "_settings", tenant_settings.TenantSettings())
    monkeypatch.setenv(tenant_settings.ENFORCEMENT_ENV, "Strict")
    monkeypatch.setenv(tenant_settings.POLICY_ENV, '{"allowedServiceAccounts": ["vllm-runner"]}')
    main.configure(settings=kopf.OperatorSettings())
    assert tenant_settings.current().mode == "Strict"
    assert tenant_settings.current().allowed_service_accounts == ("vllm-runner",)
    monkeypatch.setenv(tenant_settings.POLICY_ENV, '{"allowedEngineArgs": ["trust-remote-code"]}')
    with pytest.raises(kopf.PermanentError, match="KVPILOT_TENANT_POLICY: allowedEngineArgs"):
        main.configure(settings=kopf.OperatorSettings())
