"""The Hugging Face Hub source of a model's files (``spec.model.source: Hub``), errors mapped to retry or not.

``config.json`` at the revision, then the files a checkpoint may keep beside it, each only where vLLM reads
it: ``hf_quant_config.json`` when config.json has no ``quantization_config`` (an older NVIDIA ModelOpt
export), ``preprocessor_config.json`` and ``video_preprocessor_config.json`` when its vision tower is one
kvpilot models (their pixel budgets size vLLM's dummy encoder batch). An optional file the Hub does not
have (404), or one not cached while ``HF_HUB_OFFLINE``, is none; any other failure is config.json's.
The token is never logged; the Hub's own words reach the operator's log only, redacted.

A drafter's config.json (an ``eagle3`` or ``draft_model`` ``--speculative-config`` whose ``model`` is a Hub
id: :mod:`.drafts`) is downloaded the same way, with the model's token, at the speculative config's
``revision``; its errors name the draft and the speculative config (:data:`DRAFT`).
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import errors
from kvpilot.operator.clients.prometheus_errors import redact_text
from kvpilot.operator.planning.model_files import DRAFT_CONFIG_KEY, ModelFiles
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.model import (
    MAX_CONFIG_BYTES,
    PROCESSOR_FILES,
    QUANT_SIDECAR,
    build_config_with_quant_sidecar,
    is_quantization_in_config,
    parse_config_json,
    reads_processor_files,
)

logger = logging.getLogger(__name__)

HUB_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class HubSubject:
    """What a download is for, as its errors name it and say what to fix."""

    noun: str
    """What the repository is: ``model``, ``draft model``."""
    id_field: str
    """Where its id is given."""
    revision_field: str
    """Where its revision is given."""
    without_hub: str
    """The sources that need no Hub access."""
    elsewhere: str
    """How to give its config.json where the Hub has none."""


MODEL = HubSubject(
    "model",
    "spec.model.id",
    "spec.model.revision",
    "source: ConfigMap or Catalogue",
    "give the config through a ConfigMap (source: ConfigMap)",
)
"""``spec.model``'s checkpoint."""
DRAFT = HubSubject(
    "draft model",
    "the 'model' of --speculative-config in the engine's arguments",
    "the 'revision' of --speculative-config",
    f"source: ConfigMap, with the draft's config.json under key {DRAFT_CONFIG_KEY!r}",
    f"give the draft's config.json under key {DRAFT_CONFIG_KEY!r} of a ConfigMap (source: ConfigMap)",
)
"""The drafter of an ``eagle3`` or ``draft_model`` ``--speculative-config`` (:mod:`.drafts`)."""


def download_hub_files(model_id: str, revision: str | None, token: str | None) -> ModelFiles:
    """config.json (:func:`download_hub_config`) and, for a config that reads them, the processor files the
    checkpoint has, at the same revision with the same token."""
    config = download_hub_config(model_id, revision, token)
    if not reads_processor_files(config):
        return ModelFiles(config)  # a text model: no request for files its plan never reads
    found = ((name, _download_optional(model_id, name, revision, token)) for name in PROCESSOR_FILES)
    return ModelFiles(config, {name: content for name, content in found if content is not None})


def download_hub_draft_config(
    model_id: str, revision: str | None, token: str | None
) -> dict[str, Any] | None:
    """A drafter's config.json (:func:`download_hub_config`), its errors naming the draft model; ``None``
    when the operator is offline (``HF_HUB_OFFLINE``) and has none cached: what is not in the cache never
    will be, and the service is planned without the drafter, as before the operator read drafts, rather
    than retried for ever."""
    try:
        return download_hub_config(model_id, revision, token, DRAFT)
    except errors.HubUnreachable:
        if _hub_offline():
            return None
        raise


