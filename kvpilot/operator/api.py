"""Pydantic models of the InferenceService API (kvpilot.io/v1alpha1).

They mirror ``crds/inferenceservices.kvpilot.io.yaml``, the single source of truth;
``tests/operator/test_api_drift.py`` compares the two property by property. The
models parse a spec at the operator's edge (and in ``kvpilot render``, where no API
server has defaulted or validated anything) and convert it to and from the tuner's
value objects. Wire names are camelCase (aliases); Python names are snake_case.

Nothing here does I/O. Cross-field checks the API server enforces with CEL are
repeated in :meth:`InferenceServiceSpec.semantic_errors` so that ``render`` and the
unit tests see the same verdicts without an API server.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from kvpilot.operator import labels
from kvpilot.tuner import sglang, tgi, types, vllm
from kvpilot.tuner.vllm.args import INT_BOUNDS

GROUP = "kvpilot.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
SERVICE_LABEL = f"{GROUP}/inferenceservice"
"""The label naming the InferenceService on every object and pod it owns (docs/api-contract.md). The chart's
PodMonitor copies it into each vLLM series as ``inferenceservice``, which the dashboard and the alert rules
select and join on (:mod:`kvpilot.observability.series`)."""
VLLM_VERSION = vllm.PINNED_VLLM_VERSION
DEFAULT_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
"""The CRD's ``spec.engine.image`` default says the same (``tests/test_versions.py``)."""

KvCacheDtype = Literal[
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
]
"""The dtypes the memory model sizes: :data:`kvpilot.tuner.vllm.MODELLED_KV_CACHE_DTYPES`, spelled out for
the type checker (``tests/operator/test_api_drift.py`` ties the two, and the CRD's enum)."""
Mode = Literal["Off", "Recommend", "Auto"]
UpdateMode = Literal["Off", "Recommend", "Initial", "Auto"]
"""An EngineTuner's ``spec.updateMode`` (the Vertical Pod Autoscaler's names; the CRD's enum says the same):
Off plans and reports, Recommend also writes ``status.recommendation``, Initial also rewrites new pods of
the target (the admission webhook), Auto also evicts running pods one at a time."""

MAX_TOKENS = INT_BOUNDS["max_model_len"]
"""The largest token count the API takes (a context length, a batch of tokens): 16,777,216, above every
published model's context (Llama 4 Scout's 10M). The CRD's ``maximum``s say the same."""
MAX_SEQS = INT_BOUNDS["max_num_seqs"]
"""The largest sequence count the API takes (``--max-num-seqs``, an expected concurrency)."""
MAX_SECONDS = 86400
"""The longest duration the API takes (a day): cooldowns and rollout deadlines stay representable as
timestamps and timer delays (2**62 seconds once broke every retune with ``OSError: Value too large``)."""
MAX_CHECKPOINT_BYTES = 1 << 50
"""1 PiB: above any checkpoint (the largest published ones are a few TB)."""
Source = Literal["Catalogue", "ConfigMap", "Hub"]
Loader = Literal["Default", "RunaiStreamer"]
"""``spec.model.loader``: vLLM's default weight loader, or Run:ai's Model Streamer
(:mod:`kvpilot.tuner.vllm.loaders`: ``--load-format runai_streamer``)."""
RolloutStrategy = Literal["Auto", "Surge", "Replace", "Recreate"]
"""``spec.rollout.strategy`` (the CRD's enum says the same): how a change of the pods reaches them.
:mod:`kvpilot.operator.pods.rollout_strategy` resolves ``Auto`` to one of the other three."""
AppliedStrategy = Literal["Surge", "Replace", "Recreate"]
"""``status.rollout.strategy``: what a rollout actually used (``Auto`` never appears there)."""
EngineKind = Literal["vLLM", "SGLang", "TGI"]
"""``spec.engine.kind`` (the CRD's enum says the same; :data:`kvpilot.tuner.engines.KINDS`, which
``tests/operator/test_engine_kind.py`` ties to it): the engine the pods run."""
PodSecurity = Literal["Default", "Restricted"]
"""``spec.podSecurity`` (the CRD's enum says the same): ``Restricted`` renders a pod the ``restricted`` Pod
Security Standard admits (:mod:`kvpilot.operator.pods.pod_template`); ``Default`` the hardened root pod."""


