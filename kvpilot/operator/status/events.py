"""Kubernetes events for every decision kvpilot takes (Planned, Infeasible, ConfigResolved, ...).

The handlers talk to an :class:`Emitter`; in the operator it posts through kopf's
event queue (non-blocking, batched by kopf's poster), in tests it records. Reasons
are CamelCase; messages are written for the person reading ``kubectl describe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

NORMAL, WARNING = "Normal", "Warning"

MAX_MESSAGE = 1000
"""Kubernetes truncates event messages at 1 KiB; keep the start, which carries the reason."""


class Emitter(Protocol):
    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


def kopf_emitter(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post an event about ``body`` through kopf's poster (only inside a running operator)."""
    import kopf

    # kopf.event reads any Mapping (dicts.walk, then .get in build_object_reference); it is annotated Body
    kopf.event(body, type=type_, reason=reason, message=message[:MAX_MESSAGE])  # type: ignore[arg-type]


@dataclass
class RecordingEmitter:
    """An :class:`Emitter` that keeps ``(type, reason, message)`` tuples: for tests and ``render``."""

    events: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message[:MAX_MESSAGE]))

    @property
    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]
