"""The chart's admission policy and least-privilege RBAC on the real local control plane.

* The ValidatingAdmissionPolicy (charts/kvpilot/templates/inferenceservice-admissionpolicy.yaml), installed
  by ``helm install`` with the chart's defaults, is enforced by the real API server: ``alice``
  (``kubectl --as=alice``), who may only manage InferenceServices in her namespace and read her own token
  Secret and config, has each escalation refused with the policy's message; ``bob``, who may create pods
  there (the built-in ``edit`` role, into which the chart aggregates InferenceService rights), is admitted
  with the very same specs.
* ``kubectl auth can-i`` as the chart's ServiceAccount, in ``kube-system`` and in another tenant's namespace:
  with the defaults (cluster-wide mode) and after ``helm upgrade`` to namespace-scoped mode.

The module starts its own cluster: Helm must own the InferenceService CRD.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.chart_harness import NS, SA_USER, ChartHarness, module_cluster
from e2e.cluster import LocalCluster
from e2e.waits import wait_for
from kvpilot.operator.api import DEFAULT_IMAGE

TENANT, OTHER = "team-alice", "team-bob"
POLICY = "ValidatingAdmissionPolicy 'kvpilot-inferenceservices'"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class Admission(ChartHarness):
    """The module's cluster (:class:`ChartHarness`): alice creates in her namespace; can-i as the operator."""

    def __init__(self, cluster: LocalCluster, home: Path) -> None:
        super().__init__(cluster, home, namespace=TENANT)

    def can_i_sa(self, *args: str) -> bool:
        return self.can_i_as(SA_USER, *args)