class _Wire(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", protected_namespaces=()
    )

    def wire(self) -> dict[str, Any]:
        """The object as it appears in Kubernetes (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------- settings


class Settings(_Wire):
    """The engine settings object (api-contract.md): one field per tuned vLLM flag."""

    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_SEQS)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_dtype: KvCacheDtype | None = None
    tensor_parallel_size: int | None = Field(None, ge=1, le=64)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    def to_engine(self) -> types.EngineSettings:
        return types.EngineSettings(**self.model_dump(exclude_none=True))

    @classmethod
    def from_engine(cls, settings: types.EngineSettings) -> Settings:
        return cls.model_validate(settings.as_dict())


# --------------------------------------------------------------------------- spec


class ConfigMapRef(_Wire):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field("config.json", min_length=1, max_length=253)


class SecretRef(_Wire):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field("token", min_length=1, max_length=253)


class ClaimRef(_Wire):
    claim_name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    read_only: bool = False


class ClaimTemplate(_Wire):
    storage_class_name: str | None = Field(None, max_length=253)
    size: str | None = Field(None, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = "ReadWriteOnce"


class HostPath(_Wire):
    path: str = Field(min_length=2, max_length=1024, pattern=r"^/[^\x00]*$")


class Storage(_Wire):
    """``spec.model.storage``: the weight cache (exactly one of the three volume kinds)."""

    persistent_volume_claim: ClaimRef | None = None
    claim_template: ClaimTemplate | None = None
    host_path: HostPath | None = None
    mount_path: str = Field("/models", max_length=256, pattern=r"^/[A-Za-z0-9._/-]+$")


def _dot_segments(path: str) -> bool:
    return "/../" in path or path.endswith("/..") or "/./" in path


def ref_name_problem(revision: str) -> str | None:
    """Why ``revision`` is not a git ref name or commit hash (the CRD's CEL rule), or ``None``."""
    bad = (
        ".." in revision
        or revision.startswith(("/", "."))
        or revision.endswith(("/", ".lock"))
        or "//" in revision
        or "/." in revision
    )
    if bad:
        return (
            "revision must be a git ref name or a commit hash (no '..', '//', leading '.' or '/', "
            "trailing '/' or '.lock')"
        )
    return None


class ModelRef(_Wire):
    id: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?|(/[A-Za-z0-9_][A-Za-z0-9._-]*)+)$",
    )
    revision: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9._/-]+$")
    source: Source = "Catalogue"
    config_map_ref: ConfigMapRef | None = None
    hub_token_secret_ref: SecretRef | None = None
    storage: Storage | None = None
    checkpoint_bytes: int | None = Field(None, ge=1, le=MAX_CHECKPOINT_BYTES)
    loader: Loader = "Default"

    @property
    def is_local_path(self) -> bool:
        """``id`` names a directory inside ``storage`` (air-gapped), not a Hugging Face repository."""
        return self.id.startswith("/")


class GpuRequest(_Wire):
    count: int = Field(1, ge=1, le=64)
    product: str | None = Field(None, max_length=128)
    tensor_parallel_size: int | None = Field(None, ge=1, le=64)
    nodes_per_replica: int = Field(1, ge=1, le=64)
    """Nodes per replica, ``count`` GPUs each (1: a single-node replica, one pod)."""


MAX_GPUS_PER_REPLICA = 512
"""``gpu.count x gpu.nodesPerReplica`` at most (the CRD's CEL rule on ``spec.gpu``)."""


class Slo(_Wire):
    ttft_p95_seconds: float | None = Field(None, ge=0.001, le=3600)
    inter_token_latency_p95_seconds: float | None = Field(None, ge=0.0001, le=60)


