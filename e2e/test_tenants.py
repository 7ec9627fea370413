"""Tenants on the real control plane: what a user holding only the chart's roles can make kvpilot do.

Each finding of the attacker's run is a test here. ``alice`` holds only the chart's ``kvpilot-edit`` and
``kvpilot-view`` ClusterRoles in ``tenant-a`` (through RoleBindings), plus ``get`` on her own Hub token
``hf-alice``: no pods, Deployments, Secrets, ConfigMaps, PVCs or Services. ``tenant-a`` also holds another
team's Secret ``team-db`` and Deployment ``team-app``; ``tenant-b`` is another tenant she has no rights in.
``bob`` holds the built-in ``edit`` role in ``tenant-a`` (he may create pods, so the policy lets him be).

* spec.template (sidecars, init containers, volumes, env, identity, the node, scheduling, annotations),
  code-loading engine arguments and environment, storage.claimTemplate: refused for alice with a message
  naming the field and why, on create and on update; the same spec from bob is admitted.
* The CRD's schema, for everyone: names a Service cannot take, whitespace in images and Secret names,
  ``serve`` as a later token, a 1.2 MB spec.
* EngineTuners: a target she may not update (Auto, Initial) or get, a Hub token she may not read.
* The CEL cost: a template at its bounds naming 16 distinct Secrets is admitted; 17 are refused by name.
* The size policy, for everyone: a template weighing 64 KiB is admitted, one byte more is refused with its
  weight (the policy's CEL counts as ``pod_template.compute_template_size`` does).
* ``kubectl auth can-i --list`` of the chart's user roles and of the operator's ServiceAccount.
* An administrator's allow-lists (``helm upgrade --set``) open what they name, and nothing else.

The module starts its own cluster and ``helm install``s the chart with its defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.chart_harness import NS, SA_USER, ChartHarness, module_cluster
from e2e.cluster import LocalCluster
from e2e.tenant_cases import ALICE_MAY_USE, MODEL, REFUSED, A, pod, sidecar
from e2e.waits import wait_for
from kvpilot.operator.api import DEFAULT_IMAGE
from kvpilot.operator.pods import pod_template

B = "tenant-b"
POLICY = "ValidatingAdmissionPolicy 'kvpilot-inferenceservices'"
ET_POLICY = "ValidatingAdmissionPolicy 'kvpilot-enginetuners'"


class Tenants(ChartHarness):
    """The module's cluster (:class:`ChartHarness`); alice and bob create in ``tenant-a``."""

    def __init__(self, cluster: LocalCluster, home: Path) -> None:
        super().__init__(cluster, home, namespace=A)


def _role(t: Tenants, ns: str, name: str, user: str, *rule: str) -> None:
    t.kubectl("-n", ns, "create", "role", name, *rule)
    t.kubectl("-n", ns, "create", "rolebinding", f"{name}-{user}", f"--role={name}", f"--user={user}")