@pytest.fixture(scope="module")
def adm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admission]:
    with module_cluster(tmp_path_factory, "admission") as (cluster, home):
        a = Admission(cluster, home)
        a.kubectl("create", "namespace", NS)
        a.helm("install", "kvpilot", "charts/kvpilot", "--namespace", NS)
        for ns in (TENANT, OTHER):
            cluster.create_namespace(ns)
        for secret in ("hf-alice", "db-password"):
            a.kubectl("-n", TENANT, "create", "secret", "generic", secret, "--from-literal=token=x")
        a.kubectl("-n", TENANT, "create", "configmap", "alice-config", "--from-literal=config.json={}")
        # alice: InferenceServices in her namespace (what the chart aggregates into `edit`), her own token
        # and config
        a.kubectl(
            "-n",
            TENANT,
            "create",
            "role",
            "isvc",
            "--resource=inferenceservices.kvpilot.io",
            "--verb=get,list,watch,create,update,patch,delete",
        )
        a.kubectl(
            "-n",
            TENANT,
            "create",
            "role",
            "own",
            "--verb=get",
            "--resource=secrets,configmaps",
            "--resource-name=hf-alice",
            "--resource-name=alice-config",
        )
        a.kubectl("-n", TENANT, "create", "rolebinding", "alice-isvc", "--role=isvc", "--user=alice")
        a.kubectl("-n", TENANT, "create", "rolebinding", "alice-own", "--role=own", "--user=alice")
        # bob: the built-in edit role (pods, Deployments, Secrets, ... and, aggregated by the chart, ISVCs)
        a.kubectl("-n", TENANT, "create", "rolebinding", "bob-edit", "--clusterrole=edit", "--user=bob")
        # the policy is in force once the API server has loaded it
        probe = {"model": {"id": MODEL}, "engine": {"image": "x/y:1"}}
        wait_for(
            lambda: POLICY in a.create_as("alice", probe).stderr, 60, "the admission policy to be enforced"
        )
        yield a


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "image": (
        {"model": {"id": MODEL}, "engine": {"image": "evil.example/miner:latest"}},
        f"spec.engine.image evil.example/miner:latest is not an allowed image ({DEFAULT_IMAGE}): "
        f"alice may not create pods in namespace {TENANT}",
    ),
    "env-secret": (
        {
            "model": {"id": MODEL},
            "engine": {
                "env": [
                    {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "token"}}}
                ]
            },
        },
        "spec.engine.env[PW].valueFrom.secretKeyRef names Secret db-password, which alice may not get",
    ),
    "hub-token": (
        {"model": {"id": MODEL, "source": "Hub", "hubTokenSecretRef": {"name": "db-password"}}},
        "spec.model.hubTokenSecretRef names Secret db-password, which alice may not get",
    ),
    "config-map": (
        {"model": {"id": MODEL, "source": "ConfigMap", "configMapRef": {"name": "kube-root-ca.crt"}}},
        "spec.model.configMapRef names ConfigMap kube-root-ca.crt, which alice may not get",
    ),
    "env-config-map": (
        {
            "model": {"id": MODEL},
            "engine": {
                "env": [
                    {
                        "name": "CA",
                        "valueFrom": {"configMapKeyRef": {"name": "kube-root-ca.crt", "key": "ca.crt"}},
                    }
                ]
            },
        },
        "spec.engine.env[CA].valueFrom.configMapKeyRef names ConfigMap kube-root-ca.crt, which alice may not "
        "get",
    ),
    "claim": (
        {"model": {"id": MODEL, "storage": {"persistentVolumeClaim": {"claimName": "someone-elses"}}}},
        "spec.model.storage.persistentVolumeClaim names PersistentVolumeClaim someone-elses, which alice may "
        "not get",
    ),
    "host-path": (
        {
            "model": {
                "id": "/models/m",
                "source": "ConfigMap",
                "configMapRef": {"name": "alice-config"},
                "storage": {"hostPath": {"path": "/etc"}},
            }
        },
        "spec.model.storage.hostPath mounts a directory of the node",
    ),
    "tolerate-everything": (
        {"model": {"id": MODEL}, "engine": {"tolerations": [{"operator": "Exists"}]}},
        "spec.engine.tolerations <every taint> Exists (any effect) not covered by the allowed tolerations",
    ),
    "tolerate-any-effect": (
        {
            "model": {"id": MODEL},
            "engine": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        },
        "spec.engine.tolerations nvidia.com/gpu Exists (any effect) not covered by the allowed tolerations",
    ),
    "tolerate-control-plane": (
        {
            "model": {"id": MODEL},
            "engine": {
                "tolerations": [
                    {
                        "key": "node-role.kubernetes.io/control-plane",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
            },
        },
        "spec.engine.tolerations node-role.kubernetes.io/control-plane Exists:NoSchedule not covered",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_escalation_refused_for_a_user_who_may_not_create_pods(adm: Admission, case: str) -> None:
    spec, message = CASES[case]
    proc = adm.create_as("alice", spec, name=f"alice-{case}")
    assert proc.returncode != 0, f"{case}: admitted"
    assert POLICY in proc.stderr and message in proc.stderr, proc.stderr
    assert adm.kubectl(
        "-n", TENANT, "get", "inferenceservices.kvpilot.io", f"alice-{case}", check=False
    ).returncode


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_spec_from_a_user_who_may_create_pods_is_admitted(adm: Admission, case: str) -> None:
    spec, _ = CASES[case]
    proc = adm.create_as("bob", spec, name=f"bob-{case}")
    assert proc.returncode == 0, proc.stderr


def test_what_alice_may_read_and_allowed_values_are_admitted(adm: Admission) -> None:
    spec = {
        "model": {"id": MODEL, "source": "Hub", "hubTokenSecretRef": {"name": "hf-alice"}},
        "engine": {
            "image": DEFAULT_IMAGE,
            "env": [
                {"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf-alice", "key": "token"}}},
                {
                    "name": "C",
                    "valueFrom": {"configMapKeyRef": {"name": "alice-config", "key": "config.json"}},
                },
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            ],
        },
    }
    proc = adm.create_as("alice", spec, name="alice-fine")
    assert proc.returncode == 0, proc.stderr


def test_updates_are_checked_and_metadata_updates_never_refused(adm: Admission) -> None:
    assert adm.create_as("alice", {"model": {"id": MODEL}}, name="alice-update").returncode == 0
    patch = adm.kubectl(
        "--as=alice",
        "-n",
        TENANT,
        "patch",
        "inferenceservices.kvpilot.io",
        "alice-update",
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"image":"evil.example/miner:2"}}}',
        check=False,
    )
    assert patch.returncode != 0 and "evil.example/miner:2 is not an allowed image" in patch.stderr
    # bob's object names a Secret alice cannot read; a metadata-only update (what kopf does for its finalizer
    # and progress annotations) is not a spec write and is admitted, so deletion never hangs on the policy
    assert adm.create_as("bob", CASES["env-secret"][0], name="bob-meta").returncode == 0
    label = adm.kubectl(
        "--as=alice", "-n", TENANT, "label", "inferenceservices.kvpilot.io", "bob-meta", "x=y", check=False
    )
    assert label.returncode == 0, label.stderr