class Serving(_Wire):
    min_context_length: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_context_length: int | None = Field(None, ge=1, le=MAX_TOKENS)
    concurrency: int | None = Field(None, ge=1, le=MAX_SEQS)
    slo: Slo | None = None


class KeyRef(_Wire):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class FieldRef(_Wire):
    api_version: str | None = Field(None, max_length=64)
    field_path: str = Field(min_length=1, max_length=256)


class ResourceFieldRef(_Wire):
    container_name: str | None = Field(None, max_length=63)
    resource: str = Field(min_length=1, max_length=63)
    divisor: int | str | None = None


class EnvVarSource(_Wire):
    """core/v1 EnvVarSource: exactly one of its fields (the CRD's min/maxProperties say so too)."""

    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None
    field_ref: FieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        set_ = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(set_) != 1:
            raise ValueError(
                "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"
            )
        return self


class EnvVar(_Wire):
    name: str = Field(min_length=1, max_length=256)
    value: str | None = Field(None, max_length=1024)
    value_from: EnvVarSource | None = None


class Resources(_Wire):
    limits: dict[str, int | str] | None = Field(None, max_length=16)
    requests: dict[str, int | str] | None = Field(None, max_length=16)


class Toleration(_Wire):
    key: str | None = Field(None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0, le=31_536_000)


class Engine(_Wire):
    kind: EngineKind = "vLLM"
    """The inference engine (:data:`kvpilot.tuner.engines.KINDS`); fixed at creation (a CRD rule)."""
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512)
    vllm_version: str | None = Field(None, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", max_length=32)
    """The vLLM release the image runs, when its tag does not say
    (:func:`kvpilot.tuner.vllm.resolve_image_version`)."""
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(default_factory=list, max_length=64)
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    resources: Resources | None = None
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    pinned: Settings = Field(default_factory=Settings)


class IntRange(_Wire):
    min: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max: int | None = Field(None, ge=1, le=MAX_TOKENS)


class FractionRange(_Wire):
    min: float | None = Field(None, gt=0, le=1)
    max: float | None = Field(None, gt=0, le=1)


class Bounds(_Wire):
    max_num_seqs: IntRange | None = None
    gpu_memory_utilization: FractionRange | None = None
    max_model_len: IntRange | None = None


class TuningPolicy(_Wire):
    """The tuning knobs an InferenceService's ``spec.tuning`` and an EngineTuner's share (everything but
    the InferenceService's ``mode``; an EngineTuner says what it may change with ``spec.updateMode``)."""

    allow_fp8_kv_cache: bool = False
    allow_weight_quantization: bool = False
    cooldown_seconds: int = Field(300, ge=0, le=MAX_SECONDS)
    max_changes_per_hour: int = Field(4, ge=0, le=60)
    rollout_deadline_seconds: int = Field(900, ge=30, le=MAX_SECONDS)
    bounds: Bounds = Field(default_factory=Bounds)


class Tuning(TuningPolicy):
    mode: Mode = "Auto"


class RolloutSpec(_Wire):
    """``spec.rollout``: how a retune (or any change of the pods) rolls out on a full GPU pool."""

    strategy: RolloutStrategy = "Auto"
    allow_downtime: bool = False
    max_unavailable: int = Field(1, ge=1, le=1000)


class ServiceSpec(_Wire):
    """``spec.service``: the Service in front of the vLLM pods; ``headless`` is fixed at creation (a CRD
    rule: a Service's clusterIP is immutable)."""

    headless: bool = False


KubeObject = dict[str, Any]
"""A Kubernetes type inside ``spec.template`` (affinity, a volume, a container): the CRD's schema for it is
the API server's own (``e2e/pod_template_schema.py``), so the API server validates it; kvpilot merges it."""
KUBERNETES_SCHEMAS = frozenset(
    f"spec.template.spec.{f}"
    for f in (
        "affinity",
        "securityContext",
        "topologySpreadConstraints[]",
        "imagePullSecrets[]",
        "volumes[]",
        "initContainers[]",
        "containers[]",
    )
)
"""Paths whose schema ``tests/operator/test_api_drift.py`` does not compare property by property."""


class TemplateMetadata(_Wire):
    labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, max_length=32)
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=32
    )


