"""The e2e suite's one polling helper (shared by test_operator, test_control_plane and test_chart)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` every 0.5 s until it returns something truthy, and return that.

    An exception from ``cond`` propagates at once; on timeout, an AssertionError names ``what``
    and the last value.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
