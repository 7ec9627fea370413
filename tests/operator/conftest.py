"""Fixtures of the operator's unit tests (the fakes live in operator_fakes.py)."""

from __future__ import annotations

import pytest
from operator_fakes import Harness

from kvpilot.operator.planning import modes, resolve
from kvpilot.operator.pods import ownership


@pytest.fixture(autouse=True)
def _fresh_ownership_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with an operator that has verified no object yet (pods.ownership)."""
    monkeypatch.setattr(ownership, "VERIFIED", ownership.VerifiedOwners())


@pytest.fixture
def harness() -> Harness:
    resolve.clear_caches()
    modes.clear_cache()
    return Harness()