class PodTemplateSpec(_Wire):
    """``spec.template.spec``: the pod fields a team shapes the vLLM pods with."""

    affinity: KubeObject | None = None
    topology_spread_constraints: list[KubeObject] = Field(default_factory=list, max_length=8)
    priority_class_name: str | None = Field(None, max_length=253)
    runtime_class_name: str | None = Field(None, max_length=253)
    image_pull_secrets: list[KubeObject] = Field(default_factory=list, max_length=8)
    service_account_name: str | None = Field(None, max_length=253)
    automount_service_account_token: bool | None = None
    """Unset: False (vLLM never talks to the API server; a mounted token is one more credential to steal)."""
    security_context: KubeObject | None = None
    volumes: list[KubeObject] = Field(default_factory=list, max_length=32)
    init_containers: list[KubeObject] = Field(default_factory=list, max_length=8)
    containers: list[KubeObject] = Field(default_factory=list, max_length=8)
    scheduler_name: str | None = Field(None, max_length=253)
    dns_policy: str | None = Field(None, max_length=253)
    host_ipc: bool | None = Field(None, alias="hostIPC")


class PodTemplate(_Wire):
    """``spec.template``: merged into the vLLM pods (:func:`.pod_template.build_pod_template`)."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: PodTemplateSpec = Field(default_factory=PodTemplateSpec)


class InferenceServiceSpec(_Wire):
    model: ModelRef
    gpu: GpuRequest = Field(default_factory=GpuRequest)
    node_selector: dict[str, Annotated[str, Field(max_length=253)]] = Field(
        default_factory=dict, max_length=32
    )
    replicas: int = Field(1, ge=0, le=1000)
    serving: Serving = Field(default_factory=Serving)
    engine: Engine = Field(default_factory=Engine)
    tuning: Tuning = Field(default_factory=Tuning)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    template: PodTemplate | None = None
    pod_security: PodSecurity = "Default"

    def semantic_errors(self) -> list[str]:
        """The CRD's CEL rules, evaluated here: an empty list when the spec is consistent."""
        return _cel_equivalents(self)

    def to_bounds(self) -> types.ServingBounds:
        """The tuner's view of what the user asks for: ``serving`` and ``tuning.bounds`` merged (the tighter
        of ``serving``'s context limits and ``bounds.maxModelLen``), so the first plan keeps every bound
        the closed loop keeps."""
        b = self.tuning.bounds
        gmu = b.gpu_memory_utilization or FractionRange()
        seqs = b.max_num_seqs or IntRange()
        mml = b.max_model_len or IntRange()
        lows = [v for v in (self.serving.min_context_length, mml.min) if v]
        highs = [v for v in (self.serving.max_context_length, mml.max) if v]
        d = types.ServingBounds()
        return types.ServingBounds(
            min_context=max(lows) if lows else None,
            max_context=min(highs) if highs else None,
            concurrency=self.serving.concurrency,
            allow_fp8_kv=self.tuning.allow_fp8_kv_cache,
            allow_weight_quantization=self.tuning.allow_weight_quantization,
            min_gpu_memory_utilization=gmu.min if gmu.min is not None else d.min_gpu_memory_utilization,
            max_gpu_memory_utilization=gmu.max if gmu.max is not None else d.max_gpu_memory_utilization,
            min_max_num_seqs=seqs.min or d.min_max_num_seqs,
            max_max_num_seqs=seqs.max,
        )


def _in_range(value: float | None, rng: IntRange | FractionRange | None) -> bool:
    if value is None or rng is None:
        return True
    return (rng.min is None or value >= rng.min) and (rng.max is None or value <= rng.max)


