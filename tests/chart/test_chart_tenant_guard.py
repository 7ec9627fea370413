"""The operator's own tenant guard in the chart: admissionPolicy.operatorEnforcement, the allow-lists the
operator reads (the very values the admission policy is rendered from), and one list of code-loading vLLM
flags and variables (kvpilot/tuner/vllm/code_loading.py) for both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helmchart import CHART, RELEASE, run_helm

from kvpilot.operator import api
from kvpilot.operator.pods import tenant_guard
from kvpilot.operator.pods.tenant_settings import TenantSettings, settings_from_env
from kvpilot.tuner import vllm

Render = Callable[..., list[dict[str, Any]]]
ISVC = f"{RELEASE}-kvpilot-inferenceservices"


def _env(objs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _variables(objs: list[dict[str, Any]]) -> dict[str, str]:
    (policy,) = [
        o for o in objs if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == ISVC
    ]
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def _cel_list(expression: str, after: str) -> list[str]:
    """The CEL list literal that follows ``after`` in ``expression`` (``['A','B']``)."""
    match = re.search(re.escape(after) + r"\s*\[([^\]]*)\]", expression)
    assert match, (after, expression)
    return re.findall(r"'([^']*)'", match.group(1))


def _cel_lists(expression: str, after: str) -> list[list[str]]:
    return [
        re.findall(r"'([^']*)'", m) for m in re.findall(re.escape(after) + r"\s*\[([^\]]*)\]", expression)
    ]


def test_the_policy_and_the_operator_share_the_code_loading_lists(rendered: Render) -> None:
    v = _variables(rendered())
    assert json.loads(v["codeArgs"]) == list(vllm.CODE_LOADING_FLAGS)
    # deniedArgs: !(n in <allowedEngineArgs>) && !(n in <the exact flags>)
    assert _cel_lists(v["deniedArgs"], "!(n in")[1] == list(vllm.EXACT_FLAGS)
    assert _cel_list(v["deniedEnv"], "|| m.n in") == list(vllm.CODE_LOADING_ENV)
    assert _cel_list(v["deniedEnv"], "&& !(m.n in") == list(vllm.SAFE_PYTHON_ENV)
    for prefix in vllm.CODE_LOADING_ENV_PREFIXES:
        assert f"m.n.startsWith('{prefix}')" in v["deniedEnv"]
    # deniedKeys: <ANY_FLAG_CODE_KEYS>.exists(...) and, for --compilation-config, <its keys>.exists(...)
    assert _cel_lists(v["deniedKeys"], "filter(x,") == [list(vllm.ANY_FLAG_CODE_KEYS)]
    assert list(vllm.CODE_LOADING_KEYS) == ["--compilation-config"]
    assert _cel_lists(v["deniedKeys"], "&& ")[-1] == list(vllm.CODE_LOADING_KEYS["--compilation-config"])
    assert set(vllm.JSON_FLAG_ALIASES) <= {"-O", "-cc"} and "f.a.startsWith('-cc')" in v["deniedKeys"]
    # deniedEnvFrom: the same names as deniedEnv, as is_code_safe_env_prefix reads them
    assert _cel_list(v["deniedEnvFrom"], "||") == list(vllm.CODE_LOADING_ENV)


@pytest.mark.parametrize(
    ("sets", "mode"),
    [
        ((), "Off"),  # the policy is rendered: it guards
        (("admissionPolicy.enabled=false",), "Strict"),
        (
            ("admissionPolicy.enabled=false", "admissionPolicy.operatorEnforcement=TrustNamespace"),
            "TrustNamespace",
        ),
        (("admissionPolicy.enabled=false", "admissionPolicy.operatorEnforcement=Off"), "Off"),
        (("admissionPolicy.operatorEnforcement=Strict",), "Strict"),
    ],
)
def test_the_enforcement_mode(rendered: Render, sets: tuple[str, ...], mode: str) -> None:
    assert _env(rendered(sets=sets))["KVPILOT_OPERATOR_ENFORCEMENT"] == mode


def test_before_kubernetes_1_30_the_operator_enforces(helm: Path) -> None:
    out = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", "1.29.4").stdout
    assert re.search(r"name: KVPILOT_OPERATOR_ENFORCEMENT\n\s+value: \"Strict\"", out), out


def test_the_operator_reads_the_charts_defaults(rendered: Render) -> None:
    """The operator's settings from the chart's default values are TenantSettings' own defaults."""
    env = _env(rendered(sets=("admissionPolicy.enabled=false",)))
    assert settings_from_env(env) == TenantSettings(mode="Strict")


