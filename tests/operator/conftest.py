"""Fixtures of the operator's unit tests (the fakes live in operator_fakes.py)."""

from __future__ import annotations

import pytest
from operator_fakes import Harness, ProfileKube

from kvpilot.operator.planning import modes, resolve


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