def _cel_equivalents(spec: InferenceServiceSpec) -> list[str]:
    errors: list[str] = []
    m, g, p, b = spec.model, spec.gpu, spec.engine.pinned, spec.tuning.bounds
    if m.source == "ConfigMap" and m.config_map_ref is None:
        errors.append("spec.model: configMapRef is required when source is ConfigMap")
    if m.config_map_ref is not None and m.source != "ConfigMap":
        errors.append("spec.model: configMapRef is only used when source is ConfigMap")
    if m.hub_token_secret_ref is not None and m.source != "Hub":
        errors.append("spec.model: hubTokenSecretRef is only used when source is Hub")
    if _dot_segments(m.id):
        errors.append("spec.model.id: a model path must not contain . or .. segments")
    if m.revision is not None and (problem := ref_name_problem(m.revision)):
        errors.append(f"spec.model.revision: {problem}")
    if m.is_local_path and m.storage is None:
        errors.append(
            "spec.model: a local-path model id needs model.storage (the volume that holds the weights)"
        )
    if m.is_local_path and m.storage is not None and not m.id.startswith(m.storage.mount_path + "/"):
        errors.append("spec.model: a local-path model id must lie inside model.storage.mountPath")
    if m.is_local_path and m.source != "ConfigMap":
        errors.append(
            "spec.model: a local-path model id has no catalogue entry or Hub repository; give its "
            "config.json with source ConfigMap"
        )
    st = m.storage
    if st is not None:
        kinds = [k for k in (st.persistent_volume_claim, st.claim_template, st.host_path) if k is not None]
        if len(kinds) != 1:
            errors.append(
                "spec.model.storage: storage takes exactly one of persistentVolumeClaim, claimTemplate, "
                "hostPath"
            )
        template = st.claim_template
        if g.nodes_per_replica > 1 and template is not None and template.access_mode != "ReadWriteMany":
            errors.append(
                "spec: a replica over several nodes (gpu.nodesPerReplica > 1) mounts "
                "model.storage.claimTemplate on each of its nodes: give it accessMode ReadWriteMany (or use "
                "hostPath, a cache on each node)"
            )
        if st.host_path is not None and _dot_segments(st.host_path.path):
            errors.append("spec.model.storage.hostPath.path: hostPath.path must not contain .. segments")
    errors += labels.node_selector_problems(spec.node_selector)
    errors += labels.toleration_problems(spec.engine.tolerations)
    if g.tensor_parallel_size and g.count % g.tensor_parallel_size:
        errors.append("spec.gpu: gpu.tensorParallelSize must divide gpu.count")
    if g.count * g.nodes_per_replica > MAX_GPUS_PER_REPLICA:
        errors.append(
            f"spec.gpu: a replica holds at most {MAX_GPUS_PER_REPLICA} GPUs: gpu.count (per node) x "
            "gpu.nodesPerReplica"
        )
    if p.tensor_parallel_size and g.count % p.tensor_parallel_size:
        errors.append("spec: engine.pinned.tensorParallelSize must divide gpu.count")
    if p.tensor_parallel_size and g.tensor_parallel_size and p.tensor_parallel_size != g.tensor_parallel_size:
        errors.append(
            "spec: engine.pinned.tensorParallelSize and gpu.tensorParallelSize disagree; set one of them"
        )
    s = spec.serving
    if s.min_context_length and s.max_context_length and s.min_context_length > s.max_context_length:
        errors.append("spec.serving: serving.minContextLength must not exceed serving.maxContextLength")
    if p.max_model_len and s.min_context_length and p.max_model_len < s.min_context_length:
        errors.append("spec: engine.pinned.maxModelLen is below serving.minContextLength")
    if p.max_model_len and s.max_context_length and p.max_model_len > s.max_context_length:
        errors.append("spec: engine.pinned.maxModelLen is above serving.maxContextLength")
    for name, rng in (
        ("maxNumSeqs", b.max_num_seqs),
        ("gpuMemoryUtilization", b.gpu_memory_utilization),
        ("maxModelLen", b.max_model_len),
    ):
        if rng is not None and rng.min is not None and rng.max is not None and rng.min > rng.max:
            errors.append(f"spec.tuning.bounds.{name}: bounds.{name}.min must not exceed max")
    for name, value, rng in (
        ("maxModelLen", p.max_model_len, b.max_model_len),
        ("maxNumSeqs", p.max_num_seqs, b.max_num_seqs),
        ("gpuMemoryUtilization", p.gpu_memory_utilization, b.gpu_memory_utilization),
    ):
        if not _in_range(value, rng):
            errors.append(f"spec: engine.pinned.{name} is outside tuning.bounds.{name}")
    if p.kv_cache_dtype and p.kv_cache_dtype.startswith("fp8") and not spec.tuning.allow_fp8_kv_cache:
        errors.append(
            "spec: engine.pinned.kvCacheDtype is fp8; set tuning.allowFp8KvCache to true to confirm"
        )
    if any(e.name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and e.value is not None for e in spec.engine.env):
        errors.append(
            "spec.engine.env: do not inline a Hugging Face token; use model.hubTokenSecretRef or "
            "valueFrom.secretKeyRef"
        )
    if spec.rollout.strategy == "Recreate" and not spec.rollout.allow_downtime:
        errors.append(
            "spec.rollout: strategy Recreate takes every replica down; set rollout.allowDowntime to true "
            "to confirm"
        )
    if spec.engine.kind != "vLLM" and spec.engine.image.startswith("vllm/"):
        own = {"SGLang": sglang.serving.IMAGE_REPOSITORY, "TGI": tgi.serving.IMAGE_REPOSITORY}
        errors.append(
            f"spec.engine: engine.image is a vLLM image, but engine.kind is {spec.engine.kind}; set "
            f"engine.image to {spec.engine.kind}'s image ({own.get(spec.engine.kind, 'its own')})"
        )
    res = spec.engine.resources
    if res is not None and any("nvidia.com/gpu" in (d or {}) for d in (res.limits, res.requests)):
        errors.append("spec.engine.resources: set GPUs with gpu.count, not engine.resources")
    return errors