def test_the_operator_reads_the_allow_lists_the_policy_uses(rendered: Render) -> None:
    sets = (
        "admissionPolicy.enabled=false",
        "admissionPolicy.allowedImages={registry.example/vllm/*}",
        "admissionPolicy.allowedServiceAccounts={vllm-runner}",
        "admissionPolicy.allowedPriorityClasses={team-high}",
        "admissionPolicy.allowedEngineArgs={--trust-remote-code}",
        "admissionPolicy.allowedEngineEnv={VLLM_PLUGINS}",
        "admissionPolicy.allowedPodAnnotations={prometheus.io/*}",
        "admissionPolicy.claimTemplate.maxSize=500Gi",
        "admissionPolicy.claimTemplate.allowedStorageClasses={fast}",
    )
    s = settings_from_env(_env(rendered(sets=sets)))
    assert s.mode == "Strict"
    assert s.allowed_images == ("registry.example/vllm/*",)
    assert s.allowed_service_accounts == ("vllm-runner",) and s.allowed_priority_classes == ("team-high",)
    assert s.allowed_engine_args == ("--trust-remote-code",) and s.allowed_engine_env == ("VLLM_PLUGINS",)
    assert s.allowed_pod_annotations == ("prometheus.io/*",)
    assert s.claim_template.max_bytes == 500 << 30 and s.claim_template.allowed_storage_classes == ("fast",)


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        ("admissionPolicy.operatorEnforcement=strict", "operatorEnforcement"),
        ("operator.extraEnv[0].name=KVPILOT_OPERATOR_ENFORCEMENT", "set admissionPolicy.* instead"),
        ("operator.extraEnv[0].name=KVPILOT_TENANT_POLICY", "set admissionPolicy.* instead"),
    ],
)
def test_bad_values_are_refused(helm: Path, sets: str, complaint: str) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", sets, check=False)
    assert proc.returncode != 0 and complaint in proc.stderr, proc.stderr


def _group_with_shared_cache() -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {
            "model": {
                "id": "deepseek-ai/DeepSeek-V3",
                "storage": {"claimTemplate": {"size": "800Gi", "accessMode": "ReadWriteMany"}},
            },
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
        }
    )


@pytest.mark.parametrize("multi_node", [False, True])
def test_a_groups_shared_weight_claim_is_allowed_where_multi_node_is(
    rendered: Render, multi_node: bool
) -> None:
    """A replica over nodes needs a ReadWriteMany claim (the CRD refuses another mode): multiNode.enabled adds
    it to the claim access modes of the admission policy and of the operator's guard alike; without it the
    chart's default list (ReadWriteOnce, ReadWriteOncePod) refuses the claim in both."""
    objs = rendered(sets=(f"multiNode.enabled={str(multi_node).lower()}",))
    claims = " ".join(_variables(objs)["claimProblems"].split())
    policy = _cel_list(claims, "variables.claimTemplate.accessMode in")
    settings = settings_from_env(_env(objs))
    assert settings.mode == "Off"  # the policy guards; the operator's guard is then asked directly below
    modes = ["ReadWriteOnce", "ReadWriteOncePod", *(["ReadWriteMany"] if multi_node else [])]
    assert policy == modes and list(settings.claim_template.allowed_access_modes) == modes
    refused = [
        v
        for v in tenant_guard.compute_violations(
            _group_with_shared_cache(), settings.model_copy(update={"mode": "Strict"})
        )
        if "accessMode" in v
    ]
    assert bool(refused) is not multi_node, refused
