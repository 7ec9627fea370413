"""The operator's tenant guard (kvpilot.operator.pods.tenant_guard) over the admission policy's hostile cases.

e2e/tenant_cases.py's table is the one e2e/test_tenants.py runs against the chart's ValidatingAdmissionPolicy
on a real API server: every case the policy refuses for alice, the guard refuses in mode Strict, naming the
same fields in the same words (up to who is refused); what alice may use passes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.tenant_cases import ALICE_MAY_USE, MODEL, REFUSED, WHO, pod, sidecar
from kvpilot.operator import conditions, errors
from kvpilot.operator.enginetuner import target_observed
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.pods import tenant_guard, tenant_settings
from kvpilot.operator.pods.tenant_settings import TenantConfigError, TenantSettings, settings_from_env

STRICT = TenantSettings(mode="Strict")
TRUST = TenantSettings(mode="TrustNamespace")
REFERENCE_CASES = {
    "secret-volume",
    "env-from-secret",
    "sidecar-secret-key-ref",
    "projected-secret",
    "config-map-volume",
    "claim-volume",
    "image-pull-secret",
}
"""The cases the policy refuses for alice's identity (a Secret, ConfigMap or claim she may not get)."""


def _violations(spec: dict[str, Any], settings: TenantSettings) -> list[str]:
    parsed = desired.parse_spec(spec)  # the guard is Off here: the spec itself is valid
    return tenant_guard.compute_violations(parsed, settings)


def _policy_words(message: str) -> str:
    """The part of the policy's message that does not depend on who asked: up to ``: alice may not ...`` or
    ``, which alice may not get``."""
    return message.split(f": {WHO}")[0].split(", which alice")[0]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_strict_refuses_every_case_the_policy_refuses(case: str) -> None:
    spec, message = REFUSED[case]
    problems = _violations(spec, STRICT)
    assert problems, f"{case}: admitted"
    text = "; ".join(problems)
    assert _policy_words(message) in text, text
    assert "admissionPolicy.operatorEnforcement=Strict" in text


@pytest.mark.parametrize("case", sorted(set(REFUSED) - REFERENCE_CASES))
def test_trust_namespace_still_refuses_every_identity_free_case(case: str) -> None:
    spec, message = REFUSED[case]
    assert _policy_words(message) in "; ".join(_violations(spec, TRUST))


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_trust_namespace_allows_the_namespaces_references(case: str) -> None:
    assert _violations(REFUSED[case][0], TRUST) == []


def test_what_alice_may_use_passes() -> None:
    assert _violations(ALICE_MAY_USE, TRUST) == []
    # Strict refuses only its template's references to her own Secret: the operator cannot ask her rights
    strict = _violations(ALICE_MAY_USE, STRICT)
    assert len(strict) == 1 and strict[0].startswith(
        "spec.template.spec.containers[side].env[T].valueFrom.secretKeyRef,"
        " spec.template.spec.volumes[hf].secret names Secret hf-alice, which kvpilot cannot check its"
        " requester may get"
    ), strict
    without_refs = json.loads(json.dumps(ALICE_MAY_USE))
    without_refs["template"]["spec"]["containers"] = [sidecar()]
    without_refs["template"]["spec"]["volumes"] = without_refs["template"]["spec"]["volumes"][1:]
    assert _violations(without_refs, STRICT) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"model": MODEL},
        {"model": MODEL, "engine": {"tolerations": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}},
        {"model": MODEL, "engine": {"extraArgs": ["--model-impl", "vllm", "--max-num-seqs=8"]}},
        pod(volumes=[{"name": "x", "emptyDir": {}}], containers=[sidecar(ports=[{"containerPort": 8080}])]),
        {
            "model": MODEL,
            "engine": {
                "extraArgs": [
                    "--hf-overrides",
                    '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}',
                    "-O3",
                    "--compilation-config",
                    '{"mode": 3, "cudagraph_capture_sizes": [1, 2]}',
                    "--config-format",
                    "auto",
                ]
            },
        },
    ],
)
def test_benign_specs_pass_in_strict(spec: dict[str, Any]) -> None:
    assert _violations(spec, STRICT) == []


@pytest.mark.parametrize("prefix", ["APP_", "HF_", "X"])
def test_an_env_from_with_a_safe_prefix_passes(prefix: str) -> None:
    spec = pod(containers=[{"name": "vllm", "envFrom": [{"secretRef": {"name": "s"}, "prefix": prefix}]}])
    assert _violations(spec, TRUST) == []


def test_off_checks_nothing() -> None:
    for spec, _ in REFUSED.values():
        assert _violations(spec, TenantSettings(mode="Off")) == []


