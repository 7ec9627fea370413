"""The built-in model catalogue: a popular model's ``config.json`` by its Hugging Face id.

Sits above :mod:`kvpilot.tuner.model.configs` (the data, one module per family).
The CLI's ``plan --model`` and the operator's ``model.source: Catalogue`` read
configs here; any other model comes as its own ``config.json`` (``--config``, a
ConfigMap, or the Hub), read at the edge, never by the tuner.

Lookups hand out deep copies, so a caller may edit what it gets without touching
the catalogue.
"""

from __future__ import annotations

import copy
import difflib

from kvpilot.tuner import errors
from kvpilot.tuner.model.configs import ENTRIES, ModelEntry

_BY_ID = {entry.id.lower(): entry for entry in ENTRIES}


def _by_repo_name() -> dict[str, ModelEntry]:
    """Entries by the part after the organisation, where that part is unique."""
    seen: dict[str, list[ModelEntry]] = {}
    for entry in ENTRIES:
        seen.setdefault(entry.id.split("/", 1)[-1].lower(), []).append(entry)
    return {name: found[0] for name, found in seen.items() if len(found) == 1}


_BY_REPO_NAME = _by_repo_name()


def _key(model_id: str) -> str:
    key = model_id.strip().lower()
    for prefix in ("hf://", "https://huggingface.co/", "huggingface.co/", "hf.co/"):
        key = key.removeprefix(prefix)
    return key.strip("/")


def lookup_model(model_id: str) -> ModelEntry:
    """The catalogue entry for ``model_id`` (case-insensitive; the organisation may be left out).

    Raises :class:`~kvpilot.tuner.errors.UnknownModel`, naming close matches and
    the ways to give any other model's config.
    """
    key = _key(model_id)
    entry = _BY_ID.get(key) or _BY_REPO_NAME.get(key)
    if entry is None:
        raise errors.UnknownModel(_unknown_message(model_id, key))
    return entry


def _unknown_message(model_id: str, key: str) -> str:
    names = {entry.id.lower(): entry.id for entry in ENTRIES}
    names.update({name: entry.id for name, entry in _BY_REPO_NAME.items()})
    repo = key.split("/", 1)[-1]
    matches: list[str] = []
    for candidate in difflib.get_close_matches(key, list(names), n=8, cutoff=0.6) + difflib.get_close_matches(
        repo, list(names), n=8, cutoff=0.6
    ):
        if names[candidate] not in matches:
            matches.append(names[candidate])
    close = f" Close matches: {', '.join(matches[:5])}." if matches else ""
    return (
        f"Model {model_id!r} is not in kvpilot's built-in catalogue.{close} For any other model give its "
        "config.json: `kvpilot plan --config path/to/config.json`, or in an InferenceService set "
        "spec.model.source to ConfigMap (with configMapRef) or Hub. `kvpilot models` lists the catalogue."
    )


def lookup_model_config(model_id: str) -> dict[str, object]:
    """A deep copy of the catalogue model's ``config.json`` (see :func:`lookup_model`)."""
    return copy.deepcopy(dict(lookup_model(model_id).config))


def lookup_checkpoint_bytes(model_id: str) -> int | None:
    """The catalogue model's checkpoint size in bytes, or ``None`` when not recorded."""
    return lookup_model(model_id).checkpoint_bytes


def list_models() -> list[tuple[str, str]]:
    """``(id, description)`` of every catalogue model, grouped by family."""
    return [(entry.id, entry.description) for entry in ENTRIES]
