"""spec.template merged into the vLLM pod, and spec.podSecurity Restricted
(kvpilot.operator.pods.pod_template)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.pods import pod_template, workloads
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings

META = {"name": "llm", "namespace": "ns1", "uid": "u-1"}
SETTINGS = EngineSettings(
    max_model_len=8192,
    max_num_seqs=32,
    gpu_memory_utilization=0.9,
    kv_cache_dtype="auto",
    tensor_parallel_size=1,
)
SIDECAR = {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "ports": [{"containerPort": 9000}]}
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "search"}, "annotations": {"owner": "search@example.com"}},
    "spec": {
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "priorityClassName": "inference-high",
        "runtimeClassName": "nvidia",
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "vllm-runner",
        "securityContext": {"fsGroup": 3000},
        "volumes": [{"name": "chat-templates", "configMap": {"name": "templates"}}],
        "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
        "containers": [
            SIDECAR,
            {
                "name": "vllm",
                "securityContext": {"readOnlyRootFilesystem": True},
                "volumeMounts": [{"name": "chat-templates", "mountPath": "/templates"}],
            },
        ],
        "schedulerName": "gpu-scheduler",
        "dnsPolicy": "ClusterFirstWithHostNet",
        "hostIPC": True,
    },
}


def spec(**kw: Any) -> api.InferenceServiceSpec:
    base: dict[str, Any] = {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpu": {"count": 1, "product": "L4"},
    }
    base.update(kw)
    return api.InferenceServiceSpec.model_validate(base)


def pod(s: api.InferenceServiceSpec, products: tuple[str, ...] = ("NVIDIA-L4",)) -> dict[str, Any]:
    template: dict[str, Any] = workloads.build_deployment(META, s, SETTINGS, [], products)["spec"]["template"]
    return template


def container(p: dict[str, Any], name: str, kind: str = "containers") -> dict[str, Any]:
    return next(c for c in p["spec"][kind] if c["name"] == name)


def test_every_template_field_lands_on_the_pod() -> None:
    plain, p = pod(spec()), pod(spec(template=TEMPLATE))
    t = TEMPLATE["spec"]
    for key in (
        "topologySpreadConstraints",
        "imagePullSecrets",
        "priorityClassName",
        "runtimeClassName",
        "serviceAccountName",
        "schedulerName",
        "dnsPolicy",
        "hostIPC",
        "affinity",
    ):
        assert p["spec"][key] == t[key], key
    assert p["spec"]["securityContext"] == {"fsGroup": 3000}
    assert p["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "search"}
    assert p["metadata"]["annotations"] == {**plain["metadata"]["annotations"], "owner": "search@example.com"}
    assert p["spec"]["volumes"] == [*plain["spec"]["volumes"], *t["volumes"]]
    assert [c["name"] for c in p["spec"]["containers"]] == ["vllm", "proxy"]
    assert container(p, "proxy") == SIDECAR
    assert [c["name"] for c in p["spec"]["initContainers"]] == ["warm"]


def test_the_vllm_patch_adds_mounts_and_security_and_keeps_what_kvpilot_owns() -> None:
    plain, p = container(pod(spec()), "vllm"), container(pod(spec(template=TEMPLATE)), "vllm")
    for key in ("image", "command", "args", "resources", "startupProbe", "readinessProbe", "livenessProbe"):
        assert p[key] == plain[key], key
    assert p["securityContext"] == {**plain["securityContext"], "readOnlyRootFilesystem": True}
    assert p["volumeMounts"] == [
        *plain["volumeMounts"],
        {"name": "chat-templates", "mountPath": "/templates"},
    ]


def test_template_init_containers_run_before_the_weight_download() -> None:
    s = spec(
        template=TEMPLATE,
        model={"id": "meta-llama/Llama-3.1-8B-Instruct", "storage": {"claimTemplate": {"size": "50Gi"}}},
    )
    names = [c["name"] for c in pod(s)["spec"]["initContainers"]]
    assert names == ["warm", "fetch-weights"]


def test_gpu_product_affinity_is_anded_with_the_templates() -> None:
    """A catalogue entry with several GFD names renders a node affinity; a template's required terms keep
    it."""
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
    t = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [zone]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                        ]
                    }
                }
            }
        }
    }
    p = pod(spec(template=t), ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"))
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    product = {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"],
    }
    assert terms[0]["matchExpressions"] == [zone, product]
    assert terms[1]["matchExpressions"] == [product] and terms[1]["matchFields"]
    only_anti = pod(
        spec(template={"spec": {"affinity": {"podAntiAffinity": {}}}}),
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
    )
    req = only_anti["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req == {"nodeSelectorTerms": [{"matchExpressions": [product]}]}


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (
            {"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}},
            "spec.template.metadata.labels[app.kubernetes.io/instance]",
        ),
        (
            {"spec": {"containers": [{"name": "vllm", "command": ["sh"]}]}},
            "spec.template.spec.containers[vllm].command",
        ),
        (
            {"spec": {"containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}},
            "spec.template.spec.containers[vllm].resources",
        ),
        (
            {"spec": {"containers": [{"name": "vllm", "args": ["--max-num-seqs", "999"]}]}},
            "spec.template.spec.containers[vllm].args",
        ),
        ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "spec.template.spec.volumes[dshm]"),
        (
            {"spec": {"initContainers": [{"name": "fetch-weights", "image": "x"}]}},
            "spec.template.spec.initContainers[fetch-weights]",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "vllm", "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}]
                }
            },
            "spec.template.spec.containers[vllm].volumeMounts[x]",
        ),
    ],
)
def test_a_template_that_contradicts_kvpilot_is_invalid_spec_naming_the_field(
    template: dict[str, Any], field: str
) -> None:
    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "template": template}
    with pytest.raises(errors.InvalidSpec) as exc:
        desired.parse_spec(body)
    assert field in str(exc.value)


def test_a_clean_template_parses() -> None:
    desired.parse_spec({"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "template": TEMPLATE})


# --------------------------------------------------------------------------- Restricted


def restricted_violations(p: dict[str, Any]) -> list[str]:
    """The restricted Pod Security Standard's checks
    (kubernetes.io/docs/concepts/security/pod-security-standards),
    written out independently of pod_template, for the unit level; e2e/test_pod_shape.py asks the real
    PodSecurity admission."""
    s, out = p["spec"], []
    pod_sc = s.get("securityContext") or {}
    if s.get("hostIPC") or s.get("hostPID") or s.get("hostNetwork"):
        out.append("host namespaces")
    out += [f"volume {v['name']}" for v in s.get("volumes") or () if "hostPath" in v]
    for c in [*(s.get("initContainers") or ()), *s["containers"]]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or ()):
            out.append(f"{c['name']}: capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccomp")
    return out


def test_default_pods_fail_restricted_and_restricted_pods_pass() -> None:
    storage = {"id": "meta-llama/Llama-3.1-8B-Instruct", "storage": {"claimTemplate": {"size": "50Gi"}}}
    assert "vllm: runAsNonRoot" in restricted_violations(pod(spec(model=storage)))
    p = pod(
        spec(
            model=storage,
            podSecurity="Restricted",
            template={"spec": {"containers": [SIDECAR], "initContainers": [{"name": "warm", "image": "b"}]}},
        )
    )
    assert restricted_violations(p) == []
    sc = p["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (
        vllm.IMAGE_USER_UID,
        vllm.IMAGE_USER_GID,
        True,
    )
    for name, kind in (("vllm", "containers"), ("fetch-weights", "initContainers")):
        c = container(p, name, kind)
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[vllm.IMAGE_USER_HOME] == "home" and mounts["/tmp"] == "tmp"
        assert {"name": "HOME", "value": vllm.IMAGE_USER_HOME} in c["env"]
    volumes = {v["name"]: v for v in p["spec"]["volumes"]}
    assert volumes["home"] == {"name": "home", "emptyDir": {}} and volumes["tmp"] == {
        "name": "tmp",
        "emptyDir": {},
    }
    assert "HOME" not in {
        e["name"] for e in container(p, "proxy").get("env") or ()
    }  # sidecars: hardened only


def test_restricted_keeps_a_templates_stricter_settings_and_adds_drop_all() -> None:
    t = {
        "spec": {
            "securityContext": {"runAsUser": 4242},
            "containers": [
                {
                    "name": "proxy",
                    "image": "x",
                    "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
                }
            ],
        }
    }
    p = pod(spec(podSecurity="Restricted", template=t))
    assert p["spec"]["securityContext"]["runAsUser"] == 4242
    assert container(p, "proxy")["securityContext"]["capabilities"] == {
        "add": ["NET_BIND_SERVICE"],
        "drop": ["ALL"],
    }
    assert restricted_violations(p) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {
                "model": {
                    "id": "/models/m",
                    "source": "ConfigMap",
                    "configMapRef": {"name": "c"},
                    "storage": {"hostPath": {"path": "/data"}},
                }
            },
            "spec.model.storage.hostPath",
        ),
        ({"template": {"spec": {"hostIPC": True}}}, "spec.template.spec.hostIPC"),
        (
            {"template": {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/x"}}]}}},
            "spec.template.spec.volumes[h].hostPath",
        ),
        ({"template": {"spec": {"securityContext": {"runAsUser": 0}}}}, "spec.template.spec.securityContext"),
        (
            {
                "template": {
                    "spec": {
                        "containers": [{"name": "p", "image": "x", "securityContext": {"privileged": True}}]
                    }
                }
            },
            "spec.template.spec.containers[p].securityContext",
        ),
        (
            {
                "template": {
                    "spec": {
                        "initContainers": [
                            {
                                "name": "i",
                                "image": "x",
                                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                            }
                        ]
                    }
                }
            },
            "spec.template.spec.initContainers[i].securityContext",
        ),
    ],
)
def test_restricted_refuses_what_the_standard_refuses(changes: dict[str, Any], field: str) -> None:
    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "podSecurity": "Restricted", **changes}
    with pytest.raises(errors.InvalidSpec) as exc:
        desired.parse_spec(body)
    assert field in str(exc.value)
    desired.parse_spec({**body, "podSecurity": "Default"})  # the same template, without Restricted: fine


def test_build_pod_template_does_not_modify_its_input() -> None:
    rendered = pod(spec())
    before = repr(rendered)
    pod_template.build_pod_template(rendered, api.PodTemplate.model_validate(TEMPLATE), "Restricted")
    assert repr(rendered) == before


@pytest.mark.parametrize("pod_security", ["Default", "Restricted"])
def test_vllm_pods_mount_no_service_account_token_unless_the_template_asks(pod_security: str) -> None:
    """vLLM never calls the API server: a mounted token would only be a credential for whoever breaks in."""
    for s in (spec(podSecurity=pod_security), spec(template=TEMPLATE, podSecurity=pod_security)):
        assert pod(s)["spec"]["automountServiceAccountToken"] is False
    for wanted in (True, False):
        t = {"spec": {"serviceAccountName": "workload-identity", "automountServiceAccountToken": wanted}}
        p = pod(spec(template=t, podSecurity=pod_security))
        assert p["spec"]["automountServiceAccountToken"] is wanted


def test_a_template_over_64_kib_is_invalid_spec_saying_its_weight() -> None:
    limit = pod_template.TEMPLATE_SIZE_LIMIT
    template: dict[str, Any] = {"metadata": {"annotations": {"pad": ""}}}
    template["metadata"]["annotations"]["pad"] = "x" * (limit - pod_template.compute_template_size(template))
    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "template": template}
    with pytest.raises(errors.InvalidSpec):  # the annotation's own bound (4096) comes first
        desired.parse_spec(body)
    sidecars = [{"name": f"c{i}", "image": "busybox", "args": ["a" * 1000] * 9} for i in range(8)]
    body["template"] = {"spec": {"containers": sidecars}}
    size = pod_template.compute_template_size(body["template"])
    assert size > limit
    with pytest.raises(errors.InvalidSpec) as exc:
        desired.parse_spec(body)
    assert f"spec.template: weighs {size:,} bytes, over the limit of 65,536" in str(exc.value)
    body["template"]["spec"]["containers"] = sidecars[:7]
    desired.parse_spec(body)


def _members(node: Any) -> int:
    if isinstance(node, dict):
        return len(node) + sum(_members(v) for v in node.values())
    if isinstance(node, list):
        return len(node) + sum(_members(v) for v in node)
    return 0


def test_the_weight_bounds_the_compact_json() -> None:
    """At least the compact JSON (no string here needs escaping), at most one byte more per member (the comma
    the last one lacks) and per boolean (true weighs 5)."""
    text = json.dumps(TEMPLATE, separators=(",", ":"))
    weight = pod_template.compute_template_size(TEMPLATE)
    assert len(text) <= weight <= len(text) + _members(TEMPLATE) + text.count("true")