@pytest.fixture(scope="module")
def t(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    with module_cluster(tmp_path_factory, "tenants") as (cluster, home):
        t = Tenants(cluster, home)
        t.kubectl("create", "namespace", NS)
        t.helm("install", "kvpilot", "charts/kvpilot", "--namespace", NS)
        for ns in (A, B):
            cluster.create_namespace(ns)
            t.kubectl("-n", ns, "create", "secret", "generic", "team-db", "--from-literal=token=x")
        for i in range(18):
            t.kubectl("-n", A, "create", "secret", "generic", f"s{i}", "--from-literal=k=v")
        t.kubectl("-n", A, "create", "secret", "generic", "hf-alice", "--from-literal=token=x")
        t.kubectl("-n", A, "create", "deployment", "team-app", f"--image={DEFAULT_IMAGE}")
        t.kubectl("-n", A, "create", "deployment", "alice-app", f"--image={DEFAULT_IMAGE}")
        t.kubectl("-n", A, "create", "deployment", "payroll", f"--image={DEFAULT_IMAGE}")
        # alice: only the chart's user roles, and read access to her own Secrets
        for role in ("kvpilot-edit", "kvpilot-view"):
            t.kubectl(
                "-n", A, "create", "rolebinding", f"alice-{role}", f"--clusterrole={role}", "--user=alice"
            )
        _role(
            t,
            A,
            "own-secrets",
            "alice",
            "--verb=get",
            "--resource=secrets",
            "--resource-name=hf-alice",
            *(f"--resource-name=s{i}" for i in range(18)),
        )
        t.kubectl("-n", A, "create", "rolebinding", "bob-edit", "--clusterrole=edit", "--user=bob")
        # the policy is in force once the API server has loaded it
        probe = {"model": MODEL, "engine": {"image": "x/y:1"}}
        wait_for(
            lambda: POLICY in t.create_as("alice", probe, "probe").stderr, 60, "the policy to be enforced"
        )
        yield t


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_for_a_user_with_only_the_charts_roles(t: Tenants, case: str) -> None:
    spec, message = REFUSED[case]
    proc = t.create_as("alice", spec, f"a-{case}")
    assert proc.returncode != 0, f"{case}: admitted"
    assert POLICY in proc.stderr and message in proc.stderr, proc.stderr
    assert t.kubectl("-n", A, "get", "inferenceservices.kvpilot.io", f"a-{case}", check=False).returncode


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_same_spec_from_a_pod_creator_is_admitted(t: Tenants, case: str) -> None:
    proc = t.create_as("bob", REFUSED[case][0], f"b-{case}")
    assert proc.returncode == 0, proc.stderr


def test_what_alice_may_use_is_admitted(t: Tenants) -> None:
    proc = t.create_as("alice", ALICE_MAY_USE, "alice-fine")
    assert proc.returncode == 0, proc.stderr


def test_a_template_added_by_update_is_refused(t: Tenants) -> None:
    assert t.create_as("alice", {"model": MODEL}, "alice-update").returncode == 0
    patch = {"spec": {"template": {"spec": {"containers": [sidecar(image="evil.example/miner:2")]}}}}
    proc = t.kubectl(
        "--as=alice",
        "-n",
        A,
        "patch",
        "inferenceservices.kvpilot.io",
        "alice-update",
        "--type=merge",
        "-p",
        json.dumps(patch),
        check=False,
    )
    assert proc.returncode != 0 and "evil.example/miner:2 not an allowed image" in proc.stderr, proc.stderr


# --------------------------------------------------------------------- finding 5: the schema, for everyone

SCHEMA: dict[str, tuple[str, dict[str, Any], str]] = {
    "name-with-dot": ("my.model", {"model": MODEL}, "metadata.name must be a DNS-1035 label"),
    "name-starting-with-digit": ("1model", {"model": MODEL}, "metadata.name must be a DNS-1035 label"),
    "name-of-64": ("m" * 64, {"model": MODEL}, "metadata.name must be a DNS-1035 label"),
    "image-with-space": (
        "sp1",
        {"model": MODEL, "engine": {"image": "vllm/vllm-openai:v0.33.0 --evil"}},
        "spec.engine.image",
    ),
    "hub-secret-trailing-space": (
        "sp2",
        {"model": {**MODEL, "source": "Hub", "hubTokenSecretRef": {"name": "HF_TOKEN "}}},
        "spec.model.hubTokenSecretRef.name",
    ),
    "env-secret-space": (
        "sp3",
        {
            "model": MODEL,
            "engine": {
                "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf token", "key": "t"}}}]
            },
        },
        "spec.engine.env[0].valueFrom.secretKeyRef.name",
    ),
    "sidecar-image-space": (
        "sp4",
        pod(containers=[sidecar(image="evil latest")]),
        "spec.template.spec.containers[0].image",
    ),
    "serve-later": (
        "sv",
        {"model": MODEL, "engine": {"extraArgs": ["--dtype", "auto", "serve"]}},
        "extraArgs may not contain the token serve",
    ),
    "mb-annotation": (
        "big1",
        {"model": MODEL, "template": {"metadata": {"annotations": {"x": "a" * 1_200_000}}}},
        "spec.template.metadata.annotations.x: Too long",
    ),
    "mb-args": (
        "big2",
        pod(containers=[sidecar(args=["a" * 500] * 2400)]),
        "spec.template.spec.containers[0].args: Too many: 2400: must have at most 32 items",
    ),
    "mb-env-value": (
        "big3",
        pod(containers=[sidecar(env=[{"name": "X", "value": "a" * 1_200_000}])]),
        "spec.template.spec.containers[0].env[0].value: Too long",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA))
