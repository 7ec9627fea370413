"""The chart's RBAC: explicit verbs only, split by purpose, exactly the permissions docs/install.md lists."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helmchart import CHART, CI_VALUES, NAMESPACE, RELEASE, by_kind, run_helm, values_args
from test_chart_admission import _notes

from kvpilot.operator.inferenceservice import service_main

Render = Callable[..., list[dict[str, Any]]]
VARIANTS = [None, *CI_VALUES]
VARIANT_IDS = ["defaults", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)]
SA = f"{RELEASE}-kvpilot"

# (where, apiGroup, resource, resourceNames) -> verbs. `where` is "cluster" for a ClusterRole bound by a
# ClusterRoleBinding, or the namespace of a Role bound by a RoleBinding.
Grant = tuple[str, str, str, tuple[str, ...]]

CLUSTER_WIDE: dict[Grant, set[str]] = {
    ("cluster", "apiextensions.k8s.io", "customresourcedefinitions", ()): {"list", "watch"},
    ("cluster", "", "nodes", ()): {"get", "list", "watch"},
    ("cluster", "kvpilot.io", "tuningprofiles", ()): {"get", "list", "create"},
    ("cluster", "kvpilot.io", "tuningprofiles/status", ()): {"patch"},
    ("cluster", "", "events", ()): {"create", "patch"},
    ("cluster", "kopf.dev", "clusterkopfpeerings", (f"{RELEASE}-kvpilot",)): {"get", "patch"},
    ("cluster", "kopf.dev", "clusterkopfpeerings", ()): {"list", "watch"},
    ("cluster", "kvpilot.io", "inferenceservices", ()): {"get", "list", "watch", "patch", "update"},
    ("cluster", "kvpilot.io", "inferenceservices/status", ()): {"get", "patch", "update"},
    ("cluster", "kvpilot.io", "inferenceservices/finalizers", ()): {"update"},
    # server-side apply is a PATCH (create when it creates); garbage collection deletes: no update, no delete
    ("cluster", "apps", "deployments", ()): {"get", "list", "watch", "create", "patch"},
    ("cluster", "", "services", ()): {"get", "list", "watch", "create", "patch"},
    ("cluster", "", "persistentvolumeclaims", ()): {"get", "create", "patch"},
    ("cluster", "policy", "poddisruptionbudgets", ()): {"get", "create", "patch"},
    ("cluster", "", "pods", ()): {"get", "list", "watch"},
    ("cluster", "", "pods/log", ()): {"get"},
    ("cluster", "autoscaling", "horizontalpodautoscalers", ()): {"list"},
    ("cluster", "", "configmaps", ()): {"get"},
    ("cluster", "", "secrets", ()): {"get"},
    # EngineTuner (target mode): the kind, its target StatefulSet, and Auto's one-pod-at-a-time eviction
    ("cluster", "kvpilot.io", "enginetuners", ()): {"get", "list", "watch", "patch", "update"},
    ("cluster", "kvpilot.io", "enginetuners/status", ()): {"get", "patch", "update"},
    ("cluster", "apps", "statefulsets", ()): {"get"},
    ("cluster", "", "pods/eviction", ()): {"create"},
}


def _namespaced_expectation(namespaces: list[str], secret_names: tuple[str, ...]) -> dict[Grant, set[str]]:
    grants: dict[Grant, set[str]] = {
        ("cluster", "apiextensions.k8s.io", "customresourcedefinitions", ()): {"list", "watch"},
        ("cluster", "", "namespaces", ()): {"list", "watch"},
        ("cluster", "", "nodes", ()): {"get", "list", "watch"},
        ("cluster", "", "pods", ()): {"list"},  # capacity: the GPUs other namespaces' pods hold
        # fleet learning: TuningProfiles are cluster-scoped, shared by every namespace's services
        ("cluster", "kvpilot.io", "tuningprofiles", ()): {"get", "list", "create"},
        ("cluster", "kvpilot.io", "tuningprofiles/status", ()): {"patch"},
    }
    for ns in namespaces:
        for (_, group, resource, names), verbs in CLUSTER_WIDE.items():
            cluster_scoped = ("customresourcedefinitions", "nodes", "clusterkopfpeerings", "tuningprofiles")
            if resource.split("/")[0] in cluster_scoped:
                continue
            grants[(ns, group, resource, secret_names if resource == "secrets" else names)] = verbs
        grants[(ns, "kopf.dev", "kopfpeerings", (f"{RELEASE}-kvpilot",))] = {"get", "patch"}
        grants[(ns, "kopf.dev", "kopfpeerings", ())] = {"list", "watch"}
    return grants


def _roles(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return by_kind(objs, "ClusterRole") + by_kind(objs, "Role")


def operator_grants(objs: list[dict[str, Any]]) -> dict[Grant, set[str]]:
    """What the operator's ServiceAccount may do, from the rendered roles and bindings."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in _roles(objs)}
    grants: dict[Grant, set[str]] = {}
    for b in by_kind(objs, "ClusterRoleBinding") + by_kind(objs, "RoleBinding"):
        if {"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE} not in b["subjects"]:
            continue
        where = "cluster" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        role_ns = None if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"]
        role = roles[(ref["kind"], role_ns, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    key = (where, group, resource, tuple(rule.get("resourceNames", ())))
                    grants.setdefault(key, set()).update(rule["verbs"])
    return grants


@pytest.mark.parametrize("values_file", VARIANTS, ids=VARIANT_IDS)
def test_no_wildcards_anywhere(rendered: Render, values_file: Path | None) -> None:
    for role in _roles(rendered(values_file)):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: '*' in {field}"
            assert not any("*" in r for r in rule["resources"]), role["metadata"]["name"]
            assert "nonResourceURLs" not in rule
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_cluster_wide_grants_are_exactly_the_documented_ones(rendered: Render) -> None:
    assert operator_grants(rendered()) == CLUSTER_WIDE


def test_namespaced_grants_stay_in_the_watched_namespaces(rendered: Render) -> None:
    objs = rendered(CHART / "ci" / "namespaced-values.yaml")
    assert operator_grants(objs) == _namespaced_expectation(["team-a", "team-b"], ("hf-token",))
    # nothing namespaced is granted through a ClusterRole binding
    cluster = {res for (where, _, res, _) in operator_grants(objs) if where == "cluster"}
    assert cluster == {
        "customresourcedefinitions",
        "namespaces",
        "nodes",
        "pods",
        "tuningprofiles",
        "tuningprofiles/status",
    }


def test_namespaced_mode_reads_secrets_evicts_and_writes_pdbs_only_in_the_watched_namespaces(
    rendered: Render,
) -> None:
    objs = rendered(sets=["watchNamespaces={team-a,team-b}"])
    sensitive = {"secrets", "pods/eviction", "poddisruptionbudgets"}
    where = {(w, res) for (w, _, res, _) in operator_grants(objs) if res in sensitive}
    assert where == {(ns, res) for ns in ("team-a", "team-b") for res in sensitive}


MODEL_CONFIG = {"configmaps", "secrets"}
CONFINED = MODEL_CONFIG | {"poddisruptionbudgets", "pods/eviction"}
"""Grants a tenant would mind most (Secrets, evicting pods): Roles in the listed namespaces when listed."""


def test_cluster_wide_reads_secrets_and_evicts_only_in_the_listed_namespaces(rendered: Render) -> None:
    objs = rendered(sets=["rbac.modelConfigNamespaces={team-a,team-b}", "rbac.secrets.resourceNames={hf}"])
    expected = {g: v for g, v in CLUSTER_WIDE.items() if g[2] not in CONFINED}
    for ns in ("team-a", "team-b"):
        expected[(ns, "", "configmaps", ())] = {"get"}
        expected[(ns, "", "secrets", ("hf",))] = {"get"}
        expected[(ns, "policy", "poddisruptionbudgets", ())] = {"get", "create", "patch"}
        expected[(ns, "", "pods/eviction", ())] = {"create"}
    assert operator_grants(objs) == expected
    assert not [g for g in operator_grants(objs) if g[0] == "cluster" and g[2] in CONFINED]
    # the rest stays cluster-wide (the operator serves every namespace); model-config and disruption are Roles
    confined = [r for r in _roles(objs) if r["metadata"]["name"].endswith(("-model-config", "-disruption"))]
    where = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"].rsplit("-", 1)[1]) for r in confined
    }
    purposes = ("config", "disruption")
    assert where == {("Role", ns, purpose) for ns in ("team-a", "team-b") for purpose in purposes}


def test_notes_say_when_secrets_and_evictions_reach_every_namespace(helm: Path, tmp_path: Path) -> None:
    default = " ".join(_notes(helm, tmp_path).split())
    assert "in EVERY namespace (kube-system included)" in default
    assert "read Secrets of any name" in default and "create PodDisruptionBudgets and evict pods" in default
    named = " ".join(_notes(helm, tmp_path, "--set", "rbac.secrets.resourceNames={hf-token}").split())
    assert "read Secrets named hf-token" in named
    no_secrets = _notes(helm, tmp_path, "--set", "rbac.secrets.enabled=false")
    assert "evict pods" in no_secrets and "read Secrets" not in no_secrets
    for narrowed in ("watchNamespaces={team-a}", "rbac.modelConfigNamespaces={team-a}"):
        assert "EVERY namespace" not in _notes(helm, tmp_path, "--set", narrowed)


def test_model_config_namespaces_are_refused_in_namespace_mode(helm: Path) -> None:
    sets = ["watchNamespaces={team-a}", "rbac.modelConfigNamespaces={team-b}"]
    proc = run_helm(helm, "template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert proc.returncode != 0 and "rbac.modelConfigNamespaces is for cluster-wide mode" in proc.stderr


def test_nothing_the_operator_owns_can_be_deleted(rendered: Render) -> None:
    for values_file in VARIANTS:
        for (_, _, resource, _), verbs in operator_grants(rendered(values_file)).items():
            assert "delete" not in verbs and "deletecollection" not in verbs, resource


def test_secrets_can_be_switched_off(rendered: Render) -> None:
    grants = operator_grants(rendered(CHART / "ci" / "standalone-values.yaml"))
    assert not [g for g in grants if g[2] == "secrets"]
    assert not [g for g in grants if "kopfpeerings" in g[2]]


def test_roles_are_split_by_purpose(rendered: Render) -> None:
    prefix = f"{RELEASE}-kvpilot-"
    names = {r["metadata"]["name"].removeprefix(prefix) for r in by_kind(rendered(), "ClusterRole")}
    operator = {
        "discovery",
        "gpu-discovery",
        "capacity",
        "framework",
        "inferenceservices",
        "workloads",
        "model-config",
        "disruption",
        "tuningprofiles",
        "enginetuners",
    }
    assert names == operator | {"view", "edit"}


def test_the_cluster_wide_pod_list_can_be_switched_off(rendered: Render) -> None:
    values = CHART / "ci" / "namespaced-values.yaml"
    grants = operator_grants(rendered(values, sets=["rbac.clusterWidePods=false"]))
    assert ("cluster", "", "pods", ()) not in grants


LWS = ("leaderworkerset.x-k8s.io", "leaderworkersets", ())


def test_leader_worker_sets_are_granted_only_when_multi_node_is_enabled(rendered: Render) -> None:
    assert not [g for g in operator_grants(rendered()) if g[1] == LWS[0]]
    grants = operator_grants(rendered(sets=["multiNode.enabled=true"]))
    assert grants == {**CLUSTER_WIDE, ("cluster", *LWS): {"get", "list", "watch", "create", "patch"}}
    values = CHART / "ci" / "namespaced-values.yaml"
    namespaced = operator_grants(rendered(values, sets=["multiNode.enabled=true"]))
    assert {g[0] for g in namespaced if g[1:] == LWS} == {"team-a", "team-b"}  # only where it serves


@pytest.mark.parametrize(("sets", "watched"), [([], "false"), (["multiNode.enabled=true"], "true")])
def test_drift_repair_watches_leader_worker_sets_only_with_the_rights(
    rendered: Render, sets: list[str], watched: str
) -> None:
    (deployment,) = by_kind(rendered(sets=sets), "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[service_main.MULTI_NODE_ENV] == watched


def test_user_roles_aggregate_into_builtin_roles(rendered: Render) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(rendered(), "ClusterRole")}
    view, edit = roles[f"{RELEASE}-kvpilot-view"], roles[f"{RELEASE}-kvpilot-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert set(view["rules"][0]["verbs"]) == {"get", "list", "watch"}
    # user roles are never bound to the operator
    bound = {b["roleRef"]["name"] for b in by_kind(rendered(), "ClusterRoleBinding")}
    assert not {view["metadata"]["name"], edit["metadata"]["name"]} & bound


# --- the admission policy ---------------------------------------------------------------------------------


def _policy_variables(objs: list[dict[str, Any]]) -> dict[str, str]:
    (policy,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("-inferenceservices")
    ]
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_admission_policy_allows_the_crd_default_image_and_the_values(
    rendered: Callable[..., list[dict[str, Any]]],
) -> None:
    from kvpilot.operator import api

    default = json.loads(_policy_variables(rendered())["allowedImages"])
    assert default == [api.DEFAULT_IMAGE]
    sets = ("admissionPolicy.allowedImages={registry.example/vllm/*}",)
    assert json.loads(_policy_variables(rendered(sets=sets))["allowedImages"]) == [
        api.DEFAULT_IMAGE,
        "registry.example/vllm/*",
    ]
    tolerations = json.loads(_policy_variables(rendered())["allowedTolerations"])
    assert tolerations == [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists", "value": ""}
    ]


def test_admission_policy_binding_follows_the_served_namespaces(
    rendered: Callable[..., list[dict[str, Any]]],
) -> None:
    bindings = [o for o in rendered() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == [
        f"{RELEASE}-kvpilot-enginetuners",
        f"{RELEASE}-kvpilot-inferenceservice-size",
        f"{RELEASE}-kvpilot-inferenceservices",
    ]
    for binding in bindings:
        assert "matchResources" not in binding["spec"] and binding["spec"]["validationActions"] == ["Deny"]
    objs = rendered(sets=("watchNamespaces={team-a,team-b}",))
    for binding in [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]:
        (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert expr == {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["team-a", "team-b"],
        }
    assert not [o for o in rendered(sets=("admissionPolicy.enabled=false",)) if "Admission" in o["kind"]]
