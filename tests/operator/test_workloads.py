"""The Deployment and Service builders: what every vLLM pod gets."""

from __future__ import annotations

from kvpilot.operator import api
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import workloads
from kvpilot.tuner import memory
from kvpilot.tuner.types import EngineSettings

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
META = {"name": "llm", "namespace": "ns1", "uid": "u-1"}
SETTINGS = EngineSettings(
    max_model_len=8192,
    max_num_seqs=32,
    gpu_memory_utilization=0.9,
    kv_cache_dtype="auto",
    tensor_parallel_size=2,
)


def spec(**kw: object) -> api.InferenceServiceSpec:
    base: dict[str, object] = {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main"},
        "gpu": {"count": 2, "product": "L4"},
    }
    base.update(kw)
    return api.InferenceServiceSpec.model_validate(base)


def deployment(**kw: object) -> dict:
    return workloads.build_deployment(META, spec(**kw), SETTINGS, ["--enable-prefix-caching"], ["NVIDIA-L4"])


def test_container_command_and_args() -> None:
    c = deployment()["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "vllm/vllm-openai:v0.33.0"
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--revision",
        "main",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "32",
        "--gpu-memory-utilization",
        "0.9",
        "--kv-cache-dtype",
        "auto",
        "--tensor-parallel-size",
        "2",
        "--enable-prefix-caching",
    ]


def test_pipeline_parallel_fills_the_remaining_gpus() -> None:
    """4 GPUs with TP 2: two pipeline stages, rendered and planned for (the real planner)."""
    s = spec(gpu={"count": 4, "product": "L4", "tensorParallelSize": 2})
    d = workloads.build_deployment(META, s, SETTINGS, [], ["NVIDIA-L4"])
    args = d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"

    inputs = resolve.Inputs(resolve.read_model(s.model, "ns1", None), resolve.read_gpu(s, None))
    wanted = desired.build_desired(META, s, inputs)
    p = wanted.decision.plan
    assert (p.pipeline_parallel_size, p.settings.tensor_parallel_size, p.gpu_count) == (2, 2, 4)
    planned_args = wanted.manifests[1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert planned_args[planned_args.index("--pipeline-parallel-size") + 1] == "2"
    per_stage = memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        p.settings,
        pipeline_parallel_size=2,
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    one_stage = memory.compute_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        p.settings,
        pipeline_parallel_size=1,
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    assert p.budget == per_stage  # the budget of two stages, each holding half the layers
    assert p.budget.weights_gib < one_stage.weights_gib


def test_pod_essentials() -> None:
    d = deployment(
        engine={"image": "my/vllm:1", "resources": {"requests": {"cpu": "4"}}, "tolerations": [TOLERATION]},
        nodeSelector={"pool": "l4"},
    )
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "my/vllm:1"
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 2}, "requests": {"cpu": "4", "nvidia.com/gpu": 2}}
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 20 * 60
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["nodeSelector"] == {"pool": "l4", "nvidia.com/gpu.product": "NVIDIA-L4"}
    assert pod["tolerations"] == [TOLERATION]
    annotations = d["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_labels_selector_and_owner() -> None:
    d, s = deployment(), workloads.build_service(META, spec())
    labels = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": "llm",
        "app.kubernetes.io/managed-by": "kvpilot",
        "kvpilot.io/inferenceservice": "llm",
    }
    for obj in (d, s):
        assert obj["metadata"]["labels"] == labels
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "kvpilot.io/v1alpha1",
            "kind": "InferenceService",
            "name": "llm",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    assert d["spec"]["template"]["metadata"]["labels"] == labels
    selector = d["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items() and s["spec"]["selector"] == selector
    assert s["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_no_owner_reference_without_uid() -> None:
    assert "ownerReferences" not in workloads.build_service({"name": "x"}, spec())["metadata"]


def test_the_service_is_headless_only_when_asked() -> None:
    assert "clusterIP" not in workloads.build_service(META, spec())["spec"]  # the API server allocates one
    headless = workloads.build_service(META, spec(service={"headless": True}))["spec"]
    assert headless["clusterIP"] == "None" and headless["type"] == "ClusterIP"
    assert headless["selector"] == workloads.build_service(META, spec())["spec"]["selector"]


def test_user_env_is_kept_and_token_comes_from_secret() -> None:
    s = spec(
        model={"id": "acme/m", "source": "Hub", "hubTokenSecretRef": {"name": "hf"}},
        engine={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
    )
    pod = workloads.build_deployment(META, s, SETTINGS, [], [])["spec"]["template"]["spec"]
    token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert pod["containers"][0]["env"] == [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, token]


def test_no_gpu_product_no_selector() -> None:
    pod = workloads.build_deployment(META, spec(), SETTINGS, [], [])["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "affinity" not in pod


def test_the_streaming_loader_is_rendered_when_the_spec_asks_for_it() -> None:
    """``spec.model.loader: RunaiStreamer`` adds vLLM's ``--load-format runai_streamer``; the default adds
    nothing; a ``--load-format`` of the user's own in the extra args wins."""
    streamer = {"id": "meta-llama/Llama-3.1-8B-Instruct", "loader": "RunaiStreamer"}

    def args(model: dict[str, object], extra: list[str]) -> list[str]:
        return workloads.build_engine_args(spec(model=model), SETTINGS, extra)

    assert args(streamer, [])[-2:] == ["--load-format", "runai_streamer"]
    assert "--load-format" not in args({"id": "meta-llama/Llama-3.1-8B-Instruct"}, [])
    assert api.ModelRef(id="m").loader == "Default"
    own = args(streamer, ["--load-format=safetensors"])
    assert [a for a in own if "load-format" in a] == ["--load-format=safetensors"]
