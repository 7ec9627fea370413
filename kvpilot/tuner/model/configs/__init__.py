"""Built-in ``config.json`` data of popular models, one module per family.

The tuner may not read files, so the configs live here as Python data, copied
verbatim from the Hugging Face Hub (most from ``shared/data/vllm_memory_cases.json``,
where each was checked against the published file). :mod:`kvpilot.tuner.model.catalogue`
is the only reader; add a model by adding a :class:`ModelEntry` to its family's
``ENTRIES`` (or a new family module listed in :data:`FAMILIES`).
"""

from __future__ import annotations

from kvpilot.tuner.model.configs import (
    deepseek,
    deepseek_v4,
    gemma,
    gemma4,
    glm,
    gpt_oss,
    kimi,
    llama,
    minimax,
    mistral,
    nemotron,
    qwen,
    qwen3_5,
)
from kvpilot.tuner.model.configs._entry import ModelEntry

FAMILIES = (
    llama,
    qwen,
    qwen3_5,
    mistral,
    gemma,
    gemma4,
    deepseek,
    deepseek_v4,
    glm,
    kimi,
    gpt_oss,
    minimax,
    nemotron,
)

ENTRIES: tuple[ModelEntry, ...] = tuple(entry for family in FAMILIES for entry in family.ENTRIES)

__all__ = ["ENTRIES", "FAMILIES", "ModelEntry"]