def test_the_schema_refuses_for_everyone(t: Tenants, case: str) -> None:
    name, spec, message = SCHEMA[case]
    proc = t.create_as("bob", spec, name)
    assert proc.returncode != 0, f"{case}: admitted"
    assert message in proc.stderr, proc.stderr[:2000]


# --------------------------------------------------------------------------- finding 2: EngineTuners


def _tuner(target: str, mode: str, kind: str = "Deployment", **model: Any) -> dict[str, Any]:
    return {
        "targetRef": {"kind": kind, "name": target},
        "updateMode": mode,
        "model": {**MODEL, **model},
    }


def _group_role(t: Tenants, name: str, group: str, verbs: list[str]) -> None:
    """alice's rights on one LeaderWorkerSet, as a manifest (``kubectl create role`` asks discovery, which
    serves no LWS kind on a cluster without LWS)."""
    rule = {
        "apiGroups": ["leaderworkerset.x-k8s.io"],
        "resources": ["leaderworkersets"],
        "resourceNames": [group],
        "verbs": verbs,
    }
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": [rule]}
    t.kubectl("-n", A, "apply", "-f", "-", input=json.dumps({**role, "metadata": {"name": name}}))
    t.kubectl("-n", A, "create", "rolebinding", f"{name}-alice", f"--role={name}", "--user=alice")


@pytest.fixture(scope="module")
def tuners(t: Tenants) -> Tenants:
    """The chart gives users no EngineTuner rights (see the can-i test): an administrator grants them."""
    _role(
        t,
        A,
        "tuners",
        "alice",
        "--verb=get,list,watch,create,update,patch,delete",
        "--resource=enginetuners.kvpilot.io",
    )
    _role(
        t,
        A,
        "own-app",
        "alice",
        "--verb=get,update,patch",
        "--resource=deployments.apps",
        "--resource-name=alice-app",
    )
    # LeaderWorkerSet is not installed here: RBAC and the policy's authorizer checks need no CRD
    _group_role(t, "own-group", "alice-group", ["get", "update", "patch"])
    _group_role(t, "read-team-group", "team-group", ["get"])
    _role(t, A, "evict", "alice", "--verb=create", "--resource=pods/eviction")
    # she may read another team's Deployment (as the built-in view role lets her), not change it
    _role(
        t,
        A,
        "read-team-app",
        "alice",
        "--verb=get",
        "--resource=deployments.apps",
        "--resource-name=team-app",
    )
    return t


@pytest.mark.parametrize(
    ("case", "spec", "message"),
    [
        (
            "auto-on-another-teams",
            _tuner("team-app", "Auto"),
            "Deployment team-app, which alice may not update",
        ),
        (
            "initial-on-another-teams",
            _tuner("team-app", "Initial"),
            "alice may not update, so updateMode Initial",
        ),
        (
            "recommend-unreadable",
            _tuner("payroll", "Recommend"),
            "Deployment payroll, which alice may not get",
        ),
        (
            "auto-on-another-teams-group",
            _tuner("team-group", "Auto", kind="LeaderWorkerSet"),
            "LeaderWorkerSet team-group, which alice may not update",
        ),
        (
            "recommend-unreadable-group",
            _tuner("team-app", "Recommend", kind="LeaderWorkerSet"),  # her get is on the Deployment only
            "LeaderWorkerSet team-app, which alice may not get",
        ),
        (
            "hub-token",
            _tuner("alice-app", "Recommend", source="Hub", hubTokenSecretRef={"name": "team-db"}),
            "spec.model.hubTokenSecretRef names Secret team-db, which alice may not get",
        ),
    ],
)
def test_enginetuner_refused(tuners: Tenants, case: str, spec: dict[str, Any], message: str) -> None:
    proc = tuners.create_as("alice", spec, f"et-{case}", kind="EngineTuner")
    assert proc.returncode != 0, f"{case}: admitted"
    assert ET_POLICY in proc.stderr and message in proc.stderr, proc.stderr


def test_enginetuner_on_her_own_deployment_is_admitted(tuners: Tenants) -> None:
    spec = _tuner("alice-app", "Auto", source="Hub", hubTokenSecretRef={"name": "hf-alice"})
    proc = tuners.create_as("alice", spec, "et-own", kind="EngineTuner")
    assert proc.returncode == 0, proc.stderr