# --------------------------------------------------------------------------- status


class Condition(_Wire):
    type: str = Field(max_length=64)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=128)
    message: str | None = Field(None, max_length=32768)
    observed_generation: int | None = None
    last_transition_time: str | None = None


class GpuStatus(_Wire):
    product: str | None = None
    catalogue_name: str | None = None
    count: int | None = None
    memory_gi_b: float | None = Field(None, alias="memoryGiB")


class Recommendation(_Wire):
    settings: Settings | None = None
    engine_args: list[str] | None = None
    """Another engine's flags (SGLang's, TGI's), in its own spelling."""
    replicas: int | None = Field(None, ge=1)
    reason: str | None = None
    trigger: str | None = None
    time: str | None = None


class FailedEngineArgs(_Wire):
    args: list[str] = Field(default_factory=list)
    failure: str | None = None
    running_requests: int | None = None
    """A run-time OOM: the most running requests seen with these flags before it."""


class Budget(_Wire):
    gpu_total_gi_b: float | None = Field(None, alias="gpuTotalGiB")
    requested_gi_b: float | None = Field(None, alias="requestedGiB")
    weights_gi_b: float | None = Field(None, alias="weightsGiB")
    activation_gi_b: float | None = Field(None, alias="activationGiB")
    sampler_state_gi_b: float | None = Field(None, alias="samplerStateGiB")
    non_torch_gi_b: float | None = Field(None, alias="nonTorchGiB")
    cuda_graph_gi_b: float | None = Field(None, alias="cudaGraphGiB")
    kv_cache_gi_b: float | None = Field(None, alias="kvCacheGiB")
    lora_gi_b: float | None = Field(None, alias="loraGiB")
    speculative_gi_b: float | None = Field(None, alias="speculativeGiB")
    kv_connector_gi_b: float | None = Field(None, alias="kvConnectorGiB")
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None

    @classmethod
    def from_budget(cls, b: types.MemoryBudget) -> Budget:
        def r(x: float) -> float:
            return round(x, 3)

        def part(x: float) -> float | None:  # a term only some plans have: absent when nothing
            return round(x, 3) if x > 0 else None

        return cls(
            gpu_total_gi_b=r(b.gpu_total_gib),
            requested_gi_b=r(b.requested_gib),
            weights_gi_b=r(b.weights_gib),
            activation_gi_b=r(b.activation_gib),
            sampler_state_gi_b=r(b.sampler_state_gib),
            non_torch_gi_b=r(b.non_torch_gib),
            cuda_graph_gi_b=r(b.cuda_graph_gib),
            kv_cache_gi_b=r(b.available_kv_cache_gib),
            lora_gi_b=part(b.lora_gib),
            speculative_gi_b=part(b.speculative_gib),
            kv_connector_gi_b=part(b.kv_connector_gib),
            kv_cache_tokens=b.kv_cache_tokens,
            max_concurrency=r(b.max_concurrency),
        )


