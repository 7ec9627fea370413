"""The admission policies' rendering: allow-lists from values, the CEL cost invariants, NOTES' warnings.

What the policies refuse on a real API server: e2e/test_admission.py and e2e/test_tenants.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import CHART, RELEASE, run_helm

from kvpilot.operator.pods import pod_template

Render = Callable[..., list[dict[str, Any]]]
ISVC, TUNER = f"{RELEASE}-kvpilot-inferenceservices", f"{RELEASE}-kvpilot-enginetuners"


def _policy(objs: list[dict[str, Any]], name: str = ISVC) -> dict[str, Any]:
    (policy,) = [
        o for o in objs if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]
    return policy


def _variables(objs: list[dict[str, Any]], name: str = ISVC) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in _policy(objs, name)["spec"]["variables"]}


def _expressions(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    return [x["expression"] for k in ("matchConditions", "variables", "validations") for x in spec.get(k, ())]


@pytest.mark.parametrize("name", [ISVC, TUNER])
def test_no_expression_makes_more_than_two_authorization_checks(rendered: Render, name: str) -> None:
    """The API server costs an authorizer check() at 350,000 and stops an expression at 1,000,000: at most two
    checks in one expression (the variable mayCreatePods counts for the expression that reads it)."""
    policy = _policy(rendered(), name)
    for expr in _expressions(policy):
        assert expr.count(".check(") + expr.count("variables.mayCreatePods") <= 2, expr
    # the whole request has 10,000,000: the checks an InferenceService can cause, match condition included
    checks = sum(e.count(".check(") for e in _expressions(policy))
    assert checks * 350_000 <= 7_000_000, checks


def test_the_size_policy_is_the_generated_weight_for_everyone(rendered: Render) -> None:
    policy = _policy(rendered(), f"{RELEASE}-kvpilot-inferenceservice-size")
    assert [c["name"] for c in policy["spec"]["matchConditions"]] == ["has-template"]  # no requester exempt
    (weight,) = policy["spec"]["variables"]
    assert weight["expression"] == (CHART / "files" / "template-size.cel").read_text().strip()
    (rule,) = policy["spec"]["validations"]
    limit = pod_template.TEMPLATE_SIZE_LIMIT
    assert rule["expression"] == f"variables.templateSize <= {limit}"
    assert f"the limit is {limit} (64 KiB)" in rule["messageExpression"]


def test_every_reference_slot_checks_one_distinct_object(rendered: Render) -> None:
    policy = _policy(rendered())
    variables = _variables(rendered())
    assert "distinct()" not in json.dumps(policy)  # quadratic cost: see the template
    slots = [v for v in policy["spec"]["validations"] if "check('get')" in v["expression"]]
    assert len(slots) == 16
    assert [f"rest{i}" for i in range(17)] == [k for k in variables if k.startswith("rest")]
    assert any(v["expression"] == "variables.rest16.size() == 0" for v in policy["spec"]["validations"])
    # every kind of reference a pod can carry is collected
    for field in (
        "hubTokenSecretRef",
        "configMapRef",
        "secretKeyRef",
        "configMapKeyRef",
        "envFrom",
        "secretRef",
        "v.secret",
        "v.configMap",
        "v.persistentVolumeClaim",
        "x.s.secret",
        "x.s.configMap",
        "imagePullSecrets",
    ):
        assert field in variables["refs"], field


def test_default_allow_lists(rendered: Render) -> None:
    v = _variables(rendered())
    assert "in []" in v["identity"]  # only default
    assert "variables.pod.priorityClassName in []" in v["scheduling"]
    assert "variables.pod.runtimeClassName in ['nvidia']" in v["scheduling"]
    assert "variables.pod.schedulerName in ['default-scheduler']" in v["scheduling"]
    assert json.loads(v["allowedAnnotations"]) == [
        "kubectl.kubernetes.io/default-container",
        "kubectl.kubernetes.io/default-logs-container",
    ]
    assert "--trust-remote-code" in json.loads(v["codeArgs"])
    assert "!(n in [])" in v["deniedArgs"] and "!(m.n in [])" in v["deniedEnv"]
    assert "quantity('1Ti')" in v["claimProblems"]
    assert "in ['ReadWriteOnce','ReadWriteOncePod']" in v["claimProblems"]


def test_allow_lists_from_values(rendered: Render) -> None:
    sets = (
        "admissionPolicy.allowedServiceAccounts={vllm-runner}",
        "admissionPolicy.allowedPriorityClasses={team-high}",
        "admissionPolicy.allowedRuntimeClasses={nvidia,kata}",
        "admissionPolicy.allowedSchedulers={volcano}",
        "admissionPolicy.allowedPodAnnotations={prometheus.io/*}",
        "admissionPolicy.allowedEngineArgs={--trust-remote-code}",
        "admissionPolicy.allowedEngineEnv={VLLM_PLUGINS}",
        "admissionPolicy.claimTemplate.maxSize=500Gi",
        "admissionPolicy.claimTemplate.allowedAccessModes={ReadWriteMany}",
        "admissionPolicy.claimTemplate.allowedStorageClasses={fast}",
    )
    v = _variables(rendered(sets=sets))
    assert "in ['vllm-runner']" in v["identity"]
    assert "priorityClassName in ['team-high']" in v["scheduling"]
    assert "runtimeClassName in ['nvidia','kata']" in v["scheduling"]
    assert "schedulerName in ['default-scheduler','volcano']" in v["scheduling"]
    assert json.loads(v["allowedAnnotations"]) == ["prometheus.io/*"]
    assert "!(n in ['--trust-remote-code'])" in v["deniedArgs"]
    assert "!(m.n in ['VLLM_PLUGINS'])" in v["deniedEnv"]
    assert "quantity('500Gi')" in v["claimProblems"] and "in ['ReadWriteMany']" in v["claimProblems"]
    assert "in ['fast']" in v["claimProblems"]
    unbounded = _variables(rendered(sets=("admissionPolicy.claimTemplate.maxSize=",)))
    assert "quantity(" not in unbounded["claimProblems"]


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        ("admissionPolicy.allowedImages={ev'il}", "allowedImages"),
        ("admissionPolicy.allowedServiceAccounts={Admin SA}", "allowedServiceAccounts"),
        ("admissionPolicy.allowedEngineArgs={trust-remote-code}", "allowedEngineArgs"),
        ("admissionPolicy.allowedEngineEnv={LD PRELOAD}", "allowedEngineEnv"),
        ("admissionPolicy.allowedPodAnnotations={a'b}", "allowedPodAnnotations"),
        ("admissionPolicy.claimTemplate.maxSize=lots", "maxSize"),
        ("admissionPolicy.claimTemplate.allowedAccessModes={ReadOnlyMany}", "allowedAccessModes"),
    ],
)
def test_schema_refuses_values_that_would_break_the_cel(helm: Path, sets: str, complaint: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", sets, check=False)
    assert proc.returncode != 0 and complaint in proc.stderr, proc.stderr


def test_enginetuner_policy_checks_the_target_and_the_token(rendered: Render) -> None:
    policy = _policy(rendered(), TUNER)
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["enginetuners"]
    validations = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "check('get')" in validations and "check('update')" in validations
    assert "subresource('eviction')" in validations and "hubTokenSecretRef" in validations
    # any requester: no may-not-create-pods match condition
    assert [c["name"] for c in policy["spec"]["matchConditions"]] == ["spec-written"]


def _notes(helm: Path, tmp_path: Path, *args: str) -> str:
    """NOTES.txt as rendered (helm template does not print it): a copy of the chart renders it as a value."""
    chart = tmp_path / "kvpilot"
    if not chart.exists():
        shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_probe.tpl").write_text(
        '{{- define "probe.notes" -}}' + notes + "{{- end -}}"
    )
    (chart / "templates" / "notes-probe.yaml").write_text('notes: {{ include "probe.notes" . | toJson }}\n')
    out = run_helm(helm, "template", RELEASE, str(chart), "--show-only", "templates/notes-probe.yaml", *args)
    return str(yaml.safe_load(out.stdout)["notes"])


def test_notes_warn_when_the_policy_is_disabled(helm: Path, tmp_path: Path) -> None:
    default = _notes(helm, tmp_path)
    assert "WARNING" not in default and "operatorEnforcement" not in default
    # disabled: the operator enforces (Strict by default), and the notes say so instead of warning
    notes = _notes(helm, tmp_path, "--set", "admissionPolicy.enabled=false")
    assert "WARNING" not in notes
    assert "admissionPolicy.operatorEnforcement=Strict: no admission policy runs, so the operator" in notes
    assert "no Secret, ConfigMap or claim in spec.template" in notes and "reason Forbidden" in notes
    trust = _notes(
        helm,
        tmp_path,
        "--set",
        "admissionPolicy.enabled=false",
        "--set",
        "admissionPolicy.operatorEnforcement=TrustNamespace",
    )
    assert "admissionPolicy.operatorEnforcement=TrustNamespace: no admission policy runs" in trust
    assert "spec.template may name any Secret, ConfigMap or claim of its namespace" in trust
    # disabled and Off: nothing guards
    off = _notes(
        helm,
        tmp_path,
        "--set",
        "admissionPolicy.enabled=false",
        "--set",
        "admissionPolicy.operatorEnforcement=Off",
    )
    assert "WARNING: admissionPolicy.enabled=false: no admission policy guards InferenceServices" in off
    assert "--trust-remote-code" in off and "EngineTuner" in off
    both = _notes(helm, tmp_path, "--set", "admissionPolicy.operatorEnforcement=Strict")
    assert "the operator also enforces the tenant policy itself" in both and "WARNING" not in both


def test_before_kubernetes_1_30_no_policy_renders_and_notes_warn(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", "1.29.4").stdout
    assert "ValidatingAdmissionPolicy" not in out
    notes = _notes(helm, tmp_path, "--kube-version", "1.29.4")
    assert "admissionPolicy.operatorEnforcement=Strict: no admission policy runs" in notes
    notes = _notes(
        helm, tmp_path, "--kube-version", "1.29.4", "--set", "admissionPolicy.operatorEnforcement=Off"
    )
    assert (
        "WARNING: this cluster does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"
        in notes
    )
    assert "the chart installed NO admission policy" in notes
