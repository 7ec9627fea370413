"""The checkpoint files a plan reads, and the ``ConfigMap`` source of them.

A plan reads ``config.json`` (with the quantization of an ``hf_quant_config.json`` sidecar merged in, as vLLM
does) and, for a model whose vision tower kvpilot models, the checkpoint's ``preprocessor_config.json`` and
``video_preprocessor_config.json``: vLLM sizes its dummy encoder batch from their pixel budgets
(:mod:`kvpilot.tuner.model.processors`). The ConfigMap source reads them from keys of those names beside
config.json; the Hub source (:mod:`.hub`) downloads them beside it. Both read the processor files only for a
config that reads them, so a text model's plan never depends on a stray key or costs a Hub request.
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


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """What a model's plan is read from: config.json, and its processor files by name (none: the config
    does not read them, or the checkpoint has none; transformers' defaults then, as vLLM uses)."""

    config: Mapping[str, Any]
    processors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def compute_config_key(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compute_files_key(files: ModelFiles) -> str:
    """The digest of what the plan reads (the ModelSpec cache's and the TuningProfiles' model key):
    config.json's alone when there are no processor files, so a text model keeps the key it always had;
    with them, a changed processor file is another model (another ModelSpec and plan), as a changed
    config.json is."""
    if not files.processors:
        return compute_config_key(files.config)
    return compute_config_key({"config.json": files.config, **files.processors})


def read_config_map_files(ref: api.ConfigMapRef, namespace: str, kube: Kube) -> ModelFiles:
    """config.json under ``ref.key``, its ``hf_quant_config.json`` sidecar and, for a multimodal config, its
    processor files, from keys of the ConfigMap; a key that is not JSON: InvalidModelConfig naming it."""
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
    if not reads_processor_files(config):
        return ModelFiles(config)
    processors = {
        name: parse_config_json(data[name], f"ConfigMap {namespace}/{ref.name} key {name!r}")
        for name in PROCESSOR_FILES
        if name in data and name != ref.key
    }
    return ModelFiles(config, processors)