class Calibration(_Wire):
    observed_kv_cache_tokens: int | None = None


class Rollout(_Wire):
    settings: Settings | None = None
    started_at: str | None = None
    deadline: str | None = None
    phase: Literal["RollingOut", "Probation"] | None = None
    probation_until: str | None = None
    strategy: AppliedStrategy | None = None
    reason: str | None = Field(None, max_length=1024)
    engine_args: list[str] | None = Field(None, max_length=64)
    """Another engine's flags being rolled out (SGLang's, TGI's), in its own spelling."""


class HistoryRecord(_Wire):
    time: str | None = None
    action: Literal["Planned", "Retuned", "RolledBack", "Held", "Infeasible"] | None = None
    trigger: str | None = None
    reason: str | None = None
    from_: Settings | None = Field(None, alias="from")
    to: Settings | None = None
    from_engine_args: list[str] | None = Field(None, max_length=64)
    """Another engine's flags before (SGLang's, TGI's), in its own spelling."""
    to_engine_args: list[str] | None = Field(None, max_length=64)
    """Another engine's flags after."""


class KopfState(_Wire):
    """kopf's diff base (``kopf.StatusDiffBaseStorage``): the spec as last handled, JSON-encoded; and its
    handler progress (``kopf.StatusProgressStorage``) while a handler is being retried."""

    last_handled_configuration: str | None = Field(None, max_length=1_048_576)
    progress: dict[str, Any] | None = None
    dummy: str | None = Field(None, max_length=64)
    """kopf's touch that wakes a handler for its retry (``kopf.StatusProgressStorage``'s ``touch_field``)."""


class ProfileUsed(_Wire):
    """``status.profile``: the TuningProfile the last plan started from
    (:mod:`kvpilot.operator.planning.profiles`)."""

    name: str | None = None
    message: str | None = None
    learned_kv_cache_tokens: int | None = None


class InferenceServiceStatus(_Wire):
    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    selector: str | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    gpu: GpuStatus | None = None
    applied: Settings | None = None
    last_good_settings: Settings | None = None
    failed_settings: list[Settings] = Field(default_factory=list, max_length=32)
    failed_engine_args: list[FailedEngineArgs] = Field(default_factory=list, max_length=32)
    applied_engine_args: list[str] | None = Field(None, max_length=64)
    last_good_engine_args: list[str] | None = Field(None, max_length=64)
    recommendation: Recommendation | None = None
    budget: Budget | None = None
    warnings: list[str] = Field(default_factory=list, max_length=32)
    calibration: Calibration | None = None
    profile: ProfileUsed | None = None
    rollout: Rollout | None = None
    startup_seconds: float | None = Field(None, ge=0)
    history: list[HistoryRecord] = Field(default_factory=list, max_length=20)
    last_change_time: str | None = None
    kopf: KopfState | None = None


