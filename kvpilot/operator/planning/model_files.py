"""The checkpoint files a plan reads, and the ``ConfigMap`` source of them.

A plan reads ``config.json`` (with the quantization of an ``hf_quant_config.json`` sidecar merged in, as vLLM
does) and, for a model whose vision tower kvpilot models, the checkpoint's ``preprocessor_config.json`` and
``video_preprocessor_config.json``: vLLM sizes its dummy encoder batch from their pixel budgets
(:mod:`kvpilot.tuner.model.processors`). The ConfigMap source reads them from keys of those names beside
config.json; the Hub source (:mod:`.hub`) downloads them beside it. Both read the processor files only for a
config that reads them, so a text model's plan never depends on a stray key or costs a Hub request.

A ``--speculative-config`` of method ``eagle3`` or ``draft_model`` in the engine's arguments loads a draft
checkpoint of its own: the ConfigMap source reads that checkpoint's ``config.json`` under
:data:`DRAFT_CONFIG_KEY` (:mod:`.drafts`), only when the arguments load such a drafter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import Kube
from kvpilot.tuner.model import (
    PROCESSOR_FILES,
    QUANT_SIDECAR,
    build_config_with_quant_sidecar,
    parse_config_json,
    reads_processor_files,
)

CREATE_HINT = (
    "(a multimodal model: also --from-file=preprocessor_config.json and "
    "--from-file=video_preprocessor_config.json where the checkpoint has them; they size its encoder)"
)
"""What the ConfigMap's kubectl line adds for a multimodal model."""
DRAFT_CONFIG_KEY = "draft_config.json"
"""The ConfigMap key (source ConfigMap) of the draft checkpoint's ``config.json``, for an ``eagle3`` or
``draft_model`` ``--speculative-config`` (:mod:`.drafts`)."""


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """What a model's plan is read from: config.json, and its processor files by name (none: the config
    does not read them, or the checkpoint has none; transformers' defaults then, as vLLM uses)."""

    config: Mapping[str, Any]
    processors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    draft: Mapping[str, Any] | None = None
    """The draft checkpoint's config.json (:data:`DRAFT_CONFIG_KEY`), read only for arguments whose
    speculative decoding loads one; ``None``: not read, or the ConfigMap has none."""


def compute_config_key(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compute_files_key(files: ModelFiles) -> str:
    """The digest of what the plan reads (the ModelSpec cache's and the TuningProfiles' model key):
    config.json's alone when there are no processor files and no draft, so a text model keeps the key it
    always had; with them, a changed processor file or draft config is another model (another plan), as a
    changed config.json is."""
    if not files.processors:
        key = compute_config_key(files.config)
    else:
        key = compute_config_key({"config.json": files.config, **files.processors})
    return key if files.draft is None else compute_draft_key(key, files.draft)


def compute_draft_key(files_key: str, draft: Mapping[str, Any]) -> str:
    """The model key of a model (``files_key``: :func:`compute_files_key` of its own files) planned with a
    drafter of config.json ``draft``: whatever source gave either."""
    return compute_config_key({"model": files_key, DRAFT_CONFIG_KEY: draft})


def read_config_map_files(
    ref: api.ConfigMapRef, namespace: str, kube: Kube, *, with_draft: bool = False
) -> ModelFiles:
    """config.json under ``ref.key``, its ``hf_quant_config.json`` sidecar and, for a multimodal config, its
    processor files, from keys of the ConfigMap; ``with_draft``: the draft's config.json too, under
    :data:`DRAFT_CONFIG_KEY` where present. A key that is not JSON: InvalidModelConfig naming it."""
    data = kube.read_config_map_data(namespace, ref.name)
    if data is None:
        raise errors.ConfigNotFound(
            f"ConfigMap {namespace}/{ref.name} (spec.model.configMapRef) does not exist; create it with the "
            f"model's config.json under key {ref.key!r}: kubectl create configmap {ref.name} "
            f"--from-file={ref.key}=config.json {CREATE_HINT}"
        )
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise errors.ConfigNotFound(
            f"ConfigMap {namespace}/{ref.name} has no key {ref.key!r} (keys: {keys}); put config.json there "
            "or set spec.model.configMapRef.key"
        )
    config = parse_config_json(data[ref.key], f"ConfigMap {namespace}/{ref.name} key {ref.key!r}")
    if QUANT_SIDECAR in data and ref.key != QUANT_SIDECAR:
        where = f"ConfigMap {namespace}/{ref.name} key {QUANT_SIDECAR!r}"
        config = dict(build_config_with_quant_sidecar(config, parse_config_json(data[QUANT_SIDECAR], where)))
    draft = None
    if with_draft and DRAFT_CONFIG_KEY in data and ref.key != DRAFT_CONFIG_KEY:
        where = f"the draft's config.json, ConfigMap {namespace}/{ref.name} key {DRAFT_CONFIG_KEY!r}"
        draft = parse_config_json(data[DRAFT_CONFIG_KEY], where)
    if not reads_processor_files(config):
        return ModelFiles(config, draft=draft)
    processors = {
        name: parse_config_json(data[name], f"ConfigMap {namespace}/{ref.name} key {name!r}")
        for name in PROCESSOR_FILES
        if name in data and name != ref.key
    }
    return ModelFiles(config, processors, draft)
