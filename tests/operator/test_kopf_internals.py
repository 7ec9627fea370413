"""kopf's private shapes that :mod:`kvpilot.operator.kopf_internals` relies on, asserted against the installed
kopf: a kopf release that changes them fails here, not in a cluster."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import kopf
from kopf._core.intents import handlers, registries

from kvpilot.operator import kopf_internals


async def _tick(**_: Any) -> None:
    pass


def _registry_with_a_timer() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kopf.timer("kvpilot.io", "v1alpha1", "inferenceservices", interval=1, registry=registry)(_tick)
    return registry


def test_the_registry_keeps_spawning_handlers_in_a_list() -> None:
    spawning = kopf.OperatorRegistry()._spawning
    assert isinstance(spawning, registries.SpawningRegistry)
    assert isinstance(spawning._handlers, list)


def test_a_timer_handler_is_a_dataclass_with_fn_and_requires_finalizer() -> None:
    assert dataclasses.is_dataclass(handlers.TimerHandler)
    fields = {f.name for f in dataclasses.fields(handlers.TimerHandler)}
    assert {"fn", "requires_finalizer"} <= fields


def test_kopf_timer_still_asks_for_a_finalizer() -> None:
    """If this fails, kopf may offer a public way to register a timer without one: use it, drop the shim."""
    (handler,) = _registry_with_a_timer()._spawning.get_all_handlers()
    assert handler.requires_finalizer is True
    assert "requires_finalizer" not in inspect.signature(kopf.timer).parameters


def test_the_dropped_requirement_is_what_kopf_reads() -> None:
    registry = _registry_with_a_timer()
    assert kopf_internals.drop_finalizer_requirement(_tick, registry) == 1
    (handler,) = registry._spawning.get_all_handlers()
    assert handler.requires_finalizer is False and handler.fn is _tick
    # kopf decides on a finalizer from exactly these handlers (SpawningRegistry.requires_finalizer)
    source = inspect.getsource(registries.SpawningRegistry.requires_finalizer)
    assert "self._handlers" in source and "handler.requires_finalizer" in source
    assert kopf_internals.drop_finalizer_requirement(_tick, registry) == 0  # nothing left to change


def test_a_function_kopf_does_not_know_changes_nothing() -> None:
    assert kopf_internals.drop_finalizer_requirement(lambda: None, _registry_with_a_timer()) == 0
