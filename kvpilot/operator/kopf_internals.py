"""The one place kvpilot touches kopf's private API: a timer registered without a finalizer.

``kopf.timer`` hard-codes ``requires_finalizer=True`` (kopf 1.45, ``kopf/on.py``) and kopf has no public
way to register a timer without one; :mod:`kvpilot.operator.timers` says why the closed loop needs none.
:func:`drop_finalizer_requirement` therefore replaces the registered handler in
``OperatorRegistry._spawning._handlers`` by a copy with ``requires_finalizer=False``.

It relies on three shapes of kopf's internals, each asserted by ``tests/operator/test_kopf_internals.py``
against the installed kopf (so a kopf upgrade that changes them fails there, loudly, not in production):
the registry's ``_spawning`` is a ``SpawningRegistry`` whose ``_handlers`` is a list; its handlers are
dataclasses with ``fn`` and ``requires_finalizer``; and kopf reads ``requires_finalizer`` from that list
when it decides whether to add a finalizer. Callers raise when it changes nothing (a miss means the shapes
moved).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import kopf


def drop_finalizer_requirement(fn: Callable[..., Any], registry: kopf.OperatorRegistry | None = None) -> int:
    """Make the spawning handlers (timers, daemons) registered for ``fn`` require no finalizer; returns
    how many were changed (0 means kopf's registry no longer looks as expected: the caller raises)."""
    spawning = (registry or kopf.get_default_registry())._spawning
    changed = 0
    for i, handler in enumerate(spawning._handlers):
        if handler.fn is fn and handler.requires_finalizer:
            spawning._handlers[i] = dataclasses.replace(handler, requires_finalizer=False)
            changed += 1
    return changed