# --------------------------------------------------------------------------- least privilege: can-i matrix


def _matrix(namespace: str) -> list[tuple[str, ...]]:
    return [
        ("get", "secrets", "-n", namespace),
        ("list", "secrets", "-n", namespace),
        ("create", "deployments.apps", "-n", namespace),
        ("patch", "deployments.apps", "-n", namespace),
        ("delete", "deployments.apps", "-n", namespace),
        ("get", "pods", "--subresource=log", "-n", namespace),
        ("get", "configmaps", "-n", namespace),
        ("list", "configmaps", "-n", namespace),
    ]


def test_cluster_wide_defaults_never_list_delete_or_write_secrets(adm: Admission) -> None:
    """Cluster-wide mode serves every namespace, so it may apply Deployments and read named model configs
    anywhere (docs/install.md says so); but it never lists Secrets or ConfigMaps, never deletes a
    Deployment, and never writes a Secret, in kube-system or in any tenant's namespace."""
    for ns in ("kube-system", OTHER):
        never = [
            ("list", "secrets", "-n", ns),
            ("delete", "deployments.apps", "-n", ns),
            ("list", "configmaps", "-n", ns),
            ("create", "secrets", "-n", ns),
            ("update", "deployments.apps", "-n", ns),
            ("create", "pods", "-n", ns),
        ]
        assert [a for a in never if adm.can_i_sa(*a)] == []


def test_namespace_scoped_mode_grants_nothing_outside_its_namespaces(adm: Admission) -> None:
    adm.helm(
        "upgrade", "kvpilot", "charts/kvpilot", "--namespace", NS, "--set", f"watchNamespaces={{{TENANT}}}"
    )
    outside = [a for ns in ("kube-system", OTHER) for a in _matrix(ns)]
    wait_for(lambda: not any(adm.can_i_sa(*a) for a in outside), 30, "the cluster-wide roles to go")
    assert [" ".join(a) for a in outside if adm.can_i_sa(*a)] == []
    inside = {" ".join(a): adm.can_i_sa(*a) for a in _matrix(TENANT)}
    assert inside == {
        f"get secrets -n {TENANT}": True,
        f"list secrets -n {TENANT}": False,
        f"create deployments.apps -n {TENANT}": True,
        f"patch deployments.apps -n {TENANT}": True,
        f"delete deployments.apps -n {TENANT}": False,
        f"get pods --subresource=log -n {TENANT}": True,
        f"get configmaps -n {TENANT}": True,
        f"list configmaps -n {TENANT}": False,
    }
    # the binding follows the served namespaces: alice is still refused in hers
    proc = adm.create_as("alice", CASES["image"][0], name="alice-namespaced")
    assert proc.returncode != 0 and CASES["image"][1] in proc.stderr, proc.stderr
