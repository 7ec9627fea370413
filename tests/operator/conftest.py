"""Fixtures of the operator's unit tests (the fakes live in operator_fakes.py)."""

from __future__ import annotations

import pytest
from operator_fakes import Harness, ProfileKube

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


@pytest.fixture
def planner(harness: Harness) -> Harness:
    """The harness with the real planner, which reads the TuningProfiles of a :class:`ProfileKube`."""
    harness.kube = ProfileKube()
    harness.deps.kube = harness.kube
    harness.deps.plan_fn = None
    return harness