def test_the_allow_lists_open_what_they_name_and_nothing_else() -> None:
    opened = TenantSettings(
        mode="Strict",
        allowed_images=("registry.example/vllm/*",),
        allowed_engine_args=("--trust-remote-code",),
        allowed_service_accounts=("vllm-runner",),
        allowed_priority_classes=("team-high",),
    )
    spec = {
        "model": MODEL,
        "engine": {"image": "registry.example/vllm/openai:1", "extraArgs": ["--trust-remote-code"]},
        "template": {"spec": {"serviceAccountName": "vllm-runner", "priorityClassName": "team-high"}},
    }
    assert _violations(spec, opened) == []
    assert "--worker-cls" in "; ".join(
        _violations({"model": MODEL, "engine": {"extraArgs": ["--worker-cls=evil.W"]}}, opened)
    )
    assert _violations({"model": MODEL, "engine": {"image": "registry.example/other:1"}}, opened)


def test_a_violation_is_forbidden_through_parse_spec() -> None:
    spec = REFUSED["host-path-privileged"][0]
    tenant_settings.configure(STRICT)
    try:
        with pytest.raises(errors.PolicyViolation) as raised:
            desired.parse_spec(spec)
    finally:
        tenant_settings.configure(TenantSettings())
    failure = errors.classify(raised.value)
    assert failure.reason == "Forbidden" and failure.condition == conditions.READY and not failure.retry
    assert "spec.template.spec.volumes[root].hostPath" in failure.message
    assert "kvpilot enforces the tenant policy itself" in failure.message


def _tuner(mode: str, **model: Any) -> dict[str, Any]:
    return {
        "targetRef": {"kind": "Deployment", "name": "team-app"},
        "updateMode": mode,
        "model": {**MODEL, **model},
    }


@pytest.mark.parametrize(
    ("settings", "spec", "expected"),
    [
        (STRICT, _tuner("Auto"), "updateMode Auto rewrites Deployment team-app's pods' engine arguments"),
        (STRICT, _tuner("Initial"), "updateMode Initial"),
        (
            TRUST,
            _tuner("Recommend", storage={"hostPath": {"path": "/models"}}),
            "an EngineTuner may name no hostPath",
        ),
        (STRICT, _tuner("Recommend"), None),
        (TRUST, _tuner("Auto"), None),
    ],
)
def test_enginetuners(settings: TenantSettings, spec: dict[str, Any], expected: str | None) -> None:
    parsed = target_observed.parse_spec(spec)
    problems = tenant_guard.compute_tuner_violations(parsed, settings)
    if expected is None:
        assert problems == []
    else:
        assert expected in "; ".join(problems), problems


# --------------------------------------------------------------------------- settings from the environment


def test_settings_from_the_charts_values() -> None:
    values = {
        "allowedImages": ["r.example/*"],
        "allowedTolerations": [{"key": "gpu", "operator": "Exists"}],
        "allowedEngineArgs": ["--trust-remote-code"],
        "claimTemplate": {
            "maxSize": "500Gi",
            "allowedAccessModes": ["ReadWriteMany"],
            "allowedStorageClasses": [],
        },
    }
    s = settings_from_env(
        {"KVPILOT_OPERATOR_ENFORCEMENT": "Strict", "KVPILOT_TENANT_POLICY": json.dumps(values)}
    )
    assert s.mode == "Strict" and s.images[1:] == ("r.example/*",) and s.images[0].startswith("vllm/")
    assert s.claim_template.max_bytes == 500 << 30
    assert s.allowed_runtime_classes == ("nvidia",)  # the chart's default where a value is left out
    assert settings_from_env({}).mode == "Off"


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({"KVPILOT_OPERATOR_ENFORCEMENT": "strict"}, "expected one of Strict, TrustNamespace, Off"),
        ({"KVPILOT_TENANT_POLICY": "{"}, "KVPILOT_TENANT_POLICY: not JSON"),
        ({"KVPILOT_TENANT_POLICY": "[]"}, "expected a JSON object"),
        ({"KVPILOT_TENANT_POLICY": '{"allowedEngineArgs": ["trust-remote-code"]}'}, "not a long flag"),
        ({"KVPILOT_TENANT_POLICY": '{"allowedImages": ["a b"]}'}, "not an image reference"),
        ({"KVPILOT_TENANT_POLICY": '{"claimTemplate": {"maxSize": "lots"}}'}, "claimTemplate.maxSize"),
        ({"KVPILOT_TENANT_POLICY": '{"allowedImage": []}'}, "allowedImage: Extra inputs"),
    ],
)
def test_bad_settings_stop_the_operator_with_a_clear_error(env: dict[str, str], complaint: str) -> None:
    with pytest.raises(TenantConfigError, match=None) as raised:
        settings_from_env(env)
    assert complaint in str(raised.value), str(raised.value)
