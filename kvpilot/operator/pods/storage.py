"""The weight cache: where a vLLM pod keeps the checkpoint between starts, and how long a start may take.

Pure builders of pod fragments from ``spec.model.storage`` (api-contract.md):

* ``persistentVolumeClaim`` -- an existing claim; ``claimTemplate`` -- a claim kvpilot creates and owns
  (``<name>-model-cache``, garbage-collected with the InferenceService, sized from the checkpoint
  when no size is given); ``hostPath`` -- a node-local directory. The volume is mounted at
  ``mountPath`` and is the Hugging Face cache (``HF_HOME=<mountPath>/huggingface``) and, unless it is
  read-only, vLLM's compile and kernel caches (``VLLM_CACHE_ROOT=<mountPath>/vllm``, Triton's in
  ``<mountPath>/vllm/triton_cache``: :func:`kvpilot.tuner.vllm.build_cache_env`). vLLM keys its compiled
  graphs by a hash of its configuration, so a restart or a retune that changes no hashed setting
  (:data:`kvpilot.tuner.vllm.COMPILE_HASH_SETTINGS`) loads them instead of compiling.
* An init container downloads the weights before vLLM starts, with huggingface_hub's
  ``snapshot_download`` (resumable; a complete snapshot costs one metadata check), the token from
  the same Secret as vLLM's, so a restart or a retune loads from disk (vLLM then finds every file in
  the cache). A read-only claim, or a local-path model id, downloads nothing.
* Without storage the pod downloads into its own filesystem at every start: it requests
  ``ephemeral-storage`` for the checkpoint, and the start-up probe's budget follows the checkpoint
  size (a 400 GB checkpoint must not be killed by a 30-minute probe).

Nothing here does I/O; :mod:`kvpilot.operator.pods.workloads` puts the fragments into the Deployment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import api, errors, quantities
from kvpilot.tuner import vllm
from kvpilot.tuner.types import GIB

VOLUME = "model-cache"
INIT_CONTAINER = "fetch-weights"
COMPILE_CACHE_FOLDER = "vllm"
"""The folder of the volume that holds vLLM's compile and kernel caches (beside ``huggingface``)."""
STARTUP_PERIOD_S = 10
MIN_STARTUP_BUDGET_S = 1800
"""The start-up probe never gives up sooner than 30 minutes (compile, CUDA graphs, a cold node)."""
BASE_STARTUP_S = 600
"""Start-up work that does not scale with the checkpoint: engine init, profiling, graph capture."""
DOWNLOAD_BYTES_PER_S = 50 << 20
"""A conservative download rate from the Hub (400 Mbit/s): a 16 GB checkpoint takes about 5 minutes."""
LOAD_BYTES_PER_S = 250 << 20
"""A conservative load rate from a network volume into GPU memory."""
SCRATCH_BYTES = 10 * GIB
"""Beyond the weights: logs, /tmp, the torch.compile and Triton caches."""
CLAIM_HEADROOM = 1.2
"""A managed claim holds the checkpoint plus a fifth (the Hub cache keeps blobs and symlinks) ..."""
CLAIM_EXTRA_BYTES = 10 * GIB
"""... and 10 GiB."""

_DOWNLOAD_SCRIPT = (
    "import os\n"
    "from huggingface_hub import snapshot_download\n"
    "snapshot_download(\n"
    "    os.environ['KVPILOT_MODEL_ID'],\n"
    "    revision=os.environ.get('KVPILOT_MODEL_REVISION') or None,\n"
    "    allow_patterns=['*.json', '*.safetensors', '*.model', '*.txt', '*.tiktoken', '*.jinja', '*.py'],\n"
    ")\n"
)
"""What the init container runs, with the vLLM image's own Python and huggingface_hub."""


@dataclass(frozen=True, slots=True)
class PodStorage:
    """What the weight cache adds to the pod and beside it."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)
    """Environment of the vLLM container."""
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    """PersistentVolumeClaims to apply before the Deployment (a ``claimTemplate``)."""
    ephemeral_storage_bytes: int | None = None
    """The container's ``ephemeral-storage`` request (downloads into its own filesystem)."""
    startup_failure_threshold: int = MIN_STARTUP_BUDGET_S // STARTUP_PERIOD_S


def claim_name(name: str) -> str:
    """The name of the claim kvpilot creates for a ``claimTemplate``."""
    return f"{name}-model-cache"


def compute_claim_bytes(checkpoint_bytes: int | None) -> int:
    """The size of a managed claim sized from the checkpoint (100 GiB when the checkpoint is unknown)."""
    if not checkpoint_bytes:
        return 100 * GIB
    return math.ceil((checkpoint_bytes * CLAIM_HEADROOM + CLAIM_EXTRA_BYTES) / GIB) * GIB


def compute_startup_failure_threshold(checkpoint_bytes: int | None, *, cached: bool) -> int:
    """Start-up probe failures (every :data:`STARTUP_PERIOD_S`) before the kubelet restarts vLLM: the
    fixed start-up work plus the checkpoint's download (no cache) or load (cache) time."""
    rate = LOAD_BYTES_PER_S if cached else DOWNLOAD_BYTES_PER_S
    budget = BASE_STARTUP_S + (checkpoint_bytes or 0) / rate
    return math.ceil(max(MIN_STARTUP_BUDGET_S, budget) / STARTUP_PERIOD_S)