class InferenceService(_Wire):
    """A whole object, as ``kubectl apply -f`` or the API server hands it over."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", protected_namespaces=()
    )

    api_version: str = f"{GROUP}/{VERSION}"
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")


# --------------------------------------------------------------------------- EngineTuner (target mode)
#
# ``crds/enginetuners.kvpilot.io.yaml``: a vLLM workload someone else owns, tuned the way the Vertical Pod
# Autoscaler tunes requests. Its ``model``, ``serving`` and ``tuning`` blocks, and the status' settings,
# recommendation, budget and conditions, are the InferenceService's (the same models here; the CRD's
# subtrees are checked equal to the InferenceService CRD's by tests/operator/test_enginetuner_api.py).

ENGINE_TUNER_PLURAL = "enginetuners"
ENGINE_TUNER_KIND = "EngineTuner"
TargetKind = Literal["Deployment", "StatefulSet", "LeaderWorkerSet"]
"""The workload kinds ``spec.targetRef`` may name."""
TARGET_API_VERSIONS: dict[str, str] = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
}
"""Each target kind's API version (the LeaderWorkerSet's: sigs.k8s.io/lws, a replica over several nodes)."""


class TargetRef(_Wire):
    """``spec.targetRef``: the workload whose pods are tuned, in the EngineTuner's namespace."""

    api_version: Literal["apps/v1", "leaderworkerset.x-k8s.io/v1"] | None = None
    kind: TargetKind
    name: str = Field(min_length=1, max_length=253)

    @model_validator(mode="after")
    def _version_of_kind(self) -> TargetRef:
        want = TARGET_API_VERSIONS[self.kind]
        if self.api_version is not None and self.api_version != want:
            raise ValueError(f"apiVersion of a {self.kind} is {want}, not {self.api_version}")
        return self


class TargetGpu(_Wire):
    """``spec.gpu``: what discovery cannot read (the product when the pods run on unlabelled nodes)."""

    product: str | None = Field(None, max_length=128)
    count: int | None = Field(None, ge=1, le=64)


class EngineTunerSpec(_Wire):
    target_ref: TargetRef
    update_mode: UpdateMode = "Recommend"
    container_name: str | None = Field(None, min_length=1, max_length=63)
    model: ModelRef | None = None
    gpu: TargetGpu = Field(default_factory=TargetGpu)
    serving: Serving = Field(default_factory=Serving)
    tuning: TuningPolicy = Field(default_factory=TuningPolicy)


class Discovered(_Wire):
    """``status.discovered``: what kvpilot read from the target (its pod template and its pods' nodes)."""

    container: str | None = Field(None, max_length=63)
    engine: EngineKind | None = None
    """The engine the container runs (``None`` in a status written before kvpilot read others: vLLM)."""
    model: str | None = Field(None, max_length=256)
    model_origin: str | None = Field(None, max_length=256)
    args_origin: str | None = Field(None, max_length=256)
    gpu_product: str | None = Field(None, max_length=128)
    gpu_count: int | None = None
    settings: Settings | None = None
    engine_args: list[str] | None = Field(None, max_length=64)
    """Another engine's (SGLang's, TGI's) tuned flags the container runs, in its own spelling."""
    vllm_env: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict, max_length=32)
    pods: int | None = None
    pods_tuned: int | None = None


class EngineTunerStatus(_Wire):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    discovered: Discovered | None = None
    gpu: GpuStatus | None = None
    recommendation: Recommendation | None = None
    budget: Budget | None = None
    warnings: list[str] = Field(default_factory=list, max_length=32)
    failed_settings: list[Settings] = Field(default_factory=list, max_length=32)
    failed_engine_args: list[FailedEngineArgs] = Field(default_factory=list, max_length=32)
    """SGLang's or TGI's flags that failed on the target's pods, and how (the closed loop's)."""
    history: list[HistoryRecord] = Field(default_factory=list, max_length=20)
    last_good_settings: Settings | None = None
    last_good_engine_args: list[str] | None = Field(None, max_length=64)
    """SGLang's or TGI's flags that last passed probation on the target's pods."""
    rollout: Rollout | None = None
    last_eviction_time: str | None = None
    evictions: int | None = None
    kopf: KopfState | None = None
