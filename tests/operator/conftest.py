"""Fixtures of the operator's unit tests (the fakes live in operator_fakes.py)."""

from __future__ import annotations

import pytest
from operator_fakes import Harness

from kvpilot.operator.planning import modes, resolve


@pytest.fixture
def harness() -> Harness:
    resolve.clear_caches()
    modes.clear_cache()
    return Harness()