def test_enginetuner_on_her_own_leader_worker_set_is_admitted(tuners: Tenants) -> None:
    """The policy asks the authorizer about the LeaderWorkerSet's own group and resource, not apps'."""
    spec = _tuner("alice-group", "Auto", kind="LeaderWorkerSet")
    proc = tuners.create_as("alice", spec, "et-group", kind="EngineTuner")
    assert proc.returncode == 0, proc.stderr


def test_a_target_api_version_must_be_its_kinds(tuners: Tenants) -> None:
    spec = _tuner("alice-group", "Recommend", kind="LeaderWorkerSet")
    spec["targetRef"]["apiVersion"] = "apps/v1"
    proc = tuners.create_as("alice", spec, "et-version", kind="EngineTuner")
    assert proc.returncode != 0 and "apiVersion must be the kind's" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- CEL cost on the real API server


def _at_the_bounds(secrets: int) -> dict[str, Any]:
    """8 sidecars and 8 init containers with 32 env secretKeyRefs and 32 prefixed envFrom each, 4 projected
    volumes of 32 sources: 1,152 references to ``secrets`` distinct Secrets alice may read, weighing 63,993
    bytes (just under the size policy's 64 KiB, which now bounds the policy's cost)."""

    def container(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "image": DEFAULT_IMAGE,
            "env": [
                {"name": f"E{k}", "valueFrom": {"secretKeyRef": {"name": f"s{k % secrets}", "key": "k"}}}
                for k in range(32)
            ],
            "envFrom": [{"secretRef": {"name": f"s{k % secrets}"}, "prefix": "S_"} for k in range(32)],
        }

    volumes = [
        {
            "name": f"v{k}",
            "projected": {"sources": [{"secret": {"name": f"s{(k + m) % secrets}"}} for m in range(32)]},
        }
        for k in range(4)
    ]
    return pod(
        containers=[container(f"c{j}") for j in range(8)],
        initContainers=[container(f"i{j}") for j in range(8)],
        volumes=volumes,
    )


def test_a_template_at_its_bounds_fits_the_cel_cost_budget(t: Tenants) -> None:
    proc = t.create_as("alice", _at_the_bounds(16), "at-the-bounds")
    assert proc.returncode == 0, proc.stderr
    proc = t.create_as("alice", _at_the_bounds(17), "over-the-bounds")
    assert proc.returncode != 0
    assert "the spec names more than 16 distinct Secrets, ConfigMaps and claims" in proc.stderr, proc.stderr


SIZE_POLICY = "ValidatingAdmissionPolicy 'kvpilot-inferenceservice-size'"


