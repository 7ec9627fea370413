"""Domain errors of the tuner. The operator maps them to conditions at its edge.

Hierarchy::

    TunerError
    ├── UnknownGpu               -- a GPU name or GFD labels the catalogue cannot place
    ├── UnknownModel             -- a model id that is not in the built-in catalogue
    ├── InvalidModelConfig       -- a config.json the memory model cannot account for
    │                               (names the missing or unsupported field)
    ├── InvalidEngineArgs        -- vLLM arguments the pinned release would reject
    │                               (a flag that does not exist, a bad value)
    └── InfeasiblePlan           -- nothing within the user's bounds fits; says what would

Each carries a message written for the person who has to act on it: what is
wrong and what to change. ``reason`` is a CamelCase word for a Kubernetes
condition; the operator uses it as is.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base class of every error the tuner raises on purpose."""

    reason: str = "TunerError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownGpu(TunerError):
    """The GPU product is not in the catalogue and no memory size was given."""

    reason = "UnknownGpu"


class UnknownModel(TunerError):
    """The model id is not in the built-in catalogue."""

    reason = "UnknownModel"


class InvalidModelConfig(TunerError):
    """The Hugging Face config lacks a field the memory model needs, or has an unsupported value."""

    reason = "InvalidModelConfig"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidEngineArgs(TunerError):
    """vLLM engine arguments the pinned vLLM release would refuse (names the flag and what to use)."""

    reason = "InvalidEngineArgs"

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.flag = flag


class InfeasiblePlan(TunerError):
    """No settings within the user's bounds let vLLM start; ``suggestions`` says what would."""

    reason = "Infeasible"

    def __init__(self, message: str, suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.suggestions = suggestions
