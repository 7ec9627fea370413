"""The weight cache (spec.model.storage): volumes, the download init container, the managed claim, and
start-up budgets that follow the checkpoint's size; rendered offline, as ``kvpilot render`` does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_fakes import FakeKube

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import desired, render
from kvpilot.operator.pods import storage, workloads
from kvpilot.operator.pods.ownership import VerifiedOwners
from kvpilot.tuner import model as catalogue
from kvpilot.tuner.types import GIB

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def isvc(**model: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1"},
        "spec": {
            "model": {"id": LLAMA, **model},
            "gpu": {"product": "H100-SXM"},
            "serving": {"maxContextLength": 8192},
        },
    }


def pod_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def vllm_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in pod_of(manifests)["containers"] if c["name"] == "vllm")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or ()}


def test_without_storage_the_pod_asks_for_room_for_the_checkpoint() -> None:
    manifests = render.build_manifests(isvc())
    container = vllm_container(manifests)
    checkpoint = catalogue.lookup_checkpoint_bytes(LLAMA)
    assert checkpoint
    want = -(-(int(checkpoint * 1.1) + storage.SCRATCH_BYTES) // GIB)
    assert container["resources"]["requests"]["ephemeral-storage"] == f"{want}Gi"
    assert "initContainers" not in pod_of(manifests)
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800


def test_the_startup_budget_follows_the_checkpoint_size() -> None:
    big = 400 * 10**9
    budget = storage.compute_startup_failure_threshold(big, cached=False) * storage.STARTUP_PERIOD_S
    assert budget >= big / storage.DOWNLOAD_BYTES_PER_S > 2 * 3600  # a 400 GB download takes over 2 hours
    cached = storage.compute_startup_failure_threshold(big, cached=True) * storage.STARTUP_PERIOD_S
    assert 1800 < cached < budget  # loading from disk is faster, still longer than the 30-minute floor
    assert storage.compute_startup_failure_threshold(None, cached=False) * storage.STARTUP_PERIOD_S == 1800


def test_a_70b_pod_without_a_cache_is_not_killed_by_a_30_minute_probe() -> None:
    body = isvc()
    body["spec"]["model"]["id"] = "meta-llama/Llama-3.1-70B-Instruct"
    body["spec"]["gpu"]["count"] = 4
    probe = vllm_container(render.build_manifests(body))["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] > 3000  # 140 GB at 50 MiB/s is ~45 minutes


def test_an_existing_claim_is_the_hugging_face_cache_and_the_init_container_fills_it() -> None:
    body = isvc(storage={"persistentVolumeClaim": {"claimName": "weights"}})
    manifests = render.build_manifests(body)
    pod = pod_of(manifests)
    assert {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": False},
    } in pod["volumes"]
    container = vllm_container(manifests)
    assert {"name": "model-cache", "mountPath": "/models"} in container["volumeMounts"]
    assert env_of(container)["HF_HOME"] == "/models/huggingface"
    (init,) = pod["initContainers"]
    assert init["name"] == storage.INIT_CONTAINER and init["image"] == container["image"]
    assert env_of(init)["KVPILOT_MODEL_ID"] == LLAMA and env_of(init)["HF_HOME"] == "/models/huggingface"
    assert "snapshot_download" in init["command"][-1]
    compile(init["command"][-1], "fetch-weights", "exec")  # the script is valid Python
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not [m for m in manifests if m["kind"] == "PersistentVolumeClaim"]  # the user's claim


def test_the_download_uses_the_same_token_secret_as_vllm() -> None:
    body = isvc(
        source="Hub", hubTokenSecretRef={"name": "hf"}, storage={"hostPath": {"path": "/var/cache/hf"}}
    )
    # build_manifests has no cluster for a Hub config: render the Deployment directly from the catalogue spec
    spec = desired.parse_spec(body["spec"])
    deployment = workloads.build_deployment(body["metadata"], spec, spec.engine.pinned.to_engine(), (), ())
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert env_of(init)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache")
    assert volume["hostPath"] == {"path": "/var/cache/hf", "type": "DirectoryOrCreate"}


def test_a_read_only_claim_downloads_nothing() -> None:
    manifests = render.build_manifests(
        isvc(storage={"persistentVolumeClaim": {"claimName": "w", "readOnly": True}})
    )
    assert "initContainers" not in pod_of(manifests)
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in vllm_container(manifests)[
        "volumeMounts"
    ]
    assert "VLLM_CACHE_ROOT" not in env_of(vllm_container(manifests))  # vLLM could not write it there


def test_the_volume_keeps_vllms_compile_and_kernel_caches() -> None:
    """vLLM's caches sit beside the weights, so a retune that changes no hashed setting loads its compiled
    graphs instead of compiling; the path is the volume's, not the pod's, in every storage kind."""
    kinds: tuple[dict[str, Any], ...] = (
        {"persistentVolumeClaim": {"claimName": "w"}},
        {"hostPath": {"path": "/w"}},
        {"claimTemplate": {}},
    )
    for kind in kinds:
        body = isvc(storage={**kind, "mountPath": "/cache"})
        env = env_of(vllm_container(render.build_manifests(body)))
        assert env["VLLM_CACHE_ROOT"] == "/cache/vllm", kind
        assert env["TRITON_CACHE_DIR"] == "/cache/vllm/triton_cache", kind


def test_the_users_cache_root_wins() -> None:
    body = isvc(storage={"hostPath": {"path": "/w"}})
    body["spec"]["engine"] = {"env": [{"name": "VLLM_CACHE_ROOT", "value": "/scratch/vllm"}]}
    env = [e for e in vllm_container(render.build_manifests(body))["env"] if e["name"] == "VLLM_CACHE_ROOT"]
    assert env == [{"name": "VLLM_CACHE_ROOT", "value": "/scratch/vllm"}]


def test_without_storage_vllm_keeps_its_caches_in_the_pod() -> None:
    env = env_of(vllm_container(render.build_manifests(isvc())))
    assert "VLLM_CACHE_ROOT" not in env and "TRITON_CACHE_DIR" not in env


def test_a_claim_template_is_created_sized_and_owned_before_the_deployment() -> None:
    manifests = render.build_manifests(isvc(storage={"claimTemplate": {"storageClassName": "fast"}}))
    assert [m["kind"] for m in manifests] == ["PersistentVolumeClaim", "Service", "Deployment"]
    claim = manifests[0]
    assert claim["metadata"]["name"] == "llama-model-cache"
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    checkpoint = catalogue.lookup_checkpoint_bytes(LLAMA) or 0
    size = storage.parse_quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])
    assert size >= checkpoint * storage.CLAIM_HEADROOM
    assert claim["spec"]["storageClassName"] == "fast"
    volume = next(v for v in pod_of(manifests)["volumes"] if v["name"] == "model-cache")
    assert volume["persistentVolumeClaim"]["claimName"] == "llama-model-cache"


def test_a_claim_smaller_than_the_checkpoint_is_refused() -> None:
    with pytest.raises(render.RenderError) as caught:
        render.build_manifests(isvc(storage={"claimTemplate": {"size": "5Gi"}}))
    assert caught.value.reason == "InvalidSpec" and "below the checkpoint" in caught.value.message


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"id": "/models/llama"}, "needs model.storage"),
        ({"id": "/models/llama", "storage": {"hostPath": {"path": "/w"}}}, "source ConfigMap"),
        (
            {
                "id": "/elsewhere/llama",
                "source": "ConfigMap",
                "configMapRef": {"name": "c"},
                "storage": {"hostPath": {"path": "/w"}},
            },
            "inside model.storage.mountPath",
        ),
        ({"storage": {"hostPath": {"path": "/w"}, "claimTemplate": {}}}, "exactly one"),
        ({"storage": {"hostPath": {"path": "/w/../etc"}}}, ".. segments"),
        ({"revision": "../../etc"}, "git ref name"),
        ({"revision": "main/"}, "git ref name"),
    ],
)
def test_bad_storage_and_paths_are_invalid_specs(model: dict[str, Any], words: str) -> None:
    body = isvc(**model)
    body["spec"]["model"].update(model)
    with pytest.raises(render.RenderError) as caught:
        render.build_manifests(body)
    assert caught.value.reason == "InvalidSpec" and words in caught.value.message, caught.value.message


def test_a_claim_that_does_not_exist_is_reported_not_applied() -> None:
    kube = FakeKube()
    manifests = render.build_manifests(isvc(storage={"persistentVolumeClaim": {"claimName": "missing"}}))
    with pytest.raises(errors.ConfigNotFound, match="ml/missing"):
        asyncio.run(workloads.apply_workloads(manifests, kube, VerifiedOwners()))
    assert kube.applied == []
    kube.claims[("ml", "missing")] = {"metadata": {"name": "missing"}}
    asyncio.run(workloads.apply_workloads(manifests, kube, VerifiedOwners()))
    assert [m["kind"] for m in kube.applied] == ["Service", "Deployment"]


@pytest.mark.parametrize(
    "kind",
    [
        None,
        {"persistentVolumeClaim": {"claimName": "w"}},
        {"persistentVolumeClaim": {"claimName": "w", "readOnly": True}},
        {"hostPath": {"path": "/w"}},
        {"claimTemplate": {}},
    ],
)
def test_the_loop_prices_a_warm_cache_exactly_where_the_pod_keeps_one(kind: dict[str, Any] | None) -> None:
    """``keeps_compile_cache`` (the closed loop's ``Evidence.compile_cache_persistent``) agrees with the
    rendered pod: true where vLLM's cache root is on the volume."""
    body = isvc(**({"storage": kind} if kind else {}))
    rendered = "VLLM_CACHE_ROOT" in env_of(vllm_container(render.build_manifests(body)))
    assert storage.keeps_compile_cache(desired.parse_spec(body["spec"]).model.storage) == rendered
    assert rendered == (kind is not None and "readOnly" not in str(kind))