def download_hub_config(
    model_id: str, revision: str | None, token: str | None, subject: HubSubject = MODEL
) -> dict[str, Any]:
    """config.json from the Hugging Face Hub (``huggingface_hub``), with its quantization sidecar merged.

    ``huggingface_hub`` retries connection errors itself (about 25 s) before it gives up; then the
    reconciliation fails with ``HubUnreachable`` and kopf retries with back-off. ``subject``: what the
    checkpoint is, for the errors.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise errors.InvalidSpec(
            "source: Hub needs the huggingface_hub package, which this operator image lacks; use source: "
            "ConfigMap or Catalogue, or install kvpilot with huggingface_hub"
        ) from None
    try:
        path = hf_hub_download(
            model_id, "config.json", revision=revision, token=token or False, etag_timeout=HUB_TIMEOUT_S
        )
    except Exception as exc:
        _log_hub_error(exc, model_id)
        raise compute_hub_error(exc, model_id, revision, subject) from None
    config = _read_hub_json(path, f"config.json of {_named(subject)}{model_id}@{revision or 'main'}")
    if is_quantization_in_config(config):
        return config  # a quantization_config of its own: vLLM does not look for the sidecar
    # ModelOpt's older exports keep the quantization beside config.json; most checkpoints have none
    sidecar = _download_optional(model_id, QUANT_SIDECAR, revision, token, subject)
    return config if sidecar is None else dict(build_config_with_quant_sidecar(config, sidecar))


def _named(subject: HubSubject) -> str:
    """How a message names the repository before its id: nothing for the model, else ``the draft model``."""
    return "" if subject is MODEL else f"the {subject.noun} "


def _download_optional(
    model_id: str, filename: str, revision: str | None, token: str | None, subject: HubSubject = MODEL
) -> dict[str, Any] | None:
    """A file a checkpoint may keep beside config.json: ``None`` when the Hub has none (404) or, offline
    (``HF_HUB_OFFLINE``), when only config.json is cached; any other failure is raised, mapped, as
    config.json's is (planning without the file because the Hub blinked would plan another service)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(
            model_id, filename, revision=revision, token=token or False, etag_timeout=HUB_TIMEOUT_S
        )
    except Exception as exc:
        _log_hub_error(exc, model_id)
        mapped = compute_hub_error(exc, model_id, revision, subject)
        if isinstance(mapped, tuner_errors.InvalidModelConfig) or _hub_offline():
            return None
        raise mapped from None
    return _read_hub_json(path, f"{filename} of {_named(subject)}{model_id}@{revision or 'main'}")


def _log_hub_error(exc: Exception, model_id: str) -> None:
    """The Hub's words for the operator's owner only: redacted (no token, no userinfo), truncated."""
    logger.info("Hub request for %s failed: %s: %s", model_id, type(exc).__name__, redact_text(str(exc)))


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE``, as ``huggingface_hub`` read it: a cache-only operator never reaches the Hub."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _read_hub_json(path: str, where: str) -> dict[str, Any]:
    with open(path, "rb") as fh:  # bytes: parse_config_json refuses oversize and non-UTF-8 text itself
        raw = fh.read(MAX_CONFIG_BYTES + 1)  # one byte past the limit is enough to refuse a huge file
    return parse_config_json(raw, where)


def compute_hub_error(
    exc: Exception, model_id: str, revision: str | None, subject: HubSubject = MODEL
) -> Exception:
    """The operator or tuner error for a ``huggingface_hub`` failure (order matters: see the MRO notes);
    ``subject``: what the repository is, for the message."""
    from huggingface_hub import errors as hf

    where = f"{_named(subject)}{model_id}@{revision or 'main'}"
    unreachable = errors.HubUnreachable(
        f"the Hugging Face Hub cannot be reached for {where} ({type(exc).__name__}); retrying with "
        f"back-off. Without Hub access use {subject.without_hub}"
    )
    # LocalEntryNotFoundError (no connection, nothing cached) is also an EntryNotFoundError: check it first.
    if isinstance(exc, hf.LocalEntryNotFoundError | hf.OfflineModeIsEnabled):
        return unreachable
    if isinstance(exc, hf.GatedRepoError):  # a RepositoryNotFoundError: check it first
        return errors.HubAccessDenied(
            f"{model_id} is gated on the Hugging Face Hub; accept its licence there and put a token with "
            "access in the Secret named by spec.model.hubTokenSecretRef"
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return tuner_errors.UnknownModel(
            f"{subject.noun.capitalize()} {model_id!r} was not found on the Hugging Face Hub (or is private: "
            f"then set spec.model.hubTokenSecretRef). Check {subject.id_field}."
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return tuner_errors.UnknownModel(
            f"Revision {revision!r} of {_named(subject)}{model_id} does not exist on the Hugging Face Hub; "
            f"fix {subject.revision_field}"
        )
    if isinstance(exc, hf.EntryNotFoundError):
        return tuner_errors.InvalidModelConfig(f"{where} has no config.json on the Hub; {subject.elsewhere}")
    if isinstance(exc, hf.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return errors.HubAccessDenied(
                f"the Hugging Face Hub refused access to {where} (HTTP {status}); check the token Secret"
            )
        return errors.HubUnreachable(f"the Hugging Face Hub failed for {where} (HTTP {status}); retrying")
    if isinstance(exc, OSError) and exc.filename is not None:  # the local cache, not the network
        return errors.HubCacheUnwritable(
            f"the operator cannot write its Hugging Face cache to download {where} "
            f"({errno.errorcode.get(exc.errno or 0, type(exc).__name__)}); the platform team must give the "
            "operator a writable HF_HOME (the chart mounts an emptyDir there, hubCacheSizeLimit); retrying"
        )
    if isinstance(exc, OSError | TimeoutError) or "httpx" in type(exc).__module__:
        return unreachable
    # anything else: its text may quote the Hub's answer (status goes to the tenant): the class name only;
    # the operator's log has the text, redacted (download_hub_config)
    return errors.HubUnreachable(
        f"the Hugging Face Hub request for {where} failed ({type(exc).__name__}); retrying with back-off"
    )
