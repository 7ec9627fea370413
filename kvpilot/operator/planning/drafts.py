"""A drafter's ``config.json``: what lets the plan budget vLLM's EAGLE3 drafter or a separate draft model.

A ``--speculative-config`` (or ``--spec-*``) of method ``eagle3`` or ``draft_model`` in the engine's
arguments loads a checkpoint of its own, which the tuner budgets only from its ``config.json``
(:attr:`kvpilot.tuner.vllm.SpeculativeFlags.draft_config`, as ``kvpilot plan --draft-config`` gives it).
The operator reads it beside the model's, from ``spec.model.source``
(:func:`kvpilot.operator.planning.resolve.read_model`):

* ``Hub``: the speculative config's ``model``, when it is a Hub id (a local path starts with ``/`` or
  ``.``), downloaded with the model's token (``spec.model.hubTokenSecretRef``) at the speculative config's
  ``revision`` (vLLM's ``SpeculativeConfig.revision``, the draft's; none: the default branch), with the
  model's error mapping, naming the draft (:func:`.hub.download_hub_draft_config`);
* ``ConfigMap``: the key :data:`.model_files.DRAFT_CONFIG_KEY` of the same ConfigMap;
* ``Catalogue``: none.

A draft config read is checked as ``kvpilot plan --draft-config`` checks it (:func:`check_draft_config`):
one kvpilot cannot size is an ``InvalidModelConfig`` naming the draft (``Ready`` False, as for the model's
own config.json), and it is part of the model key (:func:`.model_files.compute_draft_key`), so another
draft is another plan and TuningProfile. Where none is read, the plan warns that the drafter is not
budgeted, with this source's advice (:func:`describe_draft_hint`, the flags'
:attr:`~kvpilot.tuner.vllm.SpeculativeFlags.draft_config_hint`). Pure; no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.planning.model_files import DRAFT_CONFIG_KEY
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import memory, vllm
from kvpilot.tuner import model as models

DRAFTED_METHODS = (vllm.EAGLE3, vllm.DRAFT_MODEL)
"""The methods whose drafter the tuner budgets from its own config.json."""
LOCAL_PATH_PREFIXES = ("/", ".")
"""How a speculative config's ``model`` that is a path in the pod (not a Hub id) starts."""
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
"""A Hugging Face repository id, as ``spec.model.id`` takes one (:class:`kvpilot.operator.api.ModelRef`)."""
REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")
"""A revision, as ``spec.model.revision`` takes one (with :func:`kvpilot.operator.api.ref_name_problem`)."""


def needs_draft_config(speculative: vllm.SpeculativeFlags | None) -> bool:
    """Whether the engine's speculative decoding loads a drafter the tuner budgets from its config.json."""
    return speculative is not None and speculative.method in DRAFTED_METHODS


def find_hub_draft(speculative: vllm.SpeculativeFlags) -> str | None:
    """The draft's Hub id; ``None``: no ``model``, or a local path."""
    model = speculative.draft_model
    if not model or model.startswith(LOCAL_PATH_PREFIXES):
        return None
    return model


def check_hub_draft(draft_id: str, revision: str | None) -> None:
    """Refuse a draft id or revision ``spec.model`` would refuse (``InvalidSpec``), before anything is
    asked of the Hub or written to its cache."""
    if len(draft_id) > 256 or not HUB_ID.match(draft_id):
        raise errors.InvalidSpec(
            f"the 'model' of --speculative-config, {draft_id[:80]!r}, is neither a Hugging Face id "
            "(org/name) nor a path in the pod (starting with '/' or '.'); fix spec.engine.extraArgs"
        )
    if revision is not None and (not REVISION.match(revision) or api.ref_name_problem(revision)):
        problem = api.ref_name_problem(revision) or "at most 128 of A-Z a-z 0-9 . _ / -"
        raise errors.InvalidSpec(
            f"the 'revision' of --speculative-config, {revision[:80]!r}: {problem}; fix spec.engine.extraArgs"
        )


def check_draft_config(speculative: vllm.SpeculativeFlags, config: Mapping[str, Any], where: str) -> None:
    """Refuse a draft config kvpilot cannot size for ``speculative``'s method, as ``kvpilot plan
    --draft-config`` does: :class:`~kvpilot.tuner.errors.InvalidModelConfig` naming ``where``."""
    try:
        if speculative.method == vllm.EAGLE3:
            models.read_eagle3_draft(config)
        else:
            memory.read_draft_model(dataclasses.replace(speculative, draft_config=config))
    except tuner_errors.InvalidModelConfig as exc:
        raise tuner_errors.InvalidModelConfig(
            f"{where} (method {speculative.method!r} of --speculative-config): {exc.message}",
            field=exc.field,
        ) from None


def describe_draft_hint(model: api.ModelRef, namespace: str, speculative: vllm.SpeculativeFlags) -> str:
    """How to give the drafter's config.json with ``model``'s source, where it was not read: the advice the
    plan's warning carries (:attr:`~kvpilot.tuner.vllm.SpeculativeFlags.draft_config_hint`)."""
    under = f"under key {DRAFT_CONFIG_KEY!r}"
    if model.source == "ConfigMap" and model.config_map_ref is not None:
        ref = f"ConfigMap {namespace}/{model.config_map_ref.name}"
        hub = "" if find_hub_draft(speculative) is None else ", or use source: Hub, which downloads it"
        return f"put it {under} of {ref}{hub}"
    if model.source == "Hub":  # a draft that is not a Hub id, or not cached by an offline operator
        if find_hub_draft(speculative) is not None:
            return (
                "the operator is offline (HF_HUB_OFFLINE) and has not cached it: use source: ConfigMap with "
                f"its config.json {under}"
            )
        return f"the draft is not a Hub id: use source: ConfigMap with its config.json {under}"
    hub = "" if find_hub_draft(speculative) is None else "source: Hub (the draft's Hub id is downloaded) or "
    return (
        f"source: Catalogue holds no draft configs: use {hub}source: ConfigMap with its config.json {under}"
    )


def with_draft_config(
    flags: vllm.EngineFlags, config: Mapping[str, Any] | None, hint: str | None
) -> vllm.EngineFlags:
    """``flags`` whose speculative decoding carries the drafter's ``config`` (``None``: not read; then
    ``hint``, how to give it); unchanged without a drafter the tuner budgets from its config."""
    spec = flags.speculative
    if spec is None or not needs_draft_config(spec) or (config is None and hint is None):
        return flags
    drafted = dataclasses.replace(spec, draft_config=config, draft_config_hint=hint)
    return dataclasses.replace(flags, speculative=drafted)
