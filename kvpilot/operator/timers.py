"""kopf timers that need no finalizer on the object they tick for.

kopf puts a finalizer on every object a timer or daemon is registered for (``kopf.timer`` sets the
handler's ``requires_finalizer``), so that it can stop the timer before the object is gone. On create
that costs a PATCH of the object and a whole round trip, because kopf runs no handler in the cycle
that adds the finalizer: the create handler waits for the watch to bring the patched object back. At
1000 objects created at once that is 1000 extra writes on the API server's critical path
(docs/operator.md, "Scale").

kvpilot's closed loop needs no finalizer: it has nothing to clean up (the garbage collector deletes the
Deployment and Service through their owner references) and its status patch of a deleted object is a
404 that kopf logs and drops. What the finalizer gave kopf is the signal to stop the timer. Here the
signal comes from the watch instead: :func:`observe` (a ``kopf.on.event`` handler on the same
resource, run by kopf before it matches the timers on each event) records the uid of a ``DELETED``
object, and the timer's ``when`` filter (:func:`is_live`) then no longer matches, so kopf stops it
(``FILTERS_MISMATCH``) in that same processing cycle. An old ``kvpilot.io/finalizer`` on an object
is removed by kopf on its next event (no handler requires it).

:func:`kvpilot.operator.kopf_internals.drop_finalizer_requirement` removes the finalizer kopf's public
``kopf.timer`` always asks for; it is kvpilot's one use of kopf's private API, kept in that shim.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

GONE_TTL_S = 600.0
"""How long a deleted object's uid is remembered: long enough for kopf to process its DELETED event."""


class GoneObjects:
    """The uids of objects the watch reported ``DELETED``, forgotten after ``ttl_s``."""

    def __init__(self, ttl_s: float = GONE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._gone: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        uid = (body.get("metadata") or {}).get("uid")
        if event_type != "DELETED" or not uid:
            return
        now = self.clock()
        with self._lock:
            self._gone[str(uid)] = now
            if len(self._gone) > 64:  # prune now and then, not on every event
                self._gone = {u: t for u, t in self._gone.items() if now - t < self.ttl_s}

    def is_live(self, body: Mapping[str, Any]) -> bool:
        uid = (body.get("metadata") or {}).get("uid")
        with self._lock:
            return uid not in self._gone

    def __len__(self) -> int:
        return len(self._gone)


GONE = GoneObjects()
"""The process-wide record (kopf's handlers are module-level)."""


def is_live(body: kopf.Body, **_: Any) -> bool:
    """A timer's ``when`` filter: False once the watch has reported the object deleted."""
    return GONE.is_live(body)


def observe(event: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """Record a ``DELETED`` watch event (called from a ``kopf.on.event`` handler)."""
    GONE.observe(event.get("type"), body)
