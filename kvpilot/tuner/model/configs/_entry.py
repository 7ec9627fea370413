"""One entry of the built-in model catalogue: a Hugging Face id and its published config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A catalogue model. ``config`` is the checkpoint's ``config.json``, as Python data, never mutated."""

    id: str
    """Hugging Face model id, e.g. ``meta-llama/Llama-3.1-8B-Instruct``."""
    description: str
    """One line for ``kvpilot models``."""
    config: Mapping[str, object]
    checkpoint_bytes: int | None = None
    """Total size of the checkpoint's weight files when known (sharper weight estimates)."""
