"""Per-namespace fairness: one tenant's burst queues behind itself, not in front of another tenant's retune.

kopf runs every object's handlers in a task of its own, and its worker limit is per resource kind: 500
InferenceServices created at once in one namespace were 500 reconciles and 500 closed-loop ticks competing
for the same API client, Hub cache and executor threads, in arrival order, while another namespace's
CUDA-OOM retune waited (12 s instead of 2.4 in the attacker's run). :class:`FairGate` admits that work:

* at most ``total`` units at once (reconciles and ticks of InferenceServices and EngineTuners);
* at most ``per_namespace`` of them from one namespace;
* when a slot frees, the next unit comes from the namespace served least recently (round-robin over the
  namespaces that have work waiting; first come, first served inside one namespace).

So a namespace with 500 waiting units gets one slot in turn like a namespace with one: the other tenant's
unit waits for at most one unit per busy namespace, not for the whole burst. The knobs are environment
variables the chart sets (``operator.fairness`` values): :data:`TOTAL_ENV`, :data:`PER_NAMESPACE_ENV`.
``tests/operator/test_fairness.py`` checks the order, the bounds and cancellation.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

TOTAL_ENV = "KVPILOT_MAX_CONCURRENT_WORK"
PER_NAMESPACE_ENV = "KVPILOT_MAX_WORK_PER_NAMESPACE"
DEFAULT_TOTAL = 16
"""Reconciles and ticks at once: half the executor pool (kvpilot.operator.clients.kube.IO_POOL, 32 threads),
whose other half serves the pod webhook, drift repair and the Hub."""
DEFAULT_PER_NAMESPACE = 4
"""One namespace's share: a burst there leaves three quarters of the slots to the others."""


class FairnessConfigError(ValueError):
    """A fairness setting that is not a positive integer, or a share above the total."""


@dataclass(frozen=True)
class FairnessSettings:
    total: int = DEFAULT_TOTAL
    per_namespace: int = DEFAULT_PER_NAMESPACE


def settings_from_env(env: Mapping[str, str] | None = None) -> FairnessSettings:
    """The settings from :data:`TOTAL_ENV` and :data:`PER_NAMESPACE_ENV` (unset: the defaults)."""
    env = os.environ if env is None else env
    total = _positive(env, TOTAL_ENV, DEFAULT_TOTAL)
    per_namespace = _positive(env, PER_NAMESPACE_ENV, min(DEFAULT_PER_NAMESPACE, total))
    if per_namespace > total:
        raise FairnessConfigError(f"{PER_NAMESPACE_ENV}={per_namespace} is above {TOTAL_ENV}={total}")
    return FairnessSettings(total, per_namespace)


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise FairnessConfigError(f"{name}={text!r}: a positive integer (units of work at once)")
    return int(text)


class FairGate:
    """Admission of units of work by namespace (module docstring). Not thread-safe: one event loop."""

    def __init__(self, total: int = DEFAULT_TOTAL, per_namespace: int = DEFAULT_PER_NAMESPACE) -> None:
        if not 1 <= per_namespace <= total:
            raise FairnessConfigError(f"per_namespace {per_namespace} must be within 1..total {total}")
        self.total = total
        self.per_namespace = per_namespace
        self.running: Counter[str] = Counter()
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        """Namespaces with waiting units, in the order their queues began."""
        self._served: dict[str, int] = {}
        """When each namespace with work running or waiting was last granted a slot (a grant count)."""
        self._grants = 0

    @property
    def active(self) -> int:
        return sum(self.running.values())

    def waiting(self, namespace: str) -> int:
        return len(self._waiting.get(namespace, ()))

    @asynccontextmanager
    async def slot(self, namespace: str) -> AsyncIterator[None]:
        """Hold one of the namespace's slots for the ``async with`` body."""
        await self._acquire(namespace)
        try:
            yield
        finally:
            self._release(namespace)

    async def _acquire(self, namespace: str) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append(granted)
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(namespace)  # granted, then cancelled before it ran: give the slot on
            else:
                self._forget(namespace, granted)
            raise

    def _release(self, namespace: str) -> None:
        self.running[namespace] -= 1
        if self.running[namespace] <= 0:
            del self.running[namespace]
            if namespace not in self._waiting:
                self._served.pop(namespace, None)  # idle: nothing of it to remember
        self._dispatch()

    def _forget(self, namespace: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(namespace)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiting[namespace]

    def _dispatch(self) -> None:
        """Grant free slots, each to the eligible namespace served longest ago (round-robin)."""
        while self.active < self.total:
            eligible = [ns for ns in self._waiting if self.running[ns] < self.per_namespace]
            if not eligible:
                return
            namespace = min(eligible, key=lambda ns: self._served.get(ns, -1))  # ties: the older queue
            queue = self._waiting[namespace]
            granted = queue.popleft()
            if not queue:
                del self._waiting[namespace]
            if granted.cancelled():
                continue
            self._grants += 1
            self._served[namespace] = self._grants
            self.running[namespace] += 1
            granted.set_result(None)


_GATE = FairGate()


def configure(settings: FairnessSettings) -> None:
    """Install the operator's gate (at start-up, before any handler runs)."""
    global _GATE
    _GATE = FairGate(settings.total, settings.per_namespace)


def gate() -> FairGate:
    """The operator's gate (:func:`configure`)."""
    return _GATE