def _weighing(size: int) -> dict[str, Any]:
    """A template of every kind of field (affinity, quantities, ports, probes, projected volumes) padded by
    one annotation to weigh exactly ``size`` as kvpilot counts it: the policy's CEL must count the same."""
    spec = _at_the_bounds(16)
    template = spec["template"]
    template["spec"]["containers"][0] |= {
        "ports": [{"containerPort": 8080, "name": "p"}],
        "resources": {"limits": {"cpu": "1", "memory": 2_000_000}},
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 5},
        "securityContext": {"runAsUser": 1000, "readOnlyRootFilesystem": True},
    }
    template["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    template["spec"]["hostIPC"] = False
    template["metadata"] = {"annotations": {"pad": ""}}
    missing = size - pod_template.compute_template_size(template)
    assert 0 <= missing <= 4096, missing
    template["metadata"]["annotations"]["pad"] = "x" * missing
    assert pod_template.compute_template_size(template) == size
    return spec


def test_a_template_over_64_kib_is_refused_for_everyone(t: Tenants) -> None:
    limit = pod_template.TEMPLATE_SIZE_LIMIT
    assert t.create_as("bob", _weighing(limit), "weighs-the-limit").returncode == 0
    proc = t.create_as("bob", _weighing(limit + 1), "weighs-one-more")
    assert proc.returncode != 0 and SIZE_POLICY in proc.stderr, proc.stderr
    assert (
        f"spec.template weighs {limit + 1} bytes" in proc.stderr
        and "the limit is 65536 (64 KiB)" in proc.stderr
    )


# --------------------------------------------------------------------------- who may do what


def _can_i_list(t: Tenants, user: str, ns: str) -> str:
    return t.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", ns).stdout


def _can(t: Tenants, user: str, *args: str) -> bool:
    return t.can_i_as(user, *args)


def test_the_can_i_matrix_of_the_user_roles_and_the_operator(t: Tenants) -> None:
    for user, ns in (("alice", A), ("alice", B), (SA_USER, A), (SA_USER, "kube-system")):
        print(f"\n# kubectl auth can-i --list --as={user} -n {ns}\n{_can_i_list(t, user, ns)}")
    alice = {
        what: _can(t, "alice", *what.split())
        for what in (
            f"create inferenceservices.kvpilot.io -n {A}",
            f"create inferenceservices.kvpilot.io -n {B}",
            f"get secrets -n {A}",
            f"create pods -n {A}",
            f"create deployments.apps -n {A}",
            f"create persistentvolumeclaims -n {A}",
            f"create services -n {A}",
            f"get configmaps -n {A}",
            f"create enginetuners.kvpilot.io -n {B}",
        )
    }
    assert alice == {
        f"create inferenceservices.kvpilot.io -n {A}": True,
        f"create inferenceservices.kvpilot.io -n {B}": False,
        f"get secrets -n {A}": False,
        f"create pods -n {A}": False,
        f"create deployments.apps -n {A}": False,
        f"create persistentvolumeclaims -n {A}": False,
        f"create services -n {A}": False,
        f"get configmaps -n {A}": False,
        f"create enginetuners.kvpilot.io -n {B}": False,  # the chart aggregates no EngineTuner rights
    }
    # the operator's ServiceAccount, as the chart grants it today (cluster-wide mode, rbac.secrets.enabled):
    # it may get any Secret by name in every namespace -- which is why the policy checks the requester's
    # own rights before kvpilot reads one for her -- but never list them or create pods
    operator = {
        what: _can(t, SA_USER, *what.split())
        for what in (
            f"get secrets -n {B}",
            f"list secrets -n {B}",
            "get secrets -n kube-system",
            f"create pods -n {B}",
            f"create deployments.apps -n {B}",
            f"create persistentvolumeclaims -n {B}",
        )
    }
    print(json.dumps(operator, indent=1))
    assert operator == {
        f"get secrets -n {B}": True,
        f"list secrets -n {B}": False,
        "get secrets -n kube-system": True,
        f"create pods -n {B}": False,
        f"create deployments.apps -n {B}": True,
        f"create persistentvolumeclaims -n {B}": True,  # claimTemplate: hence the policy's bounds
    }


# ----------------------------------------------------------------------- an administrator opts in (runs last)


def test_an_administrators_allow_lists_open_what_they_name(t: Tenants) -> None:
    before = t.create_as("alice", REFUSED["trust-remote-code"][0], "opt-in-before")
    assert before.returncode != 0
    t.helm(
        "upgrade",
        "kvpilot",
        "charts/kvpilot",
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "admissionPolicy.allowedEngineArgs={--trust-remote-code}",
        "--set",
        "admissionPolicy.allowedServiceAccounts={vllm-runner}",
        "--set",
        "admissionPolicy.allowedPriorityClasses={team-high}",
    )
    opted = {
        "model": MODEL,
        "engine": {"extraArgs": ["--trust-remote-code"]},
        "template": {"spec": {"serviceAccountName": "vllm-runner", "priorityClassName": "team-high"}},
    }
    wait_for(lambda: t.create_as("alice", opted, "opt-in").returncode == 0, 60, "the upgraded policy")
    still = t.create_as(
        "alice", {"model": MODEL, "engine": {"extraArgs": ["--worker-cls=evil.W"]}}, "opt-in-no"
    )
    assert still.returncode != 0 and "--worker-cls" in still.stderr, still.stderr


def test_notes_warn_when_the_policy_is_off(t: Tenants) -> None:
    notes = t.helm(
        "upgrade",
        "kvpilot",
        "charts/kvpilot",
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "admissionPolicy.enabled=false",
    )
    # the operator enforces instead (e2e/test_operator_enforcement.py), and the notes say so
    assert "admissionPolicy.operatorEnforcement=Strict: no admission policy runs" in notes, notes
    assert t.kubectl("get", "validatingadmissionpolicies", "-o", "name").stdout.strip() == ""
    notes = t.helm(
        "upgrade",
        "kvpilot",
        "charts/kvpilot",
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "admissionPolicy.operatorEnforcement=Off",
    )
    assert "WARNING" in notes and "admissionPolicy.enabled=false" in notes, notes
