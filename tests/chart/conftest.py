"""Fixtures for the Helm chart tests; the helpers (finding helm, rendering) live in helmchart.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from helmchart import find_helm, render


@pytest.fixture(scope="session")
def helm() -> Path:
    return find_helm()


@pytest.fixture(scope="session")
def rendered(helm: Path) -> Callable[..., list[dict[str, Any]]]:
    """``rendered(values_file=None, sets=())``: the chart's objects, memoised per arguments."""
    cache: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def _render(values_file: Path | None = None, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
        key = (values_file, tuple(sets))
        if key not in cache:
            cache[key] = render(helm, values_file, sets)
        return cache[key]

    return _render