def parse_quantity_bytes(quantity: str) -> int:
    """Bytes of a storage quantity in the CRD's pattern (``200Gi``, ``1.5T``, ``500G``)."""
    try:
        return math.ceil(quantities.parse_quantity_float(quantity))
    except ValueError:
        raise errors.InvalidSpec(
            f"spec.model.storage.claimTemplate.size: {quantity!r} is not a quantity"
        ) from None


def _gib_quantity(value: int) -> str:
    return f"{math.ceil(value / GIB)}Gi"


def _volume(metadata: Mapping[str, Any], storage: api.Storage) -> dict[str, Any]:
    if storage.persistent_volume_claim is not None:
        ref = storage.persistent_volume_claim
        return {
            "name": VOLUME,
            "persistentVolumeClaim": {"claimName": ref.claim_name, "readOnly": ref.read_only},
        }
    if storage.claim_template is not None:
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(metadata["name"])}}
    assert storage.host_path is not None  # the CRD and semantic_errors allow exactly one kind
    return {"name": VOLUME, "hostPath": {"path": storage.host_path.path, "type": "DirectoryOrCreate"}}


def keeps_compile_cache(storage: api.Storage | None) -> bool:
    """Whether the pods keep vLLM's compile cache across restarts: the weight cache is writable (the
    closed loop then prices a restart that leaves vLLM's compile hash alone without the compile)."""
    return storage is not None and not (
        storage.persistent_volume_claim is not None and storage.persistent_volume_claim.read_only
    )


def keeps_weights(storage: api.Storage | None) -> bool:
    """Whether every pod's start finds the checkpoint already on its volume: a PersistentVolumeClaim, which
    any node mounts (a ``hostPath`` holds it only on the nodes that downloaded it)."""
    return storage is not None and storage.host_path is None


def build_claim(
    metadata: Mapping[str, Any], template: api.ClaimTemplate, checkpoint_bytes: int | None
) -> dict[str, Any]:
    """The PersistentVolumeClaim of a ``claimTemplate`` (owner references are added by the caller)."""
    if template.size and checkpoint_bytes and parse_quantity_bytes(template.size) < checkpoint_bytes:
        raise errors.InvalidSpec(
            f"spec.model.storage.claimTemplate.size {template.size} is below the checkpoint's "
            f"{checkpoint_bytes / GIB:.1f} GiB; give at least "
            f"{_gib_quantity(compute_claim_bytes(checkpoint_bytes))} or leave size out to have it sized "
            "from the checkpoint"
        )
    size = template.size or _gib_quantity(compute_claim_bytes(checkpoint_bytes))
    spec: dict[str, Any] = {
        "accessModes": [template.access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if template.storage_class_name:
        spec["storageClassName"] = template.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(metadata["name"]),
            "namespace": metadata.get("namespace") or "default",
        },
        "spec": spec,
    }


def build_pod_storage(
    metadata: Mapping[str, Any],
    spec: api.InferenceServiceSpec,
    checkpoint_bytes: int | None,
    *,
    image: str,
    token_env: list[dict[str, Any]],
    security_context: Mapping[str, Any],
) -> PodStorage:
    """The pod fragments of ``spec.model.storage`` (or of its absence) for a checkpoint of that size.

    ``token_env`` is the ``HF_TOKEN`` entry vLLM gets (empty without a token Secret): the init
    container downloads with the same one.
    """
    model, storage = spec.model, spec.model.storage
    if storage is None:
        ephemeral = (math.ceil(checkpoint_bytes * 1.1) + SCRATCH_BYTES) if checkpoint_bytes else None
        return PodStorage(
            ephemeral_storage_bytes=ephemeral,
            startup_failure_threshold=compute_startup_failure_threshold(checkpoint_bytes, cached=False),
        )
    hf_home = f"{storage.mount_path}/huggingface"
    read_only = storage.persistent_volume_claim is not None and storage.persistent_volume_claim.read_only
    mount = {"name": VOLUME, "mountPath": storage.mount_path, **({"readOnly": True} if read_only else {})}
    env = [{"name": "HF_HOME", "value": hf_home}]
    if keeps_compile_cache(storage):
        cache_env = vllm.build_cache_env(f"{storage.mount_path}/{COMPILE_CACHE_FOLDER}")
        env.extend({"name": name, "value": value} for name, value in cache_env.items())
    init: list[dict[str, Any]] = []
    if not read_only and not model.is_local_path:
        fetch_env = [
            {"name": "HF_HOME", "value": hf_home},
            {"name": "KVPILOT_MODEL_ID", "value": model.id},
            *([{"name": "KVPILOT_MODEL_REVISION", "value": model.revision}] if model.revision else []),
            {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "0"},
            *token_env,
        ]
        init.append(
            {
                "name": INIT_CONTAINER,
                "image": image,
                "command": ["python3", "-c", _DOWNLOAD_SCRIPT],
                "env": fetch_env,
                "volumeMounts": [{"name": VOLUME, "mountPath": storage.mount_path}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                "securityContext": dict(security_context),
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        )
    claims = []
    if storage.claim_template is not None:
        claims.append(build_claim(metadata, storage.claim_template, checkpoint_bytes))
    return PodStorage(
        volumes=[_volume(metadata, storage)],
        mounts=[mount],
        env=env,
        init_containers=init,
        claims=claims,
        ephemeral_storage_bytes=SCRATCH_BYTES,
        startup_failure_threshold=compute_startup_failure_threshold(checkpoint_bytes, cached=True),
    )
